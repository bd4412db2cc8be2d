//! What only the PostgreSQL backend does: claim generations (epochs),
//! holders of proxy processes that are gone (liveness locks), migrations
//! raced by proxies starting together, and failing closed on a lost or
//! unreachable database. Run against a real server (`crate::test_pg_server`).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::{ClaimStore, EvidenceItem, WriteEvidence};
use crate::claims::{
    interrupt_fingerprint, ClaimKey, ClaimOutcome, ClaimRecord, ClaimState, Holder, WrittenAt,
};
use crate::config::shared_schema::SHARED_SCHEMA;
use crate::pg::{migration, PgTarget};
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::test_pg_server::PgSchema;

const LAPSE: i64 = 600_000;
const T0: i64 = 1_700_000_000_000;
const GRACE: i64 = 1_000;

pub(crate) fn key(checkpoint_id: &str) -> ClaimKey {
    ClaimKey {
        at: CheckpointRef {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: checkpoint_id.into(),
        },
        fingerprint: interrupt_fingerprint(&[("gate", Some(&b"approve?"[..]))]),
    }
}

pub(crate) fn holder(proxy: &str, session: u64) -> Holder {
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
fn a_gone_holder_stays_gone_when_another_schemas_proxy_draws_its_number() {
    let (mine, theirs) = (
        PgSchema::new("neighbour_mine"),
        PgSchema::new("neighbour_theirs"),
    );
    let b = mine.open().with_holder_gone_grace(GRACE);
    let k = key("c1");
    let gone = {
        let a = mine.open();
        a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
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
    let stores: Vec<ClaimStore> = (0..N)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            let target = db.target().clone();
            std::thread::spawn(move || {
                barrier.wait();
                ClaimStore::open(target, SHARED_SCHEMA)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("thread").expect("open"))
        .collect();
    let instances: std::collections::HashSet<i64> =
        stores.iter().filter_map(ClaimStore::instance).collect();
    assert_eq!(instances.len(), N, "each process its own liveness instance");
    let mut c = db.admin();
    let versions: i64 = c
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.schema_version",
                db.target().schema()
            ),
            &[],
        )
        .expect("versions")
        .get(0);
    assert_eq!(versions, i64::from(SHARED_SCHEMA.current_version()));
}

#[test]
fn operator_commands_need_an_existing_schema() {
    let db = PgSchema::new("operator");
    let text = ClaimStore::open_existing(db.target().clone())
        .expect_err("no schema yet")
        .to_string();
    assert!(text.contains("no claims schema"), "{text}");
    let proxy = db.open();
    proxy
        .try_claim(&key("c1"), &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let operator = ClaimStore::open_existing(db.target().clone()).expect("schema exists");
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
    let store = ClaimStore::connect(target, SHARED_SCHEMA);
    let err = store
        .try_claim(&key("c1"), &holder("p1", 1), T0, LAPSE)
        .expect_err("unreachable")
        .to_string();
    assert!(err.starts_with("claim store unavailable"), "{err}");
    assert!(err.contains(&format!("x@127.0.0.1:{port}/y")), "{err}");
}

/// Ends the backends of `sql`'s pids (a `SELECT pid FROM …`), as an
/// idle-session reaper does, and waits (at most 5 s) until each has
/// exited: a backend being ended still holds its locks until it exits,
/// so a lock counted after this is a new one; how many.
fn terminate(db: &PgSchema, pids: &str, params: &[&(dyn postgres::types::ToSql + Sync)]) -> u64 {
    db.admin()
        .execute(
            &format!("SELECT pg_terminate_backend(pid, 5000) FROM ({pids}) p"),
            params,
        )
        .expect("terminate")
}

/// The backend holding the advisory lock of `instance`.
const LOCK_HOLDER: &str = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' \
    AND objsubid = 1 AND granted AND ((classid::bigint << 32) | objid::bigint) = $1";

/// A store on `db` whose connections carry `application_name`, so the
/// test can find its backends.
fn named_store(db: &PgSchema, application_name: &str) -> ClaimStore {
    let mut target = db.target().clone();
    target.config_mut().application_name(application_name);
    ClaimStore::open(target, SHARED_SCHEMA).expect("open")
}

#[test]
fn a_reaped_decision_connection_is_replaced_and_the_decision_runs_again() {
    let db = PgSchema::new("reconnect");
    let store = named_store(&db, "rgtest-reconnect");
    let k = key("c1");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let ended = terminate(
        &db,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'rgtest-reconnect'",
        &[],
    );
    assert!(ended >= 1, "the store's decision connections");
    std::thread::sleep(Duration::from_millis(50));
    // Every decision connection was ended while idle: the next decision
    // finds its own dead (57P01), reconnects and runs again at once.
    for _ in 0..4 {
        let r = store.get(&k).expect("read after the reaper").expect("row");
        assert_eq!(r.holder, holder("p1", 1));
    }
    let consumed = store
        .consume("t-1", "", "c1", "task writes", i64::MAX, T0 + 5)
        .expect("evidence after the reaper");
    assert_eq!(consumed.len(), 1);
}

/// A store's decisions one after another go to one connection, the
/// first free one: its backend answers from warm caches, where the next
/// in turn has been idle since the decision before last.
#[test]
fn decisions_one_after_another_go_to_one_connection() {
    let db = PgSchema::new("first-free");
    let store = named_store(&db, "rgtest-first-free");
    let mut admin = db.admin();
    let since: std::time::SystemTime = admin
        .query_one("SELECT clock_timestamp()", &[])
        .expect("the server's clock")
        .get(0);
    for n in 0..6 {
        let k = key(&format!("c{n}"));
        store
            .try_claim(&k, &holder("p1", 1), T0, LAPSE)
            .expect("claim");
    }
    let used: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rgtest-first-free' \
             AND query_start >= $1",
            &[&since],
        )
        .expect("the store's connections")
        .get(0);
    assert_eq!(used, 1, "connections that decided");
}

/// Two proxies on the schema `name` (the second with the holder-gone
/// grace): the first holds `c1`; its instance id.
fn two_proxies_the_first_holding_c1(
    name: &str,
) -> (PgSchema, ClaimStore, ClaimStore, ClaimKey, i64) {
    let db = PgSchema::new(name);
    let a = db.open();
    let b = db.open().with_holder_gone_grace(GRACE);
    let k = key("c1");
    a.try_claim(&k, &holder("p1", 1), T0, LAPSE).expect("claim");
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
    a.try_claim(&held, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    a.try_claim(&answered, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
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

#[test]
fn claims_and_leases_written_before_keys_were_digests_are_kept_and_found() {
    let db = PgSchema::new("digest-migration");
    let s = db.target().schema().to_owned();
    let mut c = db.admin();
    // Version 8 made keys digests.
    migration::migrate_to(&mut c, &s, SHARED_SCHEMA, 7).expect("the schema an older build left");
    // A held claim and a run lease as that build wrote them.
    let k = key("c1");
    c.execute(
        &format!(
            "INSERT INTO {s}.claims (thread_id, checkpoint_ns, checkpoint_id, fingerprint, \
             state, proxy_id, session_id, client_addr, application_name, claimed_at_ms, \
             lapse_at_ms, epoch, holder_instance) \
             VALUES ('t-1', '', 'c1', $1, 'held', 'p1', 1, '10.0.0.1:5000', 'worker', $2, $3, \
             1, 0)"
        ),
        &[&k.fingerprint, &T0, &(T0 + LAPSE)],
    )
    .expect("an older claim");
    c.execute(
        &format!(
            "INSERT INTO {s}.run_leases (thread_id, checkpoint_ns, answered_checkpoint_id, \
             fingerprint, proxy_id, session_id, client_addr, application_name, answered_at_ms, \
             last_write_ms, until_ms, holder_instance) \
             VALUES ('t-1', '', 'c0', 'f', 'p1', 1, '10.0.0.1:5000', 'worker', $1, $1, $2, 0)"
        ),
        &[&T0, &(T0 + LAPSE)],
    )
    .expect("an older lease");
    let store = db.open();
    let digested: i64 = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM {s}.claims WHERE key_digest IS NOT NULL) \
                 + (SELECT count(*) FROM {s}.run_leases WHERE key_digest IS NOT NULL)"
            ),
            &[],
        )
        .expect("digests")
        .get(0);
    assert_eq!(digested, 2, "every row has its digest");
    // The older row is the key's claim: another reader finds it held, and
    // taking it inserts no second row.
    match store.try_claim(&k, &holder("p2", 2), T0 + 1, LAPSE) {
        Ok(ClaimOutcome::Busy(r)) => assert_eq!(r.holder, holder("p1", 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.list(Some("t-1")).expect("list").len(), 1);
    let lease = store.last_answer("t-1", "").expect("read").expect("lease");
    assert_eq!(lease.answered_checkpoint_id, "c0");
}

#[test]
fn a_store_whose_table_went_fails_each_operation_clearly() {
    let db = PgSchema::new("vanish");
    let store = db.open();
    // Another tool makes the table unusable under the running proxy.
    let mut admin = db.admin();
    admin
        .batch_execute(&format!(
            "DROP TABLE {}.claims CASCADE",
            db.target().schema()
        ))
        .expect("drop");
    let text = store
        .try_claim(&key("c1"), &holder("p1", 1), T0, LAPSE)
        .expect_err("no table")
        .to_string();
    assert!(
        text.starts_with("claim store unavailable: taking a claim failed on"),
        "{text}"
    );
}

/// The model check's restatement of the claim rule (`tests/claims_model.rs`
/// decides every claim with it), held to the SQL below.
#[path = "../../../tests/claims_rule/mod.rs"]
mod claims_rule;

/// Each state of a claim the model reaches, set up here by the store's
/// own operations on the test clock; then another reader (or the holder)
/// claims it at `at`, on the server, and the model's rule decides the same
/// row at the same instant: the outcomes, records included, are equal.
#[test]
fn the_models_claim_rule_decides_as_the_sql_claim_function() {
    type Setup = fn(&ClaimStore, &ClaimKey);
    fn claimed(s: &ClaimStore, k: &ClaimKey) {
        s.try_claim(k, &holder("p1", 1), T0, LAPSE).expect("claim");
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

/// `sql`, a call of the fence, for `holder`'s write continuing `k`'s
/// checkpoint: the writer's seven parameters, then `answer` as `$8` if
/// given.
fn fence_call(
    tx: &mut postgres::Transaction<'_>,
    sql: &str,
    k: &ClaimKey,
    holder: &Holder,
    answer: Option<&str>,
) -> Result<u64, postgres::Error> {
    let session = holder.session_id as i64;
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
        &k.at.thread_id,
        &k.at.checkpoint_ns,
        &k.at.checkpoint_id,
        &holder.proxy_id,
        &session,
        &holder.client_addr,
        &holder.application_name,
    ];
    if let Some(answer) = &answer {
        params.push(answer);
    }
    tx.execute(sql, &params)
}

/// The fence run in a write's transaction with the answer (see
/// `answer_in_write`): `holder`'s write of `answer` continuing `k`'s
/// checkpoint, committed or rolled back.
fn answer_in_write(db: &PgSchema, k: &ClaimKey, holder: &Holder, answer: &str, commit: bool) {
    let s = db.target().schema().to_owned();
    let mut c = db.admin();
    let mut tx = c.transaction().expect("begin");
    let sql =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, $8, false, 60000)");
    fence_call(&mut tx, &sql, k, holder, Some(answer))
        .expect("the holder's write passes its fence");
    if commit {
        tx.commit().expect("commit");
    } else {
        tx.rollback().expect("rollback");
    }
}

#[test]
fn an_answer_consumes_its_claim_in_its_own_transaction_and_is_reported_once() {
    let db = PgSchema::new("answer-in-write");
    let store = db.open();
    let k = key("c1");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("taken");
    // Rolled back: nothing was answered, the claim is still held.
    answer_in_write(&db, &k, &holder("p1", 1), "task a wrote approved", false);
    match store.try_claim(&k, &holder("p2", 2), T0 + 1, LAPSE) {
        Ok(ClaimOutcome::Busy(r)) => assert_eq!(r.state, ClaimState::Held),
        other => panic!("{other:?}"),
    }
    // Committed: the claim is consumed with the write, before any evidence
    // of it is applied, and even after its lapse nobody takes it over.
    answer_in_write(&db, &k, &holder("p1", 1), "task a wrote approved", true);
    match store.try_claim(&k, &holder("p2", 2), T0 + 2 * LAPSE, LAPSE) {
        Ok(ClaimOutcome::Consumed(r)) => {
            assert_eq!(r.holder, holder("p1", 1));
            assert_eq!(r.evidence.as_deref(), Some("task a wrote approved"));
        }
        other => panic!("{other:?}"),
    }
    // The write's evidence, applied late, reports that consumption once
    // (for the audit trail); the same evidence again reports nothing.
    let reported = store
        .consume("t-1", "", "c1", "task a wrote approved", T0, T0 + 3)
        .expect("consume");
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0].holder, holder("p1", 1));
    assert!(reported[0].consumed_at_ms.is_some());
    let again = store
        .consume("t-1", "", "c1", "task a wrote approved", T0, T0 + 4)
        .expect("consume");
    assert!(again.is_empty(), "{again:?}");
}

/// One write's evidence on `k`'s checkpoint, passed the proxy at
/// `written_at`.
fn evidence_item<'a>(
    kind: WriteEvidence,
    k: &'a ClaimKey,
    what: &'a str,
    written_at: Option<i64>,
) -> EvidenceItem<'a> {
    EvidenceItem {
        kind,
        at: &k.at,
        what,
        written_at: written_at.map(WrittenAt::from),
    }
}

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

