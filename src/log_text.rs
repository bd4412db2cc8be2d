//! Client-derived text as it may appear in the proxy's log: escaped (a
//! newline cannot forge a log line, a NUL cannot make the log binary) and
//! cut to a bounded length (a 1 MB thread id is not a 1 MB line).

use std::fmt;

/// Characters of client text a log line keeps.
pub const LOG_TEXT_MAX: usize = 200;

/// `text` for a log line: control characters and quotes escaped as Rust
/// escapes them, at most [`LOG_TEXT_MAX`] characters, then `…(N bytes)`.
pub fn shown(text: &str) -> Shown<'_> {
    Shown(text)
}

/// Displays its text escaped and cut; see [`shown`].
pub struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.char_indices();
        for (_, c) in chars.by_ref().take(LOG_TEXT_MAX) {
            write!(f, "{}", c.escape_debug())?;
        }
        if chars.next().is_some() {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
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
    }
}
