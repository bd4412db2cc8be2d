//! Client-derived text as it may appear in the proxy's log and in what the
//! CLI prints: escaped, so a newline cannot forge a log or timeline line,
//! an ANSI or OSC sequence cannot reach the terminal, a bidi override
//! cannot reorder what is shown and a NUL cannot make a log binary. In
//! the log it is also cut to a bounded length (a 1 MB thread id is not a
//! 1 MB line).
//!
//! One escaping for both: Rust's `escape_debug` (control characters of C0
//! and C1, DEL, format, separator and bidi characters as `\n`, `\u{1b}`,
//! `\u{202e}`; a backslash doubled), quotes escaped only in the log, where
//! a value may be shown quoted.

use std::fmt;

/// Characters of client text a log line keeps.
pub const LOG_TEXT_MAX: usize = 200;

/// `text` for a log line: escaped (quotes too), at most [`LOG_TEXT_MAX`]
/// characters, then `…(N bytes)`.
pub fn shown(text: &str) -> Shown<'_> {
    Shown(text)
}

/// `text` for the CLI's output: escaped, whole, quotes as they are.
pub fn escaped(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// Writes `text` escaped; quotes too when `quotes`.
fn write_escaped(f: &mut fmt::Formatter<'_>, text: &str, quotes: bool) -> fmt::Result {
    if quotes {
        return write!(f, "{}", text.escape_debug());
    }
    let mut from = 0;
    for (at, quote) in text.match_indices(['"', '\'']) {
        write!(f, "{}", text[from..at].escape_debug())?;
        f.write_str(quote)?;
        from = at + quote.len();
    }
    write!(f, "{}", text[from..].escape_debug())
}

/// Displays its text escaped and cut; see [`shown`].
pub struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(LOG_TEXT_MAX) {
            Some((cut, _)) => {
                write_escaped(f, &self.0[..cut], true)?;
                write!(f, "…({} bytes)", self.0.len())
            }
            None => write_escaped(f, self.0, true),
        }
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// Displays its text escaped; see [`escaped`].
pub struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlines_and_nuls_are_escaped() {
        let line = shown("t1\n2026-11-30 INFO forged\0").to_string();
        assert!(!line.contains('\n') && !line.contains('\0'), "{line}");
        assert_eq!(line, "t1\\n2026-11-30 INFO forged\\0");
    }

    #[test]
    fn long_text_is_cut_and_says_how_long_it_was() {
        let id = "x".repeat(1 << 20);
        let line = shown(&id).to_string();
        assert!(line.len() < 300, "{}", line.len());
        assert!(line.ends_with("…(1048576 bytes)"), "{line}");
        assert_eq!(shown("short").to_string(), "short");
        assert_eq!(
            shown(&"é".repeat(LOG_TEXT_MAX)).to_string().chars().count(),
            200
        );
    }

    #[test]
    fn terminal_escapes_and_invisible_characters_are_shown_visibly() {
        let hostile = "t\n[forged] answer recorded\r\x1b]0;title\x07\x1b[31mred\u{9b}2J\
                       \u{85}\u{7f}\u{202e}gnp.exe\u{2066}\u{200b}\u{2028}\u{feff}\t\0";
        let out = escaped(hostile).to_string();
        assert_eq!(
            out,
            "t\\n[forged] answer recorded\\r\\u{1b}]0;title\\u{7}\\u{1b}[31mred\\u{9b}2J\
             \\u{85}\\u{7f}\\u{202e}gnp.exe\\u{2066}\\u{200b}\\u{2028}\\u{feff}\\t\\0"
        );
        assert!(out.chars().all(|c| !c.is_control()), "{out:?}");
        assert_eq!(shown(hostile).to_string(), out);
    }

    #[test]
    fn printable_text_is_kept_and_a_backslash_cannot_pass_for_an_escape() {
        assert_eq!(
            escaped("thread-1 é 💥 — …").to_string(),
            "thread-1 é 💥 — …"
        );
        // A literal `\n` in the text reads `\\n`: not the escape of a newline.
        assert_eq!(escaped("a\\nb").to_string(), "a\\\\nb");
        // Combining marks after a letter stay; a leading one is escaped.
        assert_eq!(escaped("e\u{301}").to_string(), "e\u{301}");
        assert_eq!(escaped("\u{301}x").to_string(), "\\u{301}x");
    }

    #[test]
    fn quotes_are_kept_for_the_cli_and_escaped_in_the_log() {
        assert_eq!(escaped("o'brien \"x\"").to_string(), "o'brien \"x\"");
        assert_eq!(shown("o'brien \"x\"").to_string(), "o\\'brien \\\"x\\\"");
        assert_eq!(format!("{:?}", shown("a\"b")), "\"a\\\"b\"");
    }
}
