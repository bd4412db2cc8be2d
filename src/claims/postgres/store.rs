//! The claim operations on PostgreSQL, with the SQLite store's semantics
//! (`claims::store` documents each): one short transaction per operation.
//!
//! Racers serialize on the claim's row: a first reader inserts it
//! (`INSERT … ON CONFLICT DO NOTHING`, which waits for a concurrent
//! inserter's commit), every later one locks it (`SELECT … FOR UPDATE`)
//! and decides on the committed row. Nothing is held between operations,
//! so the claims leg's wait loop holds no lock. Each decision first marks
//! the thread's claims of proxy processes that are gone (`liveness`).

use std::sync::Arc;

use super::conn::{Fail, PgConn, Role, Tx};
use super::leases::{end_holder_leases, lease_runs, live_lease};
use super::liveness::sweep;
use super::rows::{
    select_for_update, select_key, select_where, take_or_read, CHECKPOINT_MATCH, COLUMNS, KEY_MATCH,
};
use super::target::PgTarget;
use crate::claims::error::StoreError;
use crate::claims::model::{ClaimKey, ClaimRecord, ClaimState, Holder, RunLease};
use crate::claims::outcome::{decide_existing, ClaimOutcome};
use crate::claims::store::{
    DEFAULT_RETAIN_MS, DEFAULT_RUN_LEASE_MS, DEFAULT_SUPERSEDED_GRACE_MS, NEXT_CHECKPOINT,
};

/// Default holder-gone grace applied to holders whose process is gone.
const DEFAULT_HOLDER_GONE_GRACE_MS: i64 = 1_000;

/// Handle on the PostgreSQL claims, one per proxy process.
pub struct PgClaims {
    conn: Arc<PgConn>,
    retain_ms: i64,
    superseded_grace_ms: i64,
    run_lease_ms: i64,
    holder_gone_grace_ms: i64,
}

impl std::fmt::Debug for PgClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClaims")
            .field("at", &self.conn.target.shown())
            .field("run_lease_ms", &self.run_lease_ms)
            .finish()
    }
}

impl PgClaims {
    /// The proxy's store: connected (schema created or upgraded, liveness
    /// lock taken) now if it can be; otherwise every operation fails and
    /// connecting is retried on use, with backoff.
    pub fn connect(target: PgTarget) -> PgClaims {
        PgClaims::on(PgConn::connect(target, Role::Proxy))
    }

    /// The proxy's store, connected now or an error (tests).
    pub fn open(target: PgTarget) -> Result<PgClaims, StoreError> {
        PgConn::open_now(target, Role::Proxy).map(PgClaims::on)
    }

    /// Operator commands: the schema must exist; no liveness lock.
    pub fn open_existing(target: PgTarget) -> Result<PgClaims, StoreError> {
        PgConn::open_now(target, Role::Operator).map(PgClaims::on)
    }

    fn on(conn: Arc<PgConn>) -> PgClaims {
        PgClaims {
            conn,
            retain_ms: DEFAULT_RETAIN_MS,
            superseded_grace_ms: DEFAULT_SUPERSEDED_GRACE_MS,
            run_lease_ms: DEFAULT_RUN_LEASE_MS,
            holder_gone_grace_ms: DEFAULT_HOLDER_GONE_GRACE_MS,
        }
    }

    #[cfg(test)]
    pub fn with_retention(mut self, retain_ms: i64) -> PgClaims {
        self.retain_ms = retain_ms.max(0);
        self
    }

    pub fn with_superseded_grace(mut self, grace_ms: i64) -> PgClaims {
        self.superseded_grace_ms = grace_ms.max(0);
        self
    }

    pub fn with_run_lease(mut self, lease_ms: i64) -> PgClaims {
        self.run_lease_ms = lease_ms.max(0);
        self
    }

    /// Sets the grace given to holders whose proxy process is gone.
    pub fn with_holder_gone_grace(mut self, grace_ms: i64) -> PgClaims {
        self.holder_gone_grace_ms = grace_ms.max(0);
        self
    }

    /// The database, as shown in errors.
    pub fn shown(&self) -> &str {
        self.conn.target.shown()
    }

    /// This process's liveness instance id, once connected.
    pub fn instance(&self) -> Option<i64> {
        self.conn.instance()
    }

