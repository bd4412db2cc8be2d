//! The server's consumption of a checkpoint's held claims, written once
//! for the two versions of the function that runs it (`consume` of the
//! first decisions, `consume_at` on the database's clock, see
//! `db_clock`): each held claim taken in time becomes consumed and starts
//! its holder's run lease, and the thread's live leases are renewed. Each
//! version's text stays as its migration first ran it.

use super::leases::renew_live_leases;
use super::rows::ORDER;

/// `CREATE FUNCTION <schema>.<name>(…)`: held claims on `p_checkpoint`
/// taken by `p_taken_by` become consumed at `p_now`, each upserting its
/// run lease with `lease_insert` (the statement up to its `DO UPDATE
/// SET`), and `after_consumed` runs on the consumed row before it is
/// returned.
pub(super) fn consume_held(
    s: &str,
    name: &str,
    lease_insert: &str,
    after_consumed: &str,
) -> String {
    format!(
        r#"CREATE FUNCTION {s}.{name}(
    p_thread text, p_ns text, p_checkpoint text, p_evidence text, p_taken_by bigint,
    p_now bigint, p_lease_ms bigint
) RETURNS SETOF {s}.claims LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    r {s}.claims%ROWTYPE;
BEGIN
    FOR r IN SELECT * FROM {s}.claims WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        AND checkpoint_id = p_checkpoint AND state = 'held' AND claimed_at_ms <= p_taken_by
        {ORDER} FOR UPDATE
    LOOP
        UPDATE {s}.claims SET state = 'consumed', consumed_at_ms = p_now, evidence = p_evidence
         WHERE thread_id = r.thread_id AND checkpoint_ns = r.checkpoint_ns
           AND checkpoint_id = r.checkpoint_id AND fingerprint = r.fingerprint;
        IF p_lease_ms > 0 THEN
{lease_insert}                answered_checkpoint_id = EXCLUDED.answered_checkpoint_id,
                fingerprint = EXCLUDED.fingerprint, proxy_id = EXCLUDED.proxy_id,
                session_id = EXCLUDED.session_id, client_addr = EXCLUDED.client_addr,
                application_name = EXCLUDED.application_name,
                answered_at_ms = EXCLUDED.answered_at_ms, last_write_ms = EXCLUDED.last_write_ms,
                until_ms = EXCLUDED.until_ms, holder_instance = EXCLUDED.holder_instance;
        END IF;
{after_consumed}        RETURN NEXT r;
    END LOOP;
    IF p_lease_ms > 0 THEN
{renew}    END IF;
END
$f$;
"#,
        renew = renew_live_leases(s, "p_thread", "p_now"),
    )
}
