//! Holders of proxy processes that are gone: liveness locks, their
//! grace, what a gone holder's claims and run leases become, and a lock
//! connection reaped and taken again.

use super::*;

/// Tries until the other process's lock is seen gone (the server ends a
/// closed connection's backend asynchronously), at most 5 s.
fn until_gone(mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "the dead holder was never seen gone"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_held_claim_of_a_proxy_process_that_is_gone_lapses_after_the_grace() {
    let db = PgSchema::new("liveness");
    let b = db.open().with_holder_gone_grace(GRACE);
    let k = key("c1");
    {
        let a = db.open();
        claim_as_p1(&a, &k);
        // While `a` lives, its claim holds for the whole lapse.
        match b.try_claim(&k, &holder("p2", 2), T0 + 5, LAPSE) {
            Ok(ClaimOutcome::Busy(r)) => assert_eq!(r.lapse_at_ms, T0 + LAPSE),
            other => panic!("{other:?}"),
        }
    }
    // `a` is gone (its connections closed): within the grace the claim is
    // still busy, with its lapse shortened to the grace; then taken over.
    until_gone(|| {
        matches!(b.try_claim(&k, &holder("p2", 2), T0 + 10, LAPSE),
            Ok(ClaimOutcome::Busy(r)) if r.lapse_at_ms == T0 + 10 + GRACE)
    });
    match b.try_claim(&k, &holder("p2", 2), T0 + 10 + GRACE, LAPSE) {
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!(previous.holder, holder("p1", 1));
            assert_eq!(previous.abandon_at_ms, Some(T0 + 10 + GRACE));
            assert_eq!((now.holder, now.epoch), (holder("p2", 2), 2));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_gone_holder_stays_gone_when_another_schemas_proxy_draws_its_number() {
    let (mine, theirs) = (
        PgSchema::new("neighbour_mine"),
        PgSchema::new("neighbour_theirs"),
    );
    let b = mine.open().with_holder_gone_grace(GRACE);
    let k = key("c1");
    let gone = {
        let a = mine.open();
        claim_as_p1(&a, &k);
        a.instance().expect("instance")
    };
    until_gone(|| lock_holders(&mine, gone) == 0);
    // A proxy of another schema in the same database draws the same
    // number from its own sequence and holds its liveness lock.
    drop(theirs.open());
    theirs
        .admin()
        .execute(
            &format!(
                "SELECT setval('{}.holder_instances', $1 & 4294967295, false)",
                theirs.target().schema()
            ),
            &[&gone],
        )
        .expect("setval");
    let _neighbour = theirs.open();
    // That lock is not `a`'s: its claim is still seen as a gone holder's.
    until_gone(|| {
        matches!(b.try_claim(&k, &holder("p2", 2), T0 + 10, LAPSE),
            Ok(ClaimOutcome::Busy(r)) if r.lapse_at_ms == T0 + 10 + GRACE)
    });
}

#[test]
fn an_answered_run_of_a_proxy_process_that_is_gone_is_taken_over() {
    let db = PgSchema::new("liveness_answered");
    let b = db.open().with_holder_gone_grace(GRACE).with_run_lease(0);
    let k = key("c1");
    {
        let a = db.open();
        claim_as_p1(&a, &k);
        a.consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 5)
            .expect("consume");
    }
    until_gone(|| {
        matches!(b.get(&k), Ok(Some(r)) if r.abandon_at_ms.is_some())
            || matches!(b.try_claim(&k, &holder("p2", 2), T0 + 10, LAPSE),
                Ok(ClaimOutcome::Consumed(r)) if r.abandon_at_ms.is_some())
    });
    match b.try_claim(&k, &holder("p2", 2), T0 + 10 + GRACE, LAPSE) {
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!(previous.state, ClaimState::Consumed);
            assert_eq!(now.holder, holder("p2", 2));
        }
        other => panic!("{other:?}"),
    }
}

/// The backend holding the advisory lock of `instance`.
const LOCK_HOLDER: &str = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' \
    AND objsubid = 1 AND granted AND ((classid::bigint << 32) | objid::bigint) = $1";

/// Two proxies on the schema `name` (the second with the holder-gone
/// grace): the first holds `c1`; its instance id.
fn two_proxies_the_first_holding_c1(
    name: &str,
) -> (PgSchema, ClaimStore, ClaimStore, ClaimKey, i64) {
    let db = PgSchema::new(name);
    let a = db.open();
    let b = db.open().with_holder_gone_grace(GRACE);
    let k = key("c1");
    claim_as_p1(&a, &k);
    let instance = a.instance().expect("instance");
    (db, a, b, k, instance)
}

#[test]
fn a_proxy_whose_liveness_connection_was_reaped_takes_the_same_lock_again() {
    let (db, a, b, k, first) = two_proxies_the_first_holding_c1("relock");
    assert_eq!(terminate(&db, LOCK_HOLDER, &[&first]), 1);
    // Within a heartbeat (400 ms) the proxy finds its lock connection
    // gone and takes the same instance's lock on a new one.
    until_locked(&db, first);
    assert_eq!(a.instance(), Some(first));
    match b.try_claim(&k, &holder("p2", 2), T0 + 10, LAPSE) {
        Ok(ClaimOutcome::Busy(r)) => {
            assert_eq!((r.lapse_at_ms, r.abandon_at_ms), (T0 + LAPSE, None))
        }
        other => panic!("{other:?}"),
    }
}

/// Waits (at most 5 s) until the advisory lock of `instance` is held
/// again.
fn until_locked(db: &PgSchema, instance: i64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while lock_holders(db, instance) == 0 {
        assert!(Instant::now() < deadline, "the lock was never taken again");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many backends hold the advisory lock of `instance` (0 or 1).
fn lock_holders(db: &PgSchema, instance: i64) -> i64 {
    db.admin()
        .query_one(
            &format!("SELECT count(*) FROM ({LOCK_HOLDER}) p"),
            &[&instance],
        )
        .expect("count")
        .get(0)
}

/// Ends the lock connection of `instance` until `swept` (another proxy's
/// decision) sees its holders counted as gone before the proxy takes its
/// lock back (its heartbeat may be first: then it is ended again).
fn sweep_while_gone(db: &PgSchema, instance: i64, mut swept: impl FnMut() -> bool) {
    for _ in 0..10 {
        assert_eq!(terminate(db, LOCK_HOLDER, &[&instance]), 1);
        let deadline = Instant::now() + Duration::from_millis(300);
        while Instant::now() < deadline {
            if swept() {
                return;
            }
        }
    }
    panic!("the other proxy never decided while the lock was gone");
}

#[test]
fn a_lock_gone_briefly_hands_no_claim_over_after_the_grace() {
    let db = PgSchema::new("revive");
    let a = db.open();
    let b = db.open().with_holder_gone_grace(GRACE).with_run_lease(0);
    let (held, answered) = (key("c1"), key("c2"));
    claim_as_p1(&a, &held);
    claim_as_p1(&a, &answered);
    a.consume("t-1", "", "c2", "task writes", i64::MAX, T0 + 1)
        .expect("consume");
    let me = a.instance().expect("instance");
    // The lock is ended; the other proxy decides while it is gone, so its
    // sweep counts a's holders as gone (the lapse shortened to the grace,
    // the answered claim abandoned from then). Tried again should a's
    // heartbeat take the lock back before b looks.
    let swept = |r: &crate::claims::ClaimRecord| r.abandon_at_ms == Some(T0 + 10 + GRACE);
    // Both sweeps must see the lock gone: a's heartbeat may take it back
    // between them, which the next try ends again.
    sweep_while_gone(&db, me, || {
        matches!(b.try_claim(&held, &holder("p2", 2), T0 + 10, LAPSE),
                Ok(ClaimOutcome::Busy(r)) if swept(&r) && r.lapse_at_ms == T0 + 10 + GRACE)
            && b.try_claim(&answered, &holder("p2", 2), T0 + 10, LAPSE)
                .is_ok()
            && matches!(b.get(&answered), Ok(Some(r)) if swept(&r))
    });
    // a takes the same lock back and revives both.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (h, c) = (b.get(&held), b.get(&answered));
        if let (Ok(Some(h)), Ok(Some(c))) = (h, c) {
            if h.abandon_at_ms.is_none() && c.abandon_at_ms.is_none() {
                assert_eq!(h.lapse_at_ms, T0 + LAPSE);
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the swept claims were never revived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.instance(), Some(me));
    // Past the grace a's claims still hold: the held one is busy for its
    // whole lapse, the answered one answered.
    let later = T0 + 10 + GRACE + 1;
    match b.try_claim(&held, &holder("p2", 2), later, LAPSE) {
        Ok(ClaimOutcome::Busy(r)) => assert_eq!((r.holder, r.epoch), (holder("p1", 1), 1)),
        other => panic!("{other:?}"),
    }
    match b.try_claim(&answered, &holder("p2", 2), later, LAPSE) {
        Ok(ClaimOutcome::Consumed(r)) => assert_eq!((r.holder, r.epoch), (holder("p1", 1), 1)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_closed_holder_session_is_not_revived_by_a_lock_taken_again() {
    let (db, a, b, k, me) = two_proxies_the_first_holding_c1("revive_closed");
    sweep_while_gone(&db, me, || {
        matches!(b.try_claim(&k, &holder("p2", 2), T0 + 10, LAPSE),
                Ok(ClaimOutcome::Busy(r)) if r.abandon_at_ms.is_some())
    });
    // The holder's session closes while the lock is gone: that ends its
    // claim for real, whatever the lock does next.
    a.holder_gone("p1", 1, T0 + 20, GRACE).expect("holder gone");
    until_locked(&db, me);
    std::thread::sleep(Duration::from_millis(100));
    match b.try_claim(&k, &holder("p2", 2), T0 + 20 + GRACE, LAPSE) {
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!(
                (previous.holder, now.holder),
                (holder("p1", 1), holder("p2", 2))
            );
        }
        other => panic!("{other:?}"),
    }
}