    pub fn try_claim(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now_ms: i64,
        lapse_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let lapse_at_ms = now_ms.saturating_add(lapse_ms.max(0));
        let superseded_cutoff = now_ms.saturating_sub(self.superseded_grace_ms);
        let gone_until = now_ms.saturating_add(self.holder_gone_grace_ms);
        // One statement for the common cases: a first reader takes the
        // claim; the holder's own session reads it again.
        let quick = self.conn.with_single("taking a claim", |tx| {
            Ok(match take_or_read(tx, key, holder, now_ms, lapse_at_ms)? {
                Some((taken, true)) => Some(ClaimOutcome::Taken(taken)),
                Some((prev, false)) => Some(prev)
                    .filter(|p| p.superseded_at_ms.is_none_or(|at| at > superseded_cutoff))
                    .filter(|p| p.state == ClaimState::Held && p.holder.same_session(holder))
                    .map(ClaimOutcome::AlreadyHeld),
                None => None,
            })
        })?;
        if let Some(outcome) = quick {
            return Ok(outcome);
        }
        self.conn.with_tx("taking a claim", |tx| {
            sweep(tx, &key.at.thread_id, &key.at.checkpoint_ns, gone_until)?;
            let s = tx.schema;
            let mine = tx.instance;
            // The row may have gone since (purged, thread forgotten).
            if let Some((taken, true)) = take_or_read(tx, key, holder, now_ms, lapse_at_ms)? {
                return Ok(ClaimOutcome::Taken(taken));
            }
            let Some(prev) = select_key(tx, key, true)? else {
                return Err(Fail(
                    "the claim row was deleted while it was being taken; the reader retries".into(),
                ));
            };
            // A row on a checkpoint superseded longer than the grace ago
            // is as good as purged: the thread was rewound to it.
            if prev
                .superseded_at_ms
                .is_some_and(|at| at <= superseded_cutoff)
            {
                let epoch = prev.epoch + 1;
                tx.execute(
                    &format!(
                        "UPDATE {s}.claims SET state = 'held', proxy_id = $5, session_id = $6, \
                         client_addr = $7, application_name = $8, claimed_at_ms = $9, \
                         lapse_at_ms = $10, consumed_at_ms = NULL, evidence = NULL, \
                         refusals = 0, takeovers = 0, superseded_at_ms = NULL, \
                         abandon_at_ms = NULL, epoch = $11, holder_instance = $12 \
                         WHERE {KEY_MATCH}"
                    ),
                    &[
                        &key.at.thread_id,
                        &key.at.checkpoint_ns,
                        &key.at.checkpoint_id,
                        &key.fingerprint,
                        &holder.proxy_id,
                        &(holder.session_id as i64),
                        &holder.client_addr,
                        &holder.application_name,
                        &now_ms,
                        &lapse_at_ms,
                        &epoch,
                        &mine,
                    ],
                )?;
                return Ok(ClaimOutcome::Taken(ClaimRecord::taken(
                    key,
                    holder,
                    now_ms,
                    lapse_at_ms,
                    epoch,
                )));
            }
            // Whether the answering run still writes: asked only of a consumed row.
            let writing = prev.state == ClaimState::Consumed
                && self.run_lease_ms > 0
                && live_lease(tx, &key.at.thread_id, &key.at.checkpoint_ns, now_ms)?.is_some();
            let outcome = decide_existing(prev, holder, now_ms, writing, |prev, takeovers| {
                retake(tx, prev, holder, now_ms, lapse_at_ms, takeovers)
            })?;
            Ok(outcome)
        })
    }

    pub fn consume(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        evidence: &str,
        written_at_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        self.conn.with_tx("consuming claims", |tx| {
            let at = (thread_id, checkpoint_ns, checkpoint_id);
            let consumed = consume_held(tx, at, evidence, written_at_ms, now_ms)?;
            lease_runs(tx, self.run_lease_ms, thread_id, &consumed, now_ms)?;
            Ok(consumed)
        })
    }

    pub fn note_refusal(&self, key: &ClaimKey) -> Result<(), StoreError> {
        self.conn.with_tx("counting a refusal", |tx| {
            let s = tx.schema;
            tx.execute(
                &format!("UPDATE {s}.claims SET refusals = refusals + 1 WHERE {KEY_MATCH}"),
                &[
                    &key.at.thread_id,
                    &key.at.checkpoint_ns,
                    &key.at.checkpoint_id,
                    &key.fingerprint,
                ],
            )?;
            Ok(())
        })
    }

