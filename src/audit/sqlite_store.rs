//! SQLite trail: queryable by thread, append-only by construction.
//!
//! Triggers make the table refuse UPDATE, and DELETE of any row at or above
//! the prune guard's `below_id` — normally 0, so no row. Only the prune
//! (`prune.rs`) raises it, in the same transaction that records an
//! `audit_pruned` event saying what goes; so rows leave the trail only
//! oldest first and never without a record of it. The file and its `-wal`
//! and `-shm` files are created mode 0600.

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};

use super::chain::{link, ChainedRow, Heads, Verdict, Verifier};
use super::error::AuditError;
use super::private_file::precreate_private;
use crate::audit_event::{AuditEvent, Operation};

/// How long a write waits for another connection's lock (a prune from the
/// command line, a reader checkpointing) before it counts as failed.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS audit_events (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    session_id INTEGER NOT NULL,
    client_addr TEXT NOT NULL,
    "user" TEXT NOT NULL,
    "database" TEXT NOT NULL,
    application_name TEXT NOT NULL,
    operation TEXT NOT NULL,
    thread_id TEXT,
    checkpoint_ns TEXT,
    checkpoint_id TEXT,
    parent_checkpoint_id TEXT,
    task_id TEXT,
    channels TEXT NOT NULL,
    blob_sha256 TEXT NOT NULL,
    detail TEXT NOT NULL,
    proxy_id TEXT NOT NULL DEFAULT '',
    prev_hash TEXT,
    hash TEXT
);
CREATE INDEX IF NOT EXISTS audit_events_thread_id ON audit_events(thread_id);
CREATE INDEX IF NOT EXISTS audit_events_gaps ON audit_events(id) WHERE operation = 'events_dropped';
CREATE TABLE IF NOT EXISTS audit_prune_guard (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    below_id INTEGER NOT NULL
);
INSERT OR IGNORE INTO audit_prune_guard (id, below_id) VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END;
DROP TRIGGER IF EXISTS audit_events_no_delete;
CREATE TRIGGER IF NOT EXISTS audit_events_prune_only BEFORE DELETE ON audit_events
WHEN OLD.id >= coalesce((SELECT below_id FROM audit_prune_guard WHERE id = 1), 0)
BEGIN SELECT RAISE(ABORT, 'audit_events is append-only (old rows leave only by resumeguard audit prune)'); END;
"#;

const INSERT: &str = r#"INSERT INTO audit_events (
    time, session_id, client_addr, "user", "database", application_name, operation,
    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, task_id,
    channels, blob_sha256, detail, proxy_id, prev_hash, hash
) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"#;

/// The columns read back, in [`row_to_event`]'s order; `{proxy_id}` is the
/// column, or `''` in a file no proxy of this version has opened yet.
const SELECT: &str = r#"SELECT time, session_id, client_addr, "user", "database",
    application_name, operation, thread_id, checkpoint_ns, checkpoint_id,
    parent_checkpoint_id, task_id, channels, blob_sha256, detail, {proxy_id}
FROM audit_events"#;

/// Files made before events named their replica get the column in place.
const ADD_PROXY_ID: &str = "ALTER TABLE audit_events ADD COLUMN proxy_id TEXT NOT NULL DEFAULT ''";

/// Files made before records were chained get the columns in place; their
/// older rows stay unhashed (counted by `audit verify`, not broken).
const ADD_CHAIN: &str = "ALTER TABLE audit_events ADD COLUMN prev_hash TEXT; \
    ALTER TABLE audit_events ADD COLUMN hash TEXT";

/// Each chain's head is found from its replica's newest row; the
/// console's lists walk one operation's records newest first.
const CHAIN_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS audit_events_chain ON audit_events(proxy_id, id); \
     CREATE INDEX IF NOT EXISTS audit_events_operation ON audit_events(operation, id)";