/// The database's clock is planned into the statement that reads it, not
/// called through the function manager (a search path of its own would
/// prevent that); a test build's held clock still applies.
#[test]
fn the_database_clock_is_inlined_into_its_caller() {
    let db = PgSchema::new("clock-inlined");
    let _store = db.open();
    let s = db.target().schema().to_owned();
    let mut admin = db.admin();
    let plan: Vec<String> = admin
        .query(&format!("EXPLAIN (VERBOSE) SELECT {s}.clock_ms()"), &[])
        .expect("explain")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("clock_timestamp()") && !plan.contains(&format!("{s}.clock_ms")),
        "{plan}"
    );
    let mut tx = admin.transaction().expect("begin");
    tx.execute(
        "SELECT set_config($1, $2, true)",
        &[&super::db_clock::TEST_CLOCK_SETTING, &T0.to_string()],
    )
    .expect("hold the clock");
    let held: i64 = tx
        .query_one(&format!("SELECT {s}.clock_ms()"), &[])
        .expect("read the clock")
        .get(0);
    assert_eq!(held, T0);
}

/// `k` claimed by p1's session 1 at T0 and answered at T0 + 2 (written
/// at T0 + 1): its thread's run lease starts then.
fn answer(store: &ClaimStore, k: &ClaimKey) {
    store
        .try_claim(k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
    let at = &k.at;
    store
        .consume(
            &at.thread_id,
            &at.checkpoint_ns,
            &at.checkpoint_id,
            "task a wrote x",
            T0 + 1,
            T0 + 2,
        )
        .expect("consume");
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
    store
        .try_claim(&claimed, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
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

/// The fence by either signature (the older one is what replicas of an
/// older build call): the holder's write passes and keeps its claim past
/// the commit cover, measured on the server's clock; another proxy's write
/// is refused with RGF01, naming why.
#[test]
fn the_fence_passes_the_holder_and_refuses_another_proxy_by_either_signature() {
    let db = PgSchema::new("fence-one-call");
    let store = db.open();
    let k = key("c1");
    store
        .try_claim(&k, &holder("p1", 1), T0, LAPSE)
        .expect("taken");
    let s = db.target().schema().to_owned();
    let older = format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000)");
    let newer =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, NULL, false, 0)");
    for sql in [older, newer] {
        let mut c = db.admin();
        let mut fence = |h: &Holder| {
            let mut tx = c.transaction().expect("begin");
            let server_ms: i64 = tx
                .query_one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                    &[],
                )
                .expect("clock")
                .get(0);
            let out = fence_call(&mut tx, &sql, &k, h, None);
            if out.is_ok() {
                tx.commit().expect("commit");
            }
            out.map(|_| server_ms)
        };
        let checked_at = fence(&holder("p1", 1)).expect("the holder's write passes");
        let kept = store.get(&k).expect("read").expect("the claim");
        assert_eq!(kept.state, ClaimState::Held, "{sql}");
        assert!(kept.lapse_at_ms >= checked_at + 2000, "{sql}: {kept:?}");
        let refused = fence(&holder("p2", 2)).expect_err("another proxy's write is fenced");
        let db_error = refused.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "RGF01", "{sql}");
        assert_eq!(db_error.hint(), Some("other_proxy"), "{sql}");
    }
}

