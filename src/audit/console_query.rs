//! What the approvals console asks of the trail: one page of one of its
//! lists (interrupts waiting now, answers, refusals, forks served, writes
//! rejected or fenced), newest first, paged by record id (keyset: never
//! more than a page is read), filtered by thread, approver and time
//! window (on the replica's clock in its SQLite file, on the database's in
//! the PostgreSQL table every replica writes); of either, in the same SQL
//! spelled for each. Each list walks the records of its operations from
//! the newest; what decides whether a record belongs (answered since? the
//! first answer?) looks only at the same thread's records, by the thread
//! index.

use std::path::Path;

use postgres::types::ToSql;
use rusqlite::types::Value as SqlValue;

use super::error::AuditError;
use super::postgres_store;
use super::sqlite_store::{open_read_only, row_to_event_at, select};
use crate::audit_event::AuditEvent;
use crate::pg::PgTarget;

/// The console's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleList {
    /// Interrupts parked now: no answer, no later park, no child
    /// checkpoint, the thread not deleted since.
    Waiting,
    /// Each interrupt's first answer since it was parked.
    Answered,
    /// Claims refused (racers, inspections during a run), late
    /// duplicates, and client statements refused before they ran.
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
            ConsoleList::Refused => "'claim_refused', 'late_duplicate', 'statement_refused'",
            ConsoleList::Forks => "'fork_served'",
            ConsoleList::Rejected => "'write_rejected'",
            ConsoleList::Fenced => "'write_fenced'",
        }
    }
}

/// How a store spells what the lists ask.
struct Dialect {
    /// The table, as the subqueries name it.
    table: String,
    /// The approver JSON (as text) of the record aliased `r`.
    approver_of: fn(&str) -> String,
    /// The time column `c` as the trail's RFC 3339 text.
    time_text: fn(&str) -> String,
    /// The placeholder of the `n`th bound value.
    param: fn(usize) -> String,
    /// The placeholder of the `n`th bound value, a time to compare with
    /// the time column.
    time_param: fn(usize) -> String,
    /// The time the window compares, of the record `x`.
    window_time: &'static str,
    /// The function giving the position of its second text in its first.
    find: &'static str,
}

impl Dialect {
    fn sqlite() -> Dialect {
        Dialect {
            table: "audit_events".to_owned(),
            approver_of: |r| format!("json_extract({r}.detail, '$.approver')"),
            time_text: |c| c.to_owned(),
            param: |n| format!("?{n}"),
            time_param: |n| format!("?{n}"),
            window_time: "x.time",
            find: "instr",
        }
    }