/// Writable handle on the audit database; owned by the writer thread.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Open (creating if needed, mode 0600) the database at `path` in WAL
    /// mode, so readers such as the timeline command never block the writer.
    pub fn open(path: &Path) -> Result<Store, AuditError> {
        precreate_private(path).map_err(|source| AuditError::CreateDatabase {
            path: path.to_path_buf(),
            source,
        })?;
        Store::open_existing(path)
    }

    /// Open the database at `path`, which must exist (the prune command
    /// must not create an empty trail where the user mistyped a path).
    pub fn open_existing(path: &Path) -> Result<Store, AuditError> {
        let conn = open_file(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), %mode, "audit database is not in WAL mode");
        }
        // NORMAL is durable across process crashes in WAL mode; only an OS
        // crash can lose the last commits, which is fine for an audit tail.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // One transaction: an older database swaps its delete trigger for
        // the prune-aware one with no moment unguarded.
        conn.execute_batch(&format!("BEGIN IMMEDIATE;\n{SCHEMA}"))
            .map_err(AuditError::Schema)?;
        let upgraded = match has_column(&conn, "proxy_id") {
            Ok(true) => Ok(()),
            Ok(false) => conn.execute_batch(ADD_PROXY_ID),
            Err(e) => Err(e),
        }
        .and_then(|()| match has_column(&conn, "hash") {
            Ok(true) => Ok(()),
            Ok(false) => conn.execute_batch(ADD_CHAIN),
            Err(e) => Err(e),
        })
        .and_then(|()| conn.execute_batch(CHAIN_INDEX));
        match upgraded.and_then(|()| conn.execute_batch("COMMIT")) {
            Ok(()) => Ok(Store { conn }),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(AuditError::Schema(e))
            }
        }
    }

    /// How long writes wait for another connection's lock.
    pub fn set_busy_timeout(&self, timeout: Duration) -> Result<(), AuditError> {
        Ok(self.conn.busy_timeout(timeout)?)
    }

    /// Append `events` in one transaction: one fsync per batch, not per
    /// event. The write lock is taken first, so each chain's head read in
    /// it is still the head when the batch commits.
    pub fn append<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a AuditEvent>,
    ) -> Result<(), AuditError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut heads = Heads::default();
        for ev in events {
            insert(&tx, ev, &mut heads)?;
        }
        tx.commit().map_err(|source| AuditError::Commit {
            what: "audit batch",
            source,
        })
    }

    /// The connection, for the prune.
    pub(super) fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

/// Insert one event (inside the caller's write transaction), chained to
/// its replica's newest row.
pub(super) fn insert(
    conn: &Connection,
    ev: &AuditEvent,
    heads: &mut Heads,
) -> Result<(), AuditError> {
    let prev = heads.get(&ev.proxy_id, || {
        conn.prepare_cached(
            "SELECT hash FROM audit_events WHERE proxy_id = ?1 AND hash IS NOT NULL \
             ORDER BY id DESC LIMIT 1",
        )?
        .query_row([&ev.proxy_id], |r| r.get::<_, String>(0))
        .optional()
    })?;
    let hash = link(&prev, ev)?;
    let mut stmt = conn.prepare_cached(INSERT)?;
    stmt.execute(params![
        ev.time,
        // SQLite integers are i64; ids beyond that wrap visibly
        // rather than failing the whole batch.
        ev.session_id as i64,
        ev.client_addr,
        ev.user,
        ev.database,
        ev.application_name,
        ev.operation.as_str(),
        ev.thread_id,
        ev.checkpoint_ns,
        ev.checkpoint_id,
        ev.parent_checkpoint_id,
        ev.task_id,
        serde_json::to_string(&ev.channels)?,
        serde_json::to_string(&ev.blob_sha256)?,
        serde_json::to_string(&ev.detail)?,
        ev.proxy_id,
        prev,
        hash,
    ])?;
    heads.advance(&ev.proxy_id, hash);
    Ok(())
}

/// Events for `thread_id`, in the order they were written, and every gap
/// record written since the thread's first event (the thread's own events
/// may be among those lost).
pub fn thread_events(path: &Path, thread_id: &str) -> Result<Vec<AuditEvent>, AuditError> {
    let conn = open_read_only(path)?;
    let select = select(&conn)?;
    // Two index searches (by thread; the partial index of gap records),
    // not a scan of the table.
    let mut stmt = conn.prepare(&format!(
        "{select} WHERE id IN (SELECT id FROM audit_events WHERE thread_id = ?1 \
         UNION ALL SELECT id FROM audit_events WHERE operation = 'events_dropped' \
         AND id > (SELECT min(id) FROM audit_events WHERE thread_id = ?1)) ORDER BY id"
    ))?;
    let rows = stmt.query_map([thread_id], row_to_event)?;
    collect(rows)
}