/// A write's transaction fences twice on a thread (its progress, then its
/// answer) while the evidence worker applies a batch that renews the
/// thread's run lease and then records progress on the claim the write
/// holds: the batch waits for the write's commit, and neither is aborted
/// as a deadlock.
#[test]
fn evidence_on_a_thread_waits_for_a_write_fencing_on_it_instead_of_deadlocking() {
    let db = PgSchema::new("thread-lock");
    let store = Arc::new(db.open());
    let (earlier, parked) = (key("c0"), key("c1"));
    // An earlier answer on the thread: its run lease is live.
    answer(&store, &earlier);
    store
        .try_claim(&parked, &holder("p1", 1), T0 + 3, LAPSE)
        .expect("claim");

    let s = db.target().schema().to_owned();
    let mut c = db.admin();
    let mut tx = c.transaction().expect("begin");
    tx.execute(
        "SELECT set_config($1, $2, true)",
        &[&super::db_clock::TEST_CLOCK_SETTING, &(T0 + 10).to_string()],
    )
    .expect("the write's clock");
    let progress =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, NULL, false, 0)");
    fence_call(&mut tx, &progress, &parked, &holder("p1", 1), None)
        .expect("the holder's progress passes its fence");

    let worker = {
        let store = Arc::clone(&store);
        let (earlier, parked) = (earlier.clone(), parked.clone());
        std::thread::spawn(move || {
            let items = [
                evidence_item(
                    WriteEvidence::Consumed,
                    &earlier,
                    "task a wrote x",
                    Some(T0 + 4),
                ),
                evidence_item(
                    WriteEvidence::Progress,
                    &parked,
                    "run-level __resume__ recorded",
                    Some(T0 + 4),
                ),
            ];
            store.apply_evidence(&items, T0 + 5, 1_000).map(|_| ())
        })
    };
    // The batch is waiting for the write's transaction.
    let mut watch = db.admin();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("activity")
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the batch never waited");
        std::thread::sleep(Duration::from_millis(10));
    }

    let answer =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, $8, false, 60000)");
    fence_call(
        &mut tx,
        &answer,
        &parked,
        &holder("p1", 1),
        Some("task a wrote approved"),
    )
    .expect("the holder's answer passes its fence");
    tx.commit().expect("the write commits");
    worker
        .join()
        .expect("the worker thread")
        .expect("the batch applies after the write's commit");
    let answered = store.get(&parked).expect("get").expect("row");
    assert_eq!(
        (answered.state, answered.evidence.as_deref()),
        (ClaimState::Consumed, Some("task a wrote approved"))
    );
}
