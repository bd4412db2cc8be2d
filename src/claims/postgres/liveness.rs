//! Holders on other proxy processes that are gone: their instance's
//! liveness lock (a session-level advisory lock, see `conn`) is no longer
//! held. Their claims and run leases on a thread are treated as if their
//! connection had closed (`holder_gone`): held claims lapse and both
//! count as abandoned no later than the holder-gone grace from now. The
//! server applies it (`<schema>.sweep`, see `schema`) before a decision
//! that could hand a claim over or read a run lease.
//!
//! A lock can also go while its proxy lives: its lock connection was
//! ended by the server (an idle-session reaper's `pg_terminate_backend`,
//! `idle_session_timeout`). The proxy then takes the same instance's lock
//! again on a new connection (or, when the old backend still holds it, a
//! new instance's) and revives what a sweep did meanwhile (`<schema>.revive`):
//! the sweep keeps what it shortened (the lapse, the lease's end) and the
//! generation it saw, and a revival by the live holder puts them back on
//! rows still of that generation and holder. So a lock gone for less than
//! the holder-gone grace hands nothing over: until the grace ends a swept
//! claim still counts as held.

/// Whether the advisory lock of the row `x`'s `holder_instance` is held in
/// this database (bigint keys show in pg_locks as classid/objid halves).
pub(super) const INSTANCE_DEAD: &str = "NOT EXISTS (SELECT 1 FROM pg_locks l \
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
    AND ((l.classid::bigint << 32) | l.objid::bigint) = x.holder_instance)";

/// The migration that makes a sweep undoable by its live holder: what the
/// sweep shortened is kept (`swept_*`), a closed holder session (which
/// really ends its claims) forgets it, and `revive(old, new)` gives a
/// re-taken lock's instance (`new`, the same id when it could be re-taken)
/// the rows of `old` and puts back what sweeps shortened on those still of
/// the generation swept.
pub(super) fn revival_migration(s: &str) -> String {
    format!(
        r#"
ALTER TABLE {s}.claims ADD COLUMN swept_epoch bigint, ADD COLUMN swept_lapse_at_ms bigint;
ALTER TABLE {s}.run_leases ADD COLUMN swept_answered_at_ms bigint,
    ADD COLUMN swept_until_ms bigint;

CREATE OR REPLACE FUNCTION {s}.sweep(p_thread text, p_ns text, p_instance bigint,
    p_gone_until bigint)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    UPDATE {s}.claims x SET abandon_at_ms = p_gone_until, lapse_at_ms = CASE
        WHEN x.state = 'held' THEN LEAST(x.lapse_at_ms, p_gone_until) ELSE x.lapse_at_ms END,
        swept_epoch = x.epoch, swept_lapse_at_ms = x.lapse_at_ms
     WHERE x.thread_id = p_thread AND x.checkpoint_ns = p_ns
       AND x.state IN ('held', 'consumed') AND x.abandon_at_ms IS NULL
       AND x.holder_instance <> p_instance AND {INSTANCE_DEAD};
    UPDATE {s}.run_leases x SET until_ms = p_gone_until,
        swept_answered_at_ms = x.answered_at_ms, swept_until_ms = x.until_ms
     WHERE x.thread_id = p_thread AND x.checkpoint_ns = p_ns AND x.until_ms > p_gone_until
       AND x.holder_instance <> p_instance AND {INSTANCE_DEAD};
END
$f$;

-- A closed holder session ends its claims for real: what a sweep kept
-- of them is forgotten, so no revival brings them back.
ALTER FUNCTION {s}.holder_gone(text, bigint, bigint) RENAME TO holder_gone_unswept;
CREATE FUNCTION {s}.holder_gone(p_proxy text, p_session bigint, p_until bigint)
RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    RETURN QUERY SELECT * FROM {s}.holder_gone_unswept(p_proxy, p_session, p_until);
{forget_swept}END
$f$;

CREATE FUNCTION {s}.revive(p_old bigint, p_new bigint)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    UPDATE {s}.claims SET holder_instance = p_new,
        abandon_at_ms = CASE WHEN swept_epoch = epoch THEN NULL ELSE abandon_at_ms END,
        lapse_at_ms = CASE WHEN swept_epoch = epoch
            THEN GREATEST(lapse_at_ms, swept_lapse_at_ms) ELSE lapse_at_ms END,
        swept_epoch = NULL, swept_lapse_at_ms = NULL
     WHERE holder_instance = p_old AND state IN ('held', 'consumed')
       AND (abandon_at_ms IS NULL OR swept_epoch = epoch);
    UPDATE {s}.run_leases SET holder_instance = p_new,
        until_ms = CASE WHEN swept_answered_at_ms = answered_at_ms
            THEN GREATEST(until_ms, swept_until_ms) ELSE until_ms END,
        swept_answered_at_ms = NULL, swept_until_ms = NULL
     WHERE holder_instance = p_old;
END
$f$;
"#,
        forget_swept = forget_swept(s, "p_until"),
    )
}

/// What a closed holder session does to what sweeps kept of its claims
/// and leases: forgets it (its leases ending no later than `until`, an
/// SQL expression of the function that runs it), so no revival brings
/// them back.
pub(super) fn forget_swept(s: &str, until: &str) -> String {
    format!(
        "    UPDATE {s}.claims SET swept_epoch = NULL, swept_lapse_at_ms = NULL WHERE proxy_id = p_proxy
       AND session_id = p_session AND swept_epoch IS NOT NULL;
    UPDATE {s}.run_leases SET until_ms = LEAST(until_ms, {until}), swept_answered_at_ms = NULL,
        swept_until_ms = NULL
     WHERE proxy_id = p_proxy AND session_id = p_session AND swept_answered_at_ms IS NOT NULL;
"
    )
}
