//! An error and its causes on one line, `what failed: why: root cause`.
//!
//! The library's typed errors keep each cause as a `source()` and say only
//! their own part in `Display`, so where the library itself shows an error
//! (a log line, an admin answer, a gap record) it walks the chain here; the
//! binary prints the same text through anyhow's `{:#}`.

use std::error::Error;
use std::fmt;

/// `error` with every cause after it, joined by `": "`.
pub fn chain<'a>(error: &'a (dyn Error + 'static)) -> Chain<'a> {
    Chain(error)
}

/// Displays an error and its causes; see [`chain`].
pub struct Chain<'a>(&'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("opening the trail")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_follows_the_error() {
        let e = Outer(std::io::Error::other("disk full"));
        assert_eq!(e.to_string(), "opening the trail");
        assert_eq!(chain(&e).to_string(), "opening the trail: disk full");
    }
}
