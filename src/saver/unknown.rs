//! Checkpoint traffic the proxy cannot enforce, made loud.
//!
//! A statement that addresses a checkpoint table in a shape no profile
//! knows, or a checkpoint row that does not decode by its statement's
//! layout, passes the proxy without the legs that need it. That must
//! never be silent: each such statement shape is logged once at ERROR
//! (profile, statement, reason, which legs are off for it), every
//! occurrence is counted in a process-wide counter, and the
//! `[enforce] unknown_saver` policy says whether the statement is
//! forwarded (`warn`) or refused (`refuse`).

use crate::log_text::shown;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use serde::Deserialize;

use super::decode_error::DecodeError;

/// What happens to checkpoint traffic the proxy cannot enforce.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownSaverPolicy {
    /// Forward it (logged at ERROR once per shape, counted).
    #[default]
    Warn,
    /// Fail the statement with [`REFUSAL_SQLSTATE`]; nothing of it runs.
    Refuse,
}

/// SQLSTATE of a refused unknown checkpoint statement: feature_not_supported.
pub const REFUSAL_SQLSTATE: &str = "0A000";

/// A checkpoint statement the proxy recognizes by its table but cannot
/// enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unenforced {
    /// What the statement is, as far as it was understood (e.g.
    /// `read_latest`, `insert into checkpoint_writes`, `update`).
    pub statement: String,
    /// Why it cannot be enforced.
    pub reason: String,
    /// The legs that do not apply to it.
    pub legs_off: &'static str,
}

/// Legs off for a checkpoint read whose rows cannot be decoded.
pub const READ_LEGS: &str = "fork filter, consume-once";
/// Legs off for a write whose row cannot be read.
pub const WRITE_LEGS: &str = "validity, consume-once evidence";
/// Legs off for a statement not understood at all.
pub const ALL_LEGS: &str = "fork filter, validity, consume-once";

impl Unenforced {
    /// The message a refused statement fails with.
    pub fn refusal_message(&self, profile: &str) -> String {
        format!(
            "resumeguard: checkpoint statement not recognized ({}, profile {profile}): {}; \
             refused under [enforce] unknown_saver = \"refuse\"",
            self.statement, self.reason
        )
    }
}

/// Caps the remembered shapes, as the classification cache is capped.
const SHAPES_LIMIT: usize = 10_000;

/// The shapes already reported and the count of every occurrence.
#[derive(Debug, Default)]
pub struct UnknownLog {
    reported: Mutex<HashSet<String>>,
    total: AtomicU64,
}

impl UnknownLog {
    /// The log the proxy reports to.
    pub fn global() -> &'static UnknownLog {
        static GLOBAL: OnceLock<UnknownLog> = OnceLock::new();
        GLOBAL.get_or_init(UnknownLog::default)
    }

    /// Counts one occurrence of unenforced checkpoint traffic and logs it
    /// at ERROR if its shape (profile, statement, reason) was not logged
    /// before. Returns whether it logged.
    pub fn report(&self, profile: &str, what: &Unenforced, policy: UnknownSaverPolicy) -> bool {
        self.total.fetch_add(1, Ordering::Relaxed);
        let key = format!("{profile}\u{0}{}\u{0}{}", what.statement, what.reason);
        let first = match self.reported.lock() {
            Ok(mut seen) if seen.len() < SHAPES_LIMIT => seen.insert(key),
            Ok(seen) => !seen.contains(&key),
            // A poisoned set only loses the deduplication.
            Err(_) => true,
        };
        if first {
            let outcome = match policy {
                UnknownSaverPolicy::Warn => "forwarded unchanged",
                UnknownSaverPolicy::Refuse => "refused (unknown_saver = \"refuse\")",
            };
            tracing::error!(
                profile,
                statement = %shown(&what.statement),
                reason = %shown(&what.reason),
                legs_off = what.legs_off,
                "checkpoint traffic not enforced, {outcome}: logged once per statement shape, \
                 every occurrence counted (unknown_total)"
            );
        }
        first
    }

    /// Occurrences of unenforced checkpoint traffic so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// Occurrences of unenforced checkpoint traffic in this process: each
/// time an unrecognized checkpoint statement's text is classified (every
/// Parse, simple Query or SQL PREPARE of it) and each checkpoint row that
/// did not decode.
pub fn unknown_total() -> u64 {
    UnknownLog::global().total()
}

/// The error text without the values that differ from row to row (sizes
/// in dimensions), so one defect is one shape.
pub(crate) fn shape_of_error(error: &DecodeError) -> String {
    match error {
        DecodeError::Field { field, source } => format!("{field}: {}", shape_of_error(source)),
        DecodeError::RowShape {
            column,
            width,
            dims,
        } => {
            format!(
                "{column}: expected rows of {width}, got {} dimension(s) with rows of {}",
                dims.len(),
                dims.last().copied().unwrap_or(0)
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(reason: &str) -> Unenforced {
        Unenforced {
            statement: "read_latest".into(),
            reason: reason.into(),
            legs_off: READ_LEGS,
        }
    }

    #[test]
    fn logs_once_per_shape_and_counts_every_occurrence() {
        let log = UnknownLog::default();
        let a = unknown("pending_writes rows are [task_id, channel]");
        assert!(log.report("p", &a, UnknownSaverPolicy::Warn));
        assert!(!log.report("p", &a, UnknownSaverPolicy::Warn));
        assert!(!log.report("p", &a, UnknownSaverPolicy::Refuse));
        // Another profile or reason is another shape.
        assert!(log.report("q", &a, UnknownSaverPolicy::Warn));
        assert!(log.report("p", &unknown("other"), UnknownSaverPolicy::Warn));
        assert_eq!(log.total(), 5);
    }

    #[test]
    fn row_shapes_differing_only_in_row_count_are_one_shape() {
        let err = |rows| {
            DecodeError::RowShape {
                column: "pending_writes",
                width: 6,
                dims: vec![rows, 4],
            }
            .in_field("pending_writes")
        };
        assert_eq!(shape_of_error(&err(1)), shape_of_error(&err(7)));
        assert_eq!(
            shape_of_error(&err(1)),
            "pending_writes: pending_writes: expected rows of 6, got 2 dimension(s) with rows of 4"
        );
    }

    #[test]
    fn refusal_names_statement_profile_and_reason() {
        let msg = unknown("no layout").refusal_message("langgraph-js");
        assert!(msg.contains("read_latest"), "{msg}");
        assert!(msg.contains("profile langgraph-js"), "{msg}");
        assert!(msg.contains("no layout"), "{msg}");
        assert!(msg.contains("unknown_saver = \"refuse\""), "{msg}");
    }

    #[test]
    fn policy_parses_from_config_words() {
        #[derive(Deserialize)]
        struct C {
            p: UnknownSaverPolicy,
        }
        let c: C = toml::from_str("p = \"refuse\"").unwrap();
        assert_eq!(c.p, UnknownSaverPolicy::Refuse);
        assert!(toml::from_str::<C>("p = \"ignore\"").is_err());
        assert_eq!(UnknownSaverPolicy::default(), UnknownSaverPolicy::Warn);
    }
}
