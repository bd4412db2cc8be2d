//! Run leases: after an interrupt is answered, the answering run holds its
//! thread until `run_lease_ms` after its latest write, so a late duplicate
//! resume that reads the thread's next head (past the parked checkpoint,
//! tasks still to run) is refused instead of running those tasks again.
//! Kept in the claim store's file, beside the claims that start them.

use rusqlite::{params, OptionalExtension, Transaction, TransactionBehavior};

use super::error::StoreError;
use super::model::{ClaimRecord, RunLease};
use super::rows::holder_at;
use super::store::SqliteClaims;

impl SqliteClaims {
    /// The live run lease on a namespace of a thread, if any.
    pub fn run_lease(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        now: crate::claims::clock::Now,
    ) -> Result<Option<RunLease>, StoreError> {
        let now_ms = now.on_this_host();
        // Deferred: a read takes no write lock other processes wait on.
        self.with_tx_as("reading a run lease", TransactionBehavior::Deferred, |tx| {
            live_lease(tx, thread_id, checkpoint_ns, now_ms)
        })
    }

    /// The run lease row of a namespace of a thread, live or ended.
    pub fn last_answer(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
    ) -> Result<Option<RunLease>, StoreError> {
        self.with_tx_as("reading an answer", TransactionBehavior::Deferred, |tx| {
            live_lease(tx, thread_id, checkpoint_ns, i64::MIN)
        })
    }

    /// A write of the thread arrived: claims it just consumed start a run
    /// lease held by their holder, and the thread's live leases last
    /// `run_lease_ms` past this write.
    pub(super) fn lease_runs(
        &self,
        tx: &Transaction<'_>,
        thread_id: &str,
        consumed: &[ClaimRecord],
        now_ms: i64,
    ) -> rusqlite::Result<()> {
        let run_lease_ms = self.run_lease_ms();
        if run_lease_ms == 0 {
            return Ok(());
        }
        let until = now_ms.saturating_add(run_lease_ms);
        for c in consumed {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO run_leases (thread_id, checkpoint_ns, \
                 answered_checkpoint_id, fingerprint, proxy_id, session_id, client_addr, \
                 application_name, answered_at_ms, last_write_ms, until_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)",
            )?
            .execute(params![
                c.key.at.thread_id,
                c.key.at.checkpoint_ns,
                c.key.at.checkpoint_id,
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
}

/// The live lease on a namespace of a thread, inside a transaction.
pub(super) fn live_lease(
    tx: &Transaction<'_>,
    thread_id: &str,
    checkpoint_ns: &str,
    now_ms: i64,
) -> rusqlite::Result<Option<RunLease>> {
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
}

/// The session's leases end no later than `until` (its connection closed).
pub(super) fn end_holder_leases(
    tx: &Transaction<'_>,
    proxy_id: &str,
    session_id: u64,
    until: i64,
) -> rusqlite::Result<usize> {
    tx.prepare_cached(
        "UPDATE run_leases SET until_ms = ?3 \
         WHERE proxy_id = ?1 AND session_id = ?2 AND until_ms > ?3",
    )?
    .execute(params![proxy_id, session_id as i64, until])
}

/// Leases of a thread (of one answered checkpoint, if given) end now.
pub(super) fn drop_thread_leases(
    tx: &Transaction<'_>,
    thread_id: &str,
    answered_checkpoint_id: Option<&str>,
) -> rusqlite::Result<usize> {
    tx.prepare_cached(
        "DELETE FROM run_leases WHERE thread_id = ?1 \
         AND (?2 IS NULL OR answered_checkpoint_id = ?2)",
    )?
    .execute(params![thread_id, answered_checkpoint_id])
}
