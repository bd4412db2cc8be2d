//! The claims rules, across "proxies": every test opens its own store,
//! often twice, the way two replicas share one: a schema of its own in a
//! real PostgreSQL (`RESUMEGUARD_TEST_PG_DSN`, else a server this test
//! process starts with `managed_pg`; a server that cannot be had fails
//! these tests). Each history runs on a clock the test holds
//! (`claims::postgres::db_clock`).

use std::sync::{Arc, Barrier};

use super::*;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::test_pg_server::PgSchema;

const LAPSE: i64 = 30_000;
const T0: i64 = 1_700_000_000_000;

fn key(checkpoint_id: &str, interrupt: &[u8]) -> ClaimKey {
    ClaimKey {
        at: CheckpointRef {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: checkpoint_id.into(),
        },
        fingerprint: interrupt_fingerprint(&[("gate-task", Some(interrupt))]),
    }
}

fn holder(proxy: &str, session: u64) -> Holder {
    Holder {
        proxy_id: proxy.into(),
        session_id: session,
        client_addr: format!("10.0.0.{session}:5{session:04}"),
        application_name: format!("worker-{session}"),
    }
}

/// A claim of `h` on c1 of t-1, consumed by its gated task's writes at
/// `T0 + 10` (the run lease, if any, starts then).
fn answered(store: &ClaimStore, h: &Holder) -> ClaimKey {
    let k = key("c1", b"q");
    store.try_claim(&k, h, T0, LAPSE).expect("claim");
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 10)
        .expect("consume");
    k
}

#[test]
fn one_winner_across_two_proxies_and_many_threads() {
    let db = PgSchema::new("race");
    let stores = [Arc::new(db.open()), Arc::new(db.open())];
    let k = key("c1", b"approve?");
    const N: usize = 16;
    let barrier = Arc::new(Barrier::new(N));
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let store = Arc::clone(&stores[i % 2]);
            let barrier = Arc::clone(&barrier);
            let k = k.clone();
            std::thread::spawn(move || {
                let h = holder(&format!("proxy-{}", i % 2), i as u64);
                barrier.wait();
                store.try_claim(&k, &h, T0, LAPSE).expect("try_claim")
            })
        })
        .collect();
    let outcomes: Vec<ClaimOutcome> = handles
        .into_iter()
        .map(|h| h.join().expect("racer thread"))
        .collect();
    let taken: Vec<&ClaimRecord> = outcomes
        .iter()
        .filter_map(|o| match o {
            ClaimOutcome::Taken(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(taken.len(), 1, "{outcomes:?}");
    let busy = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Busy(r) if r.holder == taken[0].holder))
        .count();
    assert_eq!(busy, N - 1, "{outcomes:?}");
}

#[test]
fn the_holders_own_session_passes_without_renewing() {
    let db = PgSchema::new("same");
    let store = db.open();
    let k = key("c1", b"q");
    let h = holder("p1", 7);
    assert!(matches!(
        store.try_claim(&k, &h, T0, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
    match store.try_claim(&k, &h, T0 + 5, LAPSE) {
        Ok(ClaimOutcome::AlreadyHeld(r)) => assert_eq!(r.lapse_at_ms, T0 + LAPSE),
        other => panic!("{other:?}"),
    }
    // Same session id on another proxy is another session.
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 7), T0 + 6, LAPSE),
        Ok(ClaimOutcome::Busy(_))
    ));
}

#[test]
fn a_lapsed_claim_is_taken_over_and_counted() {
    let db = PgSchema::new("lapse");
    let (a, b) = (db.open(), db.open());
    let k = key("c1", b"q");
    a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
    assert!(matches!(
        b.try_claim(&k, &holder("p2", 2), T0 + LAPSE - 1, LAPSE),
        Ok(ClaimOutcome::Busy(_))
    ));
    match b.try_claim(&k, &holder("p2", 2), T0 + LAPSE, LAPSE) {
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!(previous.holder, holder("p1", 1));
            assert_eq!(now.holder, holder("p2", 2));
            assert_eq!(now.takeovers, 1);
            assert_eq!(now.claimed_at_ms, T0 + LAPSE);
            assert_eq!(now.lapse_at_ms, T0 + 2 * LAPSE);
        }
        other => panic!("{other:?}"),
    }
    let stored = a.get(&k).expect("get").expect("row");
    assert_eq!(stored.takeovers, 1);
    assert_eq!(stored.holder, holder("p2", 2));
    // The old holder is now just another reader.
    assert!(matches!(
        a.try_claim(&k, &holder("p1", 1), T0 + LAPSE + 1, LAPSE),
        Ok(ClaimOutcome::Busy(_))
    ));
}

