//! The last SQL text a check found plain, with what it found, for checks
//! that are functions of the text alone (under one rule set): a client
//! that sends the same text again, as an unnamed Parse in every round
//! (psycopg, node-postgres, pgbench -M extended), is not scanned again.

/// Texts longer than this are not kept: a session holds at most this
/// much, and a text this long is rarely sent twice in a row.
const KEEP_TEXT_MAX: usize = 4 * 1024;

/// One remembered text and what the check found in it.
#[derive(Debug)]
pub struct LastText<T> {
    text: Vec<u8>,
    /// `None` while no text is remembered.
    found: Option<T>,
}

impl<T> Default for LastText<T> {
    fn default() -> Self {
        LastText {
            text: Vec::new(),
            found: None,
        }
    }
}

impl<T: Clone> LastText<T> {
    /// What the check found in `text`, if `text` is the one remembered
    /// (the same bytes, whether read as a `str` or as the client sent them).
    pub fn get(&self, text: &(impl AsRef<[u8]> + ?Sized)) -> Option<T> {
        let text = text.as_ref();
        self.found.as_ref().filter(|_| self.text == text).cloned()
    }

    /// Remembers `text` (in place of the last one) and what was found in
    /// it; a text above [`KEEP_TEXT_MAX`] is not kept, and nothing is
    /// remembered then.
    pub fn remember(&mut self, text: &(impl AsRef<[u8]> + ?Sized), found: T) {
        let text = text.as_ref();
        self.text.clear();
        if text.len() > KEEP_TEXT_MAX {
            self.found = None;
            return;
        }
        self.text.extend_from_slice(text);
        self.found = Some(found);
    }

    /// Remembers nothing (the check itself changed).
    pub fn forget(&mut self) {
        self.found = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_text_is_known() {
        let mut last = LastText::default();
        assert_eq!(last.get(""), None);
        last.remember("SELECT 1", 1);
        assert_eq!(last.get("SELECT 1"), Some(1));
        assert_eq!(last.get("SELECT 2"), None);
        assert_eq!(last.get("select 1"), None);
        assert_eq!(last.get(&b"SELECT 1"[..]), Some(1), "the same bytes");
        last.remember("SELECT 2", 2);
        assert_eq!(last.get("SELECT 1"), None);
        assert_eq!(last.get("SELECT 2"), Some(2));
        last.forget();
        assert_eq!(last.get("SELECT 2"), None);
    }

    #[test]
    fn a_long_text_is_not_kept_and_forgets_the_last() {
        let mut last = LastText::default();
        last.remember("SELECT 1", ());
        let long = "x".repeat(KEEP_TEXT_MAX + 1);
        last.remember(&long, ());
        assert_eq!(last.get(&long), None);
        assert_eq!(last.get("SELECT 1"), None);
        assert_eq!(last.get(""), None);
    }
}
