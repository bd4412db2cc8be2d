//! The sink: ordering, flushing, queue refusals, failing outputs, retention.

use super::*;
use crate::audit::jsonl::read_jsonl;
use crate::audit::outputs::MAX_ATTEMPTS;
use crate::audit::sqlite_store::{all_events, thread_events};
use crate::audit::test_util::{remove_db, temp_path};
use crate::audit_event::{Operation, SessionContext};
use crate::config::shared_schema::SHARED_SCHEMA;
use crate::test_pg_front::{relay, unix_socket_of};
use rusqlite::Connection;

fn ctx() -> SessionContext {
    SessionContext {
        session_id: 1,
        client_addr: "127.0.0.1:5555".into(),
        user: "lg".into(),
        database: "db".into(),
        application_name: "test".into(),
    }
}

fn numbered(n: u64) -> AuditEvent {
    AuditEvent::new(&ctx(), Operation::CheckpointPut)
        .with_thread("t")
        .with_detail(serde_json::json!({ "n": n }))
}

fn sqlite_cfg(path: &std::path::Path, capacity: usize) -> AuditConfig {
    AuditConfig {
        sqlite: Some(path.to_path_buf()),
        queue_capacity: capacity,
        ..AuditConfig::default()
    }
}

#[test]
fn flush_waits_until_everything_is_written_in_order() {
    let path = temp_path("sink-flush", "db");
    let sink = AuditSink::start(&sqlite_cfg(&path, 65_536), "test-proxy").unwrap();
    for n in 0..2_000 {
        sink.record(numbered(n));
    }
    assert!(sink.flush());
    // No sleeps: flush returning is the only synchronisation.
    let events = thread_events(&path, "t").unwrap();
    let ns: Vec<u64> = events
        .iter()
        .map(|e| e.detail["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (0..2_000).collect::<Vec<_>>());
    assert_eq!(
        sink.stats(),
        AuditStats {
            enqueued: 2_000,
            written: 2_000,
            dropped: 0,
            write_errors: 0,
            lost: 0,
        }
    );
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
}

#[test]
fn full_queue_drops_without_blocking_then_reports_count() {
    let path = temp_path("sink-drop", "db");
    let (sink, release) = AuditSink::start_paused(&sqlite_cfg(&path, 4)).unwrap();
    // The writer is parked before its first read, so exactly 4 fit.
    for n in 0..10 {
        sink.record(numbered(n));
    }
    let stats = sink.stats();
    assert_eq!((stats.enqueued, stats.dropped, stats.written), (4, 6, 0));
    // Flush is bounded: it gives up while the writer cannot progress.
    assert!(!sink.flush_timeout(Duration::from_millis(20)));

    release.send(()).unwrap();
    assert!(sink.flush());
    let events = all_events(&path).unwrap();
    let ops: Vec<Operation> = events.iter().map(|e| e.operation).collect();
    let mut want = vec![Operation::CheckpointPut; 4];
    want.push(Operation::EventsDropped);
    assert_eq!(ops, want);
    let kept: Vec<u64> = events[..4]
        .iter()
        .map(|e| e.detail["n"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, vec![0, 1, 2, 3]);
    let report = &events[4];
    assert_eq!(report.detail["dropped"], 6);
    assert_eq!(report.detail["reason"], "queue_full");
    assert_eq!(report.detail["queue_full"], 6);
    let (first, last) = (&report.detail["first_lost"], &report.detail["last_lost"]);
    assert!(
        first.as_str().unwrap() >= events[3].time.as_str(),
        "{first}"
    );
    assert!(
        first.as_str().unwrap() <= last.as_str().unwrap(),
        "{first} {last}"
    );
    assert!(last.as_str().unwrap() <= report.time.as_str(), "{last}");
    assert_eq!(sink.dropped_total(), 6);
    assert_eq!(report.application_name, "resumeguard");
    assert_eq!(report.thread_id, None);

    // Once reported, drops are not reported again.
    sink.record(numbered(10));
    assert!(sink.flush());
    let events = all_events(&path).unwrap();
    assert_eq!(events.len(), 6);
    assert_eq!(events[5].operation, Operation::CheckpointPut);
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
}

#[test]
fn writes_to_sqlite_and_jsonl_together() {
    let db = temp_path("sink-both", "db");
    let jl = temp_path("sink-both", "jsonl");
    let cfg = AuditConfig {
        sqlite: Some(db.clone()),
        jsonl: Some(jl.to_string_lossy().into_owned()),
        ..AuditConfig::default()
    };
    let sink = AuditSink::start(&cfg, "test-proxy").unwrap();
    let clone = sink.clone();
    sink.record(numbered(1));
    clone.record(numbered(2));
    assert!(sink.flush());
    let from_db = all_events(&db).unwrap();
    assert_eq!(from_db.len(), 2);
    assert_eq!(read_jsonl(&jl).unwrap(), from_db);
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&db);
    let _ = std::fs::remove_file(&jl);
}

#[test]
fn shutdown_stops_writer_and_discards_later_events() {
    let path = temp_path("sink-shutdown", "db");
    let sink = AuditSink::start(&sqlite_cfg(&path, 16), "test-proxy").unwrap();
    sink.record(numbered(0));
    assert!(sink.shutdown(Duration::from_secs(10)));
    sink.record(numbered(1));
    assert_eq!(all_events(&path).unwrap().len(), 1);
    assert_eq!(sink.stats().enqueued, 1);
    // Writer is gone: flush reports completion of what was accepted.
    assert!(sink.flush_timeout(Duration::from_millis(10)));
    remove_db(&path);
}

#[test]
fn disabled_and_unconfigured_sinks_are_no_ops() {
    for sink in [
        AuditSink::disabled(),
        AuditSink::start(&AuditConfig::default(), "test-proxy").unwrap(),
    ] {
        assert!(!sink.is_enabled());
        assert!(!sink.log_values());
        sink.record(numbered(0));
        assert!(sink.flush());
        assert_eq!(sink.stats(), AuditStats::default());
    }
}

#[test]
fn bad_output_path_fails_at_start() {
    let cfg = AuditConfig {
        jsonl: Some("/nonexistent-dir-resumeguard/x.jsonl".into()),
        ..AuditConfig::default()
    };
    assert!(AuditSink::start(&cfg, "test-proxy").is_err());
}

/// Poll `cond` for up to 10 s: the writer retries on its own clock.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A second connection holding the database's write lock: the writer's
/// transactions fail with "database is locked" until it is released.
fn hold_write_lock(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
    conn
}

fn ns(events: &[AuditEvent]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e.detail["n"].as_u64().unwrap())
        .collect()
}

#[test]
fn losses_while_sqlite_fails_are_counted_and_recorded_after_recovery() {
    let path = temp_path("sink-locked", "db");
    let cfg = sqlite_cfg(&path, 1024);
    let sink = AuditSink::start_with_busy_timeout(&cfg, Duration::from_millis(20)).unwrap();
    for n in 0..5 {
        sink.record(numbered(n));
    }
    assert!(sink.flush());

    let holder = hold_write_lock(&path);
    let doomed: Vec<AuditEvent> = (5..12).map(numbered).collect();
    for ev in &doomed {
        sink.record(ev.clone());
    }
    wait_until("7 events given up", || sink.dropped_total() == 7);
    assert!(
        !sink.flush_timeout(Duration::from_millis(50)),
        "a failing output does not count as flushed"
    );
    let stats = sink.stats();
    assert_eq!((stats.dropped, stats.lost), (0, 7));
    assert!(stats.write_errors >= u64::from(MAX_ATTEMPTS), "{stats:?}");
    assert_eq!(ns(&all_events(&path).unwrap()), (0..5).collect::<Vec<_>>());

    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    assert!(
        sink.flush(),
        "the gap record is written once the lock is gone"
    );
    let events = all_events(&path).unwrap();
    assert_eq!(events.len(), 6);
    assert_eq!(ns(&events[..5]), (0..5).collect::<Vec<_>>());
    let gap = &events[5];
    assert_eq!(gap.operation, Operation::EventsDropped);
    assert_eq!(gap.detail["dropped"], 7);
    assert_eq!(gap.detail["reason"], "write_failed");
    assert_eq!(gap.detail["write_failed"], 7);
    assert_eq!(gap.detail["queue_full"], 0);
    assert_eq!(gap.detail["first_lost"], doomed[0].time.as_str());
    assert_eq!(gap.detail["last_lost"], doomed[6].time.as_str());
    let error = gap.detail["error"].as_str().unwrap();
    assert!(error.contains("locked"), "{error}");

    // Recorded once: later writes carry no second gap record.
    sink.record(numbered(12));
    assert!(sink.flush());
    let events = all_events(&path).unwrap();
    assert_eq!(events.len(), 7);
    assert_eq!(events[6].detail["n"], 12);
    assert_eq!(sink.dropped_total(), 7);
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
}

#[test]
fn a_write_that_fails_briefly_is_retried_not_lost() {
    let path = temp_path("sink-retry", "db");
    let cfg = sqlite_cfg(&path, 1024);
    let sink = AuditSink::start_with_busy_timeout(&cfg, Duration::from_millis(20)).unwrap();
    let holder = hold_write_lock(&path);
    for n in 0..3 {
        sink.record(numbered(n));
    }
    // Retries come at the writer's idle wake-ups, far apart enough to
    // release the lock after the first failure.
    wait_until("a failed attempt", || sink.stats().write_errors >= 1);
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    assert!(sink.flush());
    let events = all_events(&path).unwrap();
    assert_eq!(ns(&events), vec![0, 1, 2]);
    assert_eq!(sink.dropped_total(), 0);
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
}

#[test]
fn an_output_that_never_recovers_loses_alone_and_stops_within_bounds() {
    let db = temp_path("sink-devfull", "db");
    let cfg = AuditConfig {
        sqlite: Some(db.clone()),
        jsonl: Some("/dev/full".into()),
        ..AuditConfig::default()
    };
    let sink = AuditSink::start(&cfg, "test-proxy").unwrap();
    for n in 0..4 {
        sink.record(numbered(n));
    }
    wait_until("4 events given up by jsonl", || sink.dropped_total() == 4);
    // SQLite is unaffected and has nothing to report.
    assert_eq!(ns(&all_events(&db).unwrap()), vec![0, 1, 2, 3]);
    let started = Instant::now();
    assert!(!sink.shutdown(Duration::from_millis(100)));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(sink.stats().lost, 4);
    remove_db(&db);
}

#[test]
fn the_writer_prunes_rows_past_retention_and_records_it() {
    let path = temp_path("sink-retention", "db");
    let mut old = numbered(100);
    old.time = "2020-01-01T00:00:00.000Z".into();
    let recent = numbered(101);
    Store::open(&path)
        .unwrap()
        .append([&old, &old, &recent])
        .unwrap();

    let sink = AuditSink::start(&sqlite_cfg(&path, 64), "test-proxy").unwrap();
    sink.record(numbered(0));
    assert!(sink.flush(), "flush waits for the prune too");
    let events = all_events(&path).unwrap();
    let ops: Vec<Operation> = events.iter().map(|e| e.operation).collect();
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert_eq!(events[0].detail["n"], 101);
    let pruned: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.operation == Operation::AuditPruned)
        .collect();
    assert_eq!(pruned.len(), 1, "{ops:?}");
    let detail = &pruned[0].detail;
    assert_eq!(detail["rows"], 2);
    assert_eq!(detail["by"], "retention");
    assert_eq!(detail["max_rows"], crate::audit::DEFAULT_MAX_ROWS);
    let cutoff = detail["cutoff"].as_str().unwrap();
    assert!(
        cutoff > "2020-01-01" && cutoff < recent.time.as_str(),
        "{cutoff}"
    );
    assert!(events.iter().any(|e| e.detail["n"] == 0));
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
}

