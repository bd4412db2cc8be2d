//! The migration that puts every claims decision on the database's clock:
//! each decision function reads the server's `clock_timestamp()`
//! (`<schema>.clock_ms()`) and takes durations (the lapse, the run lease,
//! the graces, how long ago the evidence's write passed its proxy) where
//! it took instants a proxy computed from its own wall clock. The old
//! signatures are dropped, so a proxy of an older build fails loudly
//! (`function … does not exist`) rather than decide on its own clock.
//!
//! A test build's `clock_ms()` can be held at an instant a test sets on
//! its connection (`resumeguard.test_clock_ms`), so store tests replay
//! histories without sleeping; a release build's reads the clock only.

use super::held_consumption::consume_held;
use super::liveness::forget_swept;
use super::rows::ORDER;

/// The setting a test build's `clock_ms()` reads first (ms since the Unix
/// epoch; empty: the real clock).
#[cfg(test)]
pub(super) const TEST_CLOCK_SETTING: &str = "resumeguard.test_clock_ms";

/// The body of `<schema>.clock_ms()`.
fn clock_body() -> &'static str {
    #[cfg(test)]
    {
        "SELECT coalesce(nullif(current_setting('resumeguard.test_clock_ms', true), '')::bigint, \
         (extract(epoch FROM clock_timestamp()) * 1000)::bigint)"
    }
    #[cfg(not(test))]
    {
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    }
}

/// The body of `<schema>.clock_ms()` from the migration that lets it be
/// inlined: every name qualified, since it no longer sets its own path.
fn inlinable_clock_body() -> &'static str {
    #[cfg(test)]
    {
        "SELECT coalesce(nullif(pg_catalog.current_setting('resumeguard.test_clock_ms', true), \
         '')::bigint, (EXTRACT(epoch FROM pg_catalog.clock_timestamp()) \
         OPERATOR(pg_catalog.*) 1000)::bigint)"
    }
    #[cfg(not(test))]
    {
        "SELECT (EXTRACT(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint"
    }
}

/// The migration that lets the planner inline `<schema>.clock_ms()` into
/// the statement that reads it. A function with its own `SET search_path`
/// is called through the function manager, which plans its body again in
/// each transaction that calls it: about 80 µs a call on a 2-core host,
/// and a park and resume's evidence and fences read it about ten times.
/// Without the setting (every name in the body qualified, so no caller's
/// path changes what it means) it is part of its caller's plan.
pub(super) fn clock_inlined_migration(s: &str) -> String {
    let clock = inlinable_clock_body();
    format!(
        r#"
CREATE OR REPLACE FUNCTION {s}.clock_ms() RETURNS bigint LANGUAGE sql VOLATILE
AS $f$ {clock} $f$;
"#
    )
}

