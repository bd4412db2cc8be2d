//! The claim store: the claims of every proxy replica in one PostgreSQL
//! schema, each rule written once, in SQL. A decision on the data path or of
//! the evidence worker is one prepared statement calling a function of
//! the schema (`schema`), in autocommit: one round trip, no BEGIN or
//! COMMIT, and a row is locked only while the server runs it, never
//! across a round trip. Operator commands keep short transactions.
//!
//! Racers serialize on the claim's row: a first reader inserts it
//! (`INSERT … ON CONFLICT DO NOTHING`, which waits for a concurrent
//! inserter's commit), every later one locks it (`SELECT … FOR UPDATE`)
//! and decides on the committed row. Nothing is held between operations,
//! so the claims leg's wait loop holds no lock. A decision that could
//! hand a claim over first marks the thread's claims of proxy processes
//! that are gone (`liveness`).

use std::sync::Arc;

use super::conn::{Fail, PgConn, Role, Tx};
use super::evidence_batch::{EvidenceItem, WriteEvidence};
use super::fault::StartFault;
use super::leases::{last_lease, live_lease};
use super::rows::{key_params, select_key, select_where, CHECKPOINT_MATCH, COLUMNS, KEY_MATCH};
use super::thread_lock::THREAD_CLASS;
use crate::claims::clock::{Now, WrittenAt};
use crate::claims::error::StoreError;
use crate::claims::model::{ClaimKey, ClaimRecord, Holder, RunLease};
use crate::claims::outcome::ClaimOutcome;
use crate::claims::timings::{ClaimsTimings, LiveClaimsTimings};
use crate::pg::{PgTarget, SchemaMigrations};
use crate::saver::checkpoint_ref::CheckpointRef;

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

/// Evidence recorded when a newer checkpoint consumes held claims.
pub const NEXT_CHECKPOINT: &str = "next checkpoint";

/// Handle on the shared claims, one per proxy process (`Send + Sync`,
/// shared in an `Arc` by session threads and the evidence worker).
pub struct ClaimStore {
    conn: Arc<PgConn>,
    retain_ms: i64,
    superseded_grace_ms: i64,
    /// The run lease and the grace of holders whose process is gone, read
    /// here at each decision (a reload may change them).
    timings: Arc<LiveClaimsTimings>,
}

impl std::fmt::Debug for ClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStore")
            .field("at", &self.conn.target.shown())
            .field("timings", &self.timings.current())
            .finish()
    }
}

impl ClaimStore {
    /// The proxy's store: connected (the shared schema created or
    /// upgraded with `migrations`, liveness lock taken) now if it can be;
    /// otherwise every operation fails and connecting is retried on use,
    /// with backoff.
    pub fn connect(target: PgTarget, migrations: SchemaMigrations) -> ClaimStore {
        ClaimStore::on(PgConn::connect(target, Role::Proxy(migrations)))
    }

    /// The proxy's store, connected now or an error (tests).
    pub fn open(target: PgTarget, migrations: SchemaMigrations) -> Result<ClaimStore, StoreError> {
        PgConn::open_now(target, Role::Proxy(migrations)).map(ClaimStore::on)
    }

    /// Operator commands: the schema must exist; no liveness lock.
    pub fn open_existing(target: PgTarget) -> Result<ClaimStore, StoreError> {
        PgConn::open_now(target, Role::Operator).map(ClaimStore::on)
    }

    fn on(conn: Arc<PgConn>) -> ClaimStore {
        ClaimStore {
            conn,
            retain_ms: DEFAULT_RETAIN_MS,
            superseded_grace_ms: DEFAULT_SUPERSEDED_GRACE_MS,
            timings: LiveClaimsTimings::new(ClaimsTimings::default()),
        }
    }

    #[cfg(test)]
    pub fn with_retention(mut self, retain_ms: i64) -> ClaimStore {
        self.retain_ms = retain_ms.max(0);
        self
    }

    /// Sets how long rows on a superseded checkpoint are kept (tests).
    #[cfg(test)]
    pub fn with_superseded_grace(mut self, grace_ms: i64) -> ClaimStore {
        self.superseded_grace_ms = grace_ms.max(0);
        self
    }