#[test]
fn every_output_names_the_replica_and_postgres_joins_once_its_database_is_known() {
    let db = crate::test_pg_server::PgSchema::new("sink_pg");
    let path = temp_path("sink-pg", "db");
    let jsonl = temp_path("sink-pg", "jsonl");
    let cfg = AuditConfig {
        sqlite: Some(path.clone()),
        jsonl: Some(jsonl.display().to_string()),
        postgres: true,
        ..AuditConfig::default()
    };
    let sink = AuditSink::start(&cfg, "replica-7").unwrap();
    assert!(sink.connect_postgres(db.target().clone(), SHARED_SCHEMA));
    assert!(
        !sink.connect_postgres(db.target().clone(), SHARED_SCHEMA),
        "given once"
    );
    sink.record(numbered(1));
    sink.record(numbered(2).with_thread("t"));
    assert!(sink.flush());
    // PostgreSQL orders a thread's records by the database clock's time,
    // which each batch corrects by its own reading of the writer's skew:
    // two records of one millisecond sent in two batches may swap there.
    // What every output holds is compared, not the order.
    let by_n = |mut events: Vec<AuditEvent>| {
        events.sort_by_key(|e| e.detail["n"].as_i64());
        events
    };
    let from_pg = by_n(crate::audit::postgres_store::thread_events(db.target(), "t").unwrap());
    let from_sqlite = by_n(thread_events(&path, "t").unwrap());
    let from_jsonl = by_n(read_jsonl(&jsonl).unwrap());
    assert_eq!(from_pg.len(), 2);
    assert_eq!(from_pg, from_sqlite);
    assert_eq!(from_pg, from_jsonl);
    assert!(from_pg.iter().all(|e| e.proxy_id == "replica-7"));
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
    let _ = std::fs::remove_file(&jsonl);
}