/// Every event in the database, in the order written.
pub fn all_events(path: &Path) -> Result<Vec<AuditEvent>, AuditError> {
    let conn = open_read_only(path)?;
    let mut stmt = conn.prepare(&format!("{} ORDER BY id", select(&conn)?))?;
    let rows = stmt.query_map([], row_to_event)?;
    collect(rows)
}

/// Walk every chain of the file: rows still below an unfinished prune's
/// guard are on their way out and not walked.
pub fn verify(path: &Path) -> Result<Verdict, AuditError> {
    let conn = open_read_only(path)?;
    let select = select(&conn)?;
    let guard: i64 = conn
        .query_row(
            "SELECT below_id FROM audit_prune_guard WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let mut pruned = conn.prepare(&format!(
        "{select} WHERE operation = 'audit_pruned' ORDER BY id"
    ))?;
    let pruned = collect(pruned.query_map([], row_to_event)?)?;
    let mut verifier = Verifier::new(&pruned);
    let chain = if has_column(&conn, "hash")? {
        "id, prev_hash, hash"
    } else {
        "id, NULL, NULL"
    };
    let mut stmt = conn.prepare(&format!(
        "{} WHERE id >= ?1 ORDER BY id",
        select.replacen("SELECT ", &format!("SELECT {chain}, "), 1)
    ))?;
    let mut rows = stmt.query([guard])?;
    while let Some(r) = rows.next()? {
        let event = row_to_event_at(r, 3)??;
        verifier.record(ChainedRow {
            id: r.get(0)?,
            event,
            prev_hash: r.get(1)?,
            hash: r.get(2)?,
        })?;
    }
    Ok(verifier.finish())
}

/// Whether the table has the column `name`.
fn has_column(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('audit_events') WHERE name = ?1)",
        [name],
        |r| r.get(0),
    )
}

/// [`SELECT`] for this file (read-only readers cannot add the column).
pub(super) fn select(conn: &Connection) -> Result<String, AuditError> {
    let column = if has_column(conn, "proxy_id")? {
        "proxy_id"
    } else {
        "'' AS proxy_id"
    };
    Ok(SELECT.replace("{proxy_id}", column))
}