    /// Reads the run lease and the grace of holders whose process is gone
    /// from `timings` at each decision: the proxy's handle, which a reload
    /// updates.
    pub fn with_timings(mut self, timings: Arc<LiveClaimsTimings>) -> ClaimStore {
        self.timings = timings;
        self
    }

    /// Sets the run lease in a handle of its own.
    #[cfg(test)]
    pub fn with_run_lease(self, lease_ms: i64) -> ClaimStore {
        let timings = self.timings.changed(|t| t.run_lease_ms = lease_ms.max(0));
        self.with_timings(timings)
    }

    /// Sets the grace given to holders whose proxy process is gone, in a
    /// handle of its own.
    #[cfg(test)]
    pub fn with_holder_gone_grace(self, grace_ms: i64) -> ClaimStore {
        let timings = self
            .timings
            .changed(|t| t.holder_gone_grace_ms = grace_ms.max(0));
        self.with_timings(timings)
    }

    /// The run lease in effect now (0: none).
    fn run_lease_ms(&self) -> i64 {
        self.timings.current().run_lease_ms
    }

    /// The database, as shown in errors.
    pub fn shown(&self) -> &str {
        self.conn.target.shown()
    }

    /// Whether this process's holders still count as alive for the other
    /// proxies (its liveness lock confirmed, the store reachable).
    pub fn live(&self) -> bool {
        self.conn.live()
    }

    /// Why the first connect failed, if it did; with a fix when no retry
    /// mends it (`serve` stops on those).
    pub fn start_fault(&self) -> Option<StartFault> {
        self.conn.start_fault()
    }

    /// This process's liveness instance id, once connected.
    pub fn instance(&self) -> Option<i64> {
        self.conn.instance()
    }

    /// One statement, `<schema>.claim(...)`: the server takes, reads or
    /// hands over the row and decides on its clock (see `db_clock`).
    pub fn try_claim(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now: impl Into<Now>,
        lapse_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.try_claim_timed(key, holder, now, lapse_ms)
            .map(|(outcome, _)| outcome)
    }

    /// [`ClaimStore::try_claim`], with the server's clock when it decided
    /// (ms since the Unix epoch): what the caller's local waits measure
    /// the record's times against.
    pub fn try_claim_timed(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now: impl Into<Now>,
        lapse_ms: i64,
    ) -> Result<(ClaimOutcome, i64), StoreError> {
        let now = now.into();
        let gone_grace_ms = self.timings.current().holder_gone_grace_ms;
        let lease_ms = self.run_lease_ms();
        self.on_clock("taking a claim", now, |tx| {
            let rows = self.claim_call(
                tx,
                "claim",
                (key, holder, lapse_ms),
                &[&gone_grace_ms, &lease_ms],
            )?;
            match rows.first() {
                Some(r) => Ok((outcome_of(&rows)?, r.try_get(19)?)),
                None => Err(Fail("the claim function returned no outcome".into())),
            }
        })
    }

    /// A claim's first step alone, `<schema>.claim_first(...)`: the claim
    /// if a first reader takes it or `holder` already holds it (with the
    /// server's clock when it decided), else `None` and nothing changed.
    pub fn try_claim_first(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now: impl Into<Now>,
        lapse_ms: i64,
    ) -> Result<Option<(ClaimOutcome, i64)>, StoreError> {
        self.on_clock("taking a free claim", now.into(), |tx| {
            let rows = self.claim_call(tx, "claim_first", (key, holder, lapse_ms), &[])?;
            match rows.first() {
                Some(r) => Ok(Some((outcome_of(&rows)?, r.try_get(19)?))),
                None => Ok(None),
            }
        })
    }

