//! The claim store: one SQLite file shared by every proxy replica in front
//! of the same database.
//!
//! Each operation is one `BEGIN IMMEDIATE` transaction: the write lock is
//! taken before the row is read, so two processes racing for one interrupt
//! serialize on the file and exactly one sees no live claim. Replicas must
//! share the file on one host (or a local volume mounted by several
//! containers of one host): WAL needs shared memory, which network file
//! systems do not give.
//!
//! Time is passed in (`now_ms`, wall-clock ms since the Unix epoch) so the
//! store never reads a clock and tests never sleep.

use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OptionalExtension, Row, Transaction};
use rusqlite::{ToSql, TransactionBehavior};

use super::error::StoreError;
use super::model::{ClaimKey, ClaimRecord, ClaimState, Holder, RunLease};

/// How long an operation waits for another process's transaction before
/// the store counts as unavailable (and the read is refused).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// Default retention of finished rows (consumed, released, long-lapsed):
/// long enough that a thread parked for hours still refuses a stray
/// duplicate of an answered interrupt.
pub const DEFAULT_RETAIN_MS: i64 = 24 * 60 * 60 * 1000;

/// Default time rows on a superseded checkpoint are kept after the thread
/// moved on: racers that read the parked head just before the move still
/// find the consumed claim and are refused.
pub const DEFAULT_SUPERSEDED_GRACE_MS: i64 = 60 * 1000;

/// Default run lease: how long after the answering run's latest write
/// another session's read of a thread head with tasks still to run is
/// refused (it would run the same tasks again).
pub const DEFAULT_RUN_LEASE_MS: i64 = 10 * 1000;

/// Evidence recorded when a newer checkpoint consumes held claims.
pub const NEXT_CHECKPOINT: &str = "next checkpoint";

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS claims (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('held', 'consumed', 'released')),
    proxy_id TEXT NOT NULL,
    session_id INTEGER NOT NULL,
    client_addr TEXT NOT NULL,
    application_name TEXT NOT NULL,
    claimed_at_ms INTEGER NOT NULL,
    lapse_at_ms INTEGER NOT NULL,
    consumed_at_ms INTEGER,
    evidence TEXT,
    refusals INTEGER NOT NULL DEFAULT 0,
    takeovers INTEGER NOT NULL DEFAULT 0,
    superseded_at_ms INTEGER,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, fingerprint)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS claims_consumed_at ON claims(consumed_at_ms);
CREATE INDEX IF NOT EXISTS claims_lapse_at ON claims(lapse_at_ms);
CREATE INDEX IF NOT EXISTS claims_superseded_at ON claims(superseded_at_ms);
CREATE INDEX IF NOT EXISTS claims_holder ON claims(proxy_id, session_id);
CREATE TABLE IF NOT EXISTS run_leases (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    answered_checkpoint_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    proxy_id TEXT NOT NULL,
    session_id INTEGER NOT NULL,
    client_addr TEXT NOT NULL,
    application_name TEXT NOT NULL,
    answered_at_ms INTEGER NOT NULL,
    last_write_ms INTEGER NOT NULL,
    until_ms INTEGER NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS run_leases_until ON run_leases(until_ms);
"#;

const COLUMNS: &str = "thread_id, checkpoint_ns, checkpoint_id, fingerprint, state, \
    proxy_id, session_id, client_addr, application_name, claimed_at_ms, lapse_at_ms, \
    consumed_at_ms, evidence, refusals, takeovers";

const KEY_MATCH: &str =
    "thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3 AND fingerprint = ?4";

const CHECKPOINT_MATCH: &str = "thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3";

/// What a reader of a parked head got from [`ClaimStore::try_claim`].
// Built once per parked read and moved, never stored in bulk: boxing the
// takeover's two records would buy nothing and complicate matching.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// No live claim existed (none, or released): this reader holds it now.
    Taken(ClaimRecord),
    /// The same session (proxy_id + session_id) already holds it: pass.
    /// The lapse time is not extended: a session that keeps re-reading
    /// without answering (a polling `get_state`) must not hold the
    /// interrupt forever.
    AlreadyHeld(ClaimRecord),
    /// Another session holds it and it has not lapsed.
    Busy(ClaimRecord),
    /// Another session's claim lapsed with no evidence: this reader took
    /// it over. `now` has `takeovers` incremented.
    TakenOver {
        previous: ClaimRecord,
        now: ClaimRecord,
    },
    /// The interrupt was already answered (by whichever session).
    Consumed(ClaimRecord),
}

