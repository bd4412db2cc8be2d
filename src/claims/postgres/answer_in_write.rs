//! The migration that records an interrupt's answer on its claim inside
//! the answering write's own transaction, where the claims schema lives in
//! the sessions' database: `fence_write` (the fence the server runs just
//! ahead of a write continuing a claimed checkpoint, see
//! `enforce::fencing`) also takes what the write is. A gated task's
//! results consume the held claims on the checkpoint and start the run
//! lease, a next checkpoint also supersedes them, in the transaction that
//! commits the write. So the claim and the answer commit together: no
//! takeover can ever find an answered interrupt's claim still held, however
//! long the off-path evidence worker takes (a locked claims table, a store
//! that is down, a proxy killed before it applied it).
//!
//! The rows a write consumed are marked (`consumed_in_write`) until the
//! worker's evidence of the same write reaches `consume` / `move_on`,
//! which return them once more, so the audit trail keeps its
//! `claim_consumed` record. The fence's older signature stays, for
//! replicas of an older build during a rolling upgrade.

/// `p_answer` of the fence: what the write is, NULL for no answer (a
/// progress write); `p_moves_on`: a next checkpoint.
pub(super) fn answer_in_write_migration(s: &str) -> String {
    format!(
        r#"
ALTER TABLE {s}.claims ADD COLUMN consumed_in_write boolean NOT NULL DEFAULT false;

-- The fence, and for an answer its consumption, in the write's transaction.
CREATE FUNCTION {s}.fence_write({CHECK_PARAMS}, {ANSWER_PARAMS}) {FENCE_RUNS} AS $f$
DECLARE
    v_now bigint;
    c {s}.claims%ROWTYPE;
BEGIN
    -- Raises RGF01 unless the writer holds the claim (its row stays locked).
    PERFORM {s}.fence_write(p_thread, p_ns, p_checkpoint, p_proxy, p_session, p_addr, p_app,
        p_took, p_cover_ms);
{answer}END
$f$;
GRANT EXECUTE ON FUNCTION {s}.fence_write(text, text, text, text, bigint, text, text, text,
    bigint, text, boolean, bigint) TO PUBLIC;

-- The worker's evidence of a write: what it consumes now, and what the
-- write consumed in its own transaction (reported once).
CREATE FUNCTION {s}.consumed_in_write(p_thread text, p_ns text, p_checkpoint text)
RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    RETURN QUERY WITH reported AS (
        UPDATE {s}.claims SET consumed_in_write = false
         WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
           AND consumed_in_write
        RETURNING *)
    SELECT * FROM reported {ORDER};
END
$f$;

ALTER FUNCTION {s}.consume(text, text, text, text, bigint, bigint) RENAME TO consume_now;
{consume_head}BEGIN
    RETURN QUERY SELECT * FROM {s}.consumed_in_write(p_thread, p_ns, p_checkpoint);
    RETURN QUERY SELECT * FROM {s}.consume_now(p_thread, p_ns, p_checkpoint, p_evidence,
        p_sent_ago_ms, p_lease_ms);
END
$f$;

ALTER FUNCTION {s}.move_on(text, text, text, text, bigint, bigint, bigint)
    RENAME TO move_on_now;
{move_on_head}BEGIN
    RETURN QUERY SELECT * FROM {s}.consumed_in_write(p_thread, p_ns, p_parent);
    RETURN QUERY SELECT * FROM {s}.move_on_now(p_thread, p_ns, p_parent, p_evidence,
        p_lease_ms, p_superseded_grace_ms, p_retain_ms);
END
$f$;
"#,
        ORDER = super::rows::ORDER,
        answer = super::fence::consume_answer(s),
        CHECK_PARAMS = super::fence::CHECK_PARAMS,
        ANSWER_PARAMS = super::fence::ANSWER_PARAMS,
        FENCE_RUNS = super::fence::FENCE_RUNS,
        consume_head = super::db_clock::consume_head(s),
        move_on_head = super::db_clock::move_on_head(s),
    )
}