    fn postgres(schema: &str) -> Dialect {
        Dialect {
            table: format!("{schema}.audit_events"),
            approver_of: |r| format!("({r}.detail -> 'approver')::text"),
            time_text: |c| {
                format!("to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
            },
            param: |n| format!("${n}"),
            time_param: |n| format!("${n}::text::timestamptz"),
            // Every replica writes the table: on the database's clock (the
            // statement's only table is `x`'s).
            window_time: postgres_store::DB_CLOCK_TIME,
            find: "strpos",
        }
    }

    /// Record `e` is of the same checkpoint of the same thread as `x`.
    fn same_checkpoint(e: &str) -> String {
        format!(
            "{e}.thread_id = x.thread_id AND coalesce({e}.checkpoint_ns, '') = \
             coalesce(x.checkpoint_ns, '') AND {e}.checkpoint_id = x.checkpoint_id"
        )
    }

    /// No answer, later park, child checkpoint or deletion since `x`.
    fn still_waiting(&self) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM {t} e WHERE e.thread_id = x.thread_id AND e.id > x.id \
             AND (e.operation = 'delete_thread' OR ({same} AND e.operation IN \
             ('interrupt_parked', 'resume_recorded', 'claim_consumed')) \
             OR (e.operation = 'checkpoint_put' AND coalesce(e.checkpoint_ns, '') = \
             coalesce(x.checkpoint_ns, '') AND e.parent_checkpoint_id = x.checkpoint_id)))",
            t = self.table,
            same = Dialect::same_checkpoint("e"),
        )
    }

    /// The id of the latest park of `x`'s checkpoint before `x`.
    fn parked_before(&self) -> String {
        format!(
            "(SELECT max(p.id) FROM {t} p WHERE {same} AND p.operation = 'interrupt_parked' \
             AND p.id < x.id)",
            t = self.table,
            same = Dialect::same_checkpoint("p"),
        )
    }

    /// No answer of `x`'s checkpoint between its park and `x`.
    fn first_answer(&self) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM {t} e WHERE {same} AND e.operation = 'resume_recorded' \
             AND e.id < x.id AND e.id > coalesce({parked}, 0))",
            t = self.table,
            same = Dialect::same_checkpoint("e"),
            parked = self.parked_before(),
        )
    }

    /// The approver an answer names, or else the one its resumed run's
    /// next checkpoint names (as `approver::attribute` does).
    fn approver(&self) -> String {
        format!(
            "coalesce({own}, (SELECT {child} FROM {t} c WHERE c.thread_id = x.thread_id \
             AND c.operation = 'checkpoint_put' AND coalesce(c.checkpoint_ns, '') = \
             coalesce(x.checkpoint_ns, '') AND c.parent_checkpoint_id = x.checkpoint_id \
             AND c.id > x.id ORDER BY c.id LIMIT 1))",
            own = (self.approver_of)("x"),
            child = (self.approver_of)("c"),
            t = self.table,
        )
    }

    /// When `x`'s checkpoint was last parked before `x`.
    fn parked_at(&self) -> String {
        format!(
            "(SELECT {time} FROM {t} p2 WHERE p2.id = {parked})",
            time = (self.time_text)("p2.time"),
            t = self.table,
            parked = self.parked_before(),
        )
    }

    /// What else a record of `list` must satisfy.
    fn condition(&self, list: ConsoleList) -> String {
        match list {
            ConsoleList::Waiting => self.still_waiting(),
            ConsoleList::Answered => self.first_answer(),
            _ => "1 = 1".to_owned(),
        }
    }

    /// The statement of a page of `list` and its bound values, from the
    /// store's own select of an event's columns (its table aliased `x`).
    fn page(
        &self,
        select: &str,
        list: ConsoleList,
        filter: &ConsoleFilter,
    ) -> (String, Vec<Bound>) {
        let extra = if list == ConsoleList::Answered {
            format!("{}, {}", self.approver(), self.parked_at())
        } else {
            "NULL, NULL".to_owned()
        };
        let select = select.replacen("SELECT ", &format!("SELECT x.id, {extra}, "), 1);
        // The search's terms first: cheaper than the list's condition,
        // which looks at the thread's other records.
        let mut sql = format!("{select} WHERE x.operation IN ({})", list.operations());
        let mut bound = Vec::new();
        let b = &mut bound;
        if let Some(t) = &filter.thread {
            bind(&mut sql, b, Bound::Text(t.clone()), self.param, |p| {
                format!(" AND x.thread_id = {p}")
            });
        }
        if let Some(s) = &filter.since {
            bind(&mut sql, b, Bound::Text(s.clone()), self.time_param, |p| {
                format!(" AND {} >= {p}", self.window_time)
            });
        }
        if let Some(u) = &filter.until {
            bind(&mut sql, b, Bound::Text(u.clone()), self.time_param, |p| {
                format!(" AND {} <= {p}", self.window_time)
            });
        }
        if let Some(before) = filter.before_id {
            bind(&mut sql, b, Bound::Int(before), self.param, |p| {
                format!(" AND x.id < {p}")
            });
        }
        if let (ConsoleList::Answered, Some(a)) = (list, &filter.approver) {
            let approver = self.approver();
            bind(&mut sql, b, Bound::Text(a.clone()), self.param, |p| {
                format!(" AND {}(lower({approver}), lower({p})) > 0", self.find)
            });
        }
        sql.push_str(&format!(" AND {}", self.condition(list)));
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        bind(&mut sql, b, Bound::Int(limit), self.param, |p| {
            format!(" ORDER BY x.id DESC LIMIT {p}")
        });
        (sql, bound)
    }
}

