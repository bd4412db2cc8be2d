//! The PostgreSQL output against a real server (the claims tests' own:
//! `test_pg_server`), each test in a schema of its own.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::audit::outputs::{Output, Target, MAX_ATTEMPTS, RETRY_BUDGET};
use crate::audit_event::BlobDigest;
use crate::config::shared_schema::SHARED_SCHEMA;
use crate::test_pg_front::PgFront;
use crate::test_pg_server::PgSchema;

fn ctx(session_id: u64) -> SessionContext {
    SessionContext {
        session_id,
        client_addr: "10.0.0.7:5100".into(),
        user: "lg".into(),
        database: "checkpoints".into(),
        application_name: "agent".into(),
    }
}

fn event(proxy: &str, time: &str, op: Operation, thread: &str) -> AuditEvent {
    let mut ev = AuditEvent::new(&ctx(u64::MAX - 3), op).with_thread(thread);
    ev.time = time.into();
    ev.proxy_id = proxy.into();
    ev
}

/// `target` with the shared schema's migrations.
fn shared(target: PgTarget) -> TrailDatabase {
    TrailDatabase {
        target,
        migrations: SHARED_SCHEMA,
    }
}

fn slot_of(db: &PgSchema) -> TargetSlot {
    let slot = TargetSlot::default();
    slot.set(shared(db.target().clone())).expect("empty slot");
    slot
}

/// A connection of the test's own.
fn plain(db: &PgSchema) -> Client {
    connect_schema(
        db.target(),
        SchemaAccess::AtLeast(0),
        "resumeguard-test",
        STATEMENT_TIMEOUT,
    )
    .expect("connect")
}

fn append(trail: &mut PgTrail, events: &[AuditEvent]) {
    let refs: Vec<&AuditEvent> = events.iter().collect();
    trail.append(&refs).expect("append");
}

/// One event of thread `t1`, appended to `db`'s trail.
fn one_event_of_t1(db: &PgSchema) -> AuditEvent {
    let ev = event(
        "proxy-a",
        "2026-11-30T10:00:00.000Z",
        Operation::ClaimTaken,
        "t1",
    );
    append(&mut PgTrail::new(slot_of(db)), std::slice::from_ref(&ev));
    ev
}

#[test]
fn a_row_with_null_where_a_value_is_read_is_an_error_not_a_panic() {
    let db = PgSchema::new("audit_null_row");
    one_event_of_t1(&db);
    let s = db.target().schema();
    db.admin()
        .batch_execute(&format!(
            "ALTER TABLE {s}.audit_events ALTER COLUMN client_addr DROP NOT NULL; \
             INSERT INTO {s}.audit_events (time, proxy_id, session_id, client_addr, \"user\", \
             \"database\", application_name, operation, thread_id, channels, blob_sha256, \
             detail) VALUES (now(), 'proxy-a', 1, NULL, 'lg', 'db', 'app', 'claim_taken', \
             't1', '[]', '[]', '{{}}')"
        ))
        .expect("a row with no client address");
    match thread_events(db.target(), "t1") {
        Err(AuditError::PostgresRow(_)) => {}
        other => panic!("expected the row's error, got {other:?}"),
    }
}

