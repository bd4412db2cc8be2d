//! The console's login form: shown by the console, and by the token check
//! to a console page's request that carries no valid token.

use super::alert::alert;
use super::html_escape::esc;

/// The login form, with a message (a refusal, or why the console is off)
/// and the page to go to after it.
pub fn login_page(next: Option<&str>, message: &str) -> axum::response::Html<String> {
    let note = if message.is_empty() {
        String::new()
    } else {
        alert(message)
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
    fn the_login_goes_on_only_to_console_pages() {
        assert_eq!(safe_next("/ui/threads/t1"), "/ui/threads/t1");
        assert_eq!(safe_next("//evil.example/ui/"), "/ui/waiting");
        assert_eq!(safe_next("https://evil.example"), "/ui/waiting");
        assert_eq!(safe_next("/ui//evil"), "/ui/waiting");
        assert_eq!(safe_next("/ui/login"), "/ui/waiting");
    }
}
