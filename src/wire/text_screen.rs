//! One search of a statement text for every word the proxy's checks look
//! for: the SQL-level command keywords the tracker reads, and the words
//! of the layer above (table names, the proxy's own schema). A text with
//! none of them (almost all traffic) is ordinary, and no check searches
//! it again.

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::{Input, MatchKind};

use super::sql_commands::KEYWORDS;

/// The words, searched for at once, ASCII case-insensitively, by one
/// deterministic automaton built at start: a simple Query's text is new
/// every time, so its search is paid on every message, and a dense DFA
/// takes about half the instructions per byte of a general multi-word
/// search.
pub struct TextScreen {
    /// `None` if the words could not be built into one search: then no
    /// text is ordinary, and every check searches for itself (slower,
    /// never blind).
    words: Option<dense::DFA<Vec<u32>>>,
}

impl std::fmt::Debug for TextScreen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextScreen")
            .field("bytes", &self.words.as_ref().map(|w| w.memory_usage()))
            .finish()
    }
}

impl TextScreen {
    /// A screen for the SQL-level command keywords and `words` (empty
    /// ones are left out: they are in every text).
    pub fn new<'a>(words: impl IntoIterator<Item = &'a str>) -> Self {
        let mut all: Vec<&str> = KEYWORDS.to_vec();
        all.extend(words.into_iter().filter(|w| !w.is_empty()));
        TextScreen {
            words: any_of(&all),
        }
    }

    /// Whether `sql` holds none of the words, in any ASCII case. The words
    /// are ASCII, so a text's bytes as the client sent them (in any
    /// encoding [`super::client_text`] reads) get the verdict its decoded
    /// text gets. A search that cannot finish finds a word.
    pub fn ordinary(&self, sql: &[u8]) -> bool {
        let Some(words) = &self.words else {
            return false;
        };
        let input = Input::new(sql).earliest(true);
        matches!(words.try_search_fwd(&input), Ok(None))
    }
}

/// An automaton matching any of `words` anywhere, ASCII
/// case-insensitively; each word is matched as its text, never as a
/// pattern (non-ASCII letters match as their UTF-8 bytes, unfolded).
fn any_of(words: &[&str]) -> Option<dense::DFA<Vec<u32>>> {
    let literals: Vec<String> = words.iter().map(|w| regex::escape(w)).collect();
    let pattern = format!("(?i-u:{})", literals.join("|"));
    dense::Builder::new()
        .configure(
            dense::Config::new()
                .start_kind(StartKind::Unanchored)
                .match_kind(MatchKind::All),
        )
        .build(&pattern)
        .ok()
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
    fn a_word_of_other_bytes_is_matched_as_its_bytes() {
        let screen = TextScreen::new(["u&", "\\", "a.b", "tâches"]);
        assert!(!screen.ordinary(r#"SELECT U&"d\0061ta""#.as_bytes()));
        assert!(!screen.ordinary(r"SELECT E'\x41'".as_bytes()));
        assert!(!screen.ordinary("SELECT * FROM A.B".as_bytes()));
        assert!(!screen.ordinary("SELECT * FROM tâches".as_bytes()));
        // `.` is no wildcard, and only ASCII letters fold.
        assert!(screen.ordinary("SELECT * FROM a_b".as_bytes()));
        assert!(screen.ordinary("SELECT * FROM TÂCHES".as_bytes()));
        assert!(screen.ordinary("SELECT u & 1".as_bytes()));
    }

    #[test]
    fn a_text_that_is_no_utf8_is_searched_as_bytes() {
        let screen = TextScreen::new(["checkpoints"]);
        assert!(!screen.ordinary(b"SELECT '\xff\xfe' FROM checkpoints"));
        assert!(screen.ordinary(b"SELECT '\xff\xfe' FROM other"));
    }

    #[test]
    fn empty_words_are_left_out() {
        let screen = TextScreen::new(["", "blobs"]);
        assert!(screen.ordinary("SELECT 1".as_bytes()));
        assert!(!screen.ordinary("SELECT * FROM blobs".as_bytes()));
    }
}
