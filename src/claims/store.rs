//! The claim store: the claims of one SQLite file shared by every proxy
//! replica in front of the same database.
//!
//! Each operation is one `BEGIN IMMEDIATE` transaction: the write lock is
//! taken before the row is read, so two processes racing for one interrupt
//! serialize on the file and exactly one sees no live claim. Replicas must
//! share the file on one host (or a local volume mounted by several
//! containers of one host): WAL needs shared memory, which network file
//! systems do not give. The file itself (opening, identity) is
//! `claims::file`; run leases are `claims::leases`.
//!
//! Time is this host's wall clock, read by the store as it decides
//! (`claims::clock`: one host, one clock); tests give a fixed instant
//! instead, so they never sleep.

use std::path::Path;
use std::sync::Arc;

use rusqlite::{params, Transaction, TransactionBehavior};

use super::clock::{Now, WrittenAt};
use super::error::StoreError;
use super::file::{OpenMode, StoreFile};
use super::leases::{drop_thread_leases, end_holder_leases, live_lease};
use super::model::{ClaimKey, ClaimRecord, ClaimState, Holder};
use super::outcome::{decide_existing, ClaimOutcome};
use super::rows::{key_params, select_key, select_where, CHECKPOINT_MATCH, COLUMNS, KEY_MATCH};
use crate::config::live::{ClaimsTimings, LiveClaimsTimings};

/// Default retention of finished rows (consumed, released, long-lapsed):
/// long enough that a thread parked for hours still refuses a stray
/// duplicate of an answered interrupt.
pub const DEFAULT_RETAIN_MS: i64 = 24 * 60 * 60 * 1000;

/// Default time rows on a superseded checkpoint are kept after the thread
/// moved on: racers that read the parked head just before the move still
/// find the consumed claim and are refused. Past it a row counts as gone
/// (a reader of that checkpoint as head claims it afresh) even before a
/// purge deletes it.
pub const DEFAULT_SUPERSEDED_GRACE_MS: i64 = 60 * 1000;

/// Default run lease: how long after the answering run's latest write
/// another session's read of a thread head with tasks still to run is
/// refused (it would run the same tasks again).
pub const DEFAULT_RUN_LEASE_MS: i64 = 10 * 1000;

/// Evidence recorded when a newer checkpoint consumes held claims.
pub const NEXT_CHECKPOINT: &str = "next checkpoint";

/// Handle on the shared claim file, one per proxy process.
///
/// `Send + Sync`: one connection behind a mutex, shared in an `Arc` by the
/// session threads and the evidence worker; calls may block up to
/// [`super::BUSY_TIMEOUT`] on another process.
/// Not `Clone`: two handles in one process would only contend on the file.
pub struct SqliteClaims {
    file: StoreFile,
    retain_ms: i64,
    superseded_grace_ms: i64,
    /// The run lease is read here at each write (a reload may change it).
    timings: Arc<LiveClaimsTimings>,
}

impl std::fmt::Debug for SqliteClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteClaims")
            .field("path", &self.path())
            .field("retain_ms", &self.retain_ms)
            .field("superseded_grace_ms", &self.superseded_grace_ms)
            .field("timings", &self.timings.current())
            .finish()
    }
}

impl SqliteClaims {
    /// Opens (creating if needed) the claim file at `path` in WAL mode and
    /// creates the schema and the file's identity. Fails at once if it
    /// cannot.
    pub fn open(path: &Path) -> Result<SqliteClaims, StoreError> {
        StoreFile::open(path, OpenMode::Create).map(SqliteClaims::on)
    }

    /// Opens an existing claim file (operator commands: a mistyped path
    /// must not start a new store beside the replicas' one).
    pub fn open_existing(path: &Path) -> Result<SqliteClaims, StoreError> {
        StoreFile::open(path, OpenMode::Existing).map(SqliteClaims::on)
    }

