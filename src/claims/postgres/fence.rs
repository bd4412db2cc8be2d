//! The fence a write's transaction runs (`fence_write`, see
//! `enforce::fencing`), as SQL the migrations that define it share: the
//! check of the writer against the claim's holder, and an answer's
//! consumption of its claim (see `answer_in_write`). And the migration
//! that makes the fence one function call. The check was a second
//! SECURITY DEFINER function that the fence called, and every nested call
//! costs the server a search_path switch and a longer path through a
//! backend that has been idle for a round trip. That cost lands on the
//! write's own round trip, three times in a resume. A copy of this fence,
//! measured at 5 ms one-way (25 resumes each, three alternations):
//! 0.37–0.53 ms per fence, against 0.49–0.65 ms before. The older
//! signature now calls the fence with no answer; it stays for replicas of
//! an older build during a rolling upgrade.

/// The fence's parameters, as its older signature has them: the
/// continued checkpoint, the writer, the generations it took, the cover.
pub(super) const CHECK_PARAMS: &str = "
    p_thread text, p_ns text, p_checkpoint text,
    p_proxy text, p_session bigint, p_addr text, p_app text,
    p_took text, p_cover_ms bigint";

/// The parameters the fence takes after [`CHECK_PARAMS`]: the answer.
pub(super) const ANSWER_PARAMS: &str = "p_answer text, p_moves_on boolean, p_lease_ms bigint";

/// How the fence runs: as the schema's owner (the clients' roles need
/// EXECUTE on it and USAGE on the schema, not the tables), on a fixed
/// search path.
pub(super) const FENCE_RUNS: &str = "RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp";

/// The variables [`check_holder`] uses.
pub(super) fn check_holder_variables(s: &str) -> String {
    format!(
        r#"    c {s}.claims%ROWTYPE;
    until_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint + p_cover_ms;
    took_epoch bigint;
    reason text;
    why text;
"#
    )
}

/// Raises RGF01 unless the writer (`p_proxy`, `p_session`, `p_addr`,
/// `p_app`, the generations it took `p_took`) holds the claim on the
/// continued checkpoint; the holder's claim is kept `p_cover_ms` past the
/// check. The claim row stays locked until the write's transaction ends,
/// so a takeover waits for its commit. No claim: nothing to check.
pub(super) fn check_holder(s: &str) -> String {
    format!(
        r#"    SELECT * INTO c FROM {s}.claims
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
       AND state IN ('held', 'consumed')
     ORDER BY claimed_at_ms DESC, epoch DESC LIMIT 1
     FOR NO KEY UPDATE;
    IF FOUND THEN
        IF c.proxy_id = p_proxy AND (c.session_id = p_session OR (
            regexp_replace(c.client_addr, ':[0-9]+$', '') = regexp_replace(p_addr, ':[0-9]+$', '')
            AND c.application_name = p_app)) THEN
            IF (c.state = 'held' AND c.lapse_at_ms < until_ms) OR c.abandon_at_ms < until_ms THEN
                UPDATE {s}.claims SET
                    lapse_at_ms = CASE WHEN state = 'held'
                        THEN greatest(lapse_at_ms, until_ms) ELSE lapse_at_ms END,
                    abandon_at_ms = CASE WHEN abandon_at_ms IS NULL
                        THEN NULL ELSE greatest(abandon_at_ms, until_ms) END
                 WHERE thread_id = c.thread_id AND checkpoint_ns = c.checkpoint_ns
                   AND checkpoint_id = c.checkpoint_id AND fingerprint = c.fingerprint;
            END IF;
        ELSE
            -- p_took: the writer's generations of claims on this checkpoint,
            -- as 'fingerprint:epoch' entries separated by commas.
            SELECT max(split_part(t, ':', 2)::bigint) INTO took_epoch
              FROM unnest(string_to_array(p_took, ',')) AS t
             WHERE split_part(t, ':', 1) = c.fingerprint
               AND split_part(t, ':', 2)::bigint < c.epoch;
            IF took_epoch IS NOT NULL THEN
                reason := 'superseded_holder';
                why := format('this session (proxy %s, session %s) held epoch %s, which was '
                    'taken over', p_proxy, p_session, took_epoch);
            ELSIF c.proxy_id <> p_proxy THEN
                reason := 'other_proxy';
                why := format('this session is on proxy %s, not the holder''s', p_proxy);
            ELSE
                reason := 'other_client';
                why := format('this session is another client (%s, application_name "%s")',
                    p_addr, p_app);
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'RGF01',
                MESSAGE = format('resumeguard: write fenced: thread "%s", checkpoint_ns "%s", '
                    'checkpoint "%s" is held by client %s (application_name "%s", proxy %s, '
                    'session %s) at epoch %s (interrupt %s); %s; nothing of this write was '
                    'committed', p_thread, p_ns, p_checkpoint, c.client_addr,
                    c.application_name, c.proxy_id, c.session_id, c.epoch,
                    left(c.fingerprint, 12), why),
                DETAIL = format('the claim''s holder: proxy %s, session %s, epoch %s',
                    c.proxy_id, c.session_id, c.epoch),
                HINT = reason;
        END IF;
    END IF;
"#
    )
}

/// For an answer (`p_answer`; `p_moves_on`: a next checkpoint), the held
/// claims on the checkpoint consumed (and marked `consumed_in_write`) and,
/// for a next checkpoint, superseded, in the write's transaction.
pub(super) fn consume_answer(s: &str) -> String {
    format!(
        r#"    IF p_answer IS NULL THEN
        RETURN;
    END IF;
    v_now := {s}.clock_ms();
    FOR c IN SELECT * FROM {s}.consume_at(p_thread, p_ns, p_checkpoint, p_answer,
        CASE WHEN p_moves_on THEN 9223372036854775807 ELSE v_now END, v_now,
        greatest(p_lease_ms, 0))
    LOOP
        UPDATE {s}.claims SET consumed_in_write = true WHERE key_digest = c.key_digest;
    END LOOP;
    IF p_moves_on THEN
        UPDATE {s}.claims SET superseded_at_ms = v_now
         WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
           AND superseded_at_ms IS NULL;
    END IF;
"#
    )
}

/// The fence as one function: `lead` (statements run first), the check,
/// and for an answer its consumption.
pub(super) fn fence_definition(s: &str, lead: &str) -> String {
    let variables = check_holder_variables(s);
    let check = check_holder(s);
    let answer = consume_answer(s);
    format!(
        r#"CREATE OR REPLACE FUNCTION {s}.fence_write({CHECK_PARAMS}, {ANSWER_PARAMS}) {FENCE_RUNS} AS $f$
DECLARE
{variables}    v_now bigint;
BEGIN
{lead}{check}{answer}END
$f$;
"#
    )
}

/// The fence and its older signature redefined as one call each.
pub(super) fn fence_one_call_migration(s: &str) -> String {
    let fence = fence_definition(s, "");
    format!(
        r#"
-- The fence: the check, and for an answer its consumption, in one call.
{fence}
-- The older signature: the same fence, with no answer.
CREATE OR REPLACE FUNCTION {s}.fence_write({CHECK_PARAMS}) {FENCE_RUNS} AS $f$
BEGIN
    PERFORM {s}.fence_write(p_thread, p_ns, p_checkpoint, p_proxy, p_session, p_addr, p_app,
        p_took, p_cover_ms, NULL::text, false, 0::bigint);
END
$f$;
"#
    )
}