#[test]
fn consumed_claims_refuse_everyone_from_either_store() {
    let db = PgSchema::new("consume");
    let (a, b) = (db.open(), db.open());
    let k = key("c1", b"q");
    a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
    let before = b
        .consume("t-1", "", "c1", "__resume__ write", i64::MAX, T0 + 3)
        .expect("consume");
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].state, ClaimState::Held);
    assert_eq!(before[0].holder, holder("p1", 1));
    for (store, h) in [(&a, holder("p1", 1)), (&b, holder("p2", 9))] {
        match store.try_claim(&k, &h, T0 + 10 * LAPSE, LAPSE) {
            Ok(ClaimOutcome::Consumed(r)) => {
                assert_eq!(r.consumed_at_ms, Some(T0 + 3));
                assert_eq!(r.evidence.as_deref(), Some("__resume__ write"));
                assert_eq!(r.holder, holder("p1", 1));
            }
            other => panic!("{other:?}"),
        }
    }
    // Consuming again finds nothing held.
    assert!(a
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 9)
        .expect("again")
        .is_empty());
    a.note_refusal(&k).expect("refusal");
    b.note_refusal(&k).expect("refusal");
    assert_eq!(a.get(&k).expect("get").expect("row").refusals, 2);
}

#[test]
fn a_new_interrupt_on_the_same_checkpoint_is_a_new_claim() {
    let db = PgSchema::new("fingerprint");
    let store = db.open();
    let first = key("c1", b"first question");
    let second = key("c1", b"second question");
    store
        .try_claim(&first, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 5)
        .expect("consume");
    assert!(matches!(
        store.try_claim(&second, &holder("p2", 2), T0 + 10, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
    assert!(matches!(
        store.try_claim(&first, &holder("p2", 2), T0 + 11, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // Another namespace with the same ids is another claim too.
    let mut sub = first.clone();
    sub.at.checkpoint_ns = "sub:abc".into();
    assert!(matches!(
        store.try_claim(&sub, &holder("p2", 2), T0 + 12, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
}

#[test]
fn consumption_after_the_lapse_is_visible_to_the_caller() {
    let db = PgSchema::new("late");
    let store = db.open();
    let k = key("c1", b"q");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let before = store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + LAPSE + 500)
        .expect("consume");
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].consumed_at_ms, Some(T0 + LAPSE + 500));
    assert!(before[0].consumed_after_lapse());
    let after = store.get(&k).expect("get").expect("row");
    assert!(after.consumed_after_lapse());
}

#[test]
fn moving_on_consumes_the_parent_and_old_rows_are_purged() {
    let db = PgSchema::new("move");
    let store = db
        .open()
        .with_retention(3_600_000)
        .with_superseded_grace(60_000);
    let parent = key("c1", b"q");
    let mut other = key("c7", b"q");
    other.at.thread_id = "t-2".into();
    store
        .try_claim(&parent, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .try_claim(&other, &holder("p1", 2), T0, LAPSE)
        .expect("claim");
    let moved = store.move_on("t-1", "", "c1", T0 + 20).expect("move on");
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].state, ClaimState::Held);
    let row = store.get(&parent).expect("get").expect("kept for racers");
    assert_eq!(row.state, ClaimState::Consumed);
    assert_eq!(row.evidence.as_deref(), Some(NEXT_CHECKPOINT));
    // A racer that read the parked head just before the move is refused.
    assert!(matches!(
        store.try_claim(&parent, &holder("p2", 3), T0 + 30, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // After the grace, the next move_on from a claimed checkpoint (any
    // thread) deletes the parent's rows.
    let mut mover = key("x", b"q");
    mover.at.thread_id = "t-3".into();
    store
        .try_claim(&mover, &holder("p1", 3), T0, LAPSE)
        .expect("claim");
    store.move_on("t-3", "", "x", T0 + 60_021).expect("move on");
    assert_eq!(store.get(&parent).expect("get"), None);
    // The other thread's claim is still held (not lapsed past retention).
    assert!(store.get(&other).expect("get").is_some());
    // Purge by absolute time: a held row lapsed before the cutoff goes; the
    // row consumed after it stays.
    assert_eq!(store.purge(T0 + LAPSE + 1).expect("purge"), 1);
    let left: Vec<ClaimKey> = store
        .list(None)
        .expect("list")
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(left, vec![mover]);
}

#[test]
fn purge_keeps_recent_consumed_rows() {
    let db = PgSchema::new("purge");
    let store = db.open();
    let k = key("c1", b"q");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 100)
        .expect("consume");
    assert_eq!(store.purge(T0 + 100).expect("purge"), 0);
    assert_eq!(store.purge(T0 + 101).expect("purge"), 1);
}

#[test]
fn forgetting_a_thread_deletes_its_claims_only() {
    let db = PgSchema::new("forget");
    let store = db.open();
    store
        .try_claim(&key("c1", b"a"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .try_claim(&key("c1", b"b"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let mut other = key("c1", b"a");
    other.at.thread_id = "t-2".into();
    store
        .try_claim(&other, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    assert_eq!(store.forget_thread("t-1").expect("forget"), 2);
    assert_eq!(store.list(Some("t-1")).expect("list"), vec![]);
    assert_eq!(store.list(None).expect("list").len(), 1);
}

#[test]
fn release_makes_a_claim_takeable_again() {
    let db = PgSchema::new("release");
    let store = db.open();
    let k1 = key("c1", b"q");
    let k2 = key("c2", b"q");
    store
        .try_claim(&k1, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .try_claim(&k2, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    assert_eq!(store.release("t-1", Some("c1")).expect("release"), 1);
    assert_eq!(
        store.get(&k1).expect("get").expect("row").state,
        ClaimState::Released
    );
    assert_eq!(
        store.get(&k2).expect("get").expect("row").state,
        ClaimState::Held
    );
    match store.try_claim(&k1, &holder("p2", 2), T0 + 1, LAPSE) {
        Ok(ClaimOutcome::Taken(r)) => {
            assert_eq!(r.holder, holder("p2", 2));
            assert_eq!(r.takeovers, 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.release("t-1", None).expect("release"), 2);
    assert_eq!(store.release("t-1", None).expect("release"), 0);
}

#[test]
fn progress_extends_a_live_claim_and_holder_gone_shortens_it() {
    let db = PgSchema::new("progress");
    let store = db.open();
    let k = key("c1", b"q");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let noted = store
        .note_progress(
            ("t-1", "", "c1"),
            "__resume__ write",
            i64::MAX,
            T0 + 2,
            120_000,
        )
        .expect("progress");
    assert_eq!(noted.len(), 1);
    assert_eq!(noted[0].lapse_at_ms, T0 + 120_002);
    assert_eq!(noted[0].state, ClaimState::Held);
    let gone = store.holder_gone("p1", 1, T0 + 10, 5_000).expect("gone");
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].lapse_at_ms, T0 + 5_010);
    assert!(store
        .holder_gone("p1", 1, T0 + 11, 5_000)
        .expect("gone")
        .is_empty());
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + 5_010, LAPSE),
        Ok(ClaimOutcome::TakenOver { .. })
    ));
}

#[test]
fn large_session_ids_round_trip() {
    let db = PgSchema::new("session");
    let store = db.open();
    let k = key("c1", b"q");
    let h = holder("p1", u64::MAX - 3);
    store.try_claim(&k, &h, T0, LAPSE).expect("claim");
    assert_eq!(store.get(&k).expect("get").expect("row").holder, h);
}

#[test]
fn list_and_render() {
    let db = PgSchema::new("list");
    let store = db.open();
    assert_eq!(render_claims(&[]), "no claims\n");
    store
        .try_claim(&key("c1", b"q"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .try_claim(&key("c2", b"q"), &holder("p2", 2), T0 + 1, LAPSE)
        .expect("claim");
    store
        .consume("t-1", "", "c1", "next checkpoint", i64::MAX, T0 + 9)
        .expect("consume");
    let records = store.list(Some("t-1")).expect("list");
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].key.at.checkpoint_id, "c1");
    let table = render_claims(&records);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("THREAD"), "{table}");
    assert!(
        lines[1].contains("consumed") && lines[1].contains("p1/1"),
        "{table}"
    );
    assert!(lines[1].contains("2023-11-14T22:13:20.009Z"), "{table}");
    assert!(
        lines[2].contains("held") && lines[2].contains("worker-2"),
        "{table}"
    );
    assert!(table.contains("evidence:\n  t-1 c1"), "{table}");
    // Columns line up: STATE starts at the same offset on every row.
    let col = lines[0].find("STATE").expect("header");
    assert_eq!(&lines[1][col..col + 8], "consumed");
    assert_eq!(&lines[2][col..col + 4], "held");
    let col = lines[0].find("EPOCH").expect("epoch column");
    assert_eq!(&lines[1][col..col + 2], "1 ");
}

#[test]
fn consumption_starts_a_run_lease_that_writes_extend() {
    let db = PgSchema::new("lease");
    let (a, b) = (
        db.open().with_run_lease(1_000),
        db.open().with_run_lease(1_000),
    );
    let k = key("c1", b"q");
    a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
    assert_eq!(b.run_lease("t-1", "", T0).expect("none yet"), None);
    b.consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 10)
        .expect("consume");
    let lease = a
        .run_lease("t-1", "", T0 + 20)
        .expect("read")
        .expect("lease");
    assert_eq!(lease.holder, holder("p1", 1));
    assert_eq!(lease.answered_checkpoint_id, "c1");
    assert_eq!(lease.fingerprint, k.fingerprint);
    assert_eq!(
        (lease.answered_at_ms, lease.last_write_ms),
        (T0 + 10, T0 + 10)
    );
    assert_eq!(lease.until_ms, T0 + 1_010);
    // Other namespaces and threads are not leased.
    assert_eq!(a.run_lease("t-1", "sub:x", T0 + 20).expect("read"), None);
    assert_eq!(a.run_lease("t-2", "", T0 + 20).expect("read"), None);
    // The run's next checkpoint (parent c1, then c2) extends it.
    b.move_on("t-1", "", "c1", T0 + 900).expect("move on");
    b.move_on("t-1", "", "c2", T0 + 1_500).expect("move on");
    let lease = a
        .run_lease("t-1", "", T0 + 2_000)
        .expect("read")
        .expect("lease");
    assert_eq!(
        (lease.last_write_ms, lease.until_ms),
        (T0 + 1_500, T0 + 2_500)
    );
    assert_eq!(lease.answered_at_ms, T0 + 10);
    // Quiet for the lease time: over, and a late write does not revive it.
    assert_eq!(a.run_lease("t-1", "", T0 + 2_500).expect("read"), None);
    b.move_on("t-1", "", "c3", T0 + 3_000).expect("move on");
    assert_eq!(a.run_lease("t-1", "", T0 + 3_001).expect("read"), None);
}

#[test]
fn a_move_on_that_consumes_starts_the_lease_too() {
    let db = PgSchema::new("lease-move");
    let store = db.open().with_run_lease(5_000);
    store
        .try_claim(&key("c1", b"q"), &holder("p1", 4), T0, LAPSE)
        .expect("claim");
    store.move_on("t-1", "", "c1", T0 + 7).expect("move on");
    let lease = store
        .run_lease("t-1", "", T0 + 8)
        .expect("read")
        .expect("lease");
    assert_eq!(lease.holder, holder("p1", 4));
    assert_eq!(lease.until_ms, T0 + 5_007);
}

#[test]
fn leases_end_with_their_holder_or_thread_and_can_be_off() {
    let db = PgSchema::new("lease-end");
    let store = db.open().with_run_lease(10_000);
    for (cp, h) in [("c1", holder("p1", 1)), ("d1", holder("p1", 2))] {
        let mut k = key(cp, b"q");
        k.at.thread_id = format!("t-{cp}");
        store.try_claim(&k, &h, T0, LAPSE).expect("claim");
        store
            .consume(&k.at.thread_id, "", cp, "task writes", i64::MAX, T0 + 1)
            .expect("consume");
    }
    // Session 1 closed: its lease ends within the grace; session 2's stays.
    store.holder_gone("p1", 1, T0 + 100, 50).expect("gone");
    assert!(store
        .run_lease("t-c1", "", T0 + 149)
        .expect("read")
        .is_some());
    assert_eq!(store.run_lease("t-c1", "", T0 + 150).expect("read"), None);
    assert!(store
        .run_lease("t-d1", "", T0 + 150)
        .expect("read")
        .is_some());
    store.forget_thread("t-d1").expect("forget");
    assert_eq!(store.run_lease("t-d1", "", T0 + 150).expect("read"), None);

    let off = PgSchema::new("lease-off");
    let store = off.open().with_run_lease(0);
    store
        .try_claim(&key("c1", b"q"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 1)
        .expect("consume");
    assert_eq!(store.run_lease("t-1", "", T0 + 2).expect("read"), None);
}

#[test]
fn an_answered_run_abandoned_before_its_next_checkpoint_is_taken_over() {
    let db = PgSchema::new("abandoned");
    let (a, b) = (db.open().with_run_lease(10_000), db.open());
    let k = answered(&a, &holder("p1", 1));
    // The holder's connection closes (a crash: no next checkpoint).
    a.holder_gone("p1", 1, T0 + 100, 1_000).expect("gone");
    // Within the grace the interrupt is still answered.
    assert!(matches!(
        b.try_claim(&k, &holder("p2", 2), T0 + 1_099, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    match b.try_claim(&k, &holder("p2", 2), T0 + 1_100, LAPSE) {
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!(previous.state, ClaimState::Consumed);
            assert_eq!(previous.holder, holder("p1", 1));
            assert_eq!(previous.abandon_at_ms, Some(T0 + 1_100));
            assert_eq!(now.state, ClaimState::Held);
            assert_eq!(now.holder, holder("p2", 2));
            assert_eq!(now.takeovers, 1);
            assert_eq!(now.abandon_at_ms, None);
        }
        other => panic!("{other:?}"),
    }
    // The new run is a live holder: a third reader waits, and once that
    // run's writes consume the claim, is refused.
    assert!(matches!(
        a.try_claim(&k, &holder("p3", 3), T0 + 1_200, LAPSE),
        Ok(ClaimOutcome::Busy(_))
    ));
    a.consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 1_300)
        .expect("consume");
    match a.try_claim(&k, &holder("p3", 3), T0 + 60_000, LAPSE) {
        Ok(ClaimOutcome::Consumed(r)) => assert_eq!(r.holder, holder("p2", 2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_answered_run_that_went_on_or_is_alive_still_refuses() {
    let late = T0 + 50 * LAPSE;
    // Holder still connected: an answered run in progress.
    let db = PgSchema::new("alive");
    let store = db.open();
    let k = answered(&store, &holder("p1", 1));
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), late, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // A child checkpoint was recorded, then the holder left: finished.
    let db = PgSchema::new("went-on");
    let store = db.open();
    let k = answered(&store, &holder("p1", 1));
    store.move_on("t-1", "", "c1", T0 + 20).expect("move on");
    store.holder_gone("p1", 1, T0 + 30, 1_000).expect("gone");
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + 50_000, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // The holder's connection closed but the run still writes (other
    // connections of a pool): its run lease is live, so not abandoned.
    let db = PgSchema::new("pool");
    let store = db.open().with_run_lease(10_000);
    let k = answered(&store, &holder("p1", 1));
    store.holder_gone("p1", 1, T0 + 100, 1_000).expect("gone");
    store
        .consume("t-1", "", "c9", "another write", i64::MAX, T0 + 1_000)
        .expect("write");
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + 5_000, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // Quiet for the lease time: abandoned.
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + 11_000, LAPSE),
        Ok(ClaimOutcome::TakenOver { .. })
    ));
}

#[test]
fn release_frees_an_answered_claim_whose_run_never_moved_on() {
    let db = PgSchema::new("release-answered");
    let store = db.open();
    let k = answered(&store, &holder("p1", 1));
    assert_eq!(store.release("t-1", None).expect("release"), 1);
    match store.try_claim(&k, &holder("p2", 2), T0 + 100, LAPSE) {
        Ok(ClaimOutcome::Taken(r)) => assert_eq!(r.holder, holder("p2", 2)),
        other => panic!("{other:?}"),
    }
    // An interrupt whose run went on stays answered.
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 200)
        .expect("consume");
    store.move_on("t-1", "", "c1", T0 + 300).expect("move on");
    assert_eq!(store.release("t-1", None).expect("release"), 0);
    assert!(matches!(
        store.try_claim(&k, &holder("p3", 3), T0 + 400, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // Unless the operator names that checkpoint (the thread was rewound).
    assert_eq!(store.release("t-1", Some("c2")).expect("release"), 0);
    assert_eq!(store.release("t-1", Some("c1")).expect("release"), 1);
    assert!(matches!(
        store.try_claim(&k, &holder("p3", 3), T0 + 500, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
}

#[test]
fn a_row_superseded_longer_than_the_grace_ago_is_claimed_afresh() {
    let db = PgSchema::new("rewound");
    let store = db.open().with_superseded_grace(60_000);
    let k = answered(&store, &holder("p1", 1));
    store.move_on("t-1", "", "c1", T0 + 20).expect("move on");
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + 60_019, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    // The thread was rewound to c1 (its newer checkpoints deleted) and no
    // purge ran yet: the row counts as gone.
    match store.try_claim(&k, &holder("p2", 2), T0 + 60_020, LAPSE) {
        Ok(ClaimOutcome::Taken(r)) => {
            assert_eq!(r.holder, holder("p2", 2));
            assert_eq!(r.superseded_at_ms, None);
        }
        other => panic!("{other:?}"),
    }
    let row = store.get(&k).expect("get").expect("row");
    assert_eq!((row.state, row.superseded_at_ms), (ClaimState::Held, None));
}

#[test]
fn each_new_holder_of_a_key_is_a_new_epoch() {
    let db = PgSchema::new("epochs");
    let (a, b) = (db.open(), db.open());
    let k = key("c1", b"q");
    let epoch = |o: Result<ClaimOutcome, StoreError>| match o {
        Ok(ClaimOutcome::Taken(r) | ClaimOutcome::AlreadyHeld(r)) => r.epoch,
        Ok(ClaimOutcome::TakenOver { previous, now }) => {
            assert_eq!(now.epoch, previous.epoch + 1);
            now.epoch
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(epoch(a.try_claim(&k, &holder("p1", 1), T0, LAPSE)), 1);
    // The same holder reading again is the same generation.
    assert_eq!(epoch(a.try_claim(&k, &holder("p1", 1), T0 + 1, LAPSE)), 1);
    // A takeover after the lapse, from the other replica.
    assert_eq!(
        epoch(b.try_claim(&k, &holder("p2", 2), T0 + LAPSE, LAPSE)),
        2
    );
    let current = a.current_holder("t-1", "", "c1").expect("holder");
    assert_eq!(
        current.as_ref().map(|r| (&r.holder, r.epoch)),
        Some((&holder("p2", 2), 2))
    );
    // Consumed by its run: still the holder that may continue it.
    b.consume("t-1", "", "c1", "task wrote x", T0 + LAPSE, T0 + LAPSE + 1)
        .expect("consume");
    let current = a
        .current_holder("t-1", "", "c1")
        .expect("holder")
        .expect("row");
    assert_eq!((current.state, current.epoch), (ClaimState::Consumed, 2));
    // Released by an operator: nobody holds it until the next take.
    b.release("t-1", Some("c1")).expect("release");
    assert_eq!(a.current_holder("t-1", "", "c1").expect("holder"), None);
    assert_eq!(
        epoch(a.try_claim(&k, &holder("p1", 3), T0 + LAPSE + 2, LAPSE)),
        3
    );
    assert_eq!(a.get(&k).expect("get").expect("row").epoch, 3);
}

#[test]
fn a_claim_kept_until_a_commit_is_not_taken_over_before_it() {
    let db = PgSchema::new("keep-until");
    let store = db.open();
    let k = key("c1", b"q");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let until = T0 + LAPSE + 5_000;
    assert!(store.keep_for(&k, 1, T0, LAPSE + 5_000).expect("keep"));
    assert_eq!(store.get(&k).expect("get").expect("row").lapse_at_ms, until);
    // Past the lapse it was given, but not past the kept time: refused.
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + LAPSE + 1, LAPSE),
        Ok(ClaimOutcome::Busy(_))
    ));
    // Never shortened.
    assert!(store.keep_for(&k, 1, T0, 1).expect("keep"));
    assert_eq!(store.get(&k).expect("get").expect("row").lapse_at_ms, until);
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), until, LAPSE),
        Ok(ClaimOutcome::TakenOver { .. })
    ));
    // The superseded generation cannot be kept any more.
    assert!(!store.keep_for(&k, 1, until, 10_000).expect("keep"));
    // A consumed claim whose holder is gone: its abandonment moves.
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, until + 1)
        .expect("consume");
    store.holder_gone("p2", 2, until + 2, 50).expect("gone");
    assert!(store.keep_for(&k, 2, until + 2, 9_998).expect("keep"));
    let row = store.get(&k).expect("get").expect("row");
    assert_eq!(row.abandon_at_ms, Some(until + 10_000));
    assert!(matches!(
        store.try_claim(&k, &holder("p3", 3), until + 100, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
}

#[test]
fn current_holder_is_the_latest_claim_on_the_checkpoint() {
    let db = PgSchema::new("current");
    let store = db.open();
    assert_eq!(store.current_holder("t-1", "", "c1").expect("holder"), None);
    let first = key("c1", b"first");
    let second = key("c1", b"second");
    store
        .try_claim(&first, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .consume("t-1", "", "c1", "task wrote x", T0, T0 + 1)
        .expect("consume");
    // The node parked again: a new interrupt on the same checkpoint.
    store
        .try_claim(&second, &holder("p2", 2), T0 + 10, LAPSE)
        .expect("claim");
    store
        .try_claim(&key("c2", b"q"), &holder("p3", 3), T0 + 20, LAPSE)
        .expect("claim");
    let current = store
        .current_holder("t-1", "", "c1")
        .expect("holder")
        .expect("row");
    assert_eq!((current.key, current.holder), (second, holder("p2", 2)));
    assert_eq!(
        store
            .current_holder("t-1", "other-ns", "c1")
            .expect("holder"),
        None
    );
    assert_eq!(store.current_holder("t-2", "", "c1").expect("holder"), None);
}

#[test]
fn a_key_claimed_afresh_after_its_row_went_stale_keeps_counting() {
    let db = PgSchema::new("stale-epoch");
    let store = db.open().with_superseded_grace(1_000);
    let k = key("c1", b"q");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store.move_on("t-1", "", "c1", T0 + 1).expect("move on");
    // Rewound to c1 after the grace: a fresh claim, the next generation.
    match store.try_claim(&k, &holder("p2", 2), T0 + 5_000, LAPSE) {
        Ok(ClaimOutcome::Taken(r)) => assert_eq!(r.epoch, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_of_any_length_are_claimed_consumed_and_leased() {
    let db = PgSchema::new("long-keys");
    let store = db.open().with_run_lease(1_000);
    // Longer than a btree index tuple holds, and not compressible.
    let thread: String = (0..10_000u32)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    let mut k = key("c1", b"q");
    k.at.thread_id = thread.clone();
    assert!(matches!(
        store.try_claim(&k, &holder("p1", 1), T0, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
    assert!(matches!(
        store.try_claim(&k, &holder("p2", 2), T0 + 1, LAPSE),
        Ok(ClaimOutcome::Busy(r)) if r.key == k
    ));
    // A key that differs only past the first 2 KB is another claim.
    let mut other = k.clone();
    other.at.thread_id.push('z');
    assert!(matches!(
        store.try_claim(&other, &holder("p2", 2), T0 + 2, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
    let consumed = store
        .consume(&thread, "", "c1", "task writes", i64::MAX, T0 + 3)
        .expect("consume");
    assert_eq!(consumed.len(), 1);
    let lease = store
        .run_lease(&thread, "", T0 + 4)
        .expect("read")
        .expect("leased");
    assert_eq!(lease.thread_id, thread);
    assert!(matches!(
        store.try_claim(&k, &holder("p3", 3), T0 + 5, LAPSE),
        Ok(ClaimOutcome::Consumed(_))
    ));
    assert_eq!(store.list(Some(&thread)).expect("list").len(), 1);
}
