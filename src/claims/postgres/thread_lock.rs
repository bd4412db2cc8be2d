//! One writer of a thread's claims and run leases at a time, so the fence
//! in a client's write transaction and the proxy's own evidence and
//! holder-gone updates cannot deadlock. Each takes a thread's claim rows
//! and then its run lease, and a write's transaction fences more than once
//! (its progress, then its answer), a batch of evidence applies several
//! items, and a closed holder's update spans its threads: so without an
//! order, one could hold the lease while it waits for a claim row the
//! other holds while that one waits for the lease. PostgreSQL then aborts
//! one of them, and when that is the client's write, the application sees
//! `deadlock detected` for a write the guard should have let through.
//!
//! So each of them first takes a transaction-level advisory lock per
//! thread it changes, in the order of the lock's key when it changes
//! several, and holds it to its commit. A batch of evidence on a thread
//! then waits for the write transaction that fenced on it. The claim
//! itself takes no such lock. It runs on the proxy's connection while a
//! client may wait for its answer inside a transaction that has fenced on
//! the same thread, and it never waits for a fence's lease.
//!
//! The keys are in the two-integer key space (the liveness locks use
//! bigint keys, which never conflict with them), class [`THREAD_CLASS`],
//! the thread's `hashtext`. Two threads whose hashes collide only take
//! turns.

/// The first half of a thread lock's advisory key ("rt").
pub(super) const THREAD_CLASS: i32 = 0x7274;

/// A statement that takes the lock of the thread `param` names (an SQL
/// expression of type text) until the transaction ends.
pub(super) fn lock_thread(param: &str) -> String {
    format!("PERFORM pg_advisory_xact_lock({THREAD_CLASS}, hashtext({param}));\n")
}

/// Statements that take the lock of every thread the array `param` names
/// (an SQL expression of type text[]), in key order, until the
/// transaction ends; they need an integer variable `k`.
pub(super) fn lock_threads(param: &str) -> String {
    format!(
        "    FOR k IN SELECT DISTINCT hashtext(t) FROM unnest({param}) AS t ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock({THREAD_CLASS}, k);
    END LOOP;\n"
    )
}

/// The migration that makes the fence, a batch of evidence and a closed
/// holder's update take the thread locks (forgetting a thread takes its
/// lock in the store's own transaction).
pub(super) fn thread_lock_migration(s: &str) -> String {
    let fence = super::fence::fence_definition(s, &format!("    {}", lock_thread("p_thread")));
    let apply_evidence = super::evidence_batch::apply_evidence_head(s, "CREATE");
    let lock_batch = lock_threads("p_thread");
    format!(
        r#"
-- The fence: the thread's lock, the check, and for an answer its
-- consumption.
{fence}
-- A batch of evidence: the lock of every thread it names, in key order,
-- then its items in order.
ALTER FUNCTION {s}.apply_evidence(text[], text[], text[], text[], text[], bigint[], bigint,
    bigint, bigint, bigint) RENAME TO apply_evidence_unlocked;
{apply_evidence}
DECLARE
    k integer;
BEGIN
{lock_batch}    RETURN QUERY SELECT * FROM {s}.apply_evidence_unlocked(p_kind, p_thread, p_ns,
        p_checkpoint, p_evidence, p_sent_ago_ms, p_hold_ms, p_lease_ms,
        p_superseded_grace_ms, p_retain_ms);
END
$f$;

-- A closed holder: the lock of every thread it has claims or leases on,
-- in key order, then its update.
ALTER FUNCTION {s}.holder_gone(text, bigint, bigint) RENAME TO holder_gone_unlocked;
CREATE FUNCTION {s}.holder_gone(p_proxy text, p_session bigint, p_until bigint)
RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    k integer;
BEGIN
    FOR k IN SELECT DISTINCT hashtext(thread_id) FROM (
        SELECT thread_id FROM {s}.claims WHERE proxy_id = p_proxy AND session_id = p_session
        UNION SELECT thread_id FROM {s}.run_leases
         WHERE proxy_id = p_proxy AND session_id = p_session) AS held ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock({THREAD_CLASS}, k);
    END LOOP;
    RETURN QUERY SELECT * FROM {s}.holder_gone_unlocked(p_proxy, p_session, p_until);
END
$f$;
"#
    )
}
