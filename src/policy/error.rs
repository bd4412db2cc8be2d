//! Rule-loading errors: always the file, the line when one is known, and
//! what is wrong, so `rules check` and startup point at the exact entry.

use std::ops::Range;
use std::path::{Path, PathBuf};

/// A rule file that cannot be used. The proxy refuses to start on one
/// rather than run without a rule it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", place(.file, .line))]
pub struct RuleError {
    pub file: PathBuf,
    /// 1-based line in `file`.
    pub line: Option<usize>,
    pub message: String,
}

impl RuleError {
    /// An error at a byte span of `src` (the text of `file`).
    pub(crate) fn at(
        file: &Path,
        src: &str,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) -> Self {
        RuleError {
            file: file.to_path_buf(),
            line: span.map(|s| line_of(src, s.start)),
            message: message.into(),
        }
    }

    /// An error about a whole file or directory.
    pub(crate) fn file(file: &Path, message: impl Into<String>) -> Self {
        RuleError {
            file: file.to_path_buf(),
            line: None,
            message: message.into(),
        }
    }
}

/// `file:line`, or the file alone when no line is known.
fn place(file: &Path, line: &Option<usize>) -> String {
    match line {
        Some(line) => format!("{}:{line}", file.display()),
        None => file.display().to_string(),
    }
}

/// The 1-based line holding byte `offset` of `src`.
pub(crate) fn line_of(src: &str, offset: usize) -> usize {
    let end = offset.min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_one_based() {
        let src = "a\nbc\nd";
        assert_eq!(line_of(src, 0), 1);
        assert_eq!(line_of(src, 2), 2);
        assert_eq!(line_of(src, 5), 3);
        assert_eq!(line_of(src, 99), 3);
    }

    #[test]
    fn display_names_file_and_line() {
        let e = RuleError::at(Path::new("r/x.toml"), "a\nb", Some(2..3), "bad");
        assert_eq!(e.to_string(), "r/x.toml:2: bad");
        assert_eq!(
            RuleError::file(Path::new("r"), "gone").to_string(),
            "r: gone"
        );
    }
}