    /// Calls the claim function `function` (`claim` or `claim_first`) for
    /// `key` and `holder`: the parameters both take, then `more`.
    fn claim_call(
        &self,
        tx: &mut Tx<'_>,
        function: &str,
        (key, holder, lapse_ms): (&ClaimKey, &Holder, i64),
        more: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, Fail> {
        let s = tx.schema;
        let mine = tx.instance;
        let session = holder.session_id as i64;
        let lapse_ms = lapse_ms.max(0);
        let mut params = key_params(key);
        params.extend_from_slice(&[
            &holder.proxy_id,
            &session,
            &holder.client_addr,
            &holder.application_name,
            &mine,
            &lapse_ms,
            &self.superseded_grace_ms,
        ]);
        params.extend_from_slice(more);
        let placeholders: Vec<String> = (1..=params.len()).map(|i| format!("${i}")).collect();
        Ok(tx.query(
            &format!(
                "SELECT {COLUMNS}, outcome, decided_at_ms FROM (SELECT (f.c).*, f.outcome, \
                 f.decided_at_ms FROM {s}.{function}({}) f) x",
                placeholders.join(", ")
            ),
            &params,
        )?)
    }

    /// Deletes the claim `holder` took on `key` at `epoch` if it still
    /// holds it there: a claim taken for a head that was not the one read
    /// (see `enforce::claim_ahead`), undone as if never taken. Whether it
    /// was there to delete.
    pub fn withdraw(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        epoch: i64,
    ) -> Result<bool, StoreError> {
        let session = holder.session_id as i64;
        self.conn
            .with_single("withdrawing a claim", |tx| {
                let s = tx.schema;
                let mut params = key_params(key);
                params.extend_from_slice(&[&holder.proxy_id, &session, &epoch]);
                tx.execute(
                    &format!(
                        "DELETE FROM {s}.claims WHERE {KEY_MATCH} AND state = 'held' \
                         AND proxy_id = $5 AND session_id = $6 AND epoch = $7"
                    ),
                    &params,
                )
                .map_err(Fail::from)
            })
            .map(|n| n == 1)
    }

    /// Runs one decision on the server's clock; in a test build, at the
    /// instant the test gave (`db_clock`'s test setting), if any.
    fn on_clock<T>(
        &self,
        op: &'static str,
        now: Now,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        self.conn.with_single(op, |tx| {
            #[cfg(test)]
            super::db_clock::hold_test_clock(tx, now)?;
            #[cfg(not(test))]
            let _ = now;
            f(tx)
        })
    }

    /// A task's write on a checkpoint: its held claims taken by the time
    /// the write passed are consumed (returned as they were).
    pub fn consume(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        evidence: &str,
        written_at: impl Into<WrittenAt>,
        now: impl Into<Now>,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let at = checkpoint(thread_id, checkpoint_ns, checkpoint_id);
        let item = EvidenceItem {
            kind: WriteEvidence::Consumed,
            at: &at,
            what: evidence,
            written_at: Some(written_at.into()),
        };
        self.apply_one(item, now)
    }

    pub fn note_refusal(&self, key: &ClaimKey) -> Result<(), StoreError> {
        self.conn.with_single("counting a refusal", |tx| {
            let s = tx.schema;
            tx.execute(
                &format!("UPDATE {s}.claims SET refusals = refusals + 1 WHERE {KEY_MATCH}"),
                &key_params(key),
            )?;
            Ok(())
        })
    }

    pub fn note_progress(
        &self,
        (thread_id, checkpoint_ns, checkpoint_id): (&str, &str, &str),
        evidence: &str,
        written_at: impl Into<WrittenAt>,
        now: impl Into<Now>,
        hold_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let (written_at, now) = (written_at.into(), now.into());
        self.on_clock("noting progress", now, |tx| {
            let s = tx.schema;
            records(tx.query(
                &format!("SELECT {COLUMNS} FROM {s}.note_progress($1, $2, $3, $4, $5, $6)"),
                &[
                    &thread_id,
                    &checkpoint_ns,
                    &checkpoint_id,
                    &evidence,
                    &hold_ms.max(0),
                    &written_at.ago_ms(now),
                ],
            )?)
        })
    }

    /// Evidence of several writes in one statement (see
    /// `evidence_batch`): each item applied as alone, in order; the claims
    /// consumed are returned with the index of the item that consumed them.
    pub fn apply_evidence(
        &self,
        items: &[EvidenceItem<'_>],
        now: impl Into<Now>,
        hold_ms: i64,
    ) -> Result<Vec<(usize, ClaimRecord)>, StoreError> {
        let now = now.into();
        let kinds: Vec<&str> = items.iter().map(|i| i.kind.sql_name()).collect();
        let threads: Vec<&str> = items.iter().map(|i| i.at.thread_id.as_str()).collect();
        let namespaces: Vec<&str> = items.iter().map(|i| i.at.checkpoint_ns.as_str()).collect();
        let checkpoints: Vec<&str> = items.iter().map(|i| i.at.checkpoint_id.as_str()).collect();
        let evidence: Vec<&str> = items.iter().map(|i| i.what).collect();
        self.on_clock("applying evidence", now, |tx| {
            let s = tx.schema;
            let ago: Vec<i64> = items
                .iter()
                .map(|i| {
                    i.written_at.map_or(0, |w| match i.kind {
                        WriteEvidence::Consumed => w.consumed_ago_ms(now),
                        _ => w.ago_ms(now),
                    })
                })
                .collect();
            let rows = tx.query(
                &format!(
                    "SELECT {COLUMNS}, item FROM (SELECT f.item, (f.claim).* FROM \
                     {s}.apply_evidence($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) f) x"
                ),
                &[
                    &kinds,
                    &threads,
                    &namespaces,
                    &checkpoints,
                    &evidence,
                    &ago,
                    &hold_ms.max(0),
                    &self.run_lease_ms(),
                    &self.superseded_grace_ms,
                    &self.retain_ms,
                ],
            )?;
            rows.iter()
                .map(|r| {
                    let item: i32 = r.try_get(18)?;
                    let index = usize::try_from(item)
                        .ok()
                        .and_then(|i| i.checked_sub(1))
                        .filter(|i| *i < items.len())
                        .ok_or_else(|| Fail(format!("apply_evidence named item {item}")))?;
                    Ok((index, super::rows::record(r)?))
                })
                .collect()
        })
    }

    pub fn holder_gone(
        &self,
        proxy_id: &str,
        session_id: u64,
        now: impl Into<Now>,
        grace_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let now = now.into();
        self.on_clock("ending a holder's claims", now, |tx| {
            let s = tx.schema;
            // Returned with their lapse shortened, abandoned from then.
            let mut shortened = records(tx.query(
                &format!("SELECT {COLUMNS} FROM {s}.holder_gone($1, $2, $3)"),
                &[&proxy_id, &(session_id as i64), &grace_ms.max(0)],
            )?)?;
            for r in &mut shortened {
                r.abandon_at_ms = Some(r.abandon_at_ms.unwrap_or(r.lapse_at_ms));
            }
            Ok(shortened)
        })
    }

    /// A checkpoint whose parent this is was written: the parent's claims
    /// are consumed (returned as they were) and superseded.
    pub fn move_on(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        parent_checkpoint_id: &str,
        now: impl Into<Now>,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let at = checkpoint(thread_id, checkpoint_ns, parent_checkpoint_id);
        let item = EvidenceItem {
            kind: WriteEvidence::MovedOn,
            at: &at,
            what: NEXT_CHECKPOINT,
            written_at: None,
        };
        self.apply_one(item, now)
    }

    /// One write's evidence, through the same statement as a gathered batch.
    fn apply_one(
        &self,
        item: EvidenceItem<'_>,
        now: impl Into<Now>,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let hold_ms = self.timings.current().progress_hold_ms;
        let consumed = self.apply_evidence(&[item], now, hold_ms)?;
        Ok(consumed.into_iter().map(|(_, record)| record).collect())
    }

    pub fn purge(&self, older_than_ms: i64) -> Result<usize, StoreError> {
        self.conn.with_tx("purging claims", |tx| {
            let s = tx.schema;
            let superseded = tx.execute(
                &format!("DELETE FROM {s}.claims WHERE superseded_at_ms < $1"),
                &[&older_than_ms],
            )?;
            Ok(superseded as usize + purge_before(tx, older_than_ms)?)
        })
    }

    pub fn forget_thread(&self, thread_id: &str) -> Result<usize, StoreError> {
        self.conn.with_tx("forgetting a thread", |tx| {
            let s = tx.schema;
            // The thread's lock first, as every writer of its claims and
            // leases takes it (see `thread_lock`).
            tx.execute(
                &format!("SELECT pg_advisory_xact_lock({THREAD_CLASS}, hashtext($1))"),
                &[&thread_id],
            )?;
            tx.execute(
                &format!("DELETE FROM {s}.run_leases WHERE thread_id = $1"),
                &[&thread_id],
            )?;
            let n = tx.execute(
                &format!("DELETE FROM {s}.claims WHERE thread_id = $1"),
                &[&thread_id],
            )?;
            Ok(n as usize)
        })
    }

    pub fn list(&self, thread_id: Option<&str>) -> Result<Vec<ClaimRecord>, StoreError> {
        self.conn.with_tx("listing claims", |tx| {
            select_where(tx, "$1::text IS NULL OR thread_id = $1", &[&thread_id])
        })
    }

    pub fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        self.conn
            .with_single("reading a claim", |tx| select_key(tx, key, false))
    }

    /// The latest-generation held or consumed claim on a checkpoint.
    pub fn current_holder(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
    ) -> Result<Option<ClaimRecord>, StoreError> {
        self.current_holder_timed(thread_id, checkpoint_ns, checkpoint_id, Now::STORE)
            .map(|(current, _)| current)
    }

    /// [`ClaimStore::current_holder`], with the server's clock when it was
    /// read.
    pub fn current_holder_timed(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        now: impl Into<Now>,
    ) -> Result<(Option<ClaimRecord>, i64), StoreError> {
        let now = now.into();
        self.on_clock("reading a checkpoint's holder", now, |tx| {
            let s = tx.schema;
            let rows = tx.query(
                &format!(
                    "SELECT c.*, {s}.clock_ms() FROM (SELECT 1) one LEFT JOIN LATERAL \
                     (SELECT {COLUMNS} FROM {s}.claims WHERE {CHECKPOINT_MATCH} \
                     AND state IN ('held', 'consumed') \
                     ORDER BY claimed_at_ms DESC, epoch DESC LIMIT 1) c ON true"
                ),
                &[&thread_id, &checkpoint_ns, &checkpoint_id],
            )?;
            let read_at: i64 = match rows.first() {
                Some(r) => r.try_get(18)?,
                None => return Err(Fail("the holder's read returned no clock".into())),
            };
            let current = match rows.first() {
                Some(r) if r.try_get::<_, Option<String>>(0)?.is_some() => {
                    Some(super::rows::record(r)?)
                }
                _ => None,
            };
            Ok((current, read_at))
        })
    }

    /// Keeps generation `epoch` of `key` from lapsing, or from counting as
    /// abandoned, for `cover_ms` from now on the server's clock: a held
    /// claim's lapse time and a consumed claim's abandonment time (when it
    /// has one) move up to then if they are earlier. Whether that
    /// generation is still the key's, held or consumed (false: it was
    /// taken over or released meanwhile).
    pub fn keep_for(
        &self,
        key: &ClaimKey,
        epoch: i64,
        now: impl Into<Now>,
        cover_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = now.into();
        self.on_clock("keeping a claim through a commit", now, |tx| {
            let s = tx.schema;
            let cover_ms = cover_ms.max(0);
            let mut params = key_params(key);
            params.extend_from_slice(&[&epoch, &cover_ms]);
            tx.execute(
                &format!(
                    "UPDATE {s}.claims SET \
                         lapse_at_ms = CASE WHEN state = 'held' \
                             THEN greatest(lapse_at_ms, {s}.clock_ms() + $6) \
                             ELSE lapse_at_ms END, \
                         abandon_at_ms = CASE WHEN abandon_at_ms IS NULL THEN NULL \
                             ELSE greatest(abandon_at_ms, {s}.clock_ms() + $6) END \
                         WHERE {KEY_MATCH} AND epoch = $5 AND state IN ('held', 'consumed')"
                ),
                &params,
            )
            .map_err(Fail::from)
        })
        .map(|n| n == 1)
    }

    pub fn release(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<usize, StoreError> {
        self.conn.with_tx("releasing claims", |tx| {
            let s = tx.schema;
            let n = tx.execute(
                &format!(
                    "UPDATE {s}.claims SET state = 'released', abandon_at_ms = NULL \
                     WHERE thread_id = $1 AND ($2::text IS NULL OR checkpoint_id = $2) \
                     AND (state = 'held' OR (state = 'consumed' \
                          AND (superseded_at_ms IS NULL OR $2::text IS NOT NULL)))"
                ),
                &[&thread_id, &checkpoint_id],
            )?;
            Ok(n as usize)
        })
    }

    /// The run lease row, live or ended; no sweep: a read only.
    pub fn last_answer(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
    ) -> Result<Option<RunLease>, StoreError> {
        self.conn.with_single("reading an answer", |tx| {
            last_lease(tx, thread_id, checkpoint_ns)
        })
    }

    pub fn run_lease(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        now: impl Into<Now>,
    ) -> Result<Option<RunLease>, StoreError> {
        let now = now.into();
        let gone_grace_ms = self.timings.current().holder_gone_grace_ms;
        self.on_clock("reading a run lease", now, |tx| {
            live_lease(tx, thread_id, checkpoint_ns, gone_grace_ms)
        })
    }
}

/// The rows `<schema>.claim(...)` returned, as the reader's outcome: one
/// row labelled with it, or for a row handed over, the row as it was
/// (`taken_over_from`, `taken_from`: released) and as it is now (`now`).
fn outcome_of(rows: &[postgres::Row]) -> Result<ClaimOutcome, Fail> {
    let mut labelled = Vec::with_capacity(rows.len());
    for r in rows {
        labelled.push((r.try_get::<_, String>(18)?, super::rows::record(r)?));
    }
    let now = labelled
        .iter()
        .find(|(label, _)| label == "now")
        .map(|(_, r)| r.clone());
    let Some((label, record)) = labelled.into_iter().find(|(label, _)| label != "now") else {
        return Err(Fail("the claim function returned no outcome".into()));
    };
    let handed = |now: Option<ClaimRecord>| {
        now.ok_or_else(|| {
            Fail(format!(
                "the claim function said {label} without the new row"
            ))
        })
    };
    Ok(match label.as_str() {
        "taken" => ClaimOutcome::Taken(record),
        "already_held" => ClaimOutcome::AlreadyHeld(record),
        "busy" => ClaimOutcome::Busy(record),
        "consumed" => ClaimOutcome::Consumed(record),
        "taken_from" => ClaimOutcome::Taken(handed(now)?),
        "taken_over_from" => ClaimOutcome::TakenOver {
            now: handed(now)?,
            previous: record,
        },
        other => return Err(Fail(format!("unknown claim outcome {other:?}"))),
    })
}

fn records(rows: Vec<postgres::Row>) -> Result<Vec<ClaimRecord>, Fail> {
    rows.iter().map(super::rows::record).collect()
}

fn purge_before(tx: &mut Tx<'_>, cutoff: i64) -> Result<usize, Fail> {
    let s = tx.schema;
    let consumed = tx.execute(
        &format!("DELETE FROM {s}.claims WHERE consumed_at_ms < $1 AND state = 'consumed'"),
        &[&cutoff],
    )?;
    let stale = tx.execute(
        &format!("DELETE FROM {s}.claims WHERE lapse_at_ms < $1 AND state IN ('held', 'released')"),
        &[&cutoff],
    )?;
    // Run leases ended by then go too, after the claims (the order the
    // fence takes them in); they are not claims, so not counted.
    tx.execute(
        &format!("DELETE FROM {s}.run_leases WHERE until_ms < $1"),
        &[&cutoff],
    )?;
    Ok((consumed + stale) as usize)
}

/// The checkpoint named by its three parts.
fn checkpoint(thread_id: &str, checkpoint_ns: &str, checkpoint_id: &str) -> CheckpointRef {
    CheckpointRef {
        thread_id: thread_id.to_owned(),
        checkpoint_ns: checkpoint_ns.to_owned(),
        checkpoint_id: checkpoint_id.to_owned(),
    }
}
