//! What the approvals console asks of a SQLite trail: one page of one of
//! its lists (interrupts waiting now, answers, refusals, forks served,
//! writes rejected or fenced), newest first, paged by record id (keyset:
//! never more than a page is read), filtered by thread, approver and time
//! window. Each list walks the `(operation, id)` index from the newest
//! record; what decides whether a record belongs (answered since? first
//! answer?) looks only at the same thread's records, by the thread index.

use std::path::Path;

use rusqlite::types::Value as SqlValue;

use super::error::AuditError;
use super::event::AuditEvent;
use super::sqlite_store::{open_read_only, row_to_event_at, select};

/// The console's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleList {
    /// Interrupts parked now: no answer, no later park, no child
    /// checkpoint, the thread not deleted since.
    Waiting,
    /// Each interrupt's first answer since it was parked.
    Answered,
    /// Claims refused (racers, inspections during a run) and late
    /// duplicates.
    Refused,
    Forks,
    Rejected,
    Fenced,
}

impl ConsoleList {
    fn operations(self) -> &'static str {
        match self {
            ConsoleList::Waiting => "'interrupt_parked'",
            ConsoleList::Answered => "'resume_recorded'",
            ConsoleList::Refused => "'claim_refused', 'late_duplicate'",
            ConsoleList::Forks => "'fork_served'",
            ConsoleList::Rejected => "'write_rejected'",
            ConsoleList::Fenced => "'write_fenced'",
        }
    }

    /// What else a record of this list must satisfy (`x` is the record).
    fn condition(self) -> &'static str {
        match self {
            ConsoleList::Waiting => STILL_WAITING,
            ConsoleList::Answered => FIRST_ANSWER,
            _ => "1",
        }
    }
}

/// The same checkpoint of the same thread as `x`.
macro_rules! same_checkpoint {
    ($e:literal) => {
        concat!(
            $e,
            ".thread_id = x.thread_id AND coalesce(",
            $e,
            ".checkpoint_ns, '') = coalesce(x.checkpoint_ns, '') AND ",
            $e,
            ".checkpoint_id = x.checkpoint_id"
        )
    };
}

const STILL_WAITING: &str = concat!(
    "NOT EXISTS (SELECT 1 FROM audit_events e WHERE e.thread_id = x.thread_id AND e.id > x.id \
     AND (e.operation = 'delete_thread' OR (",
    same_checkpoint!("e"),
    " AND e.operation IN ('interrupt_parked', 'resume_recorded', 'claim_consumed')) \
     OR (e.operation = 'checkpoint_put' AND coalesce(e.checkpoint_ns, '') = \
     coalesce(x.checkpoint_ns, '') AND e.parent_checkpoint_id = x.checkpoint_id)))"
);

/// The id of the latest park of `x`'s checkpoint before `x`.
macro_rules! parked_before {
    () => {
        concat!(
            "(SELECT max(p.id) FROM audit_events p WHERE ",
            same_checkpoint!("p"),
            " AND p.operation = 'interrupt_parked' AND p.id < x.id)"
        )
    };
}

const FIRST_ANSWER: &str = concat!(
    "NOT EXISTS (SELECT 1 FROM audit_events e WHERE ",
    same_checkpoint!("e"),
    " AND e.operation = 'resume_recorded' AND e.id < x.id AND e.id > coalesce(",
    parked_before!(),
    ", 0))"
);

/// When `x`'s checkpoint was last parked before `x`.
const PARKED_AT: &str = concat!(
    "(SELECT p2.time FROM audit_events p2 WHERE p2.id = ",
    parked_before!(),
    ")"
);

/// The approver an answer names, or else the one its resumed run's next
/// checkpoint names (as `approver::attribute` does), as JSON text.
const APPROVER: &str = "coalesce(json_extract(x.detail, '$.approver'), \
     (SELECT json_extract(c.detail, '$.approver') FROM audit_events c \
      WHERE c.thread_id = x.thread_id AND c.operation = 'checkpoint_put' \
      AND coalesce(c.checkpoint_ns, '') = coalesce(x.checkpoint_ns, '') \
      AND c.parent_checkpoint_id = x.checkpoint_id AND c.id > x.id ORDER BY c.id LIMIT 1))";

/// Which page of a list to read.
#[derive(Debug, Clone, Default)]
pub struct ConsoleFilter {
    pub thread: Option<String>,
    /// Part of the approver's JSON (case-insensitive): answers only.
    pub approver: Option<String>,
    /// RFC 3339 bounds, inclusive, as the trail stores times.
    pub since: Option<String>,
    pub until: Option<String>,
    /// Records older than this id (the previous page's last).
    pub before_id: Option<i64>,
    pub limit: usize,
}

/// One record of a list, with what the console shows beside it.
#[derive(Debug, Clone)]
pub struct ListedEvent {
    pub id: i64,
    pub event: AuditEvent,
    /// Answers: the approver named (JSON text).
    pub approver: Option<String>,
    /// Answers: when the interrupt answered was parked.
    pub parked_at: Option<String>,
}