#[test]
fn appends_batches_and_reads_a_thread_back_in_time_order_over_replicas() {
    let db = PgSchema::new("audit_append");
    let mut a = PgTrail::new(slot_of(&db));
    let mut b = PgTrail::new(slot_of(&db));
    let mut parked = event(
        "proxy-a",
        "2026-11-30T10:00:00.100Z",
        Operation::InterruptParked,
        "t1",
    )
    .with_checkpoint("", "1ef4f797-8335-6428-8001-8a1503f9b875");
    parked.parent_checkpoint_id = Some("1ef4f797-8335-6427-8000-000000000000".into());
    parked.task_id = Some("task-9".into());
    parked.channels = vec!["__interrupt__".into()];
    parked.blob_sha256 = vec![BlobDigest::of("__interrupt__", b"approve?")];
    parked.detail = serde_json::json!({"rows": 1, "n": 12345678901234567890u64});
    let other = event(
        "proxy-a",
        "2026-11-30T10:00:00.200Z",
        Operation::ReadLatest,
        "t2",
    );
    let taken = event(
        "proxy-a",
        "2026-11-30T10:00:00.400Z",
        Operation::ClaimTaken,
        "t1",
    );
    // Replica B's refusal falls between A's two batches in time.
    let refused = event(
        "proxy-b",
        "2026-11-30T10:00:00.300Z",
        Operation::ClaimRefused,
        "t1",
    )
    .with_detail(serde_json::json!({"reason": "held by proxy-a"}));
    append(&mut a, &[parked.clone(), other.clone()]);
    append(&mut a, std::slice::from_ref(&taken));
    append(&mut b, std::slice::from_ref(&refused));
    let mut gap = event(
        "proxy-b",
        "2026-11-30T10:00:00.350Z",
        Operation::EventsDropped,
        "x",
    );
    gap.thread_id = None;
    let early_gap = AuditEvent {
        time: "2026-11-30T09:00:00.000Z".into(),
        ..gap.clone()
    };
    append(&mut b, &[early_gap, gap.clone()]);

    let target = db.target();
    assert_eq!(
        thread_events(target, "t1").unwrap(),
        vec![parked, refused, gap.clone(), taken],
        "both replicas' events by time, with the gap recorded since the thread began"
    );
    assert_eq!(thread_events(target, "t2").unwrap(), vec![other, gap]);
    assert!(thread_events(target, "nope").unwrap().is_empty());

    let listed = threads(target, &EventFilter::default()).unwrap();
    let summary: Vec<_> = listed
        .iter()
        .map(|t| (t.thread_id.as_str(), t.events, t.last_operation.as_str()))
        .collect();
    assert_eq!(
        summary,
        [("t1", 3, "claim_taken"), ("t2", 1, "read_latest")]
    );
    // On the database's clock: each time moved by its batch's trip to the
    // server (under a millisecond here, more on a loaded host).
    let (first, last) = (&listed[0].first, &listed[0].last);
    assert!(first.starts_with("2026-11-30T10:00:00.1"), "{first}");
    assert!(last.starts_with("2026-11-30T10:00:00.4"), "{last}");
    let refusals = EventFilter {
        ops: vec![Operation::ClaimRefused],
        ..EventFilter::default()
    };
    let only = threads(target, &refusals).unwrap();
    assert_eq!((only.len(), only[0].events), (1, 1));
    let late = EventFilter {
        since: Some("2026-11-30T10:00:00.250Z".into()),
        ..EventFilter::default()
    };
    assert_eq!(threads(target, &late).unwrap().len(), 1);
}

/// Appends `events` as a replica whose clock reads `clock` as the batch
/// leaves (the events carry times of that clock too).
fn append_on_clock(db: &PgSchema, events: &[&AuditEvent], clock: SystemTime) {
    let schema = db.target().schema().to_owned();
    let mut client = plain(db);
    let insert = client.prepare(&insert_sql(&schema)).expect("prepare");
    let mut heads = Heads::default();
    let mut load = |proxy: &str| head_of(&mut plain(db), &schema, proxy);
    let Ok(mut columns) = Columns::of(events, &mut heads, &mut load) else {
        panic!("columns");
    };
    columns.sent_micros = sent_micros(clock);
    client.execute(&insert, &columns.params()).expect("insert");
}

