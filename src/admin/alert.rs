//! The alert an admin HTML page (a console page, the login form) shows
//! in place of what could not be read or done.

use super::html_escape::esc;

/// `message`, escaped, as an alert screen readers announce.
pub fn alert(message: &str) -> String {
    format!("<p class=\"note bad\" role=\"alert\">{}</p>", esc(message))
}
