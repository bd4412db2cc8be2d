//! The claims schema: migrations raced by proxies starting together,
//! operator commands on an existing schema, rows an older build wrote, and
//! the database's clock function.

use super::*;

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
