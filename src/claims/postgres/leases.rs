//! Run leases in the PostgreSQL store: as `claims::leases` (an answered
//! interrupt's run holds its thread until `run_lease_ms` after its latest
//! write), with each lease recording its holder's instance. The server
//! starts and extends them (`<schema>.consume`, see `schema`, and a batch
//! of evidence, see `unclaimed_evidence`), with the statement written
//! here; the store reads them here.

use super::conn::{Fail, Tx};
use super::rows::holder_at;
use crate::claims::model::RunLease;

/// The columns of a run lease the store reads, in `lease_of`'s order.
const LEASE_COLUMNS: &str = "thread_id, checkpoint_ns, answered_checkpoint_id, fingerprint, \
    proxy_id, session_id, client_addr, application_name, answered_at_ms, last_write_ms, until_ms";

/// The statement that extends the live run leases of the thread `thread`
/// to `p_lease_ms` past `now` (SQL expressions of the functions that run
/// it), recording a write at `now`: what every write of a leased thread
/// does to its lease.
pub(super) fn renew_live_leases(s: &str, thread: &str, now: &str) -> String {
    format!(
        "        UPDATE {s}.run_leases SET last_write_ms = {now},
            until_ms = GREATEST(until_ms, {now} + p_lease_ms)
         WHERE thread_id = {thread} AND until_ms > {now};
"
    )
}

/// The live lease on a namespace of a thread, in one statement, after
/// the server marked the thread's holders whose process is gone (gone
/// from `gone_grace_ms` after now, on its clock).
pub(super) fn live_lease(
    tx: &mut Tx<'_>,
    thread_id: &str,
    checkpoint_ns: &str,
    gone_grace_ms: i64,
) -> Result<Option<RunLease>, Fail> {
    let s = tx.schema;
    let mine = tx.instance;
    let rows = tx.query(
        &format!("SELECT {LEASE_COLUMNS} FROM {s}.run_lease($1, $2, $3, $4)"),
        &[&thread_id, &checkpoint_ns, &mine, &gone_grace_ms],
    )?;
    rows.first().map(lease_of).transpose()
}

/// The lease row on a namespace of a thread, live or ended (kept until
/// the retention purge): its latest answered interrupt. A read only.
pub(super) fn last_lease(
    tx: &mut Tx<'_>,
    thread_id: &str,
    checkpoint_ns: &str,
) -> Result<Option<RunLease>, Fail> {
    let s = tx.schema;
    let rows = tx.query(
        &format!(
            "SELECT {LEASE_COLUMNS} FROM {s}.run_leases WHERE thread_id = $1 AND checkpoint_ns = $2"
        ),
        &[&thread_id, &checkpoint_ns],
    )?;
    rows.first().map(lease_of).transpose()
}

fn lease_of(r: &postgres::Row) -> Result<RunLease, Fail> {
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
}
