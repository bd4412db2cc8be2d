//! Retention: the one sanctioned way rows leave the audit trail.
//!
//! A prune removes a prefix of the trail (every row below a boundary id),
//! so the trail that remains has no holes. [`begin`] decides the boundary,
//! records an `audit_pruned` event (how many rows, the cutoff, who asked)
//! and raises the guard the delete trigger checks, all in one transaction;
//! [`step`] then deletes in chunks, so a large prune never holds the write
//! lock long enough to stall the audit writer, and lowers the guard when
//! nothing is left below it. A prune interrupted by a crash is finished by
//! the next one, which records only rows the first did not declare.

use std::time::SystemTime;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::chain::{Heads, CHAIN_STARTS};
use super::error::AuditError;
use super::sqlite_store::{insert, Store};
use crate::audit_event::{AuditEvent, Operation, SessionContext};
use crate::timestamp::format_rfc3339_millis;

/// Rows deleted per transaction.
pub const PRUNE_CHUNK: i64 = 20_000;

/// Which rows a prune removes: those older than `before`, and all but the
/// newest `max_rows`. Either may be absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneRule {
    pub before: Option<SystemTime>,
    pub max_rows: Option<u64>,
}

/// A prune that was declared: the `audit_pruned` record's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// Rows this prune removes.
    pub rows: u64,
    /// Every row with a smaller id goes.
    pub below_id: i64,
}

/// Declare a prune by `rule` (recorded as asked for `by`): returns what it
/// removes, or `None` when no row qualifies. Rows are removed by [`step`].
pub fn begin(
    store: &mut Store,
    rule: &PruneRule,
    by: &str,
) -> Result<Option<Declared>, AuditError> {
    let tx = store
        .conn()
        .transaction_with_behavior(TransactionBehavior::Immediate)?;
    let guard = guard(&tx)?;
    let cutoff = rule.before.map(format_rfc3339_millis);
    let Some(boundary) = boundary(&tx, cutoff.as_deref(), rule.max_rows)? else {
        return Ok(None);
    };
    if boundary <= guard {
        // An earlier prune already declared these rows.
        return Ok(None);
    }
    let rows: i64 = tx.query_row(
        "SELECT count(*) FROM audit_events WHERE id >= ?1 AND id < ?2",
        params![guard, boundary],
        |r| r.get(0),
    )?;
    if rows == 0 {
        return Ok(None);
    }
    let record = AuditEvent::new(&SessionContext::internal(), Operation::AuditPruned).with_detail(
        serde_json::json!({
            "rows": rows,
            "below_id": boundary,
            "cutoff": cutoff,
            "max_rows": rule.max_rows,
            "by": by,
            CHAIN_STARTS: chain_starts(&tx, guard, boundary)?,
        }),
    );
    insert(&tx, &record, &mut Heads::default())?;
    tx.execute(
        "UPDATE audit_prune_guard SET below_id = ?1 WHERE id = 1",
        [boundary],
    )?;
    tx.commit().map_err(|source| AuditError::Commit {
        what: "the prune record",
        source,
    })?;
    Ok(Some(Declared {
        rows: rows as u64,
        below_id: boundary,
    }))
}

/// Delete up to [`PRUNE_CHUNK`] rows below the guard; when none are left,
/// lower the guard. Returns whether rows below it remain.
pub fn step(store: &mut Store) -> Result<bool, AuditError> {
    let tx = store
        .conn()
        .transaction_with_behavior(TransactionBehavior::Immediate)?;
    let guard = guard(&tx)?;
    tx.execute(
        "DELETE FROM audit_events WHERE id < min(?1, (SELECT min(id) FROM audit_events) + ?2)",
        params![guard, PRUNE_CHUNK],
    )?;
    let more: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM audit_events WHERE id < ?1)",
        [guard],
        |r| r.get(0),
    )?;
    if !more && guard > 0 {
        tx.execute("UPDATE audit_prune_guard SET below_id = 0 WHERE id = 1", [])?;
    }
    tx.commit().map_err(|source| AuditError::Commit {
        what: "a prune step",
        source,
    })?;
    Ok(more)
}