/// Whether the SQLite trail holds `n` events, polled for up to `bound`;
/// returns how long it took (or `bound`).
fn sqlite_has(path: &std::path::Path, n: usize, bound: Duration) -> Duration {
    let started = Instant::now();
    while all_events(path).map_or(0, |e| e.len()) < n && started.elapsed() < bound {
        std::thread::sleep(Duration::from_millis(2));
    }
    started.elapsed()
}

/// A sink of `proxy_id` writing a fresh SQLite file (queues of 16) and the
/// PostgreSQL table at `target`.
fn sqlite_and_postgres(
    tag: &str,
    proxy_id: &str,
    target: PgTarget,
) -> (std::path::PathBuf, AuditSink) {
    let path = temp_path(tag, "db");
    let cfg = AuditConfig {
        postgres: true,
        ..sqlite_cfg(&path, 16)
    };
    let sink = AuditSink::start(&cfg, proxy_id).unwrap();
    assert!(sink.connect_postgres(target, SHARED_SCHEMA));
    (path, sink)
}

#[test]
fn a_stalled_postgres_output_delays_and_drops_only_its_own_events() {
    // A "database" that accepts the connection and never answers: the
    // PostgreSQL output's writer waits in the startup exchange, which no
    // connect timeout covers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dsn = format!("postgres://rg@127.0.0.1:{port}/rg?sslmode=disable");
    let target = PgTarget::from_dsn(&dsn).unwrap();
    let (path, sink) = sqlite_and_postgres("sink-stalled-pg", "test-proxy", target);
    sink.record(numbered(0));
    let (held, _) = listener.accept().unwrap();
    assert_eq!(sqlite_has(&path, 1, Duration::from_secs(10)).as_secs(), 0);

    // The PostgreSQL output is stuck on event 0; the local trail stays
    // current.
    for n in 1..=10 {
        sink.record(numbered(n));
    }
    let waited = sqlite_has(&path, 11, Duration::from_secs(10));
    eprintln!("local trail had the events after {waited:?} with PostgreSQL stuck");
    assert!(waited < Duration::from_millis(500), "{waited:?}");

    // Only the stuck output's queue fills: it refuses 4 of the next 10
    // (event 0 is in its writer's hands, 1..=16 fill its 16 slots).
    for n in 11..=20 {
        sink.record(numbered(n));
        sqlite_has(&path, n as usize + 1, Duration::from_secs(10));
    }
    let events = all_events(&path).unwrap();
    assert_eq!(ns(&events), (0..=20).collect::<Vec<_>>(), "no gap locally");
    let stats = sink.stats();
    assert_eq!((stats.enqueued, stats.dropped), (21 + 17, 4), "{stats:?}");
    assert_eq!(sink.dropped_total(), 4);
    let depth: Vec<(&str, u64)> = sink
        .output_stats()
        .iter()
        .map(|(name, s)| (*name, s.queue_depth()))
        .collect();
    assert_eq!(depth, [("sqlite", 0), ("postgres", 17)]);

    // Shutdown gives up on the stuck writer within its bound and counts
    // everything the PostgreSQL output never got as its loss.
    let started = Instant::now();
    assert!(!sink.shutdown(Duration::from_millis(100)));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(sink.dropped_total(), 21);
    let lost: Vec<(&str, u64)> = sink
        .output_stats()
        .iter()
        .map(|(name, s)| (*name, s.lost))
        .collect();
    assert_eq!(lost, [("sqlite", 0), ("postgres", 21)]);
    // When the writer comes loose later, nothing is counted twice.
    drop(held);
    drop(listener);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sink.dropped_total(), 21);
    assert_eq!(all_events(&path).unwrap().len(), 21);
    remove_db(&path);
}

