//! Holders on other proxy processes that are gone: their instance's
//! liveness lock (a session-level advisory lock, see `conn`) is no longer
//! held. Their claims and run leases on a thread are treated as if their
//! connection had closed (`holder_gone`): held claims lapse and both
//! count as abandoned no later than the holder-gone grace from now.

use super::conn::{Fail, Tx};

/// Whether the advisory lock of the row's `holder_instance` is held in
/// this database (bigint keys show in pg_locks as classid/objid halves).
const INSTANCE_DEAD: &str = "NOT EXISTS (SELECT 1 FROM pg_locks l \
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
    AND ((l.classid::bigint << 32) | l.objid::bigint) = x.holder_instance)";

/// Marks the claims and leases on one namespace of a thread whose holder
/// instance is gone; `until` = now + holder-gone grace.
pub(super) fn sweep(
    tx: &mut Tx<'_>,
    thread_id: &str,
    checkpoint_ns: &str,
    until: i64,
) -> Result<(), Fail> {
    let s = tx.schema;
    let mine = tx.instance;
    tx.execute(
        &format!(
            "UPDATE {s}.claims x SET abandon_at_ms = $4, lapse_at_ms = CASE \
             WHEN x.state = 'held' THEN LEAST(x.lapse_at_ms, $4) ELSE x.lapse_at_ms END \
             WHERE x.thread_id = $1 AND x.checkpoint_ns = $2 \
             AND x.state IN ('held', 'consumed') AND x.abandon_at_ms IS NULL \
             AND x.holder_instance <> $3 AND {INSTANCE_DEAD}"
        ),
        &[&thread_id, &checkpoint_ns, &mine, &until],
    )?;
    tx.execute(
        &format!(
            "UPDATE {s}.run_leases x SET until_ms = $4 \
             WHERE x.thread_id = $1 AND x.checkpoint_ns = $2 AND x.until_ms > $4 \
             AND x.holder_instance <> $3 AND {INSTANCE_DEAD}"
        ),
        &[&thread_id, &checkpoint_ns, &mine, &until],
    )?;
    Ok(())
}
