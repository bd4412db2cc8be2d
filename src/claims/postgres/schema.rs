//! The claims' part of the shared schema in PostgreSQL: claims, run
//! leases, the fence writes are checked by in their own transaction, and
//! the decision functions the store and the fence call. These are its
//! steps of the schema's versioned migrations (`pg::migration`), each at
//! its version in the one order of the whole schema, in which the audit
//! trail's steps are versions 2 and 4.

use super::answer_in_write::answer_in_write_migration;
use super::claim_first::claim_first_migration;
use super::db_clock::{clock_inlined_migration, db_clock_migration};
use super::evidence_batch::evidence_batch_migration;
use super::fence::{
    check_holder, check_holder_variables, fence_one_call_migration, CHECK_PARAMS, FENCE_RUNS,
};
use super::held_consumption::consume_held;
use super::key_digest::key_digest_migration;
use super::liveness::{revival_migration, INSTANCE_DEAD};
use super::rows::ORDER;
use super::thread_lock::thread_lock_migration;
use super::unclaimed_evidence::{lease_only_evidence_migration, unclaimed_evidence_migration};
use crate::pg::Migration;

/// The claims' steps, each at its version of the shared schema.
pub const CLAIMS_MIGRATIONS: [Migration; 14] = [
    Migration {
        version: 1,
        sql: tables,
    },
    Migration {
        version: 3,
        sql: fence_write,
    },
    Migration {
        version: 5,
        sql: decisions,
    },
    // A sweep its live holder can undo: a liveness lock re-taken after
    // its connection was ended keeps its claims (see `liveness`).
    Migration {
        version: 6,
        sql: revival_migration,
    },
    // Every decision on the database's clock (see `db_clock`).
    Migration {
        version: 7,
        sql: db_clock_migration,
    },
    // Keys of any length (see `key_digest`).
    Migration {
        version: 8,
        sql: key_digest_migration,
    },
    // An answer consumes its claim in its own transaction (see
    // `answer_in_write`).
    Migration {
        version: 9,
        sql: answer_in_write_migration,
    },
    // Several writes' evidence in one statement (see `evidence_batch`).
    Migration {
        version: 10,
        sql: evidence_batch_migration,
    },
    // The fence in one function call (see `fence`).
    Migration {
        version: 11,
        sql: fence_one_call_migration,
    },
    // One writer of a thread's claims and leases at a time (see
    // `thread_lock`).
    Migration {
        version: 12,
        sql: thread_lock_migration,
    },
    // A claim's first step on its own, askable ahead (see
    // `claim_first`).
    Migration {
        version: 13,
        sql: claim_first_migration,
    },
    // Evidence on a checkpoint with no claim, of a thread with no live
    // run lease, skipped (see `unclaimed_evidence`).
    Migration {
        version: 14,
        sql: unclaimed_evidence_migration,
    },
    // The database's clock inlined into its callers (see `db_clock`).
    Migration {
        version: 15,
        sql: clock_inlined_migration,
    },
    // Evidence on an unclaimed checkpoint only renews its thread's
    // live run lease, once per batch (see `unclaimed_evidence`).
    Migration {
        version: 16,
        sql: lease_only_evidence_migration,
    },
];

