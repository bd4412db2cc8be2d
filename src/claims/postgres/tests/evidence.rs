//! Claim evidence applied in batches: in order, as each piece alone
//! would, and without a decision where nothing is claimed or only a run
//! lease is renewed.

use super::*;

#[test]
fn evidence_applied_together_does_in_order_what_each_piece_does_alone() {
    let db = PgSchema::new("gathered");
    let store = db.open();
    let (progressed, answered, moved) = (key("c1"), key("c2"), key("c3"));
    for (k, h) in [(&progressed, 1), (&answered, 2), (&moved, 3)] {
        store.try_claim(k, &holder("p1", h), T0, 10).expect("claim");
    }
    let nothing_claimed = key("c9");
    let items = [
        evidence_item(
            WriteEvidence::Progress,
            &progressed,
            "run-level __resume__ recorded",
            Some(T0 + 4),
        ),
        evidence_item(
            WriteEvidence::Consumed,
            &nothing_claimed,
            "task a wrote x",
            Some(T0 + 4),
        ),
        evidence_item(
            WriteEvidence::Consumed,
            &answered,
            "task a wrote approved",
            Some(T0 + 4),
        ),
        evidence_item(WriteEvidence::MovedOn, &moved, super::NEXT_CHECKPOINT, None),
        // The same write's evidence again consumes nothing more.
        evidence_item(
            WriteEvidence::Consumed,
            &answered,
            "task a wrote approved",
            Some(T0 + 4),
        ),
    ];
    let consumed = store
        .apply_evidence(&items, T0 + 5, 1_000)
        .expect("applied");
    // Each consumed claim as it was, with the item that consumed it.
    let shown: Vec<(usize, &str)> = consumed
        .iter()
        .map(|(i, r)| (*i, r.key.at.checkpoint_id.as_str()))
        .collect();
    assert_eq!(shown, [(2, "c2"), (3, "c3")]);
    assert!(consumed
        .iter()
        .all(|(_, r)| r.consumed_at_ms == Some(T0 + 5)));
    let answered = store.get(&answered).expect("get").expect("row");
    assert_eq!(
        (answered.state, answered.evidence.as_deref()),
        (ClaimState::Consumed, Some("task a wrote approved"))
    );
    // Progress held its claim past its lapse, on the server's clock.
    let held = store.get(&progressed).expect("get").expect("row");
    assert_eq!(held.state, ClaimState::Held);
    assert_eq!(held.lapse_at_ms, T0 + 5 + 1_000);
    assert_eq!(
        held.evidence.as_deref(),
        Some("run-level __resume__ recorded")
    );
    let superseded = store.get(&moved).expect("get").expect("row");
    assert_eq!(
        (superseded.state, superseded.superseded_at_ms),
        (ClaimState::Consumed, Some(T0 + 5))
    );
    assert_eq!(superseded.evidence.as_deref(), Some(super::NEXT_CHECKPOINT));
    // Nothing at all is one statement that does nothing.
    assert!(store
        .apply_evidence(&[], T0 + 6, 1_000)
        .expect("empty")
        .is_empty());
}

/// Renames the functions a batch runs per item on a claimed checkpoint
/// from `<name><from>` to `<name><to>`.
fn rename_item_functions(db: &PgSchema, from: &str, to: &str) {
    let s = db.target().schema().to_owned();
    let mut admin = db.admin();
    let functions = [
        ("note_progress", "text, text, text, text, bigint, bigint"),
        ("consume", "text, text, text, text, bigint, bigint"),
        ("move_on", "text, text, text, text, bigint, bigint, bigint"),
    ];
    for (name, args) in functions {
        admin
            .batch_execute(&format!(
                "ALTER FUNCTION {s}.{name}{from}({args}) RENAME TO {name}{to}"
            ))
            .expect("rename");
    }
}

