//! A run of failures of one use of the claim store, as its log tells it:
//! the guard never stops guarding silently, and a store down for an hour
//! must not write an ERROR per write. The first failure of a run is news,
//! so is a failure whose cause (its error's text) differs from the one
//! before; the rest of the run is not; the first success after a run ends
//! it.

use std::fmt::Display;
use std::sync::{Mutex, PoisonError};

/// Whether the store is failing this use now, and why it failed last.
#[derive(Debug, Default)]
pub struct FailureStreak {
    /// The text of the last failure's error, while failures run.
    cause: Mutex<Option<String>>,
}

/// What one failure is to its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The first of a run: the use worked before.
    Began,
    /// A failure for another cause than the one before it.
    CauseChanged,
    /// Another failure for the same cause.
    Continues,
}

impl FailureStreak {
    /// Records a failure; what it is to the run.
    pub fn failed(&self, error: &impl Display) -> Failure {
        let text = error.to_string();
        let mut cause = self.cause.lock().unwrap_or_else(PoisonError::into_inner);
        let failure = match cause.as_deref() {
            None => Failure::Began,
            Some(before) if before == text => Failure::Continues,
            Some(_) => Failure::CauseChanged,
        };
        *cause = Some(text);
        failure
    }

    /// Records a success; whether it ended a run of failures.
    pub fn succeeded(&self) -> bool {
        let mut cause = self.cause.lock().unwrap_or_else(PoisonError::into_inner);
        cause.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_begins_changes_cause_and_ends_once() {
        let streak = FailureStreak::default();
        assert!(!streak.succeeded(), "no run yet");
        assert_eq!(streak.failed(&"refused"), Failure::Began);
        assert_eq!(streak.failed(&"refused"), Failure::Continues);
        assert_eq!(streak.failed(&"timed out"), Failure::CauseChanged);
        assert_eq!(streak.failed(&"timed out"), Failure::Continues);
        assert!(streak.succeeded(), "the success ends the run");
        assert!(!streak.succeeded(), "once");
        assert_eq!(streak.failed(&"timed out"), Failure::Began);
    }
}