    pub fn note_progress(
        &self,
        (thread_id, checkpoint_ns, checkpoint_id): (&str, &str, &str),
        evidence: &str,
        written_at_ms: i64,
        now_ms: i64,
        hold_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let until = now_ms.saturating_add(hold_ms.max(0));
        self.conn.with_tx("noting progress", |tx| {
            let s = tx.schema;
            tx.execute(
                &format!(
                    "UPDATE {s}.claims SET evidence = $4, lapse_at_ms = GREATEST(lapse_at_ms, $5) \
                     WHERE {CHECKPOINT_MATCH} AND state = 'held' AND claimed_at_ms <= $6"
                ),
                &[
                    &thread_id,
                    &checkpoint_ns,
                    &checkpoint_id,
                    &evidence,
                    &until,
                    &written_at_ms,
                ],
            )?;
            select_where(
                tx,
                &format!("{CHECKPOINT_MATCH} AND state = 'held'"),
                &[&thread_id, &checkpoint_ns, &checkpoint_id],
            )
        })
    }

    pub fn holder_gone(
        &self,
        proxy_id: &str,
        session_id: u64,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let until = now_ms.saturating_add(grace_ms.max(0));
        self.conn.with_tx("ending a holder's claims", |tx| {
            let s = tx.schema;
            let filter =
                "proxy_id = $1 AND session_id = $2 AND state = 'held' AND lapse_at_ms > $3";
            let session = session_id as i64;
            let mut shortened = select_where(tx, filter, &[&proxy_id, &session, &until])?;
            tx.execute(
                &format!("UPDATE {s}.claims SET lapse_at_ms = $3 WHERE {filter}"),
                &[&proxy_id, &session, &until],
            )?;
            tx.execute(
                &format!(
                    "UPDATE {s}.claims SET abandon_at_ms = $3 WHERE proxy_id = $1 \
                     AND session_id = $2 AND state IN ('held', 'consumed') \
                     AND abandon_at_ms IS NULL"
                ),
                &[&proxy_id, &session, &until],
            )?;
            end_holder_leases(tx, proxy_id, session_id, until)?;
            for r in &mut shortened {
                r.lapse_at_ms = until;
                r.abandon_at_ms = Some(r.abandon_at_ms.unwrap_or(until));
            }
            Ok(shortened)
        })
    }

