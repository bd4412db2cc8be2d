//! The store's connections: failing closed on an unreachable database or
//! a table gone, a reaped decision connection replaced, and decisions one
//! after another on one connection.

use super::*;

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
    claim_as_p1(&store, &k);
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
        claim_as_p1(&store, &k);
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