#[test]
fn replicas_whose_clocks_disagree_read_back_in_the_order_they_wrote() {
    let db = PgSchema::new("audit_db_clock");
    let mut ahead = PgTrail::new(slot_of(&db));
    let parked = event(
        "proxy-ahead",
        &AuditEvent::now_string(),
        Operation::InterruptParked,
        "t1",
    );
    append(&mut ahead, std::slice::from_ref(&parked));
    // The replica that answers next runs 15 s behind: its record's time,
    // and its clock as the batch leaves, are both 15 s back.
    let behind = SystemTime::now() - Duration::from_secs(15);
    let answered = event(
        "proxy-behind",
        &crate::timestamp::format_rfc3339_millis(behind),
        Operation::ResumeRecorded,
        "t1",
    );
    append_on_clock(&db, &[&answered], behind);
    let taken = event(
        "proxy-ahead",
        &AuditEvent::now_string(),
        Operation::ClaimConsumed,
        "t1",
    );
    append(&mut ahead, std::slice::from_ref(&taken));

    assert_eq!(
        thread_events(db.target(), "t1").unwrap(),
        vec![parked.clone(), answered, taken],
        "as written, not by each replica's own time; each keeps its own time"
    );
    let drift: f64 = plain(&db)
        .query_one(
            &format!(
                "SELECT extract(epoch FROM db_time - time)::float8 FROM {}.audit_events \
                 WHERE proxy_id = 'proxy-behind'",
                db.target().schema()
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        (14.0..16.0).contains(&drift),
        "moved onto the database's clock by {drift} s"
    );
    let listed = threads(db.target(), &EventFilter::default()).unwrap();
    let (first, last) = (listed[0].first.as_str(), listed[0].last.as_str());
    assert!(
        parked.time.as_str() <= first && first <= last,
        "the thread's first time is the park's on the database's clock, not the time \
         of the replica behind ({first}, {last}; parked {})",
        parked.time
    );
    assert_eq!(listed[0].last_operation, "claim_consumed");
}

#[test]
fn the_consoles_time_windows_on_the_shared_trail_are_on_the_databases_clock() {
    use crate::audit::console_query::{console_list_postgres, ConsoleFilter, ConsoleList};
    use crate::timestamp::format_rfc3339_millis;

    let db = PgSchema::new("audit_console_clock");
    // Two refusals now: one through a replica on time, one through a
    // replica 15 s behind, whose record says 15 s ago.
    let on_time = event(
        "proxy-on-time",
        &AuditEvent::now_string(),
        Operation::ClaimRefused,
        "t-on-time",
    );
    append(
        &mut PgTrail::new(slot_of(&db)),
        std::slice::from_ref(&on_time),
    );
    let behind = SystemTime::now() - Duration::from_secs(15);
    let late = event(
        "proxy-behind",
        &format_rfc3339_millis(behind),
        Operation::ClaimRefused,
        "t-behind",
    );
    append_on_clock(&db, &[&late], behind);
    let ago = |s: u64| {
        Some(format_rfc3339_millis(
            SystemTime::now() - Duration::from_secs(s),
        ))
    };
    let listed = |since: Option<String>, until: Option<String>| -> Vec<String> {
        let filter = ConsoleFilter {
            since,
            until,
            limit: 10,
            ..ConsoleFilter::default()
        };
        console_list_postgres(db.target(), ConsoleList::Refused, &filter)
            .unwrap()
            .into_iter()
            .map(|l| l.event.thread_id.unwrap_or_default())
            .collect()
    };
    assert_eq!(
        listed(ago(5), None),
        ["t-behind", "t-on-time"],
        "the last 5 s on the database's clock hold both refusals"
    );
    assert!(
        listed(None, ago(10)).is_empty(),
        "neither happened 10 s ago on the database's clock"
    );
}

#[test]
fn sql_looking_event_text_is_stored_verbatim() {
    let db = PgSchema::new("audit_verbatim");
    let mut trail = PgTrail::new(slot_of(&db));
    let thread = "t'); DROP TABLE audit_events; --";
    let mut ev = event(
        "p'1",
        "2026-11-30T10:00:00.000Z",
        Operation::Unrecognized,
        thread,
    );
    ev.application_name = r#"app", $1, E'\\x00' -- "#.into();
    ev.client_addr = "$$ ; SELECT pg_sleep(10) $$".into();
    ev.checkpoint_ns = Some("node:'\"\\".into());
    ev.channels = vec!["a'b".into(), "c\"d".into()];
    ev.detail = serde_json::json!({
        "sql": "INSERT INTO x VALUES ('a''b'); DELETE FROM resumeguard.audit_events; --",
        "unicode": "é ∑ \u{1F600}",
    });
    append(&mut trail, std::slice::from_ref(&ev));
    assert_eq!(thread_events(db.target(), thread).unwrap(), vec![ev]);
    let mut c = plain(&db);
    let detail: String = c
        .query_one(
            &format!(
                "SELECT detail::text FROM {}.audit_events",
                db.target().schema()
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        detail.contains(r#""sql":"INSERT INTO x VALUES ('a''b'); DELETE FROM"#),
        "{detail}"
    );
}

fn numbered(n: u64, time: &str) -> Vec<Arc<AuditEvent>> {
    (0..n)
        .map(|i| {
            let mut e = event("", time, Operation::ReadLatest, "t");
            e.session_id = i;
            Arc::new(e)
        })
        .collect()
}

#[test]
fn before_its_database_is_known_the_output_keeps_events_for_its_budget_then_loses_them_and_says_so_after(
) {
    let db = PgSchema::new("audit_unknown");
    let slot = TargetSlot::default();
    let budget = Duration::from_millis(300);
    let mut out = Output::new(
        Target::Postgres(Box::new(PgTrail::new(Arc::clone(&slot)))),
        "proxy-a",
    )
    .with_retry_budget(budget);
    // Nothing reached a database: no write costs an attempt, so batches
    // wait past the refused writes' limit, for the whole budget.
    assert!(out.write(&numbered(2, "2026-11-30T10:00:00.000Z")));
    assert!(!out.is_settled());
    for _ in 0..MAX_ATTEMPTS {
        assert!(out.write(&numbered(1, "2026-11-30T10:00:00.000Z")));
    }
    assert_eq!(out.write_lost(), 0, "retained, not lost yet");
    assert_eq!(out.retained(), 5);
    std::thread::sleep(budget);
    assert!(out.write(&[]));
    assert_eq!(out.write_lost(), 5);

    slot.set(shared(db.target().clone())).unwrap();
    let after = numbered(1, "2026-11-30T10:00:01.000Z");
    assert!(!out.write(&after), "the database is known");
    assert!(out.is_settled());
    let events = thread_events(db.target(), "t").unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].session_id, 0);
    assert_eq!(events[1].operation, Operation::EventsDropped);
    assert_eq!(events[1].detail["dropped"], 5);
    assert_eq!(events[1].detail["reason"], "write_failed");
    assert_eq!(events[1].proxy_id, "proxy-a");
}

#[test]
fn a_batch_the_database_fails_is_retained_then_lost_and_the_recovery_writes_a_gap_record() {
    let db = PgSchema::new("audit_losses");
    let mut out = Output::new(
        Target::Postgres(Box::new(PgTrail::new(slot_of(&db)))),
        "proxy-a",
    );
    assert!(!out.write(&numbered(1, "2026-11-30T10:00:00.000Z")));
    // The server refuses every insert for a while.
    let s = db.target().schema().to_owned();
    let mut admin = plain(&db);
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$BEGIN RAISE EXCEPTION 'disk full, say'; END$$; \
             CREATE TRIGGER refuse BEFORE INSERT ON {s}.audit_events \
             FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse()"
        ))
        .unwrap();
    assert!(out.write(&numbered(2, "2026-11-30T10:00:01.000Z")));
    assert!(out.write(&numbered(2, "2026-11-30T10:00:02.000Z")));
    assert_eq!(out.write_lost(), 0, "retained, not lost yet");
    assert!(out.write(&[]));
    assert_eq!(out.write_lost(), 4, "three failed attempts: given up");
    admin
        .batch_execute(&format!("DROP TRIGGER refuse ON {s}.audit_events"))
        .unwrap();
    assert!(!out.write(&numbered(1, "2026-11-30T10:00:03.000Z")));
    assert!(out.is_settled());
    let events = thread_events(db.target(), "t").unwrap();
    let shape: Vec<(&str, Operation)> = events
        .iter()
        .map(|e| (e.time.as_str(), e.operation))
        .collect();
    assert_eq!(
        shape[..2],
        [
            ("2026-11-30T10:00:00.000Z", Operation::ReadLatest),
            ("2026-11-30T10:00:03.000Z", Operation::ReadLatest),
        ]
    );
    assert_eq!(shape.len(), 3, "{events:?}");
    assert_eq!(events[2].operation, Operation::EventsDropped, "written now");
    let gap = &events[2].detail;
    assert_eq!(
        (&gap["dropped"], &gap["reason"]),
        (&4.into(), &"write_failed".into())
    );
    assert_eq!(gap["first_lost"], "2026-11-30T10:00:01.000Z");
    assert_eq!(gap["last_lost"], "2026-11-30T10:00:02.000Z");
    assert!(
        gap["error"]
            .as_str()
            .unwrap()
            .contains("disk full, say (P0001)"),
        "{gap}"
    );
}