/// Handle on the shared claim file, one per proxy process.
///
/// `Send + Sync`: one connection behind a mutex, shared in an `Arc` by the
/// session threads and the evidence worker; calls may block up to
/// [`BUSY_TIMEOUT`] on another process.
/// Not `Clone`: two handles in one process would only contend on the file.
pub struct ClaimStore {
    conn: Mutex<Connection>,
    path: String,
    retain_ms: i64,
    superseded_grace_ms: i64,
    run_lease_ms: i64,
}

impl std::fmt::Debug for ClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStore")
            .field("path", &self.path)
            .field("retain_ms", &self.retain_ms)
            .field("superseded_grace_ms", &self.superseded_grace_ms)
            .field("run_lease_ms", &self.run_lease_ms)
            .finish()
    }
}

impl ClaimStore {
    /// Opens (creating if needed) the claim file at `path` in WAL mode and
    /// creates the schema.
    pub fn open(path: &Path) -> Result<ClaimStore, StoreError> {
        let shown = path.display().to_string();
        let open_err = |reason: String| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        if path.is_dir() {
            return Err(open_err("it is a directory, not a database file".into()));
        }
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() && !parent.is_dir() {
                return Err(open_err(format!(
                    "directory {} does not exist",
                    parent.display()
                )));
            }
        }
        let conn = Connection::open(path).map_err(|e| open_err(describe(&e)))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| open_err(describe(&e)))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| open_err(describe(&e)))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %shown, %mode, "claim store is not in WAL mode");
        }
        // NORMAL is durable across process crashes in WAL mode; an OS crash
        // may lose the last commits, but it also ends every racer.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| open_err(describe(&e)))?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| open_err(format!("creating the claims schema: {}", describe(&e))))?;
        Ok(ClaimStore {
            conn: Mutex::new(conn),
            path: shown,
            retain_ms: DEFAULT_RETAIN_MS,
            superseded_grace_ms: DEFAULT_SUPERSEDED_GRACE_MS,
            run_lease_ms: DEFAULT_RUN_LEASE_MS,
        })
    }

    /// Sets how long consumed, released and long-lapsed rows are kept
    /// before [`ClaimStore::move_on`] deletes them.
    pub fn with_retention(mut self, retain_ms: i64) -> ClaimStore {
        self.retain_ms = retain_ms.max(0);
        self
    }

    /// Sets how long rows on a superseded checkpoint are kept.
    pub fn with_superseded_grace(mut self, grace_ms: i64) -> ClaimStore {
        self.superseded_grace_ms = grace_ms.max(0);
        self
    }

    /// Sets the run lease (0: no leases; answered threads are not guarded
    /// after their parked head is gone).
    pub fn with_run_lease(mut self, lease_ms: i64) -> ClaimStore {
        self.run_lease_ms = lease_ms.max(0);
        self
    }

    /// The file this store lives in, as shown in errors.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// A reader of a parked head asks for the interrupt `key`. A new claim
    /// lapses `lapse_ms` after `now_ms` unless evidence consumes it.
    pub fn try_claim(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now_ms: i64,
        lapse_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let lapse_at_ms = now_ms.saturating_add(lapse_ms.max(0));
        self.with_tx("taking a claim", |tx| {
            let Some(prev) = select_key(tx, key)? else {
                tx.prepare_cached(&format!(
                    "INSERT INTO claims ({COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, 'held', ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL, 0, 0)"
                ))?
                .execute(params![
                    key.thread_id,
                    key.checkpoint_ns,
                    key.checkpoint_id,
                    key.fingerprint,
                    holder.proxy_id,
                    holder.session_id as i64,
                    holder.client_addr,
                    holder.application_name,
                    now_ms,
                    lapse_at_ms,
                ])?;
                return Ok(ClaimOutcome::Taken(ClaimRecord {
                    key: key.clone(),
                    holder: holder.clone(),
                    state: ClaimState::Held,
                    claimed_at_ms: now_ms,
                    lapse_at_ms,
                    consumed_at_ms: None,
                    evidence: None,
                    refusals: 0,
                    takeovers: 0,
                }));
            };
            let outcome = match prev.state {
                ClaimState::Consumed => ClaimOutcome::Consumed(prev),
                ClaimState::Held if prev.holder.same_session(holder) => {
                    ClaimOutcome::AlreadyHeld(prev)
                }
                ClaimState::Held if now_ms < prev.lapse_at_ms => ClaimOutcome::Busy(prev),
                ClaimState::Held => {
                    let now = retake(tx, &prev, holder, now_ms, lapse_at_ms, 1)?;
                    ClaimOutcome::TakenOver {
                        previous: prev,
                        now,
                    }
                }
                ClaimState::Released => {
                    ClaimOutcome::Taken(retake(tx, &prev, holder, now_ms, lapse_at_ms, 0)?)
                }
            };
            Ok(outcome)
        })
    }

    /// Evidence of a run on this checkpoint arrived: every held claim on
    /// it (any fingerprint) becomes consumed. Returns the records as they
    /// were just before, so the caller sees who held them and whether
    /// `now_ms > lapse_at_ms` (consumed after its lapse: the long-gate
    /// warning).
    /// `written_at_ms` is when the evidence's write passed the proxy: only
    /// claims taken by then are consumed, so a late write answering an
    /// earlier interrupt cannot consume the claim on a newer one.
    pub fn consume(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        evidence: &str,
        written_at_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        self.with_tx("consuming claims", |tx| {
            let consumed = consume_held(
                tx,
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                evidence,
                written_at_ms,
                now_ms,
            )?;
            self.lease_runs(tx, thread_id, &consumed, now_ms)?;
            Ok(consumed)
        })
    }

    /// Counts one refused reader on `key` (no-op if the row is gone).
    pub fn note_refusal(&self, key: &ClaimKey) -> Result<(), StoreError> {
        self.with_tx("counting a refusal", |tx| {
            tx.prepare_cached(&format!(
                "UPDATE claims SET refusals = refusals + 1 WHERE {KEY_MATCH}"
            ))?
            .execute(key_params(key).as_slice())?;
            Ok(())
        })
    }

    /// Progress short of an answer (e.g. the bare form's run-level
    /// `__resume__` write, which may precede the node's effect): held
    /// claims on the checkpoint stay held, record `evidence`, and lapse no
    /// earlier than `now_ms + hold_ms`. Lets the caller keep a live run's
    /// claim until its task writes or next checkpoint consume it, while a
    /// holder that dies mid-gate still lapses. Returns the updated records.
    pub fn note_progress(
        &self,
        (thread_id, checkpoint_ns, checkpoint_id): (&str, &str, &str),
        evidence: &str,
        written_at_ms: i64,
        now_ms: i64,
        hold_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let until = now_ms.saturating_add(hold_ms.max(0));
        self.with_tx("noting progress", |tx| {
            tx.prepare_cached(&format!(
                "UPDATE claims SET evidence = ?4, lapse_at_ms = max(lapse_at_ms, ?5) \
                 WHERE {CHECKPOINT_MATCH} AND state = 'held' AND claimed_at_ms <= ?6"
            ))?
            .execute(params![
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                evidence,
                until,
                written_at_ms
            ])?;
            select_where(
                tx,
                &format!("{CHECKPOINT_MATCH} AND state = 'held'"),
                &[&thread_id, &checkpoint_ns, &checkpoint_id],
            )
        })
    }

    /// The holder's connection closed: its held claims lapse, and its run
    /// leases end, no later than `now_ms + grace_ms`, so a crash mid-gate
    /// or mid-run frees the thread sooner. Returns the claim records whose
    /// lapse was shortened.
    pub fn holder_gone(
        &self,
        proxy_id: &str,
        session_id: u64,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let until = now_ms.saturating_add(grace_ms.max(0));
        self.with_tx("ending a holder's claims", |tx| {
            let filter =
                "proxy_id = ?1 AND session_id = ?2 AND state = 'held' AND lapse_at_ms > ?3";
            let mut shortened =
                select_where(tx, filter, &[&proxy_id, &(session_id as i64), &until])?;
            tx.prepare_cached(&format!(
                "UPDATE claims SET lapse_at_ms = ?3 WHERE {filter}"
            ))?
            .execute(params![proxy_id, session_id as i64, until])?;
            tx.prepare_cached(
                "UPDATE run_leases SET until_ms = ?3 \
                 WHERE proxy_id = ?1 AND session_id = ?2 AND until_ms > ?3",
            )?
            .execute(params![proxy_id, session_id as i64, until])?;
            for r in &mut shortened {
                r.lapse_at_ms = until;
            }
            Ok(shortened)
        })
    }

    /// The thread put a checkpoint whose parent is `parent_checkpoint_id`:
    /// held claims on the parent are consumed ([`NEXT_CHECKPOINT`]) and
    /// returned as they were before. The parent's rows are marked
    /// superseded and deleted after the superseded grace; finished rows
    /// anywhere older than the retention are purged.
    pub fn move_on(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        parent_checkpoint_id: &str,
        now_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let superseded_cutoff = now_ms.saturating_sub(self.superseded_grace_ms);
        let retain_cutoff = now_ms.saturating_sub(self.retain_ms);
        self.with_tx("moving claims on", |tx| {
            let consumed = consume_held(
                tx,
                thread_id,
                checkpoint_ns,
                parent_checkpoint_id,
                NEXT_CHECKPOINT,
                // The thread moved on: every claim on the parent is done.
                i64::MAX,
                now_ms,
            )?;
            self.lease_runs(tx, thread_id, &consumed, now_ms)?;
            tx.prepare_cached(&format!(
                "UPDATE claims SET superseded_at_ms = ?4 \
                 WHERE {CHECKPOINT_MATCH} AND superseded_at_ms IS NULL"
            ))?
            .execute(params![
                thread_id,
                checkpoint_ns,
                parent_checkpoint_id,
                now_ms
            ])?;
            tx.prepare_cached("DELETE FROM claims WHERE superseded_at_ms < ?1")?
                .execute([superseded_cutoff])?;
            purge_before(tx, retain_cutoff)?;
            Ok(consumed)
        })
    }

    /// Deletes finished rows older than `older_than_ms` (an absolute time):
    /// consumed rows by consumption time, released and held rows by lapse
    /// time (a held row lapsed that long ago has no live holder; the next
    /// reader takes it afresh), superseded rows by supersession time.
    /// Returns the number of rows deleted.
    pub fn purge(&self, older_than_ms: i64) -> Result<usize, StoreError> {
        self.with_tx("purging claims", |tx| {
            let superseded = tx
                .prepare_cached("DELETE FROM claims WHERE superseded_at_ms < ?1")?
                .execute([older_than_ms])?;
            Ok(superseded + purge_before(tx, older_than_ms)?)
        })
    }

    /// The thread was deleted (`delete_thread`): all its claims and its
    /// run leases go.
    pub fn forget_thread(&self, thread_id: &str) -> Result<usize, StoreError> {
        self.with_tx("forgetting a thread", |tx| {
            tx.prepare_cached("DELETE FROM run_leases WHERE thread_id = ?1")?
                .execute([thread_id])?;
            tx.prepare_cached("DELETE FROM claims WHERE thread_id = ?1")?
                .execute([thread_id])
        })
    }

    /// The live run lease on a namespace of a thread, if any.
    pub fn run_lease(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        now_ms: i64,
    ) -> Result<Option<RunLease>, StoreError> {
        self.with_tx_as("reading a run lease", TransactionBehavior::Deferred, |tx| {
            tx.prepare_cached(
                "SELECT thread_id, checkpoint_ns, answered_checkpoint_id, fingerprint, proxy_id, \
                 session_id, client_addr, application_name, answered_at_ms, last_write_ms, until_ms \
                 FROM run_leases WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND until_ms > ?3",
            )?
            .query_row(params![thread_id, checkpoint_ns, now_ms], |r| {
                Ok(RunLease {
                    thread_id: r.get(0)?,
                    checkpoint_ns: r.get(1)?,
                    answered_checkpoint_id: r.get(2)?,
                    fingerprint: r.get(3)?,
                    holder: holder_at(r, 4)?,
                    answered_at_ms: r.get(8)?,
                    last_write_ms: r.get(9)?,
                    until_ms: r.get(10)?,
                })
            })
            .optional()
        })
    }

    /// A write of the thread arrived: claims it just consumed start a run
    /// lease held by their holder, and the thread's live leases last
    /// `run_lease_ms` past this write.
    fn lease_runs(
        &self,
        tx: &Transaction<'_>,
        thread_id: &str,
        consumed: &[ClaimRecord],
        now_ms: i64,
    ) -> rusqlite::Result<()> {
        if self.run_lease_ms == 0 {
            return Ok(());
        }
        let until = now_ms.saturating_add(self.run_lease_ms);
        for c in consumed {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO run_leases (thread_id, checkpoint_ns, \
                 answered_checkpoint_id, fingerprint, proxy_id, session_id, client_addr, \
                 application_name, answered_at_ms, last_write_ms, until_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)",
            )?
            .execute(params![
                c.key.thread_id,
                c.key.checkpoint_ns,
                c.key.checkpoint_id,
                c.key.fingerprint,
                c.holder.proxy_id,
                c.holder.session_id as i64,
                c.holder.client_addr,
                c.holder.application_name,
                now_ms,
                until
            ])?;
        }
        tx.prepare_cached(
            "UPDATE run_leases SET last_write_ms = ?2, until_ms = max(until_ms, ?3) \
             WHERE thread_id = ?1 AND until_ms > ?2",
        )?
        .execute(params![thread_id, now_ms, until])?;
        Ok(())
    }

    /// Claims of one thread, or all, ordered by thread, namespace and time.
    pub fn list(&self, thread_id: Option<&str>) -> Result<Vec<ClaimRecord>, StoreError> {
        self.with_tx("listing claims", |tx| {
            select_where(tx, "?1 IS NULL OR thread_id = ?1", &[&thread_id])
        })
    }

    /// One claim by key.
    pub fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        self.with_tx("reading a claim", |tx| select_key(tx, key))
    }

    /// Operator release: held claims of the thread (optionally of one
    /// checkpoint) become released; the next reader takes them afresh.
    pub fn release(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<usize, StoreError> {
        self.with_tx("releasing claims", |tx| {
            tx.prepare_cached(
                "UPDATE claims SET state = 'released' WHERE thread_id = ?1 \
                 AND state = 'held' AND (?2 IS NULL OR checkpoint_id = ?2)",
            )?
            .execute(params![thread_id, checkpoint_id])
        })
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction, committed on success.
    fn with_tx<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.with_tx_as(op, TransactionBehavior::Immediate, f)
    }

    /// [`ClaimStore::with_tx`] with another locking behaviour: `Deferred`
    /// for a read, which then takes no write lock other processes wait on.
    fn with_tx_as<T>(
        &self,
        op: &'static str,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let err = |e: rusqlite::Error| StoreError::Sqlite {
            path: self.path.clone(),
            op,
            reason: describe(&e),
        };
        // A panic elsewhere cannot leave a half-done transaction behind:
        // dropping a `Transaction` rolls it back, so the connection is sound.
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = conn.transaction_with_behavior(behavior).map_err(err)?;
        let out = f(&tx).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(out)
    }
}

