//! What one output of the trail has lost and not yet said so in itself.
//!
//! Events are lost when the queue is full (the producer could not hand
//! them over) or when an output keeps failing to write them. Each output
//! keeps a ledger of its own losses until it can write an `events_dropped`
//! gap record saying how many, why, and over which time window.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::audit_event::{AuditEvent, Operation, SessionContext};
use crate::timestamp::format_rfc3339_millis;

/// Why events were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// The queue in front of the writer was full.
    QueueFull,
    /// The output failed every attempt to write them.
    WriteFailed,
}

/// Losses of one output since its last gap record.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LossLedger {
    queue_full: u64,
    write_failed: u64,
    /// RFC 3339 times of the earliest and latest lost event.
    first_lost: Option<String>,
    last_lost: Option<String>,
    /// The latest write error, for `write_failed` losses.
    error: Option<String>,
}

impl LossLedger {
    /// Count `n` events lost for `reason`, lost between `first` and `last`
    /// (RFC 3339 strings, which order as the times they name).
    pub fn add(&mut self, reason: LossReason, n: u64, first: &str, last: &str) {
        if n == 0 {
            return;
        }
        match reason {
            LossReason::QueueFull => self.queue_full += n,
            LossReason::WriteFailed => self.write_failed += n,
        }
        if self.first_lost.as_deref().is_none_or(|f| first < f) {
            self.first_lost = Some(first.to_owned());
        }
        if self.last_lost.as_deref().is_none_or(|l| last > l) {
            self.last_lost = Some(last.to_owned());
        }
    }

    /// Remember the error that made events fail.
    pub fn note_error(&mut self, error: &str) {
        self.error = Some(error.to_owned());
    }

    /// Events lost and not yet recorded.
    pub fn count(&self) -> u64 {
        self.queue_full + self.write_failed
    }

    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// `queue_full`, `write_failed`, or both joined by `+`.
    pub fn reason(&self) -> &'static str {
        match (self.queue_full > 0, self.write_failed > 0) {
            (true, true) => "queue_full+write_failed",
            (true, false) => "queue_full",
            _ => "write_failed",
        }
    }

    pub fn first_lost(&self) -> &str {
        self.first_lost.as_deref().unwrap_or_default()
    }

    pub fn last_lost(&self) -> &str {
        self.last_lost.as_deref().unwrap_or_default()
    }

    /// The `events_dropped` record for these losses.
    pub fn gap_record(&self) -> AuditEvent {
        let mut detail = serde_json::json!({
            "dropped": self.count(),
            "reason": self.reason(),
            "queue_full": self.queue_full,
            "write_failed": self.write_failed,
            "first_lost": self.first_lost(),
            "last_lost": self.last_lost(),
        });
        if let (Some(error), true) = (&self.error, self.write_failed > 0) {
            detail["error"] = serde_json::Value::String(error.clone());
        }
        AuditEvent::new(&SessionContext::internal(), Operation::EventsDropped).with_detail(detail)
    }
}

/// RFC 3339 time of a millisecond timestamp since the epoch.
pub fn millis_to_rfc3339(ms: u64) -> String {
    format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms))
}

/// Milliseconds since the epoch now (0 if the clock is before 1970).
pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reasons_and_widens_the_window() {
        let mut ledger = LossLedger::default();
        assert!(ledger.is_empty());
        ledger.add(LossReason::QueueFull, 0, "2030-01-01T00:00:00.000Z", "x");
        assert!(ledger.is_empty(), "nothing lost, nothing counted");
        ledger.add(
            LossReason::WriteFailed,
            3,
            "2026-01-01T00:00:02.000Z",
            "2026-01-01T00:00:03.000Z",
        );
        ledger.note_error("database or disk is full");
        ledger.add(
            LossReason::QueueFull,
            2,
            "2026-01-01T00:00:01.000Z",
            "2026-01-01T00:00:02.500Z",
        );
        assert_eq!(ledger.count(), 5);
        let gap = ledger.gap_record();
        assert_eq!(gap.operation, Operation::EventsDropped);
        assert_eq!(gap.application_name, "resumeguard");
        assert_eq!(
            gap.detail,
            serde_json::json!({
                "dropped": 5,
                "reason": "queue_full+write_failed",
                "queue_full": 2,
                "write_failed": 3,
                "first_lost": "2026-01-01T00:00:01.000Z",
                "last_lost": "2026-01-01T00:00:03.000Z",
                "error": "database or disk is full",
            })
        );
    }

    #[test]
    fn queue_only_losses_carry_no_error() {
        let mut ledger = LossLedger::default();
        ledger.note_error("stale");
        ledger.add(LossReason::QueueFull, 1, "a", "b");
        let detail = ledger.gap_record().detail;
        assert_eq!(detail["reason"], "queue_full");
        assert!(detail.get("error").is_none());
        assert_eq!(millis_to_rfc3339(1_000), "1970-01-01T00:00:01.000Z");
    }
}
