//! The console's HTML: the frame every page shares (top bar, navigation,
//! search). Pages are strings built here and in the page modules; nothing
//! client-derived reaches them unescaped (`admin/html_escape.rs`).

use std::fmt::Write;

use crate::admin::html_escape::esc;

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