/// The claims and run leases tables.
fn tables(s: &str) -> String {
    format!(
        r#"
CREATE TABLE {s}.claims (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL,
    checkpoint_id text NOT NULL,
    fingerprint text NOT NULL,
    state text NOT NULL CHECK (state IN ('held', 'consumed', 'released')),
    proxy_id text NOT NULL,
    session_id bigint NOT NULL,
    client_addr text NOT NULL,
    application_name text NOT NULL,
    claimed_at_ms bigint NOT NULL,
    lapse_at_ms bigint NOT NULL,
    consumed_at_ms bigint,
    evidence text,
    refusals bigint NOT NULL DEFAULT 0,
    takeovers bigint NOT NULL DEFAULT 0,
    superseded_at_ms bigint,
    abandon_at_ms bigint,
    epoch bigint NOT NULL DEFAULT 1,
    holder_instance bigint NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, fingerprint)
);
CREATE INDEX claims_consumed_at ON {s}.claims (consumed_at_ms);
CREATE INDEX claims_lapse_at ON {s}.claims (lapse_at_ms);
CREATE INDEX claims_superseded_at ON {s}.claims (superseded_at_ms);
CREATE INDEX claims_holder ON {s}.claims (proxy_id, session_id);
CREATE TABLE {s}.run_leases (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL,
    answered_checkpoint_id text NOT NULL,
    fingerprint text NOT NULL,
    proxy_id text NOT NULL,
    session_id bigint NOT NULL,
    client_addr text NOT NULL,
    application_name text NOT NULL,
    answered_at_ms bigint NOT NULL,
    last_write_ms bigint NOT NULL,
    until_ms bigint NOT NULL,
    holder_instance bigint NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns)
);
CREATE INDEX run_leases_until ON {s}.run_leases (until_ms);
CREATE SEQUENCE {s}.holder_instances;
"#
    )
}

/// The fence checked inside the writer's own transaction (see
/// `enforce::fencing`): the rule of `policy::claims::decide_write`
/// and the commit cover of `keep_for`, on the database's clock.
/// The claim row stays locked until the write's transaction ends,
/// so a takeover waits for its commit. SECURITY DEFINER: the
/// clients' roles need EXECUTE on it and USAGE on the schema, not
/// the tables.
fn fence_write(s: &str) -> String {
    format!(
        r#"
CREATE FUNCTION {s}.fence_write({CHECK_PARAMS}) {FENCE_RUNS} AS $f$
DECLARE
{variables}BEGIN
{check}END
$f$;
GRANT USAGE ON SCHEMA {s} TO PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.fence_write(text, text, text, text, bigint, text, text, text, bigint)
    TO PUBLIC;
"#,
        variables = check_holder_variables(s),
        check = check_holder(s),
    )
}