#[test]
fn a_connection_the_server_ends_is_made_again_and_the_retried_batch_written() {
    let db = PgSchema::new("audit_reconnect");
    let slot = slot_of(&db);
    let mut out = Output::new(Target::Postgres(Box::new(PgTrail::new(slot))), "proxy-a");
    let at = |ms: u32, op| event("proxy-a", &format!("2026-11-30T10:00:00.{ms:03}Z"), op, "t");
    assert!(!out.write(&[Arc::new(at(1, Operation::ReadLatest))]));
    let mut admin = plain(&db);
    let ended: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'resumeguard-audit' AND pid <> pg_backend_pid() \
             AND query LIKE $1",
            &[&format!("%{}.audit_events%", db.target().schema())],
        )
        .unwrap()
        .get(0);
    assert_eq!(ended, 1, "the output's connection was found and ended");
    // The server ends the backend asynchronously; a write on the dead
    // connection fails and is kept; the next reconnects and writes it.
    let (mut failed, mut offered) = (0, 1);
    for ms in 2..50 {
        offered += 1;
        if out.write(&[Arc::new(at(ms, Operation::ClaimTaken))]) {
            failed += 1;
        } else if failed > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(failed, 1, "one failed write, then the reconnect");
    assert!(out.is_settled(), "nothing lost");
    let events = thread_events(db.target(), "t").unwrap();
    // Read back on the database's clock, records of two batches a
    // millisecond apart may read out of order by the trip's length.
    let mut times: Vec<&str> = events.iter().map(|e| &e.time[20..23]).collect();
    times.sort_unstable();
    times.dedup();
    assert_eq!(
        events.len(),
        offered,
        "every event once, the retried one too"
    );
    assert_eq!(times.len(), offered);
    assert!(events
        .iter()
        .all(|e| e.operation != Operation::EventsDropped));
    assert_eq!(out.write_lost(), 0);
}