/// SQLite's text, with the busy case spelled out.
fn describe(e: &rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => format!(
            "{e} (still locked by another process after {} ms)",
            BUSY_TIMEOUT.as_millis()
        ),
        _ => e.to_string(),
    }
}

fn key_params(key: &ClaimKey) -> [&dyn ToSql; 4] {
    [
        &key.thread_id,
        &key.checkpoint_ns,
        &key.checkpoint_id,
        &key.fingerprint,
    ]
}

fn select_key(tx: &Transaction<'_>, key: &ClaimKey) -> rusqlite::Result<Option<ClaimRecord>> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM claims WHERE {KEY_MATCH}"))?
        .query_row(key_params(key).as_slice(), record)
        .optional()
}

fn select_where(
    tx: &Transaction<'_>,
    filter: &str,
    args: &[&dyn ToSql],
) -> rusqlite::Result<Vec<ClaimRecord>> {
    tx.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM claims WHERE {filter} \
         ORDER BY thread_id, checkpoint_ns, claimed_at_ms, checkpoint_id, fingerprint"
    ))?
    .query_map(args, record)?
    .collect()
}

/// Hands `prev`'s row to `holder` as a fresh held claim.
fn retake(
    tx: &Transaction<'_>,
    prev: &ClaimRecord,
    holder: &Holder,
    now_ms: i64,
    lapse_at_ms: i64,
    takeover: i64,
) -> rusqlite::Result<ClaimRecord> {
    tx.prepare_cached(&format!(
        "UPDATE claims SET state = 'held', proxy_id = ?5, session_id = ?6, client_addr = ?7, \
         application_name = ?8, claimed_at_ms = ?9, lapse_at_ms = ?10, consumed_at_ms = NULL, \
         evidence = NULL, takeovers = takeovers + ?11 WHERE {KEY_MATCH}"
    ))?
    .execute(params![
        prev.key.thread_id,
        prev.key.checkpoint_ns,
        prev.key.checkpoint_id,
        prev.key.fingerprint,
        holder.proxy_id,
        holder.session_id as i64,
        holder.client_addr,
        holder.application_name,
        now_ms,
        lapse_at_ms,
        takeover,
    ])?;
    Ok(ClaimRecord {
        key: prev.key.clone(),
        holder: holder.clone(),
        state: ClaimState::Held,
        claimed_at_ms: now_ms,
        lapse_at_ms,
        consumed_at_ms: None,
        evidence: None,
        refusals: prev.refusals,
        takeovers: prev.takeovers + takeover,
    })
}