    /// The proxy's store: opened now if it can be; otherwise every
    /// operation fails with the open error (reads of parked heads are
    /// refused) and opening is retried on use, with backoff, until it
    /// works. Once open, an operation fails while the path does not hold
    /// the file this process opened (removed, replaced, overwritten).
    pub fn connect(path: &Path) -> SqliteClaims {
        SqliteClaims::on(StoreFile::connect(path))
    }

    fn on(file: StoreFile) -> SqliteClaims {
        SqliteClaims {
            file,
            retain_ms: DEFAULT_RETAIN_MS,
            superseded_grace_ms: DEFAULT_SUPERSEDED_GRACE_MS,
            timings: LiveClaimsTimings::new(ClaimsTimings::default()),
        }
    }

    /// Sets how long consumed, released and long-lapsed rows are kept
    /// before [`SqliteClaims::move_on`] deletes them.
    #[cfg(test)]
    pub fn with_retention(mut self, retain_ms: i64) -> SqliteClaims {
        self.retain_ms = retain_ms.max(0);
        self
    }

    /// Sets how long rows on a superseded checkpoint are kept.
    pub fn with_superseded_grace(mut self, grace_ms: i64) -> SqliteClaims {
        self.superseded_grace_ms = grace_ms.max(0);
        self
    }

    /// Reads the run lease from `timings` at each write: the proxy's
    /// handle, which a reload updates.
    pub fn with_timings(mut self, timings: Arc<LiveClaimsTimings>) -> SqliteClaims {
        self.timings = timings;
        self
    }

    /// Sets the run lease (0: no leases; answered threads are not guarded
    /// after their parked head is gone) in a handle of its own.
    #[cfg(test)]
    pub fn with_run_lease(self, lease_ms: i64) -> SqliteClaims {
        let timings = self.timings.changed(|t| t.run_lease_ms = lease_ms.max(0));
        self.with_timings(timings)
    }

    /// The run lease in effect now (0: none).
    pub(super) fn run_lease_ms(&self) -> i64 {
        self.timings.current().run_lease_ms
    }

    /// The file this store lives in, as shown in errors.
    pub fn path(&self) -> &str {
        self.file.shown()
    }

    /// A reader of a parked head asks for the interrupt `key`. A new claim
    /// lapses `lapse_ms` after now unless evidence consumes it. Returns
    /// the outcome and the time it was decided at.
    pub fn try_claim(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now: Now,
        lapse_ms: i64,
    ) -> Result<(ClaimOutcome, i64), StoreError> {
        let now_ms = now.on_this_host();
        let lapse_at_ms = now_ms.saturating_add(lapse_ms.max(0));
        let superseded_cutoff = now_ms.saturating_sub(self.superseded_grace_ms);
        self.with_tx("taking a claim", |tx| {
            // A row on a checkpoint superseded longer than the grace ago
            // is as good as purged: the thread was rewound to it.
            let found = select_key(tx, key)?;
            // A stale row's generation still counts: epochs never go back.
            let epoch = found.as_ref().map_or(0, |p| p.epoch).saturating_add(1);
            let prev = found.filter(|p| p.superseded_at_ms.is_none_or(|at| at > superseded_cutoff));
            let Some(prev) = prev else {
                tx.prepare_cached(&format!(
                    "INSERT OR REPLACE INTO claims ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, 'held', \
                     ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL, 0, 0, NULL, NULL, ?11)"
                ))?
                .execute(params![
                    key.at.thread_id,
                    key.at.checkpoint_ns,
                    key.at.checkpoint_id,
                    key.fingerprint,
                    holder.proxy_id,
                    holder.session_id as i64,
                    holder.client_addr,
                    holder.application_name,
                    now_ms,
                    lapse_at_ms,
                    epoch,
                ])?;
                return Ok((
                    ClaimOutcome::Taken(ClaimRecord::taken(
                        key,
                        holder,
                        now_ms,
                        lapse_at_ms,
                        epoch,
                    )),
                    now_ms,
                ));
            };
            // Whether the answering run still writes: asked only of a consumed row.
            let writing = prev.state == ClaimState::Consumed
                && self.run_lease_ms() > 0
                && live_lease(tx, &key.at.thread_id, &key.at.checkpoint_ns, now_ms)?.is_some();
            let outcome = decide_existing(prev, holder, now_ms, writing, |prev, takeovers| {
                retake(tx, prev, holder, now_ms, lapse_at_ms, takeovers)
            })?;
            Ok((outcome, now_ms))
        })
    }

