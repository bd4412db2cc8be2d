//! The migration that gives a claim's first step a function of its own,
//! `claim_first`: a first reader takes the claim (the row inserted), or
//! the holder's own session reads its held claim again, and otherwise
//! nothing happens and nothing is returned. No lock is waited for but the
//! insert's, no sweep runs, no claim changes hands. So the proxy can ask
//! it beside a read of a head it expects to be parked, before the head is
//! known (see `enforce::claim_ahead`), and withdraw a claim it took for a
//! head the read did not return. `claim` takes this same step first, so
//! the rule is written once.

use super::db_clock::{claim_contested, claim_head, claim_insert, claim_own_reread};

pub(super) fn claim_first_migration(s: &str) -> String {
    let (insert, reread, contested) = (claim_insert(s), claim_own_reread(s), claim_contested(s));
    let claim_head = claim_head(s, "CREATE OR REPLACE");
    format!(
        r#"
-- A claim's first step: taken by a first reader, or read again by its
-- holder's own session; no row otherwise, and nothing changed.
CREATE FUNCTION {s}.claim_first(
    p_thread text, p_ns text, p_checkpoint text, p_fingerprint text,
    p_proxy text, p_session bigint, p_addr text, p_app text, p_instance bigint,
    p_lapse_ms bigint, p_superseded_grace_ms bigint
) RETURNS TABLE (outcome text, c {s}.claims, decided_at_ms bigint) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    r {s}.claims%ROWTYPE;
    v_now bigint := {s}.clock_ms();
BEGIN
{insert}{reread}END
$f$;

-- The claim: its first step, then after the gone-holder sweep that step
-- again (the row may also have gone since: purged, thread forgotten),
-- then the row locked and decided.
{claim_head}    FOR pass IN 1..2 LOOP
        RETURN QUERY SELECT * FROM {s}.claim_first(p_thread, p_ns, p_checkpoint,
            p_fingerprint, p_proxy, p_session, p_addr, p_app, p_instance, p_lapse_ms,
            p_superseded_grace_ms);
        IF FOUND THEN
            RETURN;
        END IF;
        EXIT WHEN pass = 2;
        PERFORM {s}.sweep(p_thread, p_ns, p_instance, v_now + p_gone_grace_ms);
    END LOOP;
{contested}END
$f$;
"#
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{holder, key};
    use crate::claims::ClaimOutcome;
    use crate::test_pg_server::PgSchema;

    const T0: i64 = 1_700_000_000_000;
    const LAPSE: i64 = 10_000;

    #[test]
    fn the_first_step_takes_a_free_claim_and_leaves_any_other_as_it_was() {
        let db = PgSchema::new("first");
        let store = db.open();
        let (k, p1, p2) = (key("c1"), holder("p1", 1), holder("p2", 2));
        match store.try_claim_first(&k, &p1, T0, LAPSE) {
            Ok(Some((ClaimOutcome::Taken(r), at))) => assert_eq!((r.epoch, at), (1, T0)),
            other => panic!("{other:?}"),
        }
        match store.try_claim_first(&k, &p1, T0 + 1, LAPSE) {
            Ok(Some((ClaimOutcome::AlreadyHeld(r), _))) => assert_eq!(r.holder, p1),
            other => panic!("{other:?}"),
        }
        // Lapsed, yet the first step never hands a claim over.
        let before = store.get(&k).expect("get");
        let lapsed = T0 + LAPSE + 1;
        assert_eq!(store.try_claim_first(&k, &p2, lapsed, LAPSE), Ok(None));
        assert_eq!(store.get(&k).expect("get"), before, "nothing changed");
        match store.try_claim(&k, &p2, lapsed, LAPSE) {
            Ok(ClaimOutcome::TakenOver { now, .. }) => assert_eq!(now.epoch, 2),
            other => panic!("the claim itself still takes it over: {other:?}"),
        }
    }

    #[test]
    fn a_withdrawn_claim_is_gone_only_for_its_holder_at_its_generation() {
        let db = PgSchema::new("withdraw");
        let store = db.open();
        let (k, p1, p2) = (key("c1"), holder("p1", 1), holder("p2", 2));
        store.try_claim_first(&k, &p1, T0, LAPSE).expect("taken");
        assert_eq!(store.withdraw(&k, &p2, 1), Ok(false), "another holder's");
        assert_eq!(store.withdraw(&k, &p1, 2), Ok(false), "another generation");
        assert!(store.get(&k).expect("get").is_some());
        assert_eq!(store.withdraw(&k, &p1, 1), Ok(true));
        assert_eq!(store.get(&k).expect("get"), None);
        match store.try_claim(&k, &p2, T0 + 1, LAPSE) {
            Ok(ClaimOutcome::Taken(r)) => assert_eq!(r.epoch, 1, "as if never taken"),
            other => panic!("{other:?}"),
        }
    }
}