fn consume_held(
    tx: &Transaction<'_>,
    thread_id: &str,
    checkpoint_ns: &str,
    checkpoint_id: &str,
    evidence: &str,
    taken_by_ms: i64,
    now_ms: i64,
) -> rusqlite::Result<Vec<ClaimRecord>> {
    let held = select_where(
        tx,
        &format!("{CHECKPOINT_MATCH} AND state = 'held' AND claimed_at_ms <= ?4"),
        &[&thread_id, &checkpoint_ns, &checkpoint_id, &taken_by_ms],
    )?;
    if !held.is_empty() {
        tx.prepare_cached(&format!(
            "UPDATE claims SET state = 'consumed', consumed_at_ms = ?4, evidence = ?5 \
             WHERE {CHECKPOINT_MATCH} AND state = 'held' AND claimed_at_ms <= ?6"
        ))?
        .execute(params![
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            now_ms,
            evidence,
            taken_by_ms
        ])?;
    }
    Ok(held)
}

fn purge_before(tx: &Transaction<'_>, cutoff: i64) -> rusqlite::Result<usize> {
    // Run leases ended by then go too; they are not claims, so not counted.
    tx.prepare_cached("DELETE FROM run_leases WHERE until_ms < ?1")?
        .execute([cutoff])?;
    let consumed = tx
        .prepare_cached("DELETE FROM claims WHERE consumed_at_ms < ?1 AND state = 'consumed'")?
        .execute([cutoff])?;
    let stale = tx
        .prepare_cached(
            "DELETE FROM claims WHERE lapse_at_ms < ?1 AND state IN ('held', 'released')",
        )?
        .execute([cutoff])?;
    Ok(consumed + stale)
}