    pub fn move_on(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        parent_checkpoint_id: &str,
        now_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let superseded_cutoff = now_ms.saturating_sub(self.superseded_grace_ms);
        let retain_cutoff = now_ms.saturating_sub(self.retain_ms);
        self.conn.with_tx("moving claims on", |tx| {
            let at = (thread_id, checkpoint_ns, parent_checkpoint_id);
            // The thread moved on: every claim on the parent is done.
            let consumed = consume_held(tx, at, NEXT_CHECKPOINT, i64::MAX, now_ms)?;
            lease_runs(tx, self.run_lease_ms, thread_id, &consumed, now_ms)?;
            let s = tx.schema;
            tx.execute(
                &format!(
                    "UPDATE {s}.claims SET superseded_at_ms = $4 \
                     WHERE {CHECKPOINT_MATCH} AND superseded_at_ms IS NULL"
                ),
                &[&thread_id, &checkpoint_ns, &parent_checkpoint_id, &now_ms],
            )?;
            tx.execute(
                &format!("DELETE FROM {s}.claims WHERE superseded_at_ms < $1"),
                &[&superseded_cutoff],
            )?;
            purge_before(tx, retain_cutoff)?;
            Ok(consumed)
        })
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

    pub fn current_holder(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
    ) -> Result<Option<ClaimRecord>, StoreError> {
        self.conn
            .with_single("reading a checkpoint's holder", |tx| {
                let s = tx.schema;
                let rows = tx.query(
                    &format!(
                        "SELECT {COLUMNS} FROM {s}.claims WHERE {CHECKPOINT_MATCH} \
                     AND state IN ('held', 'consumed') \
                     ORDER BY claimed_at_ms DESC, epoch DESC LIMIT 1"
                    ),
                    &[&thread_id, &checkpoint_ns, &checkpoint_id],
                )?;
                rows.first().map(super::rows::record).transpose()
            })
    }

    /// Keeps generation `epoch` of `key` from lapsing, or from counting as
    /// abandoned, before `until_ms`: a held claim's lapse time and a
    /// consumed claim's abandonment time (when it has one) move up to
    /// `until_ms` if they are earlier. Whether that generation is still
    /// the key's, held or consumed (false: it was taken over or released
    /// meanwhile).
    pub fn keep_until(
        &self,
        key: &ClaimKey,
        epoch: i64,
        until_ms: i64,
    ) -> Result<bool, StoreError> {
        self.conn
            .with_single("keeping a claim through a commit", |tx| {
                let s = tx.schema;
                tx.execute(
                    &format!(
                        "UPDATE {s}.claims SET \
                         lapse_at_ms = CASE WHEN state = 'held' \
                             THEN greatest(lapse_at_ms, $6) ELSE lapse_at_ms END, \
                         abandon_at_ms = CASE WHEN abandon_at_ms IS NULL THEN NULL \
                             ELSE greatest(abandon_at_ms, $6) END \
                         WHERE {KEY_MATCH} AND epoch = $5 AND state IN ('held', 'consumed')"
                    ),
                    &[
                        &key.at.thread_id,
                        &key.at.checkpoint_ns,
                        &key.at.checkpoint_id,
                        &key.fingerprint,
                        &epoch,
                        &until_ms,
                    ],
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
            live_lease(tx, thread_id, checkpoint_ns, i64::MIN)
        })
    }

    pub fn run_lease(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        now_ms: i64,
    ) -> Result<Option<RunLease>, StoreError> {
        let gone_until = now_ms.saturating_add(self.holder_gone_grace_ms);
        self.conn.with_tx("reading a run lease", |tx| {
            sweep(tx, thread_id, checkpoint_ns, gone_until)?;
            live_lease(tx, thread_id, checkpoint_ns, now_ms)
        })
    }
}

/// Hands `prev`'s row to `holder` as a fresh held claim, the next epoch.
fn retake(
    tx: &mut Tx<'_>,
    prev: &ClaimRecord,
    holder: &Holder,
    now_ms: i64,
    lapse_at_ms: i64,
    takeover: i64,
) -> Result<ClaimRecord, Fail> {
    let s = tx.schema;
    let mine = tx.instance;
    tx.execute(
        &format!(
            "UPDATE {s}.claims SET state = 'held', proxy_id = $5, session_id = $6, \
             client_addr = $7, application_name = $8, claimed_at_ms = $9, lapse_at_ms = $10, \
             consumed_at_ms = NULL, evidence = NULL, takeovers = takeovers + $11, \
             abandon_at_ms = NULL, epoch = epoch + 1, holder_instance = $12 WHERE {KEY_MATCH}"
        ),
        &[
            &prev.key.at.thread_id,
            &prev.key.at.checkpoint_ns,
            &prev.key.at.checkpoint_id,
            &prev.key.fingerprint,
            &holder.proxy_id,
            &(holder.session_id as i64),
            &holder.client_addr,
            &holder.application_name,
            &now_ms,
            &lapse_at_ms,
            &takeover,
            &mine,
        ],
    )?;
    Ok(prev.retaken(holder, now_ms, lapse_at_ms, takeover))
}

/// Held claims on a checkpoint taken by `taken_by_ms` become consumed;
/// returns them as they were.
fn consume_held(
    tx: &mut Tx<'_>,
    (thread_id, checkpoint_ns, checkpoint_id): (&str, &str, &str),
    evidence: &str,
    taken_by_ms: i64,
    now_ms: i64,
) -> Result<Vec<ClaimRecord>, Fail> {
    let held = select_for_update(
        tx,
        &format!("{CHECKPOINT_MATCH} AND state = 'held' AND claimed_at_ms <= $4"),
        &[&thread_id, &checkpoint_ns, &checkpoint_id, &taken_by_ms],
    )?;
    if !held.is_empty() {
        let s = tx.schema;
        let fingerprints: Vec<&str> = held.iter().map(|c| c.key.fingerprint.as_str()).collect();
        tx.execute(
            &format!(
                "UPDATE {s}.claims SET state = 'consumed', consumed_at_ms = $4, evidence = $5 \
                 WHERE {CHECKPOINT_MATCH} AND state = 'held' AND fingerprint = ANY($6)"
            ),
            &[
                &thread_id,
                &checkpoint_ns,
                &checkpoint_id,
                &now_ms,
                &evidence,
                &fingerprints,
            ],
        )?;
    }
    Ok(held)
}

fn purge_before(tx: &mut Tx<'_>, cutoff: i64) -> Result<usize, Fail> {
    let s = tx.schema;
    // Run leases ended by then go too; they are not claims, so not counted.
    tx.execute(
        &format!("DELETE FROM {s}.run_leases WHERE until_ms < $1"),
        &[&cutoff],
    )?;
    let consumed = tx.execute(
        &format!("DELETE FROM {s}.claims WHERE consumed_at_ms < $1 AND state = 'consumed'"),
        &[&cutoff],
    )?;
    let stale = tx.execute(
        &format!("DELETE FROM {s}.claims WHERE lapse_at_ms < $1 AND state IN ('held', 'released')"),
        &[&cutoff],
    )?;
    Ok((consumed + stale) as usize)
}