pub(super) fn db_clock_migration(s: &str) -> String {
    let clock = clock_body();
    let (first_insert, own_reread) = (claim_insert(s), claim_own_reread(s));
    let contested = claim_contested(s);
    let claim_head = claim_head(s, "CREATE");
    let consume_at = consume_held(
        s,
        "consume_at",
        &format!(
            "            INSERT INTO {s}.run_leases (thread_id, checkpoint_ns, answered_checkpoint_id,
                fingerprint, proxy_id, session_id, client_addr, application_name,
                answered_at_ms, last_write_ms, until_ms, holder_instance)
            VALUES (r.thread_id, r.checkpoint_ns, r.checkpoint_id, r.fingerprint, r.proxy_id,
                r.session_id, r.client_addr, r.application_name, p_now, p_now,
                p_now + p_lease_ms, r.holder_instance)
            ON CONFLICT ON CONSTRAINT run_leases_pkey DO UPDATE SET
"
        ),
        "        r.consumed_at_ms := p_now;\n",
    );
    format!(
        r#"
-- The database's clock, in ms since the Unix epoch: the time base of
-- every claim, lease and holder-gone time.
CREATE FUNCTION {s}.clock_ms() RETURNS bigint LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $f$ {clock} $f$;

DROP FUNCTION {s}.claim(text, text, text, text, text, bigint, text, text, bigint,
    bigint, bigint, bigint, bigint, bigint);
DROP FUNCTION {s}.consume(text, text, text, text, bigint, bigint, bigint);
DROP FUNCTION {s}.move_on(text, text, text, text, bigint, bigint, bigint, bigint);
DROP FUNCTION {s}.note_progress(text, text, text, text, bigint, bigint);
DROP FUNCTION {s}.holder_gone(text, bigint, bigint);
DROP FUNCTION {s}.holder_gone_unswept(text, bigint, bigint);
DROP FUNCTION {s}.run_lease(text, text, bigint, bigint, bigint);

-- A reader asks for an interrupt's claim: taken, read by its holder, or
-- handed over, decided on the server's clock (read again once the row
-- is locked: a wait for another decision's commit does not age it).
-- `decided_at_ms` is that clock, for the proxy's local waits.
{claim_head}    -- A first reader takes it; the second pass follows the sweep (the row
    -- may also have gone since: purged, thread forgotten).
    FOR pass IN 1..2 LOOP
{first_insert}        EXIT WHEN pass = 2;
{own_reread}        PERFORM {s}.sweep(p_thread, p_ns, p_instance, v_now + p_gone_grace_ms);
    END LOOP;
{contested}END
$f$;

-- Held claims on a checkpoint taken by p_taken_by become consumed at
-- p_now (returned as they were, with the time of their consumption) and
-- start their holder's run lease; the thread's live leases last
-- p_lease_ms past now. Called with instants of the server's clock only.
{consume_at}
-- Evidence of a run on a checkpoint: held claims taken by the time its
-- write passed the proxy (p_sent_ago_ms before now) are consumed.
{consume_head}{declare_now}    RETURN QUERY SELECT * FROM {s}.consume_at(p_thread, p_ns, p_checkpoint, p_evidence,
        v_now - p_sent_ago_ms, v_now, p_lease_ms);
END
$f$;

-- The thread put a checkpoint whose parent is p_parent: its held claims
-- are consumed (returned), its rows superseded; rows superseded longer
-- than the grace ago and finished rows older than the retention go.
{move_on_head}{declare_now}    -- The thread moved on: every claim on the parent is done, however
    -- late it was taken.
    RETURN QUERY SELECT * FROM {s}.consume_at(p_thread, p_ns, p_parent, p_evidence,
        9223372036854775807, v_now, p_lease_ms);
    UPDATE {s}.claims SET superseded_at_ms = v_now
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_parent
       AND superseded_at_ms IS NULL;
    DELETE FROM {s}.claims WHERE superseded_at_ms < v_now - p_superseded_grace_ms;
    DELETE FROM {s}.run_leases WHERE until_ms < v_now - p_retain_ms;
    DELETE FROM {s}.claims WHERE consumed_at_ms < v_now - p_retain_ms AND state = 'consumed';
    DELETE FROM {s}.claims WHERE lapse_at_ms < v_now - p_retain_ms
        AND state IN ('held', 'released');
END
$f$;

-- Progress short of an answer: held claims taken by the time the write
-- passed its proxy record it and lapse no earlier than p_hold_ms from
-- now; the held claims are returned.
CREATE FUNCTION {s}.note_progress(
    p_thread text, p_ns text, p_checkpoint text, p_evidence text, p_hold_ms bigint,
    p_sent_ago_ms bigint
) RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
{declare_now}    UPDATE {s}.claims SET evidence = p_evidence,
        lapse_at_ms = GREATEST(lapse_at_ms, v_now + greatest(p_hold_ms, 0))
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
       AND state = 'held' AND claimed_at_ms <= v_now - p_sent_ago_ms;
    RETURN QUERY SELECT * FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        AND checkpoint_id = p_checkpoint AND state = 'held' {ORDER};
END
$f$;

-- The holder's connection closed: its held claims lapse, and its leases
-- end, no later than p_grace_ms from now; its claims count as abandoned
-- from then, and what a sweep kept of them is forgotten (a closed
-- session ends its claims for real: no revival brings them back). The
-- held claims whose lapse this shortens are returned, shortened.
CREATE FUNCTION {s}.holder_gone(p_proxy text, p_session bigint, p_grace_ms bigint)
RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    v_until bigint := {s}.clock_ms() + greatest(p_grace_ms, 0);
BEGIN
    PERFORM 1 FROM {s}.claims WHERE proxy_id = p_proxy AND session_id = p_session
        AND state IN ('held', 'consumed') {ORDER} FOR UPDATE;
    RETURN QUERY WITH shortened AS (
        UPDATE {s}.claims SET lapse_at_ms = v_until WHERE proxy_id = p_proxy
           AND session_id = p_session AND state = 'held' AND lapse_at_ms > v_until
        RETURNING *)
    SELECT * FROM shortened {ORDER};
    UPDATE {s}.claims SET abandon_at_ms = v_until WHERE proxy_id = p_proxy
       AND session_id = p_session AND state IN ('held', 'consumed') AND abandon_at_ms IS NULL;
    UPDATE {s}.run_leases SET until_ms = v_until WHERE proxy_id = p_proxy
       AND session_id = p_session AND until_ms > v_until;
{forget_swept}END
$f$;

-- The live run lease on a namespace of a thread, after marking the
-- thread's claims and leases whose holder's proxy process is gone
-- (gone from p_gone_grace_ms after now).
CREATE FUNCTION {s}.run_lease(
    p_thread text, p_ns text, p_instance bigint, p_gone_grace_ms bigint
) RETURNS SETOF {s}.run_leases LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
{declare_now}    PERFORM {s}.sweep(p_thread, p_ns, p_instance, v_now + p_gone_grace_ms);
    RETURN QUERY SELECT * FROM {s}.run_leases
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND until_ms > v_now;
END
$f$;
"#,
        ORDER = ORDER,
        consume_head = consume_head(s),
        move_on_head = move_on_head(s),
        declare_now = declare_now(s),
        forget_swept = forget_swept(s, "v_until"),
    )
}