pub(super) fn open_read_only(path: &Path) -> Result<Connection, AuditError> {
    open_file(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
}

/// The trail's existing file at `path`, opened with `mode` (read-write or
/// read-only), waiting up to `BUSY_TIMEOUT` for another writer's lock.
fn open_file(path: &Path, mode: OpenFlags) -> Result<Connection, AuditError> {
    let conn = Connection::open_with_flags(path, mode | OpenFlags::SQLITE_OPEN_NO_MUTEX).map_err(
        |source| AuditError::OpenDatabase {
            path: path.to_path_buf(),
            source,
        },
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

fn collect(
    rows: impl Iterator<Item = rusqlite::Result<Result<AuditEvent, AuditError>>>,
) -> Result<Vec<AuditEvent>, AuditError> {
    let mut out = Vec::new();
    for row in rows {
        out.push(row??);
    }
    Ok(out)
}

/// Decode one row. SQL errors surface through rusqlite; malformed JSON or an
/// unknown operation surface as the inner error so one bad row is reported
/// rather than silently skipped.
fn row_to_event(r: &Row<'_>) -> rusqlite::Result<Result<AuditEvent, AuditError>> {
    row_to_event_at(r, 0)
}

/// [`row_to_event`] of a row whose [`SELECT`] columns start at `at`.
pub(super) fn row_to_event_at(
    r: &Row<'_>,
    at: usize,
) -> rusqlite::Result<Result<AuditEvent, AuditError>> {
    let op_name: String = r.get(at + 6)?;
    let channels: String = r.get(at + 12)?;
    let blobs: String = r.get(at + 13)?;
    let detail: String = r.get(at + 14)?;
    let time: String = r.get(at)?;
    let session_id: i64 = r.get(at + 1)?;
    let client_addr: String = r.get(at + 2)?;
    let user: String = r.get(at + 3)?;
    let database: String = r.get(at + 4)?;
    let application_name: String = r.get(at + 5)?;
    let thread_id: Option<String> = r.get(at + 7)?;
    let checkpoint_ns: Option<String> = r.get(at + 8)?;
    let checkpoint_id: Option<String> = r.get(at + 9)?;
    let parent_checkpoint_id: Option<String> = r.get(at + 10)?;
    let task_id: Option<String> = r.get(at + 11)?;
    let proxy_id: String = r.get(at + 15)?;
    Ok((|| {
        Ok(AuditEvent {
            time,
            proxy_id,
            session_id: session_id as u64,
            client_addr,
            user,
            database,
            application_name,
            operation: Operation::parse(&op_name)
                .ok_or_else(|| AuditError::UnknownOperation(op_name.clone()))?,
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            parent_checkpoint_id,
            task_id,
            channels: column("channels", &channels)?,
            blob_sha256: column("blob_sha256", &blobs)?,
            detail: column("detail", &detail)?,
            run_metadata: None,
            answer: None,
        })
    })())
}

/// One JSON column of a row, decoded.
pub(super) fn column<T: serde::de::DeserializeOwned>(
    column: &'static str,
    text: &str,
) -> Result<T, AuditError> {
    serde_json::from_str(text).map_err(|source| AuditError::Column { column, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::test_util::{remove_db, temp_path};
    use crate::audit_event::{BlobDigest, SessionContext};

    fn sample(thread: &str, op: Operation) -> AuditEvent {
        let ctx = SessionContext {
            session_id: u64::MAX - 1,
            client_addr: "127.0.0.1:4242".into(),
            user: "lg".into(),
            database: "checkpoints".into(),
            application_name: "agent".into(),
        };
        let mut ev = AuditEvent::new(&ctx, op).with_thread(thread);
        ev.checkpoint_ns = Some("".into());
        ev.checkpoint_id = Some("1ef4f797-8335-6428-8001-8a1503f9b875".into());
        ev.parent_checkpoint_id = Some("1ef4f797-8335-6427-8000-000000000000".into());
        ev.task_id = Some("task-9".into());
        ev.channels = vec!["messages".into(), "__interrupt__".into()];
        ev.blob_sha256 = vec![BlobDigest::of("messages", b"payload")];
        ev.detail = serde_json::json!({"rows": 1, "sql": "INSERT ..."});
        ev.proxy_id = "proxy-a".into();
        ev
    }

    #[test]
    fn an_older_file_gains_the_proxy_id_column_in_place() {
        let path = temp_path("sqlite-upgrade", "db");
        let before = SCHEMA.replace(
            ",\n    proxy_id TEXT NOT NULL DEFAULT '',\n    prev_hash TEXT,\n    hash TEXT",
            "",
        );
        assert_ne!(before, SCHEMA);
        let old = Connection::open(&path).unwrap();
        old.execute_batch(&before).unwrap();
        let mut first = sample("t1", Operation::ReadLatest);
        first.proxy_id = String::new();
        old.execute(
            "INSERT INTO audit_events (time, session_id, client_addr, \"user\", \"database\", \
             application_name, operation, thread_id, checkpoint_ns, checkpoint_id, \
             parent_checkpoint_id, task_id, channels, blob_sha256, detail) \
             SELECT time, session_id, client_addr, \"user\", \"database\", application_name, \
             operation, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, task_id, \
             channels, blob_sha256, detail FROM (SELECT ?1 AS time, 1 AS session_id, '' AS \
             client_addr, '' AS \"user\", '' AS \"database\", '' AS application_name, \
             'read_latest' AS operation, 't1' AS thread_id, NULL AS checkpoint_ns, NULL AS \
             checkpoint_id, NULL AS parent_checkpoint_id, NULL AS task_id, '[]' AS channels, \
             '[]' AS blob_sha256, 'null' AS detail)",
            [&first.time],
        )
        .unwrap();
        drop(old);
        // Readers of a file no proxy of this version opened see no replica.
        let read = thread_events(&path, "t1").unwrap();
        assert_eq!((read.len(), read[0].proxy_id.as_str()), (1, ""));
        let second = sample("t1", Operation::CheckpointPut);
        Store::open(&path)
            .unwrap()
            .append(std::slice::from_ref(&second))
            .unwrap();
        let read = thread_events(&path, "t1").unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].proxy_id, "");
        assert_eq!(read[1], second);
        // The row from before hashing is counted, the new one chained.
        let verdict = verify(&path).unwrap();
        assert!(verdict.holds(), "{:?}", verdict.breaks);
        let unhashed: Vec<(u64, u64)> = verdict
            .chains
            .iter()
            .map(|c| (c.unhashed_before, c.records))
            .collect();
        assert_eq!(unhashed, vec![(1, 0), (0, 1)]);
        remove_db(&path);
    }

    #[test]
    fn round_trips_events_by_thread_in_order() {
        let path = temp_path("sqlite-roundtrip", "db");
        let a = sample("t1", Operation::BlobPut);
        let b = sample("t2", Operation::CheckpointPut);
        let mut c = sample("t1", Operation::WritesPut);
        c.thread_id = Some("t1".into());
        c.checkpoint_ns = None;
        c.detail = serde_json::Value::Null;
        {
            let mut store = Store::open(&path).unwrap();
            store.append(&[a.clone(), b.clone()]).unwrap();
            store.append(std::slice::from_ref(&c)).unwrap();
        }
        // Reopening keeps existing rows (CREATE IF NOT EXISTS).
        Store::open(&path).unwrap().append(&[]).unwrap();

        assert_eq!(
            thread_events(&path, "t1").unwrap(),
            vec![a.clone(), c.clone()]
        );
        assert_eq!(thread_events(&path, "t2").unwrap(), vec![b.clone()]);
        assert!(thread_events(&path, "nope").unwrap().is_empty());
        assert_eq!(all_events(&path).unwrap(), vec![a, b, c]);

        let conn = Connection::open(&path).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        remove_db(&path);
    }

    #[test]
    fn a_thread_shows_the_gaps_recorded_since_it_began() {
        let path = temp_path("sqlite-gaps", "db");
        let gap = |n: u64| {
            AuditEvent::new(&SessionContext::internal(), Operation::EventsDropped)
                .with_detail(serde_json::json!({ "dropped": n }))
        };
        let a = sample("t1", Operation::ReadLatest);
        let b = sample("t2", Operation::ReadLatest);
        let c = sample("t1", Operation::CheckpointPut);
        let mut store = Store::open(&path).unwrap();
        store
            .append([&gap(1), &a, &b, &gap(2), &c, &gap(3)])
            .unwrap();
        let ops = |t: &str| -> Vec<(Operation, serde_json::Value)> {
            thread_events(&path, t)
                .unwrap()
                .into_iter()
                .map(|e| (e.operation, e.detail["dropped"].clone()))
                .collect()
        };
        let none = serde_json::Value::Null;
        assert_eq!(
            ops("t1"),
            vec![
                (Operation::ReadLatest, none.clone()),
                (Operation::EventsDropped, 2.into()),
                (Operation::CheckpointPut, none.clone()),
                (Operation::EventsDropped, 3.into()),
            ]
        );
        assert_eq!(
            ops("t2"),
            vec![
                (Operation::ReadLatest, none),
                (Operation::EventsDropped, 2.into()),
                (Operation::EventsDropped, 3.into()),
            ]
        );
        assert!(ops("nope").is_empty(), "no thread, no gaps");
        drop(store);
        remove_db(&path);
    }

    #[test]
    fn table_refuses_update_and_delete() {
        let path = temp_path("sqlite-appendonly", "db");
        Store::open(&path)
            .unwrap()
            .append(&[sample("t", Operation::ReadLatest)])
            .unwrap();
        let conn = Connection::open(&path).unwrap();
        let upd = conn.execute("UPDATE audit_events SET \"user\" = 'x'", []);
        assert!(upd.unwrap_err().to_string().contains("append-only"));
        let del = conn.execute("DELETE FROM audit_events", []);
        assert!(del.unwrap_err().to_string().contains("append-only"));
        assert_eq!(all_events(&path).unwrap().len(), 1);
        remove_db(&path);
    }

    /// Rows of the file changed behind the writer's back, as an attacker
    /// with the file would: the triggers dropped first.
    fn tamper(path: &Path, sql: &str) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(&format!(
            "DROP TRIGGER audit_events_no_update; DROP TRIGGER audit_events_prune_only; {sql}"
        ))
        .unwrap();
    }

    #[test]
    fn verify_names_the_first_record_changed_or_removed() {
        use crate::audit::chain::Break;
        let trail = |name: &str| {
            let path = temp_path(name, "db");
            let mut store = Store::open(&path).unwrap();
            let mut b = sample("t2", Operation::ReadLatest);
            b.proxy_id = "proxy-b".into();
            let events: Vec<AuditEvent> = (0..5)
                .map(|i| sample(&format!("t{i}"), Operation::CheckpointPut))
                .collect();
            store.append(&events[..2]).unwrap();
            store
                .append([&b, &events[2], &events[3], &events[4]])
                .unwrap();
            path
        };
        let path = trail("sqlite-verify");
        let verdict = verify(&path).unwrap();
        assert!(verdict.holds(), "{:?}", verdict.breaks);
        assert_eq!(verdict.records(), vec![("proxy-a", 5), ("proxy-b", 1)]);
        tamper(
            &path,
            "UPDATE audit_events SET \"user\" = 'mallory' WHERE id = 4",
        );
        assert_eq!(
            verify(&path).unwrap().breaks,
            vec![Break::Changed {
                id: 4,
                proxy_id: "proxy-a".into()
            }]
        );
        remove_db(&path);

        // The breaks a verify finds in a fresh trail after `sql`.
        let breaks_after = |name: &str, sql: &str| {
            let path = trail(name);
            tamper(&path, sql);
            let breaks = verify(&path).unwrap().breaks;
            remove_db(&path);
            breaks
        };
        assert_eq!(
            breaks_after(
                "sqlite-verify-delete",
                "DELETE FROM audit_events WHERE id = 2"
            ),
            vec![Break::Missing {
                id: 4,
                after: 1,
                proxy_id: "proxy-a".into()
            }]
        );
        assert_eq!(
            breaks_after(
                "sqlite-verify-oldest",
                "DELETE FROM audit_events WHERE id = 1"
            ),
            vec![Break::Unanchored {
                id: 2,
                proxy_id: "proxy-a".into()
            }]
        );
    }

    #[test]
    fn a_pruned_trail_verifies_from_where_the_prune_says_it_starts() {
        use crate::audit::prune::{prune, PruneRule};
        let path = temp_path("sqlite-verify-prune", "db");
        let mut store = Store::open(&path).unwrap();
        let events: Vec<AuditEvent> = (0..6)
            .map(|i| sample(&format!("t{i}"), Operation::CheckpointPut))
            .collect();
        store.append(&events).unwrap();
        let rule = PruneRule {
            before: None,
            max_rows: Some(3),
        };
        prune(&mut store, &rule, "test").unwrap().unwrap();
        store.append(&events[..1]).unwrap();
        let verdict = verify(&path).unwrap();
        assert!(verdict.holds(), "{:?}", verdict.breaks);
        let a = verdict.chains.iter().find(|c| c.proxy_id == "proxy-a");
        assert!(a.is_some_and(|a| a.after_prune), "{:?}", verdict.chains);
        // Without the prune's record of where the chain starts, the same
        // removal is a break.
        tamper(
            &path,
            "DELETE FROM audit_events WHERE operation = 'audit_pruned'",
        );
        let breaks = verify(&path).unwrap().breaks;
        assert!(
            matches!(
                breaks.as_slice(),
                [crate::audit::chain::Break::Unanchored { .. }, ..]
            ),
            "{breaks:?}"
        );
        drop(store);
        remove_db(&path);
    }

    #[test]
    fn database_and_its_side_files_are_created_0600() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp_path("sqlite-mode", "db");
        let mut store = Store::open(&path).unwrap();
        store.append(&[sample("t", Operation::ReadLatest)]).unwrap();
        // While the writer is open its -wal and -shm files exist.
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{suffix}");
        }
        drop(store);
        remove_db(&path);
    }

    #[test]
    fn the_prune_command_does_not_create_a_missing_database() {
        let path = temp_path("sqlite-existing", "db");
        assert!(Store::open_existing(&path).is_err());
        assert!(!path.exists());
    }

    #[test]
    fn missing_database_is_an_error_for_readers() {
        let path = temp_path("sqlite-missing", "db");
        assert!(thread_events(&path, "t").is_err());
    }
}