    /// Evidence of a run on this checkpoint arrived: every held claim on
    /// it (any fingerprint) becomes consumed. Returns the records as they
    /// were just before, with the time of their consumption, so the caller
    /// sees who held them and whether they were consumed after their lapse
    /// (the long-gate warning).
    /// `written_at` is when the evidence's write passed the proxy: only
    /// claims taken by then are consumed, so a late write answering an
    /// earlier interrupt cannot consume the claim on a newer one.
    pub fn consume(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        evidence: &str,
        written_at: WrittenAt,
        now: Now,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let now_ms = now.on_this_host();
        let written_at_ms = written_at.on_this_host(now_ms);
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
    /// earlier than `hold_ms` from now. Lets the caller keep a live run's
    /// claim until its task writes or next checkpoint consume it, while a
    /// holder that dies mid-gate still lapses. Returns the updated records.
    pub fn note_progress(
        &self,
        (thread_id, checkpoint_ns, checkpoint_id): (&str, &str, &str),
        evidence: &str,
        written_at: WrittenAt,
        now: Now,
        hold_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let now_ms = now.on_this_host();
        let written_at_ms = written_at.on_this_host(now_ms);
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
    /// leases end, no later than `grace_ms` from now, so a crash mid-gate
    /// or mid-run frees the thread sooner; from then on its held and
    /// consumed claims count as abandoned by it
    /// ([`ClaimRecord::is_abandoned`]). Returns the claim records whose
    /// lapse was shortened.
    pub fn holder_gone(
        &self,
        proxy_id: &str,
        session_id: u64,
        now: Now,
        grace_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let until = now.on_this_host().saturating_add(grace_ms.max(0));
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
                "UPDATE claims SET abandon_at_ms = ?3 WHERE proxy_id = ?1 AND session_id = ?2 \
                 AND state IN ('held', 'consumed') AND abandon_at_ms IS NULL",
            )?
            .execute(params![proxy_id, session_id as i64, until])?;
            end_holder_leases(tx, proxy_id, session_id, until)?;
            for r in &mut shortened {
                r.lapse_at_ms = until;
                r.abandon_at_ms = Some(r.abandon_at_ms.unwrap_or(until));
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
        now: Now,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let now_ms = now.on_this_host();
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
            drop_thread_leases(tx, thread_id, None)?;
            tx.prepare_cached("DELETE FROM claims WHERE thread_id = ?1")?
                .execute([thread_id])
        })
    }

    /// Claims of one thread, or all, ordered by thread, namespace and time.
    pub fn list(&self, thread_id: Option<&str>) -> Result<Vec<ClaimRecord>, StoreError> {
        self.with_tx("listing claims", |tx| {
            select_where(tx, "?1 IS NULL OR thread_id = ?1", &[&thread_id])
        })
    }

    /// The claim whose holder may continue this checkpoint: its
    /// latest-generation held or consumed claim, any fingerprint (the most
    /// recently claimed one, then the highest epoch). `None` when the
    /// checkpoint has no such claim (never claimed, released, purged).
    /// A read: takes no write lock. With the time it was read at.
    pub fn current_holder(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        now: Now,
    ) -> Result<(Option<ClaimRecord>, i64), StoreError> {
        let now_ms = now.on_this_host();
        self.with_tx_as(
            "reading a checkpoint's holder",
            TransactionBehavior::Deferred,
            |tx| {
                let mut live = select_where(
                    tx,
                    &format!("{CHECKPOINT_MATCH} AND state IN ('held', 'consumed')"),
                    &[&thread_id, &checkpoint_ns, &checkpoint_id],
                )?;
                live.sort_by_key(|r| (r.claimed_at_ms, r.epoch));
                Ok((live.pop(), now_ms))
            },
        )
    }

