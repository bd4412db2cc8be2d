//! Run leases in the PostgreSQL store: as `claims::leases` (an answered
//! interrupt's run holds its thread until `run_lease_ms` after its latest
//! write), with each lease recording its holder's instance.

use super::conn::{Fail, Tx};
use super::rows::holder_at;
use crate::claims::model::{ClaimRecord, RunLease};

/// Claims just consumed start a run lease held by their holder, and the
/// thread's live leases last `lease_ms` past this write.
pub(super) fn lease_runs(
    tx: &mut Tx<'_>,
    lease_ms: i64,
    thread_id: &str,
    consumed: &[ClaimRecord],
    now_ms: i64,
) -> Result<(), Fail> {
    if lease_ms == 0 {
        return Ok(());
    }
    let s = tx.schema;
    let until = now_ms.saturating_add(lease_ms);
    for c in consumed {
        tx.execute(
            &format!(
                "INSERT INTO {s}.run_leases (thread_id, checkpoint_ns, answered_checkpoint_id, \
                 fingerprint, proxy_id, session_id, client_addr, application_name, \
                 answered_at_ms, last_write_ms, until_ms, holder_instance) \
                 SELECT thread_id, checkpoint_ns, checkpoint_id, fingerprint, $5, $6, $7, $8, \
                 $9, $9, $10, holder_instance FROM {s}.claims \
                 WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 \
                 AND fingerprint = $4 \
                 ON CONFLICT (thread_id, checkpoint_ns) DO UPDATE SET \
                 answered_checkpoint_id = EXCLUDED.answered_checkpoint_id, \
                 fingerprint = EXCLUDED.fingerprint, proxy_id = EXCLUDED.proxy_id, \
                 session_id = EXCLUDED.session_id, client_addr = EXCLUDED.client_addr, \
                 application_name = EXCLUDED.application_name, \
                 answered_at_ms = EXCLUDED.answered_at_ms, \
                 last_write_ms = EXCLUDED.last_write_ms, until_ms = EXCLUDED.until_ms, \
                 holder_instance = EXCLUDED.holder_instance"
            ),
            &[
                &c.key.at.thread_id,
                &c.key.at.checkpoint_ns,
                &c.key.at.checkpoint_id,
                &c.key.fingerprint,
                &c.holder.proxy_id,
                &(c.holder.session_id as i64),
                &c.holder.client_addr,
                &c.holder.application_name,
                &now_ms,
                &until,
            ],
        )?;
    }
    tx.execute(
        &format!(
            "UPDATE {s}.run_leases SET last_write_ms = $2, until_ms = GREATEST(until_ms, $3) \
             WHERE thread_id = $1 AND until_ms > $2"
        ),
        &[&thread_id, &now_ms, &until],
    )?;
    Ok(())
}

/// The live lease on a namespace of a thread.
pub(super) fn live_lease(
    tx: &mut Tx<'_>,
    thread_id: &str,
    checkpoint_ns: &str,
    now_ms: i64,
) -> Result<Option<RunLease>, Fail> {
    let s = tx.schema;
    let rows = tx.query(
        &format!(
            "SELECT thread_id, checkpoint_ns, answered_checkpoint_id, fingerprint, proxy_id, \
             session_id, client_addr, application_name, answered_at_ms, last_write_ms, until_ms \
             FROM {s}.run_leases WHERE thread_id = $1 AND checkpoint_ns = $2 AND until_ms > $3"
        ),
        &[&thread_id, &checkpoint_ns, &now_ms],
    )?;
    rows.first()
        .map(|r| {
            Ok(RunLease {
                thread_id: r.try_get(0)?,
                checkpoint_ns: r.try_get(1)?,
                answered_checkpoint_id: r.try_get(2)?,
                fingerprint: r.try_get(3)?,
                holder: holder_at(r, 4)?,
                answered_at_ms: r.try_get(8)?,
                last_write_ms: r.try_get(9)?,
                until_ms: r.try_get(10)?,
            })
        })
        .transpose()
}

/// The session's leases end no later than `until`.
pub(super) fn end_holder_leases(
    tx: &mut Tx<'_>,
    proxy_id: &str,
    session_id: u64,
    until: i64,
) -> Result<u64, Fail> {
    let s = tx.schema;
    Ok(tx.execute(
        &format!(
            "UPDATE {s}.run_leases SET until_ms = $3 \
             WHERE proxy_id = $1 AND session_id = $2 AND until_ms > $3"
        ),
        &[&proxy_id, &(session_id as i64), &until],
    )?)
}
