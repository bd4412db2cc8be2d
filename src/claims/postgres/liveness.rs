//! Holders on other proxy processes that are gone: their instance's
//! liveness lock (a session-level advisory lock, see `conn`) is no longer
//! held. Their claims and run leases on a thread are treated as if their
//! connection had closed (`holder_gone`): held claims lapse and both
//! count as abandoned no later than the holder-gone grace from now. The
//! server applies it (`<schema>.sweep`, see `schema`) before a decision
//! that could hand a claim over or read a run lease.

/// Whether the advisory lock of the row `x`'s `holder_instance` is held in
/// this database (bigint keys show in pg_locks as classid/objid halves).
pub(super) const INSTANCE_DEAD: &str = "NOT EXISTS (SELECT 1 FROM pg_locks l \
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
    AND ((l.classid::bigint << 32) | l.objid::bigint) = x.holder_instance)";