    /// One claim by key.
    pub fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        self.with_tx("reading a claim", |tx| select_key(tx, key))
    }

    /// Operator release: held claims of the thread (optionally of one
    /// checkpoint) become released, and so do consumed claims on a
    /// checkpoint the thread never moved on from (its answering run died
    /// before its next checkpoint: without a release the thread is refused
    /// until that run's holder counts as gone). The next reader takes them
    /// afresh. Without `checkpoint_id`, an interrupt whose run went on
    /// stays consumed; naming the checkpoint releases its consumed claims
    /// even so (the operator rewound the thread to it). Returns the number
    /// of claims released.
    pub fn release(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<usize, StoreError> {
        self.with_tx("releasing claims", |tx| {
            tx.prepare_cached(
                "UPDATE claims SET state = 'released', abandon_at_ms = NULL \
                 WHERE thread_id = ?1 AND (?2 IS NULL OR checkpoint_id = ?2) \
                 AND (state = 'held' OR (state = 'consumed' \
                      AND (superseded_at_ms IS NULL OR ?2 IS NOT NULL)))",
            )?
            .execute(params![thread_id, checkpoint_id])
        })
    }

    /// Keeps generation `epoch` of `key` from lapsing, or from counting as
    /// abandoned, for `cover_ms` from now: a held claim's lapse time and a
    /// consumed claim's abandonment time (when it has one) move up to then
    /// if they are earlier. Whether that generation is still the key's,
    /// held or consumed (false: it was taken over or released meanwhile).
    pub fn keep_for(
        &self,
        key: &ClaimKey,
        epoch: i64,
        now: Now,
        cover_ms: i64,
    ) -> Result<bool, StoreError> {
        let until_ms = now.on_this_host().saturating_add(cover_ms.max(0));
        self.with_tx("keeping a claim through a commit", |tx| {
            tx.prepare_cached(&format!(
                "UPDATE claims SET \
                 lapse_at_ms = CASE WHEN state = 'held' THEN max(lapse_at_ms, ?6) \
                     ELSE lapse_at_ms END, \
                 abandon_at_ms = CASE WHEN abandon_at_ms IS NULL THEN NULL \
                     ELSE max(abandon_at_ms, ?6) END \
                 WHERE {KEY_MATCH} AND epoch = ?5 AND state IN ('held', 'consumed')"
            ))?
            .execute(params![
                key.at.thread_id,
                key.at.checkpoint_ns,
                key.at.checkpoint_id,
                key.fingerprint,
                epoch,
                until_ms
            ])
            .map(|n| n == 1)
        })
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction, committed on success.
    fn with_tx<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.file.with_tx(op, TransactionBehavior::Immediate, f)
    }

    /// [`SqliteClaims::with_tx`] with another locking behaviour: `Deferred`
    /// for a read, which then takes no write lock other processes wait on.
    pub(super) fn with_tx_as<T>(
        &self,
        op: &'static str,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.file.with_tx(op, behavior, f)
    }
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
         evidence = NULL, takeovers = takeovers + ?11, abandon_at_ms = NULL, \
         epoch = epoch + 1 WHERE {KEY_MATCH}"
    ))?
    .execute(params![
        prev.key.at.thread_id,
        prev.key.at.checkpoint_ns,
        prev.key.at.checkpoint_id,
        prev.key.fingerprint,
        holder.proxy_id,
        holder.session_id as i64,
        holder.client_addr,
        holder.application_name,
        now_ms,
        lapse_at_ms,
        takeover,
    ])?;
    Ok(prev.retaken(holder, now_ms, lapse_at_ms, takeover))
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
    Ok(held
        .into_iter()
        .map(|r| ClaimRecord {
            consumed_at_ms: Some(now_ms),
            ..r
        })
        .collect())
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
