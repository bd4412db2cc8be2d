//! Claiming a checkpoint: each holder a new generation (epoch), the
//! current holder of a checkpoint, and the model check's claim rule held
//! to the SQL `claim` function.

use super::*;

#[test]
fn each_new_holder_is_a_new_epoch_and_the_latest_is_the_current_holder() {
    let db = PgSchema::new("epoch");
    let store = db.open();
    let k = key("c1");
    match store.try_claim(&k, &holder("p1", 1), T0, 10) {
        Ok(ClaimOutcome::Taken(r)) => assert_eq!(r.epoch, 1),
        other => panic!("{other:?}"),
    }
    match store.try_claim(&k, &holder("p2", 2), T0 + 10, 10) {
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!((previous.epoch, now.epoch), (1, 2));
        }
        other => panic!("{other:?}"),
    }
    store.release("t-1", None).expect("release");
    match store.try_claim(&k, &holder("p3", 3), T0 + 20, 10) {
        Ok(ClaimOutcome::Taken(r)) => assert_eq!(r.epoch, 3),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get(&k).expect("get").expect("row").epoch, 3);
    let current = store
        .current_holder("t-1", "", "c1")
        .expect("holder")
        .expect("held");
    assert_eq!((current.holder, current.epoch), (holder("p3", 3), 3));
    // A newer interrupt on the checkpoint is the current holder.
    let second = ClaimKey {
        fingerprint: interrupt_fingerprint(&[("gate", Some(&b"again?"[..]))]),
        ..k.clone()
    };
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 25)
        .expect("consume");
    store
        .try_claim(&second, &holder("p4", 4), T0 + 30, 10)
        .expect("claim");
    let current = store.current_holder("t-1", "", "c1").expect("holder");
    assert_eq!(current.map(|c| c.holder), Some(holder("p4", 4)));
    assert_eq!(store.current_holder("t-1", "", "c9").expect("none"), None);
}

/// The model check's restatement of the claim rule (`tests/claims_model.rs`
/// decides every claim with it), held to the SQL below.
#[path = "../../../../tests/claims_rule/mod.rs"]
mod claims_rule;

/// Each state of a claim the model reaches, set up here by the store's
/// own operations on the test clock; then another reader (or the holder)
/// claims it at `at`, on the server, and the model's rule decides the same
/// row at the same instant: the outcomes, records included, are equal.
#[test]
fn the_models_claim_rule_decides_as_the_sql_claim_function() {
    type Setup = fn(&ClaimStore, &ClaimKey);
    fn claimed(s: &ClaimStore, k: &ClaimKey) {
        claim_as_p1(s, k);
    }
    fn answered(s: &ClaimStore, k: &ClaimKey) {
        claimed(s, k);
        let at = &k.at;
        s.consume(
            &at.thread_id,
            "",
            &at.checkpoint_id,
            "task writes",
            i64::MAX,
            T0 + 5,
        )
        .expect("consume");
    }
    fn abandoned(s: &ClaimStore, k: &ClaimKey) {
        answered(s, k);
        s.holder_gone("p1", 1, T0 + 10, 1_000).expect("gone");
    }
    fn pool_still_writes(s: &ClaimStore, k: &ClaimKey) {
        abandoned(s, k);
        s.consume(
            &k.at.thread_id,
            "",
            "c9",
            "another write",
            i64::MAX,
            T0 + 500,
        )
        .expect("write");
    }
    fn went_on(s: &ClaimStore, k: &ClaimKey) {
        answered(s, k);
        s.move_on(&k.at.thread_id, "", &k.at.checkpoint_id, T0 + 8)
            .expect("move on");
        s.holder_gone("p1", 1, T0 + 10, 1_000).expect("gone");
    }
    fn released(s: &ClaimStore, k: &ClaimKey) {
        claimed(s, k);
        s.release(&k.at.thread_id, None).expect("release");
    }
    let a = holder("p1", 1);
    let other = holder("p2", 2);
    let cases: [(&str, Setup, &Holder, i64, &str); 11] = [
        ("fresh", |_, _| {}, &other, T0, "taken"),
        ("held, live", claimed, &other, T0 + LAPSE - 1, "busy"),
        (
            "held, its holder",
            claimed,
            &a,
            T0 + LAPSE + 1,
            "already_held",
        ),
        ("held, lapsed", claimed, &other, T0 + LAPSE, "taken_over"),
        ("consumed", answered, &other, T0 + 50 * LAPSE, "consumed"),
        (
            "holder gone, in grace",
            abandoned,
            &other,
            T0 + 1_009,
            "consumed",
        ),
        ("abandoned", abandoned, &other, T0 + 20_000, "taken_over"),
        (
            "pool still writes",
            pool_still_writes,
            &other,
            T0 + 2_000,
            "consumed",
        ),
        (
            "pool went quiet",
            pool_still_writes,
            &other,
            T0 + 20_000,
            "taken_over",
        ),
        ("went on", went_on, &other, T0 + 20_000, "consumed"),
        ("released", released, &other, T0 + 10, "taken"),
    ];
    let db = PgSchema::new("rule");
    let store = db.open().with_run_lease(2_000);
    for (n, (name, setup, reader, at, expected)) in cases.into_iter().enumerate() {
        let k = ClaimKey {
            at: CheckpointRef {
                thread_id: format!("t-{n}"),
                ..key("c1").at
            },
            ..key("c1")
        };
        setup(&store, &k);
        let prev = store.get(&k).expect("read");
        let modelled = match prev {
            None => ClaimOutcome::Taken(ClaimRecord::taken(&k, reader, at, at + LAPSE, 1)),
            Some(prev) => {
                let writing = prev.state == ClaimState::Consumed
                    && store
                        .run_lease(&k.at.thread_id, "", at)
                        .expect("lease")
                        .is_some();
                claims_rule::decide_existing(prev, reader, at, at + LAPSE, writing)
            }
        };
        let decided = store.try_claim(&k, reader, at, LAPSE).expect("claim");
        assert_eq!(decided, modelled, "{name}");
        let label = match decided {
            ClaimOutcome::Taken(_) => "taken",
            ClaimOutcome::AlreadyHeld(_) => "already_held",
            ClaimOutcome::Busy(_) => "busy",
            ClaimOutcome::TakenOver { .. } => "taken_over",
            ClaimOutcome::Consumed(_) => "consumed",
        };
        assert_eq!(label, expected, "{name}");
    }
}