/// An output retrying for `budget`, writing `db`'s table through `front`;
/// its first event (numbered 0) written.
fn output_through(front: &PgFront, db: &PgSchema, budget: Duration) -> Output {
    let slot = TargetSlot::default();
    slot.set(shared(front.target(db.target()))).unwrap();
    let out = Output::new(Target::Postgres(Box::new(PgTrail::new(slot))), "proxy-a");
    let mut out = out.with_retry_budget(budget);
    assert!(!out.write(&numbered(1, "2026-11-30T10:00:00.000Z")));
    out
}

/// One event a write for `lasting` while the database is away (`front`
/// down), as traffic does; then writes until the output answers again.
/// The events numbered from 1, in order.
fn write_through_an_outage(front: &PgFront, out: &mut Output, lasting: Duration) -> Vec<u64> {
    front.down();
    let started = Instant::now();
    let mut sent = Vec::new();
    while started.elapsed() < lasting {
        let n = sent.len() as u64 + 1;
        let mut ev = event("", "2026-11-30T10:00:01.000Z", Operation::ReadLatest, "t");
        ev.session_id = n;
        assert!(out.write(&[Arc::new(ev)]), "the database is away");
        sent.push(n);
        std::thread::sleep(Duration::from_millis(20));
    }
    front.up();
    let back = Instant::now();
    while out.write(&[]) {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "the output answers"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sent
}

#[test]
fn events_written_while_the_database_is_away_within_the_budget_are_kept_not_lost() {
    let db = PgSchema::new("audit_outage");
    let front = PgFront::new(db.target());
    let mut out = output_through(&front, &db, RETRY_BUDGET);
    // Longer than three writes' worth of reconnect backoff (100 + 200 ms).
    let sent = write_through_an_outage(&front, &mut out, Duration::from_millis(1500));
    assert!(sent.len() > 10, "{sent:?}");
    assert!(out.is_settled());
    assert_eq!(out.write_lost(), 0);
    let events = thread_events(db.target(), "t").unwrap();
    assert!(events
        .iter()
        .all(|e| e.operation != Operation::EventsDropped));
    let written: Vec<u64> = events.iter().map(|e| e.session_id).collect();
    assert_eq!(written, [vec![0], sent].concat(), "all of them, in order");
}

#[test]
fn events_the_database_is_away_for_longer_than_the_budget_are_lost_with_a_gap_record() {
    let db = PgSchema::new("audit_long_outage");
    let front = PgFront::new(db.target());
    let mut out = output_through(&front, &db, Duration::from_millis(500));
    let sent = write_through_an_outage(&front, &mut out, Duration::from_millis(1500));
    let lost = out.write_lost();
    assert!(lost > 0 && lost <= sent.len() as u64, "{lost} of {sent:?}");
    assert!(out.is_settled());
    let events = thread_events(db.target(), "t").unwrap();
    let gaps: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.operation == Operation::EventsDropped)
        .collect();
    assert_eq!(gaps.len(), 1, "{events:?}");
    assert_eq!(gaps[0].detail["dropped"], lost);
    assert_eq!(gaps[0].detail["reason"], "write_failed");
    assert_eq!(events.len() as u64, 1 + sent.len() as u64 - lost + 1);
}