/// Evidence on a checkpoint with no claim runs no decision function: with
/// every per-item function of the batch gone, such a batch still applies,
/// on a thread never claimed and on another checkpoint of a claimed one.
/// Beside a claimed checkpoint's evidence, the claim it consumed comes back
/// under its own item's index.
#[test]
fn evidence_where_nothing_is_claimed_runs_no_decision() {
    let db = PgSchema::new("unclaimed-evidence");
    let store = db.open();
    let claimed = key("c1");
    claim_as_p1(&store, &claimed);
    let mut unclaimed = key("c1");
    unclaimed.at.thread_id = "t-never-parked".into();
    let earlier = key("c0");
    let item = |kind, k| evidence_item(kind, k, "task a wrote x", Some(T0 + 4));
    let nothing_claimed = [
        item(WriteEvidence::Progress, &unclaimed),
        item(WriteEvidence::Consumed, &unclaimed),
        item(WriteEvidence::MovedOn, &unclaimed),
        item(WriteEvidence::Consumed, &earlier),
        item(WriteEvidence::MovedOn, &earlier),
    ];
    rename_item_functions(&db, "", "_gone");
    let applied = store.apply_evidence(&nothing_claimed, T0 + 5, 1_000);
    assert!(
        applied.as_ref().is_ok_and(Vec::is_empty),
        "evidence where nothing is claimed ran a decision: {applied:?}"
    );
    // The same batch on the claimed thread does run them.
    let claimed_batch = [item(WriteEvidence::Consumed, &claimed)];
    assert!(store.apply_evidence(&claimed_batch, T0 + 5, 1_000).is_err());
    rename_item_functions(&db, "_gone", "");

    let mixed = [
        item(WriteEvidence::Consumed, &unclaimed),
        item(WriteEvidence::MovedOn, &unclaimed),
        item(WriteEvidence::Consumed, &claimed),
    ];
    let consumed = store
        .apply_evidence(&mixed, T0 + 5, 1_000)
        .expect("applied");
    let shown: Vec<(usize, &str, &str)> = consumed
        .iter()
        .map(|(i, r)| {
            (
                *i,
                r.key.at.thread_id.as_str(),
                r.key.at.checkpoint_id.as_str(),
            )
        })
        .collect();
    assert_eq!(shown, [(2, "t-1", "c1")]);
}

/// Evidence on unclaimed checkpoints of a thread whose run lease is live
/// (a resumed run's next checkpoints) runs no decision function either:
/// it renews the lease, once, from the batch's time, and a batch of
/// progress alone renews nothing.
#[test]
fn evidence_of_a_leased_thread_on_unclaimed_checkpoints_only_renews_its_lease() {
    let db = PgSchema::new("lease-only-evidence");
    let store = db.open().with_run_lease(2_000);
    let (answered, next, after) = (key("c1"), key("c2"), key("c3"));
    answer(&store, &answered);
    let lease_until = |at: i64| {
        let lease = store.run_lease("t-1", "", at).expect("read");
        lease.map(|l| (l.last_write_ms, l.until_ms))
    };
    assert_eq!(lease_until(T0 + 3), Some((T0 + 2, T0 + 2_002)));

    rename_item_functions(&db, "", "_gone");
    let item = |kind, k| evidence_item(kind, k, "task b wrote y", Some(T0 + 900));
    let progress_only = [item(WriteEvidence::Progress, &next)];
    let applied = store.apply_evidence(&progress_only, T0 + 500, 1_000);
    assert!(applied.is_ok_and(|a| a.is_empty()), "progress alone");
    assert_eq!(lease_until(T0 + 600), Some((T0 + 2, T0 + 2_002)));

    let run_went_on = [
        item(WriteEvidence::Consumed, &next),
        item(WriteEvidence::MovedOn, &next),
        item(WriteEvidence::Progress, &after),
        item(WriteEvidence::Consumed, &after),
    ];
    let applied = store.apply_evidence(&run_went_on, T0 + 1_000, 1_000);
    assert!(
        applied.as_ref().is_ok_and(Vec::is_empty),
        "the run's next checkpoints ran a decision: {applied:?}"
    );
    assert_eq!(lease_until(T0 + 1_100), Some((T0 + 1_000, T0 + 3_000)));
    rename_item_functions(&db, "_gone", "");
}
