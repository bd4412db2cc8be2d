//! What `resumeguard audit` asks of the trail besides one thread's story:
//! which threads it holds (with their last activity), and which of a
//! thread's events fall in a time window or are of given operations.

use std::path::Path;
use std::time::SystemTime;

use serde::Serialize;

use super::before::parse_instant;
use super::error::{AuditError, FilterError};
use super::sqlite_store::open_read_only;
use crate::audit_event::{AuditEvent, Operation};
use crate::log_text::escaped;
use crate::timestamp::format_rfc3339_millis;

/// Which events to keep: a time window (inclusive, RFC 3339 strings as
/// the trail stores them) and a set of operations (empty: all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub since: Option<String>,
    pub until: Option<String>,
    pub ops: Vec<Operation>,
}

impl EventFilter {
    /// From the command's `--since`, `--until` (RFC 3339 UTC times or ages
    /// such as `2h`) and `--op` names.
    pub fn parse(
        since: Option<&str>,
        until: Option<&str>,
        ops: &[String],
        now: SystemTime,
    ) -> Result<EventFilter, FilterError> {
        let at = |flag: &str, spec: Option<&str>| -> Result<Option<String>, FilterError> {
            spec.map(|s| parse_instant(flag, s, now).map(format_rfc3339_millis))
                .transpose()
        };
        let ops = ops
            .iter()
            .map(|name| {
                Operation::parse(name.trim())
                    .ok_or_else(|| FilterError::UnknownOperation { name: name.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let filter = EventFilter {
            since: at("--since", since)?,
            until: at("--until", until)?,
            ops,
        };
        if let (Some(s), Some(u)) = (&filter.since, &filter.until) {
            if s > u {
                return Err(FilterError::EmptyWindow {
                    since: s.clone(),
                    until: u.clone(),
                });
            }
        }
        Ok(filter)
    }

    pub fn is_empty(&self) -> bool {
        *self == EventFilter::default()
    }

    pub fn keeps(&self, ev: &AuditEvent) -> bool {
        self.in_window(&ev.time) && (self.ops.is_empty() || self.ops.contains(&ev.operation))
    }

    fn in_window(&self, time: &str) -> bool {
        self.since.as_deref().is_none_or(|s| time >= s)
            && self.until.as_deref().is_none_or(|u| time <= u)
    }
}

/// One thread of the trail, for `audit --threads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadSummary {
    pub thread_id: String,
    pub events: u64,
    pub first: String,
    pub last: String,
    pub last_operation: String,
}

/// The threads with events in the filter's window (and of its operations),
/// the most recently active first. Reads the whole table: an operator's
/// question, not a hot path.
pub fn threads(path: &Path, filter: &EventFilter) -> Result<Vec<ThreadSummary>, AuditError> {
    let conn = open_read_only(path)?;
    let mut stmt = conn.prepare(
        "SELECT thread_id, time, operation FROM audit_events \
         WHERE thread_id IS NOT NULL ORDER BY id",
    )?;
    let mut out: Vec<ThreadSummary> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let (thread, time, op): (String, String, String) = (row.get(0)?, row.get(1)?, row.get(2)?);
        if !filter.in_window(&time)
            || !(filter.ops.is_empty()
                || Operation::parse(&op).is_some_and(|o| filter.ops.contains(&o)))
        {
            continue;
        }
        let i = *index.entry(thread.clone()).or_insert_with(|| {
            out.push(ThreadSummary {
                thread_id: thread,
                events: 0,
                first: time.clone(),
                last: String::new(),
                last_operation: String::new(),
            });
            out.len() - 1
        });
        let t = &mut out[i];
        t.events += 1;
        t.last = time;
        t.last_operation = op;
    }
    out.sort_by(|a, b| b.last.cmp(&a.last));
    Ok(out)
}

/// `last activity  events  thread  last operation`, one line a thread.
pub fn render_threads(threads: &[ThreadSummary]) -> String {
    let mut out = String::new();
    for t in threads {
        // Escaped whole: the thread id is a client's (see `timeline`).
        let line = format!(
            "{}  {:>6}  {}  (last: {}; first {})",
            t.last, t.events, t.thread_id, t.last_operation, t.first
        );
        out.push_str(&format!("{}\n", escaped(&line)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::sqlite_store::Store;
    use crate::audit::test_util::{remove_db, temp_path};
    use crate::audit_event::SessionContext;

    fn at(time: &str, op: Operation, thread: &str) -> AuditEvent {
        let mut e = AuditEvent::new(&SessionContext::default(), op).with_thread(thread);
        e.time = time.into();
        e
    }

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-11-30T12:00:00Z").unwrap()
    }

    #[test]
    fn filters_by_window_and_operation() {
        let f = EventFilter::parse(
            Some("2026-11-30T10:00:00Z"),
            Some("1h"),
            &["resume_recorded".into(), " claim_consumed".into()],
            now(),
        )
        .unwrap();
        assert_eq!(f.since.as_deref(), Some("2026-11-30T10:00:00.000Z"));
        assert_eq!(f.until.as_deref(), Some("2026-11-30T11:00:00.000Z"));
        assert!(f.keeps(&at(
            "2026-11-30T10:00:00.000Z",
            Operation::ResumeRecorded,
            "t"
        )));
        assert!(f.keeps(&at(
            "2026-11-30T11:00:00.000Z",
            Operation::ClaimConsumed,
            "t"
        )));
        assert!(!f.keeps(&at(
            "2026-11-30T11:00:00.001Z",
            Operation::ClaimConsumed,
            "t"
        )));
        assert!(!f.keeps(&at(
            "2026-11-30T09:59:59.999Z",
            Operation::ResumeRecorded,
            "t"
        )));
        assert!(!f.keeps(&at(
            "2026-11-30T10:30:00.000Z",
            Operation::CheckpointPut,
            "t"
        )));
        assert!(EventFilter::parse(None, None, &[], now())
            .unwrap()
            .is_empty());
        let bad = EventFilter::parse(None, None, &["resume".into()], now()).unwrap_err();
        assert!(format!("{bad:#}").contains("resume_recorded"), "{bad:#}");
        assert!(EventFilter::parse(Some("1h"), Some("2h"), &[], now()).is_err());
        assert!(EventFilter::parse(Some("yesterday"), None, &[], now()).is_err());
    }

    #[test]
    fn a_lapse_is_no_operation_of_its_own() {
        // The proxy learns of a lapse only when a reader takes the claim
        // over: `claim_takeover` names the lapsed holder and the reason.
        let unknown = EventFilter::parse(None, None, &["claim_lapsed".into()], now()).unwrap_err();
        let listed = format!("{unknown:#}");
        assert!(listed.contains("claim_takeover"), "{listed}");
        assert!(!listed.contains("claim_lapsed,"), "{listed}");
    }

    #[test]
    fn lists_threads_most_recent_first() {
        let path = temp_path("threads", "sqlite");
        let mut store = Store::open(&path).unwrap();
        let events = [
            at("2026-11-30T09:00:00.000Z", Operation::CheckpointPut, "a"),
            at("2026-11-30T10:00:00.000Z", Operation::InterruptParked, "b"),
            at("2026-11-30T11:00:00.000Z", Operation::ResumeRecorded, "a"),
        ];
        store.append(events.iter()).unwrap();
        let all = threads(&path, &EventFilter::default()).unwrap();
        assert_eq!(
            all.iter()
                .map(|t| (t.thread_id.as_str(), t.events, t.last_operation.as_str()))
                .collect::<Vec<_>>(),
            [("a", 2, "resume_recorded"), ("b", 1, "interrupt_parked")]
        );
        assert_eq!(all[0].first, "2026-11-30T09:00:00.000Z");
        assert_eq!(all[0].last, "2026-11-30T11:00:00.000Z");
        let text = render_threads(&all);
        assert!(
            text.starts_with("2026-11-30T11:00:00.000Z       2  a  (last: resume_recorded"),
            "{text}"
        );
        let forged = ThreadSummary {
            thread_id: "x\n2026-11-30T12:00:00.000Z       9  forged\x1b[0m".into(),
            ..all[0].clone()
        };
        let text = render_threads(&[forged]);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("x\\n2026-11-30T12:00:00.000Z       9  forged\\u{1b}[0m"),
            "{text}"
        );
        let early = EventFilter::parse(None, Some("2026-11-30T10:30:00Z"), &[], now()).unwrap();
        let listed = threads(&path, &early).unwrap();
        assert_eq!(listed[0].thread_id, "b");
        assert_eq!((listed[1].thread_id.as_str(), listed[1].events), ("a", 1));
        remove_db(&path);
    }
}