/// Whether a declared prune is unfinished (rows below the guard remain).
pub fn pending(store: &mut Store) -> Result<bool, AuditError> {
    let conn = store.conn();
    let guard = guard(conn)?;
    Ok(guard > 0
        && conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM audit_events WHERE id < ?1)",
            [guard],
            |r| r.get(0),
        )?)
}

/// Declare and carry out a prune to the end (the command line's prune).
pub fn prune(
    store: &mut Store,
    rule: &PruneRule,
    by: &str,
) -> Result<Option<Declared>, AuditError> {
    let declared = begin(store, rule, by)?;
    while step(store)? {}
    Ok(declared)
}

/// Per replica, the hash of the newest row from `guard` up to `boundary`:
/// where each chain the prune shortens starts once it is done.
fn chain_starts(
    conn: &Connection,
    guard: i64,
    boundary: i64,
) -> Result<serde_json::Map<String, serde_json::Value>, AuditError> {
    let mut stmt = conn.prepare(
        "SELECT proxy_id, hash FROM audit_events WHERE id IN (SELECT max(id) FROM audit_events \
         WHERE id >= ?1 AND id < ?2 AND hash IS NOT NULL GROUP BY proxy_id)",
    )?;
    let rows = stmt.query_map(params![guard, boundary], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut starts = serde_json::Map::new();
    for row in rows {
        let (proxy, hash) = row?;
        starts.insert(proxy, hash.into());
    }
    Ok(starts)
}

fn guard(conn: &Connection) -> Result<i64, AuditError> {
    let below: Option<i64> = conn
        .query_row(
            "SELECT below_id FROM audit_prune_guard WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(below.unwrap_or(0))
}

/// The smallest id to keep, or `None` when the rule removes nothing.
/// The time rule keeps everything from the first row at or after the
/// cutoff, found by scanning in id order from the oldest row, so its cost
/// is the rows it removes.
fn boundary(
    conn: &Connection,
    cutoff: Option<&str>,
    max_rows: Option<u64>,
) -> Result<Option<i64>, AuditError> {
    let Some(max_id) = conn.query_row("SELECT max(id) FROM audit_events", [], |r| {
        r.get::<_, Option<i64>>(0)
    })?
    else {
        return Ok(None);
    };
    let by_time = match cutoff {
        Some(cutoff) => Some(
            conn.query_row(
                "SELECT id FROM audit_events WHERE time >= ?1 ORDER BY id LIMIT 1",
                [cutoff],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .unwrap_or(max_id + 1),
        ),
        None => None,
    };
    // Over the limit, the newest `max_rows - 1` stay, so that with the
    // prune's own record the trail holds `max_rows`: an idle trail at its
    // limit is not pruned again (and again) for that record.
    let min_id: i64 = conn.query_row("SELECT min(id) FROM audit_events", [], |r| r.get(0))?;
    let by_rows = max_rows
        .filter(|&n| n > 0)
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .filter(|&n| max_id - min_id + 1 > n)
        .map(|n| max_id - (n - 1) + 1);
    Ok(by_time.into_iter().chain(by_rows).max())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::sqlite_store::all_events;
    use crate::audit::test_util::{remove_db, temp_path};
    use std::time::Duration;

    fn at(time: &str, n: u64) -> AuditEvent {
        let mut ev = AuditEvent::new(&SessionContext::default(), Operation::ReadLatest)
            .with_thread("t")
            .with_detail(serde_json::json!({ "n": n }));
        ev.time = time.into();
        ev
    }

    fn store_with(path: &std::path::Path, events: &[AuditEvent]) -> Store {
        let mut store = Store::open(path).unwrap();
        store.append(events).unwrap();
        store
    }

    /// A store holding one event at each of `times`, numbered from 1.
    fn store_at(path: &std::path::Path, times: &[&str]) -> Store {
        let events: Vec<AuditEvent> = times.iter().zip(1..).map(|(t, n)| at(t, n)).collect();
        store_with(path, &events)
    }

    fn guard_of(store: &mut Store) -> i64 {
        guard(store.conn()).unwrap()
    }

    fn before(rfc3339: &str) -> PruneRule {
        PruneRule {
            before: Some(humantime::parse_rfc3339(rfc3339).unwrap()),
            max_rows: None,
        }
    }

    #[test]
    fn removes_rows_before_the_cutoff_and_records_it() {
        let path = temp_path("prune-time", "db");
        let mut store = store_at(
            &path,
            &[
                "2020-01-01T00:00:00.000Z",
                "2020-06-01T00:00:00.000Z",
                "2021-01-01T00:00:00.000Z",
                "2025-01-01T00:00:00.000Z",
            ],
        );
        let declared = prune(&mut store, &before("2021-01-01T00:00:00Z"), "cli")
            .unwrap()
            .unwrap();
        assert_eq!(
            declared,
            Declared {
                rows: 2,
                below_id: 3
            }
        );
        let events = all_events(&path).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].detail["n"], 3);
        assert_eq!(events[1].detail["n"], 4);
        let record = &events[2];
        assert_eq!(record.operation, Operation::AuditPruned);
        assert_eq!(record.application_name, "resumeguard");
        // Where the shortened chain starts: the last removed row's hash,
        // which the first kept row follows.
        let kept_prev: String = Connection::open(&path)
            .unwrap()
            .query_row("SELECT prev_hash FROM audit_events WHERE id = 3", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(
            record.detail,
            serde_json::json!({
                "rows": 2,
                "below_id": 3,
                "cutoff": "2021-01-01T00:00:00.000Z",
                "max_rows": null,
                "by": "cli",
                CHAIN_STARTS: { "": kept_prev },
            })
        );
        // The guard is down again: nothing more can be deleted.
        assert_eq!(guard_of(&mut store), 0);
        let del = store.conn().execute("DELETE FROM audit_events", []);
        assert!(del.unwrap_err().to_string().contains("append-only"));
        // Nothing left to prune: no second record.
        let again = prune(&mut store, &before("2021-01-01T00:00:00Z"), "cli").unwrap();
        assert_eq!(again, None);
        assert_eq!(all_events(&path).unwrap().len(), 3);
        remove_db(&path);
    }

    #[test]
    fn keeps_the_newest_max_rows() {
        let path = temp_path("prune-rows", "db");
        let events: Vec<AuditEvent> = (0..10).map(|n| at("2026-01-01T00:00:00.000Z", n)).collect();
        let mut store = store_with(&path, &events);
        let rule = PruneRule {
            before: None,
            max_rows: Some(4),
        };
        let declared = prune(&mut store, &rule, "retention").unwrap().unwrap();
        assert_eq!(
            declared,
            Declared {
                rows: 7,
                below_id: 8
            }
        );
        let left = all_events(&path).unwrap();
        let ns: Vec<_> = left[..3].iter().map(|e| e.detail["n"].clone()).collect();
        assert_eq!(ns, vec![7, 8, 9]);
        assert_eq!(left[3].operation, Operation::AuditPruned);
        assert_eq!(left.len(), 4, "the prune's own record counts");
        // At its limit and idle, the trail is left alone.
        assert_eq!(prune(&mut store, &rule, "retention").unwrap(), None);
        assert_eq!(all_events(&path).unwrap().len(), 4);
        remove_db(&path);
    }

    #[test]
    fn deletes_in_chunks_under_one_record() {
        let path = temp_path("prune-chunks", "db");
        let n = PRUNE_CHUNK as u64 + 5;
        let events: Vec<AuditEvent> = (0..n).map(|i| at("2020-01-01T00:00:00.000Z", i)).collect();
        let mut store = store_with(&path, &events);
        let rule = before("2021-01-01T00:00:00Z");
        let declared = begin(&mut store, &rule, "retention").unwrap().unwrap();
        assert_eq!(declared.rows, n);
        assert!(pending(&mut store).unwrap());
        assert!(step(&mut store).unwrap(), "a second chunk is left");
        assert!(!step(&mut store).unwrap());
        assert!(!pending(&mut store).unwrap());
        let left = all_events(&path).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].operation, Operation::AuditPruned);
        remove_db(&path);
    }

    #[test]
    fn an_interrupted_prune_is_finished_without_a_second_record() {
        let path = temp_path("prune-resume", "db");
        let mut store = store_at(
            &path,
            &[
                "2020-01-01T00:00:00.000Z",
                "2020-01-02T00:00:00.000Z",
                "2030-01-01T00:00:00.000Z",
            ],
        );
        let rule = before("2021-01-01T00:00:00Z");
        begin(&mut store, &rule, "retention").unwrap().unwrap();
        // Declared rows may go; the rest of the table stays guarded.
        let conn = store.conn();
        assert_eq!(
            conn.execute("DELETE FROM audit_events WHERE id = 1", [])
                .unwrap(),
            1
        );
        assert!(conn
            .execute("DELETE FROM audit_events WHERE id = 3", [])
            .is_err());
        drop(store);

        let mut store = Store::open(&path).unwrap();
        assert_eq!(prune(&mut store, &rule, "cli").unwrap(), None);
        let left = all_events(&path).unwrap();
        let ops: Vec<_> = left.iter().map(|e| e.operation).collect();
        assert_eq!(ops, vec![Operation::ReadLatest, Operation::AuditPruned]);
        assert_eq!(left[1].detail["rows"], 2);
        assert_eq!(guard_of(&mut store), 0);
        remove_db(&path);
    }

    #[test]
    fn a_database_with_the_older_delete_trigger_is_upgraded() {
        let path = temp_path("prune-upgrade", "db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE audit_events (id INTEGER PRIMARY KEY, time TEXT NOT NULL,
                 session_id INTEGER NOT NULL, client_addr TEXT NOT NULL, \"user\" TEXT NOT NULL,
                 \"database\" TEXT NOT NULL, application_name TEXT NOT NULL,
                 operation TEXT NOT NULL, thread_id TEXT, checkpoint_ns TEXT,
                 checkpoint_id TEXT, parent_checkpoint_id TEXT, task_id TEXT,
                 channels TEXT NOT NULL, blob_sha256 TEXT NOT NULL, detail TEXT NOT NULL);
                 CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
                 BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END;",
            )
            .unwrap();
        }
        let mut store = store_at(&path, &["2020-01-01T00:00:00.000Z"]);
        let declared = prune(&mut store, &before("2021-01-01T00:00:00Z"), "cli").unwrap();
        assert_eq!(declared.map(|d| d.rows), Some(1));
        let del = store.conn().execute("DELETE FROM audit_events", []);
        assert!(del.unwrap_err().to_string().contains("append-only"));
        remove_db(&path);
    }

    #[test]
    fn an_empty_trail_or_no_rule_prunes_nothing() {
        let path = temp_path("prune-empty", "db");
        let mut store = Store::open(&path).unwrap();
        let rule = PruneRule {
            before: Some(SystemTime::now() + Duration::from_secs(60)),
            max_rows: Some(1),
        };
        assert_eq!(prune(&mut store, &rule, "cli").unwrap(), None);
        store.append(&[at("2020-01-01T00:00:00.000Z", 1)]).unwrap();
        assert_eq!(
            prune(&mut store, &PruneRule::default(), "cli").unwrap(),
            None
        );
        assert_eq!(all_events(&path).unwrap().len(), 1);
        remove_db(&path);
    }
}
