//! Store behaviour across "proxies": every test opens its own file, often
//! twice, the way two replicas share one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

const LAPSE: i64 = 30_000;
const T0: i64 = 1_700_000_000_000;

/// A scratch database removed (with its WAL side files) on drop.
struct TempDb(PathBuf);

impl TempDb {
    fn new(name: &str) -> TempDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        TempDb(std::env::temp_dir().join(format!(
            "resumeguard-claims-{name}-{}-{n}-{nanos}.db",
            std::process::id()
        )))
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn open(&self) -> ClaimStore {
        ClaimStore::open(&self.0).expect("open claim store")
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        for suffix in ["-wal", "-shm"] {
            let mut side = self.0.as_os_str().to_owned();
            side.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(side));
        }
    }
}

fn key(checkpoint_id: &str, interrupt: &[u8]) -> ClaimKey {
    ClaimKey {
        thread_id: "t-1".into(),
        checkpoint_ns: String::new(),
        checkpoint_id: checkpoint_id.into(),
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

#[test]
fn one_winner_across_two_proxies_and_many_threads() {
    let db = TempDb::new("race");
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
    let db = TempDb::new("same");
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
    let db = TempDb::new("lapse");
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
    let db = TempDb::new("consume");
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
    let db = TempDb::new("fingerprint");
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
    let sub = ClaimKey {
        checkpoint_ns: "sub:abc".into(),
        ..first.clone()
    };
    assert!(matches!(
        store.try_claim(&sub, &holder("p2", 2), T0 + 12, LAPSE),
        Ok(ClaimOutcome::Taken(_))
    ));
}

#[test]
fn consumption_after_the_lapse_is_visible_to_the_caller() {
    let db = TempDb::new("late");
    let store = db.open();
    let k = key("c1", b"q");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let before = store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + LAPSE + 500)
        .expect("consume");
    assert_eq!(before.len(), 1);
    assert!(T0 + LAPSE + 500 > before[0].lapse_at_ms);
    let after = store.get(&k).expect("get").expect("row");
    assert!(after.consumed_after_lapse());
}

#[test]
fn moving_on_consumes_the_parent_and_old_rows_are_purged() {
    let db = TempDb::new("move");
    let store = db
        .open()
        .with_retention(3_600_000)
        .with_superseded_grace(60_000);
    let parent = key("c1", b"q");
    let other = ClaimKey {
        thread_id: "t-2".into(),
        ..key("c7", b"q")
    };
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
    // After the grace, the next move_on (any thread) deletes the parent's rows.
    store.move_on("t-3", "", "x", T0 + 60_021).expect("move on");
    assert_eq!(store.get(&parent).expect("get"), None);
    // The other thread's claim is still held (not lapsed past retention).
    assert!(store.get(&other).expect("get").is_some());
    // Purge by absolute time: a held row lapsed before the cutoff goes.
    assert_eq!(store.purge(T0 + LAPSE + 1).expect("purge"), 1);
    assert_eq!(store.list(None).expect("list"), vec![]);
}

#[test]
fn purge_keeps_recent_consumed_rows() {
    let db = TempDb::new("purge");
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
    let db = TempDb::new("forget");
    let store = db.open();
    store
        .try_claim(&key("c1", b"a"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .try_claim(&key("c1", b"b"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let other = ClaimKey {
        thread_id: "t-2".into(),
        ..key("c1", b"a")
    };
    store
        .try_claim(&other, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    assert_eq!(store.forget_thread("t-1").expect("forget"), 2);
    assert_eq!(store.list(Some("t-1")).expect("list"), vec![]);
    assert_eq!(store.list(None).expect("list").len(), 1);
}

#[test]
fn release_makes_a_claim_takeable_again() {
    let db = TempDb::new("release");
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
    let db = TempDb::new("progress");
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
    let db = TempDb::new("session");
    let store = db.open();
    let k = key("c1", b"q");
    let h = holder("p1", u64::MAX - 3);
    store.try_claim(&k, &h, T0, LAPSE).expect("claim");
    assert_eq!(store.get(&k).expect("get").expect("row").holder, h);
}

#[test]
fn list_and_render() {
    let db = TempDb::new("list");
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
    assert_eq!(records[0].key.checkpoint_id, "c1");
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
}

#[test]
fn an_unopenable_path_is_a_clear_error() {
    let missing = std::env::temp_dir()
        .join("resumeguard-claims-no-such-dir-4f1e")
        .join("claims.db");
    let err = ClaimStore::open(&missing).expect_err("missing dir");
    let text = err.to_string();
    assert!(
        text.starts_with("claim store unavailable: cannot open"),
        "{text}"
    );
    assert!(text.contains("does not exist"), "{text}");
    assert!(text.contains("claims.db"), "{text}");

    let dir = std::env::temp_dir();
    let text = ClaimStore::open(&dir).expect_err("directory").to_string();
    assert!(text.contains("is a directory"), "{text}");
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error() {
    let db = TempDb::new("garbage");
    std::fs::write(
        db.path(),
        b"this is not sqlite, just sixteen+ bytes of text",
    )
    .expect("write");
    let text = ClaimStore::open(db.path())
        .expect_err("garbage")
        .to_string();
    assert!(
        text.starts_with("claim store unavailable: cannot open"),
        "{text}"
    );
    assert!(text.contains("not a database"), "{text}");
}

#[test]
fn a_store_that_disappears_fails_each_operation_clearly() {
    let db = TempDb::new("vanish");
    let store = db.open();
    // Another tool makes the table unusable under the running proxy.
    rusqlite::Connection::open(db.path())
        .and_then(|c| c.execute_batch("DROP TABLE claims"))
        .expect("drop");
    let text = store
        .try_claim(&key("c1", b"q"), &holder("p1", 1), T0, LAPSE)
        .expect_err("no table")
        .to_string();
    assert!(
        text.starts_with("claim store unavailable: taking a claim failed on"),
        "{text}"
    );
    assert!(text.contains("no such table"), "{text}");
}

#[test]
fn consumption_starts_a_run_lease_that_writes_extend() {
    let db = TempDb::new("lease");
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
    let db = TempDb::new("lease-move");
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
    let db = TempDb::new("lease-end");
    let store = db.open().with_run_lease(10_000);
    for (cp, h) in [("c1", holder("p1", 1)), ("d1", holder("p1", 2))] {
        let k = ClaimKey {
            thread_id: format!("t-{cp}"),
            ..key(cp, b"q")
        };
        store.try_claim(&k, &h, T0, LAPSE).expect("claim");
        store
            .consume(&k.thread_id, "", cp, "task writes", i64::MAX, T0 + 1)
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

    let off = TempDb::new("lease-off");
    let store = off.open().with_run_lease(0);
    store
        .try_claim(&key("c1", b"q"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 1)
        .expect("consume");
    assert_eq!(store.run_lease("t-1", "", T0 + 2).expect("read"), None);
}