/// `consume`'s signature since the database's clock, up to its body:
/// evidence of a run whose write passed its proxy `p_sent_ago_ms` ago.
pub(super) fn consume_head(s: &str) -> String {
    format!(
        r#"CREATE FUNCTION {s}.consume(
    p_thread text, p_ns text, p_checkpoint text, p_evidence text, p_sent_ago_ms bigint,
    p_lease_ms bigint
) RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
"#
    )
}

/// `move_on`'s signature since the database's clock, up to its body:
/// the thread's next checkpoint, with the graces as durations.
pub(super) fn move_on_head(s: &str) -> String {
    format!(
        r#"CREATE FUNCTION {s}.move_on(
    p_thread text, p_ns text, p_parent text, p_evidence text, p_lease_ms bigint,
    p_superseded_grace_ms bigint, p_retain_ms bigint
) RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
"#
    )
}

/// A decision's declarations when `v_now`, the database's clock as the
/// function starts, is its only variable.
fn declare_now(s: &str) -> String {
    format!(
        "DECLARE
    v_now bigint := {s}.clock_ms();
BEGIN
"
    )
}

/// `claim`'s signature and declarations, up to the first statement of
/// its body: `create` is `CREATE` or `CREATE OR REPLACE`.
pub(super) fn claim_head(s: &str, create: &str) -> String {
    format!(
        r#"{create} FUNCTION {s}.claim(
    p_thread text, p_ns text, p_checkpoint text, p_fingerprint text,
    p_proxy text, p_session bigint, p_addr text, p_app text, p_instance bigint,
    p_lapse_ms bigint, p_superseded_grace_ms bigint, p_gone_grace_ms bigint,
    p_lease_ms bigint
) RETURNS TABLE (outcome text, c {s}.claims, decided_at_ms bigint) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    r {s}.claims%ROWTYPE;
    writing boolean;
    v_now bigint := {s}.clock_ms();
BEGIN
    decided_at_ms := v_now;
"#
    )
}

/// A claim's first step, taking it: a first reader inserts the row, as
/// held, at epoch 1, as of `v_now`.
pub(super) fn claim_insert(s: &str) -> String {
    format!(
        r#"        INSERT INTO {s}.claims (thread_id, checkpoint_ns, checkpoint_id, fingerprint, state,
            proxy_id, session_id, client_addr, application_name, claimed_at_ms, lapse_at_ms,
            epoch, holder_instance)
        VALUES (p_thread, p_ns, p_checkpoint, p_fingerprint, 'held', p_proxy, p_session,
            p_addr, p_app, v_now, v_now + greatest(p_lapse_ms, 0), 1, p_instance)
        ON CONFLICT DO NOTHING RETURNING * INTO r;
        IF FOUND THEN
            RETURN QUERY SELECT 'taken', r, v_now;
            RETURN;
        END IF;
"#
    )
}