/// A TCP front for the test server's Unix socket that holds its first
/// connection unanswered until `release` sends (or hangs up), then relays
/// it and every later one: a database that stalls, then answers.
fn stalling_front(server: &PgTarget) -> (u16, mpsc::Sender<()>) {
    let socket = unix_socket_of(server);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let front = listener.local_addr().unwrap().port();
    let (release, gate) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut gate = Some(gate);
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            if let Some(gate) = gate.take() {
                let _ = gate.recv();
            }
            if relay(client, &socket).is_none() {
                return;
            }
        }
    });
    (front, release)
}

#[test]
fn a_postgres_output_that_stalls_then_answers_records_its_own_losses_there_alone() {
    use crate::test_pg_server::PgSchema;
    let db = PgSchema::new("sink_stall");
    let (front, release) = stalling_front(db.target());
    let dsn = format!("postgres://postgres@127.0.0.1:{front}/postgres?sslmode=disable");
    let target = PgTarget::from_dsn(&dsn)
        .unwrap()
        .with_schema(db.target().schema())
        .unwrap();
    let (path, sink) = sqlite_and_postgres("sink-stall", "replica-s", target);
    for n in 0..40 {
        sink.record(numbered(n));
        let waited = sqlite_has(&path, n as usize + 1, Duration::from_secs(10));
        assert!(waited < Duration::from_millis(500), "event {n}: {waited:?}");
    }
    let lost = |name: &str| {
        let stats = sink.output_stats();
        stats.iter().find(|(n, _)| *n == name).map(|(_, s)| s.lost)
    };
    let pg_lost = lost("postgres").unwrap();
    assert!(
        pg_lost >= 40 - 16 - 16,
        "its queue refused the overflow: {pg_lost}"
    );
    assert_eq!(lost("sqlite"), Some(0));

    release.send(()).unwrap();
    assert!(sink.flush(), "the PostgreSQL output catches up");
    let local = all_events(&path).unwrap();
    assert_eq!(ns(&local), (0..40).collect::<Vec<_>>(), "no gap locally");
    let shared = crate::audit::postgres_store::thread_events(db.target(), "t").unwrap();
    let (gaps, kept): (Vec<AuditEvent>, Vec<AuditEvent>) = shared
        .into_iter()
        .partition(|e| e.operation == Operation::EventsDropped);
    assert_eq!(kept.len() as u64, 40 - pg_lost);
    let kept = ns(&kept);
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "{kept:?}");
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(gaps[0].detail["dropped"], pg_lost);
    assert_eq!(gaps[0].detail["reason"], "queue_full");
    assert_eq!(gaps[0].proxy_id, "replica-s");
    assert_eq!(sink.dropped_total(), pg_lost);
    assert!(sink.shutdown(Duration::from_secs(10)));
    remove_db(&path);
}