/// One page of `list`, newest first.
pub fn console_list(
    path: &Path,
    list: ConsoleList,
    filter: &ConsoleFilter,
) -> Result<Vec<ListedEvent>, AuditError> {
    let conn = open_read_only(path)?;
    let answered = list == ConsoleList::Answered;
    let extra = if answered {
        format!("{APPROVER}, {PARKED_AT}")
    } else {
        "NULL, NULL".to_owned()
    };
    // The record is `x`; the columns it is read from name no table, so
    // they are x's (the subqueries name theirs).
    let select = select(&conn)?
        .replace("FROM audit_events", "FROM audit_events x")
        .replacen("SELECT ", &format!("SELECT x.id, {extra}, "), 1);
    // The search's terms first: cheaper than the list's condition, which
    // looks at the thread's other records.
    let mut sql = format!("{select} WHERE x.operation IN ({})", list.operations());
    let mut params: Vec<SqlValue> = Vec::new();
    let mut bind = |sql: &mut String, clause: &str, v: SqlValue| {
        params.push(v);
        sql.push_str(&clause.replace('?', &format!("?{}", params.len())));
    };
    if let Some(t) = &filter.thread {
        bind(&mut sql, " AND x.thread_id = ?", SqlValue::Text(t.clone()));
    }
    if let Some(s) = &filter.since {
        bind(&mut sql, " AND x.time >= ?", SqlValue::Text(s.clone()));
    }
    if let Some(u) = &filter.until {
        bind(&mut sql, " AND x.time <= ?", SqlValue::Text(u.clone()));
    }
    if let Some(b) = filter.before_id {
        bind(&mut sql, " AND x.id < ?", SqlValue::Integer(b));
    }
    if let (true, Some(a)) = (answered, &filter.approver) {
        let clause = format!(" AND instr(lower({APPROVER}), lower(?)) > 0");
        bind(&mut sql, &clause, SqlValue::Text(a.clone()));
    }
    sql.push_str(&format!(" AND {}", list.condition()));
    let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
    bind(
        &mut sql,
        " ORDER BY x.id DESC LIMIT ?",
        SqlValue::Integer(limit),
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(ListedEvent {
            id: r.get(0)?,
            approver: r.get(1)?,
            parked_at: r.get(2)?,
            event: row_to_event_at(r, 3)??,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::audit::event::{Operation, SessionContext};
    use crate::audit::sqlite_store::Store;
    use crate::audit::test_util::{remove_db, temp_path};

    fn ev(op: Operation, thread: &str, ckpt: &str) -> AuditEvent {
        AuditEvent::new(&SessionContext::default(), op)
            .with_thread(thread)
            .with_checkpoint("", ckpt)
    }

    fn threads(path: &Path, list: ConsoleList, f: &ConsoleFilter) -> Vec<String> {
        console_list(path, list, f)
            .unwrap()
            .into_iter()
            .map(|l| l.event.thread_id.unwrap_or_default())
            .collect()
    }

    #[test]
    fn waiting_lists_parks_not_answered_superseded_or_deleted() {
        let path = temp_path("console", "sqlite");
        let mut store = Store::open(&path).unwrap();
        let mut child = ev(Operation::CheckpointPut, "superseded", "c2");
        child.parent_checkpoint_id = Some("c1".into());
        let mut answered_child = ev(Operation::CheckpointPut, "answered", "c2");
        answered_child.parent_checkpoint_id = Some("c1".into());
        answered_child.detail = json!({"approver": {"user_id": "alice"}});
        let events = [
            ev(Operation::InterruptParked, "waiting", "c1"),
            ev(Operation::InterruptParked, "answered", "c1"),
            ev(Operation::InterruptParked, "superseded", "c1"),
            ev(Operation::InterruptParked, "deleted", "c1"),
            ev(Operation::InterruptParked, "waiting", "c1"),
            ev(Operation::ResumeRecorded, "answered", "c1"),
            ev(Operation::ResumeRecorded, "answered", "c1"),
            answered_child,
            child,
            ev(Operation::DeleteThread, "deleted", ""),
            ev(Operation::ClaimRefused, "answered", "c1"),
        ];
        store.append(events.iter()).unwrap();
        let all = ConsoleFilter {
            limit: 10,
            ..ConsoleFilter::default()
        };
        // One row per checkpoint: the newest park.
        assert_eq!(threads(&path, ConsoleList::Waiting, &all), ["waiting"]);
        let answers = console_list(&path, ConsoleList::Answered, &all).unwrap();
        assert_eq!(answers.len(), 1, "the first answer only");
        assert_eq!(
            answers[0].approver.as_deref(),
            Some(r#"{"user_id":"alice"}"#)
        );
        assert!(answers[0].parked_at.is_some());
        let bob = ConsoleFilter {
            approver: Some("BOB".into()),
            ..all.clone()
        };
        assert!(threads(&path, ConsoleList::Answered, &bob).is_empty());
        let alice = ConsoleFilter {
            approver: Some("Alic".into()),
            ..all.clone()
        };
        assert_eq!(threads(&path, ConsoleList::Answered, &alice), ["answered"]);
        assert_eq!(threads(&path, ConsoleList::Refused, &all), ["answered"]);
        remove_db(&path);
    }

    #[test]
    fn pages_follow_one_another_by_id() {
        let path = temp_path("console-pages", "sqlite");
        let mut store = Store::open(&path).unwrap();
        let events: Vec<_> = (0..5)
            .map(|i| ev(Operation::ForkServed, &format!("t{i}"), "c"))
            .collect();
        store.append(events.iter()).unwrap();
        let first = ConsoleFilter {
            limit: 2,
            ..ConsoleFilter::default()
        };
        let page = console_list(&path, ConsoleList::Forks, &first).unwrap();
        assert_eq!(page.len(), 2);
        let next = ConsoleFilter {
            before_id: page.last().map(|l| l.id),
            ..first.clone()
        };
        assert_eq!(threads(&path, ConsoleList::Forks, &next), ["t2", "t1"]);
        let one = ConsoleFilter {
            thread: Some("t0".into()),
            ..first
        };
        assert_eq!(threads(&path, ConsoleList::Forks, &one), ["t0"]);
        remove_db(&path);
    }
}