#[test]
fn an_unreachable_database_is_retried_after_a_backoff_not_on_every_write() {
    let dead = PgTarget::from_dsn("host=127.0.0.1 port=1 user=x dbname=x").unwrap();
    let slot = TargetSlot::default();
    slot.set(shared(dead)).unwrap();
    let mut trail = PgTrail::new(slot);
    let ev = event("p", "2026-11-30T10:00:00.000Z", Operation::ReadLatest, "t");
    let first = trail.append(&[&ev]).unwrap_err().to_string();
    assert!(first.contains("127.0.0.1:1"), "{first}");
    let second = trail.append(&[&ev]).unwrap_err().to_string();
    assert!(second.contains("backoff"), "{second}");
}

#[test]
fn readers_need_the_table_and_create_nothing() {
    let db = PgSchema::new("audit_reader");
    let err = thread_events(db.target(), "t").unwrap_err().to_string();
    assert!(err.contains("version 0"), "{err}");
    let mut c = plain(&db);
    let exists: bool = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&db.target().schema()],
        )
        .unwrap()
        .get(0);
    assert!(!exists, "a reader made the schema");
}

#[test]
fn retention_deletes_old_rows_in_chunks_and_records_it_once() {
    let db = PgSchema::new("audit_retention");
    let mut a = PgTrail::new(slot_of(&db));
    let mut b = PgTrail::new(slot_of(&db));
    let old = event(
        "proxy-a",
        "2026-01-01T00:00:00.000Z",
        Operation::ReadLatest,
        "old",
    );
    let new = event(
        "proxy-a",
        "2026-11-30T00:00:00.000Z",
        Operation::ReadLatest,
        "new",
    );
    append(&mut a, &[old.clone(), old, new.clone()]);
    let cutoff = "2026-06-01T00:00:00.000Z";
    assert_eq!(a.prune_step(cutoff, "proxy-a").unwrap(), 2);
    assert_eq!(b.prune_step(cutoff, "proxy-b").unwrap(), 0, "already gone");
    assert!(thread_events(db.target(), "old").unwrap().is_empty());
    assert_eq!(thread_events(db.target(), "new").unwrap(), vec![new]);
    let mut c = plain(&db);
    let records: Vec<(String, String)> = c
        .query(
            &format!(
                "SELECT proxy_id, detail::text FROM {}.audit_events \
                 WHERE operation = 'audit_pruned'",
                db.target().schema()
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].0, "proxy-a");
    assert!(records[0].1.contains(r#""rows":2"#), "{records:?}");
}

#[test]
fn rows_cannot_be_edited_or_truncated_only_appended_and_pruned() {
    let db = PgSchema::new("audit_append_only");
    let ev = one_event_of_t1(&db);
    let s = db.target().schema();
    let mut c = plain(&db);
    for sql in [
        format!("UPDATE {s}.audit_events SET proxy_id = 'someone else'"),
        format!("TRUNCATE {s}.audit_events"),
    ] {
        let err = c.batch_execute(&sql).expect_err(&sql);
        assert!(error_text(&err).contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(thread_events(db.target(), "t1").unwrap(), vec![ev]);
    let deleted = c
        .execute(&format!("DELETE FROM {s}.audit_events"), &[])
        .expect("retention deletes");
    assert_eq!(deleted, 1);
}

#[test]
fn verify_walks_every_replicas_chain_and_names_the_record_changed_or_removed() {
    use crate::audit::chain::Break;
    let db = PgSchema::new("audit_verify");
    let mut a = PgTrail::new(slot_of(&db));
    let mut b = PgTrail::new(slot_of(&db));
    let at = |proxy: &str, n: u32| {
        let mut ev = event(
            proxy,
            &format!("2026-11-30T10:00:0{n}.000Z"),
            Operation::CheckpointPut,
            &format!("t{n}"),
        );
        // Text the json column must keep as written for the hash to hold.
        ev.detail = serde_json::json!({"n": n, "ratio": 0.1, "big": 12345678901234567890u64});
        ev
    };
    append(&mut a, &[at("proxy-a", 1), at("proxy-a", 2)]);
    append(&mut b, &[at("proxy-b", 3)]);
    append(&mut a, &[at("proxy-a", 4)]);
    // A writer that reconnects continues its chain from the table.
    let mut a2 = PgTrail::new(slot_of(&db));
    append(&mut a2, &[at("proxy-a", 5)]);
    let verdict = verify(db.target()).unwrap();
    assert!(verdict.holds(), "{:?}", verdict.breaks);
    assert_eq!(verdict.records(), vec![("proxy-a", 4), ("proxy-b", 1)]);

    let s = db.target().schema();
    let mut c = plain(&db);
    let id_of = |c: &mut Client, thread: &str| -> i64 {
        c.query_one(
            &format!("SELECT id FROM {s}.audit_events WHERE thread_id = $1"),
            &[&thread],
        )
        .unwrap()
        .get(0)
    };
    let (id2, id4) = (id_of(&mut c, "t2"), id_of(&mut c, "t4"));
    // As an owner of the table can: triggers off, one row rewritten.
    c.batch_execute(&format!(
        "ALTER TABLE {s}.audit_events DISABLE TRIGGER USER; \
         UPDATE {s}.audit_events SET detail = '{{\"n\": 2}}' WHERE thread_id = 't2'; \
         ALTER TABLE {s}.audit_events ENABLE TRIGGER USER"
    ))
    .unwrap();
    assert_eq!(
        verify(db.target()).unwrap().breaks,
        vec![Break::Changed {
            id: id2,
            proxy_id: "proxy-a".into()
        }]
    );
    c.batch_execute(&format!(
        "DELETE FROM {s}.audit_events WHERE thread_id = 't2'"
    ))
    .unwrap();
    let id1 = id_of(&mut c, "t1");
    assert_eq!(
        verify(db.target()).unwrap().breaks,
        vec![Break::Missing {
            id: id4,
            after: id1,
            proxy_id: "proxy-a".into()
        }]
    );
}

#[test]
fn retention_says_where_each_chain_now_starts() {
    let db = PgSchema::new("audit_verify_retention");
    let mut a = PgTrail::new(slot_of(&db));
    let mut b = PgTrail::new(slot_of(&db));
    let old = |proxy: &str| {
        event(
            proxy,
            "2026-01-01T00:00:00.000Z",
            Operation::ReadLatest,
            "old",
        )
    };
    let new = |proxy: &str| {
        event(
            proxy,
            "2026-11-30T00:00:00.000Z",
            Operation::ReadLatest,
            "new",
        )
    };
    append(&mut a, &[old("proxy-a"), old("proxy-a")]);
    append(&mut b, &[old("proxy-b")]);
    append(&mut a, &[new("proxy-a")]);
    assert_eq!(
        a.prune_step("2026-06-01T00:00:00.000Z", "proxy-a").unwrap(),
        3
    );
    // Every row of B's chain went: its next record follows the last one.
    append(&mut b, &[new("proxy-b")]);
    let verdict = verify(db.target()).unwrap();
    assert!(verdict.holds(), "{:?}", verdict.breaks);
    assert!(
        verdict.chains.iter().all(|c| c.after_prune),
        "{:?}",
        verdict.chains
    );
    // The same removal without the prune's record is a break.
    let s = db.target().schema();
    plain(&db)
        .batch_execute(&format!(
            "DELETE FROM {s}.audit_events WHERE operation = 'audit_pruned'"
        ))
        .unwrap();
    let breaks = verify(db.target()).unwrap().breaks;
    assert_eq!(breaks.len(), 2, "{breaks:?}");
}