/// Every decision in one statement, each its own transaction on the
/// server (see `claims::postgres::store`): the claim, and the
/// evidence of a run. A row is locked only while the statement
/// runs, never across a round trip, so a resume's next decision or
/// fenced write does not wait for another decision's COMMIT.
fn decisions(s: &str) -> String {
    format!(
        r#"
-- Holders on other proxy processes that are gone (their instance's
-- liveness lock, a session-level advisory lock, is not held): their
-- claims and leases on one namespace of a thread are treated as if their
-- connection had closed (see `holder_gone`), from p_gone_until.
CREATE FUNCTION {s}.sweep(p_thread text, p_ns text, p_instance bigint, p_gone_until bigint)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    UPDATE {s}.claims x SET abandon_at_ms = p_gone_until, lapse_at_ms = CASE
        WHEN x.state = 'held' THEN LEAST(x.lapse_at_ms, p_gone_until) ELSE x.lapse_at_ms END
     WHERE x.thread_id = p_thread AND x.checkpoint_ns = p_ns
       AND x.state IN ('held', 'consumed') AND x.abandon_at_ms IS NULL
       AND x.holder_instance <> p_instance AND {INSTANCE_DEAD};
    UPDATE {s}.run_leases x SET until_ms = p_gone_until
     WHERE x.thread_id = p_thread AND x.checkpoint_ns = p_ns AND x.until_ms > p_gone_until
       AND x.holder_instance <> p_instance AND {INSTANCE_DEAD};
END
$f$;

CREATE FUNCTION {s}.claim(
    p_thread text, p_ns text, p_checkpoint text, p_fingerprint text,
    p_proxy text, p_session bigint, p_addr text, p_app text, p_instance bigint,
    p_now bigint, p_lapse_at bigint, p_superseded_cutoff bigint, p_gone_until bigint,
    p_lease_ms bigint
) RETURNS TABLE (outcome text, c {s}.claims) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    r {s}.claims%ROWTYPE;
    writing boolean;
BEGIN
    -- A first reader takes it; the second pass follows the sweep (the row
    -- may also have gone since: purged, thread forgotten).
    FOR pass IN 1..2 LOOP
        INSERT INTO {s}.claims VALUES (p_thread, p_ns, p_checkpoint, p_fingerprint, 'held',
            p_proxy, p_session, p_addr, p_app, p_now, p_lapse_at, NULL, NULL, 0, 0, NULL, NULL,
            1, p_instance)
        ON CONFLICT DO NOTHING RETURNING * INTO r;
        IF FOUND THEN
            RETURN QUERY SELECT 'taken', r;
            RETURN;
        END IF;
        EXIT WHEN pass = 2;
        -- The holder's own session reading again: no lock, no sweep.
        SELECT * INTO r FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
            AND checkpoint_id = p_checkpoint AND fingerprint = p_fingerprint;
        IF FOUND AND r.state = 'held' AND r.proxy_id = p_proxy AND r.session_id = p_session
            AND (r.superseded_at_ms IS NULL OR r.superseded_at_ms > p_superseded_cutoff) THEN
            RETURN QUERY SELECT 'already_held', r;
            RETURN;
        END IF;
        PERFORM {s}.sweep(p_thread, p_ns, p_instance, p_gone_until);
    END LOOP;
    SELECT * INTO r FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        AND checkpoint_id = p_checkpoint AND fingerprint = p_fingerprint FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the claim row was deleted while it was being taken; the reader retries';
    END IF;
    -- A row on a checkpoint superseded longer than the grace ago is as
    -- good as purged (the thread was rewound to it); its epoch counts on.
    IF r.superseded_at_ms <= p_superseded_cutoff THEN
        UPDATE {s}.claims SET state = 'held', proxy_id = p_proxy, session_id = p_session,
            client_addr = p_addr, application_name = p_app, claimed_at_ms = p_now,
            lapse_at_ms = p_lapse_at, consumed_at_ms = NULL, evidence = NULL, refusals = 0,
            takeovers = 0, superseded_at_ms = NULL, abandon_at_ms = NULL, epoch = r.epoch + 1,
            holder_instance = p_instance
         WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
           AND fingerprint = p_fingerprint
        RETURNING * INTO r;
        RETURN QUERY SELECT 'taken', r;
        RETURN;
    END IF;
    -- The claim rule (restated for the model check: tests/claims_rule).
    writing := r.state = 'consumed' AND p_lease_ms > 0 AND EXISTS (SELECT 1 FROM {s}.run_leases
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND until_ms > p_now);
    IF r.state = 'consumed' AND NOT (r.superseded_at_ms IS NULL
        AND r.abandon_at_ms IS NOT NULL AND p_now >= r.abandon_at_ms AND NOT writing) THEN
        RETURN QUERY SELECT 'consumed', r;
        RETURN;
    END IF;
    IF r.state = 'held' AND r.proxy_id = p_proxy AND r.session_id = p_session THEN
        RETURN QUERY SELECT 'already_held', r;
        RETURN;
    END IF;
    IF r.state = 'held' AND p_now < r.lapse_at_ms THEN
        RETURN QUERY SELECT 'busy', r;
        RETURN;
    END IF;
    -- Taken over (a lapsed held claim, an abandoned consumed one) or,
    -- released, taken afresh: the next generation.
    RETURN QUERY SELECT CASE WHEN r.state = 'released' THEN 'taken_from' ELSE 'taken_over_from'
        END, r;
    UPDATE {s}.claims SET state = 'held', proxy_id = p_proxy, session_id = p_session,
        client_addr = p_addr, application_name = p_app, claimed_at_ms = p_now,
        lapse_at_ms = p_lapse_at, consumed_at_ms = NULL, evidence = NULL,
        takeovers = takeovers + CASE WHEN r.state = 'released' THEN 0 ELSE 1 END,
        abandon_at_ms = NULL, epoch = epoch + 1, holder_instance = p_instance
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
       AND fingerprint = p_fingerprint
    RETURNING * INTO r;
    RETURN QUERY SELECT 'now', r;
END
$f$;

-- Held claims on a checkpoint taken by p_taken_by become consumed
-- (returned as they were) and start their holder's run lease; the
-- thread's live leases last p_lease_ms past this write.
{consume}
-- The thread put a checkpoint whose parent is p_parent: its held claims
-- are consumed (returned), its rows superseded; rows superseded before
-- p_superseded_cutoff and finished rows older than p_retain_cutoff go.
CREATE FUNCTION {s}.move_on(
    p_thread text, p_ns text, p_parent text, p_evidence text, p_now bigint, p_lease_ms bigint,
    p_superseded_cutoff bigint, p_retain_cutoff bigint
) RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    RETURN QUERY SELECT * FROM {s}.consume(p_thread, p_ns, p_parent, p_evidence,
        9223372036854775807, p_now, p_lease_ms);
    UPDATE {s}.claims SET superseded_at_ms = p_now
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_parent
       AND superseded_at_ms IS NULL;
    DELETE FROM {s}.claims WHERE superseded_at_ms < p_superseded_cutoff;
    DELETE FROM {s}.run_leases WHERE until_ms < p_retain_cutoff;
    DELETE FROM {s}.claims WHERE consumed_at_ms < p_retain_cutoff AND state = 'consumed';
    DELETE FROM {s}.claims WHERE lapse_at_ms < p_retain_cutoff AND state IN ('held', 'released');
END
$f$;

-- Progress short of an answer: held claims taken by p_written_at record
-- it and lapse no earlier than p_until; the held claims are returned.
CREATE FUNCTION {s}.note_progress(
    p_thread text, p_ns text, p_checkpoint text, p_evidence text, p_until bigint,
    p_written_at bigint
) RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    UPDATE {s}.claims SET evidence = p_evidence, lapse_at_ms = GREATEST(lapse_at_ms, p_until)
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
       AND state = 'held' AND claimed_at_ms <= p_written_at;
    RETURN QUERY SELECT * FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        AND checkpoint_id = p_checkpoint AND state = 'held' {ORDER};
END
$f$;

-- The holder's connection closed: its held claims lapse, and its leases
-- end, no later than p_until; its claims count as abandoned from then.
-- The held claims whose lapse this shortens are returned as they were.
CREATE FUNCTION {s}.holder_gone(p_proxy text, p_session bigint, p_until bigint)
RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    RETURN QUERY SELECT * FROM {s}.claims WHERE proxy_id = p_proxy AND session_id = p_session
        AND state = 'held' AND lapse_at_ms > p_until {ORDER} FOR UPDATE;
    UPDATE {s}.claims SET lapse_at_ms = p_until WHERE proxy_id = p_proxy
       AND session_id = p_session AND state = 'held' AND lapse_at_ms > p_until;
    UPDATE {s}.claims SET abandon_at_ms = p_until WHERE proxy_id = p_proxy
       AND session_id = p_session AND state IN ('held', 'consumed') AND abandon_at_ms IS NULL;
    UPDATE {s}.run_leases SET until_ms = p_until WHERE proxy_id = p_proxy
       AND session_id = p_session AND until_ms > p_until;
END
$f$;

-- The live run lease on a namespace of a thread, after marking the
-- thread's claims and leases whose holder's proxy process is gone.
CREATE FUNCTION {s}.run_lease(
    p_thread text, p_ns text, p_instance bigint, p_now bigint, p_gone_until bigint
) RETURNS SETOF {s}.run_leases LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    PERFORM {s}.sweep(p_thread, p_ns, p_instance, p_gone_until);
    RETURN QUERY SELECT * FROM {s}.run_leases
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND until_ms > p_now;
END
$f$;
"#,
        INSTANCE_DEAD = INSTANCE_DEAD,
        ORDER = ORDER,
        consume = consume_held(
            s,
            "consume",
            &format!(
                "            INSERT INTO {s}.run_leases VALUES (r.thread_id, r.checkpoint_ns, r.checkpoint_id,
                r.fingerprint, r.proxy_id, r.session_id, r.client_addr, r.application_name,
                p_now, p_now, p_now + p_lease_ms, r.holder_instance)
            ON CONFLICT (thread_id, checkpoint_ns) DO UPDATE SET
"
            ),
            "",
        ),
    )
}