/// The four holder columns (proxy_id, session_id, client_addr,
/// application_name) starting at column `first`.
fn holder_at(r: &Row<'_>, first: usize) -> rusqlite::Result<Holder> {
    Ok(Holder {
        proxy_id: r.get(first)?,
        // Stored as the same 64 bits in SQLite's signed INTEGER.
        session_id: r.get::<_, i64>(first + 1)? as u64,
        client_addr: r.get(first + 2)?,
        application_name: r.get(first + 3)?,
    })
}

fn record(r: &Row<'_>) -> rusqlite::Result<ClaimRecord> {
    let state: String = r.get(4)?;
    let state = ClaimState::parse(&state).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            format!("unknown claim state {state:?}").into(),
        )
    })?;
    Ok(ClaimRecord {
        key: ClaimKey {
            thread_id: r.get(0)?,
            checkpoint_ns: r.get(1)?,
            checkpoint_id: r.get(2)?,
            fingerprint: r.get(3)?,
        },
        holder: holder_at(r, 5)?,
        state,
        claimed_at_ms: r.get(9)?,
        lapse_at_ms: r.get(10)?,
        consumed_at_ms: r.get(11)?,
        evidence: r.get(12)?,
        refusals: r.get(13)?,
        takeovers: r.get(14)?,
    })
}
