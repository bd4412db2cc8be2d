//! One search of a statement text for every word the proxy's checks look
//! for: the SQL-level command keywords the tracker reads, and the words
//! of the layer above (table names, the proxy's own schema). A text with
//! none of them (almost all traffic) is ordinary, and no check searches
//! it again.

use aho_corasick::AhoCorasick;

use super::sql_commands::KEYWORDS;

/// The words, searched for at once, ASCII case-insensitively.
pub struct TextScreen {
    /// `None` if the words could not be built into one search: then no
    /// text is ordinary, and every check searches for itself (slower,
    /// never blind).
    words: Option<AhoCorasick>,
}

impl std::fmt::Debug for TextScreen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextScreen")
            .field("words", &self.words.as_ref().map(|w| w.patterns_len()))
            .finish()
    }
}

impl TextScreen {
    /// A screen for the SQL-level command keywords and `words` (empty
    /// ones are left out: they are in every text).
    pub fn new<'a>(words: impl IntoIterator<Item = &'a str>) -> Self {
        let mut all: Vec<&str> = KEYWORDS.to_vec();
        all.extend(words.into_iter().filter(|w| !w.is_empty()));
        let words = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(&all)
            .ok();
        TextScreen { words }
    }

    /// Whether `sql` holds none of the words, in any ASCII case. The words
    /// are ASCII, so a text's bytes as the client sent them (in any
    /// encoding [`super::client_text`] reads) get the verdict its decoded
    /// text gets.
    pub fn ordinary(&self, sql: &[u8]) -> bool {
        self.words.as_ref().is_some_and(|w| !w.is_match(sql))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_without_the_words_is_ordinary() {
        let screen = TextScreen::new(["checkpoints", "resumeguard"]);
        assert!(screen.ordinary("SELECT abalance FROM pgbench_accounts WHERE aid = 7".as_bytes()));
        assert!(screen.ordinary("".as_bytes()));
        assert!(!screen.ordinary("select * from CheckPoints".as_bytes()));
        assert!(!screen.ordinary("SELECT * FROM ResumeGuard.claims".as_bytes()));
    }

    #[test]
    fn the_command_keywords_are_always_among_the_words() {
        let screen = TextScreen::new([]);
        for keyword in KEYWORDS {
            let upper = keyword.to_ascii_uppercase();
            assert!(
                !screen.ordinary(format!("{upper} s").as_bytes()),
                "{keyword}"
            );
        }
        assert!(!screen.ordinary("/* x */ prepare q AS SELECT 1".as_bytes()));
        assert!(screen.ordinary("SELECT 1".as_bytes()));
    }

    #[test]
    fn empty_words_are_left_out() {
        let screen = TextScreen::new(["", "blobs"]);
        assert!(screen.ordinary("SELECT 1".as_bytes()));
        assert!(!screen.ordinary("SELECT * FROM blobs".as_bytes()));
    }
}
