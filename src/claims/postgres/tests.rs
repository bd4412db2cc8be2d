//! What only the PostgreSQL backend does: claim generations (epochs),
//! holders of proxy processes that are gone (liveness locks), migrations
//! raced by proxies starting together, and failing closed on a lost or
//! unreachable database. Run against a real server (`test_server`).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::test_server::PgSchema;
use super::{PgClaims, PgTarget};
use crate::claims::{interrupt_fingerprint, ClaimKey, ClaimOutcome, ClaimState, Holder};
use crate::saver::checkpoint_ref::CheckpointRef;

const LAPSE: i64 = 600_000;
const T0: i64 = 1_700_000_000_000;
const GRACE: i64 = 1_000;

fn key(checkpoint_id: &str) -> ClaimKey {
    ClaimKey {
        at: CheckpointRef {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: checkpoint_id.into(),
        },
        fingerprint: interrupt_fingerprint(&[("gate", Some(&b"approve?"[..]))]),
    }
}

fn holder(proxy: &str, session: u64) -> Holder {
    Holder {
        proxy_id: proxy.into(),
        session_id: session,
        client_addr: "10.0.0.1:5000".into(),
        application_name: "worker".into(),
    }
}

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
        a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
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
fn an_answered_run_of_a_proxy_process_that_is_gone_is_taken_over() {
    let db = PgSchema::new("liveness_answered");
    let b = db.open().with_holder_gone_grace(GRACE).with_run_lease(0);
    let k = key("c1");
    {
        let a = db.open();
        a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
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

#[test]
fn proxies_starting_together_migrate_once() {
    let db = PgSchema::new("migrate");
    const N: usize = 4;
    let barrier = Arc::new(Barrier::new(N));
    let stores: Vec<PgClaims> = (0..N)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            let target = db.target().clone();
            std::thread::spawn(move || {
                barrier.wait();
                PgClaims::open(target)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("thread").expect("open"))
        .collect();
    let instances: std::collections::HashSet<i64> =
        stores.iter().filter_map(PgClaims::instance).collect();
    assert_eq!(instances.len(), N, "each process its own liveness instance");
    let mut c = db
        .target()
        .config
        .connect(postgres::NoTls)
        .expect("connect");
    let versions: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {}.schema_version", db.target().schema),
            &[],
        )
        .expect("versions")
        .get(0);
    assert_eq!(versions, i64::from(super::schema::current_version()));
}

#[test]
fn operator_commands_need_an_existing_schema() {
    let db = PgSchema::new("operator");
    let text = PgClaims::open_existing(db.target().clone())
        .expect_err("no schema yet")
        .to_string();
    assert!(text.contains("no claims schema"), "{text}");
    let proxy = db.open();
    proxy
        .try_claim(&key("c1"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let operator = PgClaims::open_existing(db.target().clone()).expect("schema exists");
    assert_eq!(operator.list(None).expect("list").len(), 1);
    assert_eq!(operator.release("t-1", None).expect("release"), 1);
}

#[test]
fn an_unreachable_database_fails_closed_and_says_which() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let target =
        PgTarget::from_dsn(&format!("host=127.0.0.1 port={port} user=x dbname=y")).expect("dsn");
    let store = PgClaims::connect(target);
    let err = store
        .try_claim(&key("c1"), &holder("p1", 1), T0, LAPSE)
        .expect_err("unreachable")
        .to_string();
    assert!(err.starts_with("claim store unavailable"), "{err}");
    assert!(err.contains(&format!("x@127.0.0.1:{port}/y")), "{err}");
}

#[test]
fn a_lost_connection_fails_the_operation_then_reconnects() {
    let db = PgSchema::new("reconnect");
    let mut target = db.target().clone();
    target.config.application_name("rgtest-reconnect");
    let store = PgClaims::open(target).expect("open");
    let k = key("c1");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let mut admin = db
        .target()
        .config
        .connect(postgres::NoTls)
        .expect("connect");
    let ended = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'rgtest-reconnect'",
            &[],
        )
        .expect("terminate");
    assert!(ended >= 1, "the store's decision connections");
    // The next operation fails (fail closed) ...
    let mut failed = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !failed && Instant::now() < deadline {
        failed = store.get(&k).is_err();
    }
    assert!(failed, "an operation on the lost connection failed");
    // ... and once the retry time came, the store reconnects.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.get(&k) {
            Ok(Some(r)) => {
                assert_eq!(r.holder, holder("p1", 1));
                break;
            }
            other => assert!(Instant::now() < deadline, "never reconnected: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_proxy_that_lost_its_liveness_lock_takes_a_new_one_and_keeps_its_claims() {
    let db = PgSchema::new("relock");
    let a = db.open();
    let b = db.open().with_holder_gone_grace(GRACE);
    let k = key("c1");
    a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
    let first = a.instance().expect("instance");
    let mut admin = db
        .target()
        .config
        .connect(postgres::NoTls)
        .expect("connect");
    let ended = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks \
             WHERE locktype = 'advisory' AND objsubid = 1 AND objid::text::bigint = $1",
            &[&first],
        )
        .expect("terminate");
    assert_eq!(ended, 1);
    // Within a second the proxy asks its lock connection, finds it gone
    // and takes a new lock, which its claims follow.
    std::thread::sleep(Duration::from_millis(1_100));
    a.get(&k).expect("read").expect("row");
    let second = a.instance().expect("instance");
    assert_ne!(first, second);
    match b.try_claim(&k, &holder("p2", 2), T0 + 10, LAPSE) {
        Ok(ClaimOutcome::Busy(r)) => {
            assert_eq!((r.lapse_at_ms, r.abandon_at_ms), (T0 + LAPSE, None))
        }
        other => panic!("{other:?}"),
    }
}