/// Binds `v` as the next value and appends `clause` of its placeholder.
fn bind(
    sql: &mut String,
    bound: &mut Vec<Bound>,
    v: Bound,
    placeholder: fn(usize) -> String,
    clause: impl FnOnce(&str) -> String,
) {
    bound.push(v);
    sql.push_str(&clause(&placeholder(bound.len())));
}

/// A value bound to a list's statement.
#[derive(Debug, Clone)]
enum Bound {
    Text(String),
    Int(i64),
}

/// Which page of a list to read.
#[derive(Debug, Clone, Default)]
pub struct ConsoleFilter {
    pub thread: Option<String>,
    /// Part of the approver's JSON (case-insensitive): answers only.
    pub approver: Option<String>,
    /// RFC 3339 bounds, inclusive, as the trail stores times; of the
    /// shared table, on the database's clock.
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

/// One page of `list` of the SQLite trail at `path`, newest first.
pub fn console_list(
    path: &Path,
    list: ConsoleList,
    filter: &ConsoleFilter,
) -> Result<Vec<ListedEvent>, AuditError> {
    let conn = open_read_only(path)?;
    // The record is `x`; the columns it is read from name no table, so
    // they are x's (the subqueries name theirs).
    let select = select(&conn)?.replace("FROM audit_events", "FROM audit_events x");
    let (sql, bound) = Dialect::sqlite().page(&select, list, filter);
    let params = bound.into_iter().map(|b| match b {
        Bound::Text(t) => SqlValue::Text(t),
        Bound::Int(i) => SqlValue::Integer(i),
    });
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

/// One page of `list` of the PostgreSQL table of every replica.
pub fn console_list_postgres(
    target: &PgTarget,
    list: ConsoleList,
    filter: &ConsoleFilter,
) -> Result<Vec<ListedEvent>, AuditError> {
    let s = target.schema();
    let table = format!("{s}.audit_events");
    let select =
        postgres_store::select(s).replace(&format!("FROM {table}"), &format!("FROM {table} x"));
    let (sql, bound) = Dialect::postgres(s).page(&select, list, filter);
    let params: Vec<Box<dyn ToSql + Sync>> = bound
        .into_iter()
        .map(|b| -> Box<dyn ToSql + Sync> {
            match b {
                Bound::Text(t) => Box::new(t),
                Bound::Int(i) => Box::new(i),
            }
        })
        .collect();
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref()).collect();
    let mut client = postgres_store::clock_reader(target)?;
    let rows = client
        .query(&sql, &refs)
        .map_err(postgres_store::read_error(target))?;
    rows.iter()
        .map(|r| {
            Ok(ListedEvent {
                id: postgres_store::column_of(r, 0)?,
                approver: postgres_store::column_of(r, 1)?,
                parked_at: postgres_store::column_of(r, 2)?,
                event: postgres_store::row_to_event_at(r, 3)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::audit::sqlite_store::Store;
    use crate::audit::test_util::{remove_db, temp_path};
    use crate::audit_event::{Operation, SessionContext};

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

    #[test]
    fn refused_lists_statements_refused_beside_claims_refused() {
        let path = temp_path("console-refused", "sqlite");
        let mut store = Store::open(&path).unwrap();
        let own_schema = AuditEvent::new(&SessionContext::default(), Operation::StatementRefused)
            .with_detail(serde_json::json!({"refusal": "own_schema"}));
        let events = [
            ev(Operation::ClaimRefused, "raced", "c"),
            own_schema,
            ev(Operation::ForkServed, "forked", "c"),
        ];
        store.append(events.iter()).unwrap();
        let all = ConsoleFilter {
            limit: 10,
            ..ConsoleFilter::default()
        };
        let listed = console_list(&path, ConsoleList::Refused, &all).unwrap();
        let operations: Vec<_> = listed.iter().map(|l| l.event.operation).collect();
        assert_eq!(
            operations,
            [Operation::StatementRefused, Operation::ClaimRefused],
            "newest first, nothing else"
        );
        remove_db(&path);
    }
}