/// A claim's first step, reading it: the holder's own session reading its
/// held claim again (the row not locked, nothing changed).
pub(super) fn claim_own_reread(s: &str) -> String {
    format!(
        r#"        -- The holder's own session reading again: no lock, no sweep.
        SELECT * INTO r FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
            AND checkpoint_id = p_checkpoint AND fingerprint = p_fingerprint;
        IF FOUND AND r.state = 'held' AND r.proxy_id = p_proxy AND r.session_id = p_session
            AND (r.superseded_at_ms IS NULL
                 OR r.superseded_at_ms > v_now - p_superseded_grace_ms) THEN
            RETURN QUERY SELECT 'already_held', r, v_now;
            RETURN;
        END IF;
"#
    )
}

/// The claim rule past its first step (see `claim_first`): the row is
/// there and neither free nor this holder's, so it is locked and decided
/// on the server's clock. The body's end in every version of `claim`.
pub(super) fn claim_contested(s: &str) -> String {
    format!(
        r#"    SELECT * INTO r FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        AND checkpoint_id = p_checkpoint AND fingerprint = p_fingerprint FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the claim row was deleted while it was being taken; the reader retries';
    END IF;
    v_now := {s}.clock_ms();
    decided_at_ms := v_now;
    -- A row on a checkpoint superseded longer than the grace ago is as
    -- good as purged (the thread was rewound to it); its epoch counts on.
    IF r.superseded_at_ms <= v_now - p_superseded_grace_ms THEN
        UPDATE {s}.claims SET state = 'held', proxy_id = p_proxy, session_id = p_session,
            client_addr = p_addr, application_name = p_app, claimed_at_ms = v_now,
            lapse_at_ms = v_now + greatest(p_lapse_ms, 0), consumed_at_ms = NULL,
            evidence = NULL, refusals = 0, takeovers = 0, superseded_at_ms = NULL,
            abandon_at_ms = NULL, epoch = r.epoch + 1, holder_instance = p_instance
         WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
           AND fingerprint = p_fingerprint
        RETURNING * INTO r;
        RETURN QUERY SELECT 'taken', r, v_now;
        RETURN;
    END IF;
    -- The claim rule (restated for the model check: tests/claims_rule).
    writing := r.state = 'consumed' AND p_lease_ms > 0 AND EXISTS (SELECT 1 FROM {s}.run_leases
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND until_ms > v_now);
    IF r.state = 'consumed' AND NOT (r.superseded_at_ms IS NULL
        AND r.abandon_at_ms IS NOT NULL AND v_now >= r.abandon_at_ms AND NOT writing) THEN
        RETURN QUERY SELECT 'consumed', r, v_now;
        RETURN;
    END IF;
    IF r.state = 'held' AND r.proxy_id = p_proxy AND r.session_id = p_session THEN
        RETURN QUERY SELECT 'already_held', r, v_now;
        RETURN;
    END IF;
    IF r.state = 'held' AND v_now < r.lapse_at_ms THEN
        RETURN QUERY SELECT 'busy', r, v_now;
        RETURN;
    END IF;
    -- Taken over (a lapsed held claim, an abandoned consumed one) or,
    -- released, taken afresh: the next generation.
    RETURN QUERY SELECT CASE WHEN r.state = 'released' THEN 'taken_from' ELSE 'taken_over_from'
        END, r, v_now;
    UPDATE {s}.claims SET state = 'held', proxy_id = p_proxy, session_id = p_session,
        client_addr = p_addr, application_name = p_app, claimed_at_ms = v_now,
        lapse_at_ms = v_now + greatest(p_lapse_ms, 0), consumed_at_ms = NULL, evidence = NULL,
        takeovers = takeovers + CASE WHEN r.state = 'released' THEN 0 ELSE 1 END,
        abandon_at_ms = NULL, epoch = epoch + 1, holder_instance = p_instance
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
       AND fingerprint = p_fingerprint
    RETURNING * INTO r;
    RETURN QUERY SELECT 'now', r, v_now;
"#
    )
}

/// Holds a test build's `clock_ms()` at `now` on this decision's
/// connection (or lets it read the real clock): set before each decision,
/// so a fixed instant never outlives the decision it was given for.
#[cfg(test)]
pub(super) fn hold_test_clock(
    tx: &mut super::conn::Tx<'_>,
    now: crate::claims::clock::Now,
) -> Result<(), super::conn::Fail> {
    let value = now.fixed().map(|ms| ms.to_string()).unwrap_or_default();
    tx.execute(
        "SELECT set_config($1, $2, false)",
        &[&TEST_CLOCK_SETTING, &value],
    )?;
    Ok(())
}
