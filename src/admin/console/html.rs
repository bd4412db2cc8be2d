//! The console's HTML: escaping of everything that comes from a client or
//! the trail, the frame every page shares (top bar, navigation, search),
//! and the login page. Pages are strings built here and in the page
//! modules; nothing client-derived reaches them unescaped.

use std::fmt::Write;

/// `s` with `& < > " '` escaped: safe in element text and in quoted
/// attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a URL's path segment or query value.
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// The pages of the navigation bar: path, label.
pub const NAV: [(&str, &str); 7] = [
    ("/ui/waiting", "Waiting"),
    ("/ui/answered", "Answered"),
    ("/ui/refused", "Refused"),
    ("/ui/forks", "Forks served"),
    ("/ui/rejected", "Writes rejected"),
    ("/ui/fenced", "Writes fenced"),
    ("/ui/claims", "Claims held"),
];

/// What a page puts in the shared frame.
pub struct Frame<'a> {
    pub title: &'a str,
    /// The navigation entry to mark (a path of [`NAV`]).
    pub active: &'a str,
    /// The session's CSRF token (the logout form), when logged in by
    /// the login form.
    pub csrf: Option<&'a str>,
    /// Which trail the page read (`TrailSource::describe`).
    pub source: &'a str,
}

/// A whole page: head, top bar, navigation, then `main` (already HTML).
pub fn page(f: &Frame<'_>, main: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let current = if path == f.active {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{path}\"{current}>{label}</a>");
    }
    let logout = match f.csrf {
        Some(csrf) => format!(
            "<form method=\"post\" action=\"/ui/logout\" class=\"logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\">Log out</button></form>",
            esc(csrf)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · resumeguard</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\">\
         <script src=\"/ui/static/console.js\" defer></script></head><body>\
         <header class=\"top\"><a class=\"brand\" href=\"/ui/waiting\">\
         <span class=\"mark\">◆</span> resumeguard <span class=\"sub\">approvals</span></a>\
         <span class=\"source\" title=\"the trail read\">{source}</span>{logout}</header>\
         <nav class=\"tabs\">{nav}</nav><main>{main}</main></body></html>",
        title = esc(f.title),
        source = esc(f.source),
    )
}

/// The login form, with a message (a refusal, or why the console is off)
/// and the page to go to after it.
pub fn login_page(next: Option<&str>, message: &str) -> axum::response::Html<String> {
    let note = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"note bad\" role=\"alert\">{}</p>", esc(message))
    };
    let next = next.unwrap_or("/ui/waiting");
    axum::response::Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Log in · resumeguard</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\"></head><body class=\"login\">\
         <form method=\"post\" action=\"/ui/login\" class=\"card login-card\">\
         <h1><span class=\"mark\">◆</span> resumeguard</h1>\
         <p class=\"muted\">Approvals console. Log in with the proxy's <code>[admin] token</code>.</p>\
         {note}<label for=\"token\">Admin token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <button type=\"submit\" id=\"login\">Log in</button></form></body></html>",
        esc(next)
    ))
}

/// A console path to go to after the login: `next` if it is one, else
/// the waiting list (never another site).
pub fn safe_next(next: &str) -> &str {
    let console = next.starts_with("/ui/")
        && !next.starts_with("/ui/login")
        && !next.contains("//")
        && !next.contains('\\')
        && next.bytes().all(|b| b.is_ascii_graphic());
    if console {
        next
    } else {
        "/ui/waiting"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_text_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\u{1b}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\\u{1b}"
        );
        assert_eq!(url("a b/c?d"), "a%20b%2Fc%3Fd");
    }

    #[test]
    fn the_login_goes_on_only_to_console_pages() {
        assert_eq!(safe_next("/ui/threads/t1"), "/ui/threads/t1");
        assert_eq!(safe_next("//evil.example/ui/"), "/ui/waiting");
        assert_eq!(safe_next("https://evil.example"), "/ui/waiting");
        assert_eq!(safe_next("/ui//evil"), "/ui/waiting");
        assert_eq!(safe_next("/ui/login"), "/ui/waiting");
    }
}
