//! The validity gate in a session: invalid writes refused where the
//! client expects their answer, and the injected statement's answers
//! swallowed.

use super::*;

/// A session whose validity leg has one rule: `items` is a list of strings.
fn validating_state() -> SessionState {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rg-session-rules-{}-{n}", std::process::id()));
    std::fs::create_dir_all(dir.join("channels")).unwrap();
    std::fs::write(
        dir.join("channels/items.toml"),
        "[[channel]]\nname = \"items\"\nschema = { type = \"array\", items = { type = \"string\" } }\n",
    )
    .unwrap();
    let rules = crate::policy::ChannelRules::load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let classifier = Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()]));
    let legs = Legs {
        validity: Arc::new(rules),
        ..Legs::default()
    };
    SessionState::new(classifier, legs, SessionContext::default())
}

fn put_bind() -> Vec<u8> {
    put_bind_at(b"ck-42")
}

#[test]
fn an_invalid_blob_is_refused_at_the_checkpoint_row_that_names_it() {
    let mut st = validating_state();
    client(&mut st, &[parse("b", BLOB_SQL), parse("c", PUT_SQL)]);
    // msgpack [None]: the blob itself passes through (it runs in the
    // transaction the rejection aborts) ...
    assert_eq!(st.on_client(&blob_bind(b"\x91\xc0")).unwrap(), None);
    client(&mut st, &[msg(b'D', b"P\0"), execute()]);
    // ... and the checkpoint row of the same put carries the rejection.
    let injected = st.on_client(&put_bind()).unwrap().expect("rejected");
    assert!(is_raise(&injected));
    let text = crate::wire::reject::readable(&injected);
    assert!(text.contains("23514"), "{text}");
    assert!(text.contains("checkpoint ck-42"), "{text}");
    assert!(text.contains("/items/type"), "{text}");
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].operation, Operation::WriteRejected);
    assert_eq!(events[0].checkpoint_id.as_deref(), Some("ck-42"));
    // The Sync passes unchanged: nothing is left waiting.
    assert_eq!(st.on_client(&msg(b'S', b"")).unwrap(), None);
}

#[test]
fn an_invalid_blob_without_its_checkpoint_row_is_refused_before_sync() {
    let mut st = validating_state();
    client(&mut st, &[parse("b", BLOB_SQL)]);
    assert_eq!(st.on_client(&blob_bind(b"\x91\xc0")).unwrap(), None);
    let sync = msg(b'S', b"");
    let injected = st.on_client(&sync).unwrap().expect("rejected at Sync");
    assert!(is_raise(&injected));
    assert!(injected.ends_with(&sync), "the Sync still follows");
}

#[test]
fn the_injected_answers_are_swallowed_and_the_error_forwarded() {
    let mut st = validating_state();
    client(&mut st, &[parse("b", BLOB_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    st.on_client(&blob_bind(b"\x91\xa1a")).unwrap();
    client(&mut st, &[msg(b'D', b"P\0"), execute()]);
    st.on_client(&msg(b'S', b"")).unwrap();
    // Valid blob: its own answers, then the Sync's.
    let routes = server_routes(
        &mut st,
        &[
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'I'),
        ],
    );
    assert!(routes.iter().all(|r| *r == Route::Forward));
    // Invalid blob, refused at Sync: the injected Parse/Bind answers are
    // the proxy's, the raised error reaches the client, then ReadyForQuery.
    st.on_client(&blob_bind(b"\x91\xc0")).unwrap();
    client(&mut st, &[msg(b'D', b"P\0"), execute()]);
    st.on_client(&msg(b'S', b"")).unwrap();
    let routes = server_routes(
        &mut st,
        &[
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'E', b"SERROR\0C23514\0Mrejected\0\0"),
            ready(b'I'),
        ],
    );
    assert_eq!(
        routes,
        [
            Route::Forward,
            Route::Forward,
            Route::Forward,
            Route::Swallow,
            Route::Swallow,
            Route::Forward,
            Route::Forward
        ]
    );
    assert!(st.is_idle());
}

/// task-1's pending write on t1/""/ck1 with this `idx` in text format.
fn write_bind_with_idx(idx: &[u8]) -> Vec<u8> {
    bind(
        "w",
        &[0, 0, 0, 0, 0, 0, 0, 0, 1],
        &[
            Some(b"t1"),
            Some(b""),
            Some(b"ck1"),
            Some(b"task-1"),
            Some(b"~__pregel_pull, gate"),
            Some(idx),
            Some(b"approved"),
            Some(b"msgpack"),
            Some(&[0xc3]),
        ],
        &[],
    )
}

#[test]
fn an_undecodable_write_is_refused_while_consume_once_must_read_it() {
    // Consume-once on, no channel rules: the fence and the claim evidence
    // read the write's values.
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL)]);
    let injected = st
        .on_client(&write_bind_with_idx(b"zero"))
        .unwrap()
        .expect("refused");
    assert!(is_raise(&injected));
    let text = crate::wire::reject::readable(&injected);
    assert!(text.contains("23514"), "{text}");
    assert!(text.contains("do not decode"), "{text}");
    assert!(text.contains("idx"), "{text}");
    assert_eq!(ops(&mut st), [Operation::WriteRejected]);
}

#[test]
fn an_undecodable_write_is_recorded_with_the_columns_that_decode() {
    // Only idx fails: the record names the write's thread, checkpoint,
    // task, channel and value digest, so `audit --thread t1` finds it.
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL)]);
    let refused = st.on_client(&write_bind_with_idx(b"zero")).unwrap();
    assert!(refused.is_some(), "refused");
    let events = std::mem::take(&mut st.ready_events);
    let [ev] = events.as_slice() else {
        panic!("one record: {events:?}");
    };
    assert_eq!(ev.operation, Operation::WriteRejected);
    assert_eq!(ev.thread_id.as_deref(), Some("t1"));
    assert_eq!(ev.checkpoint_ns.as_deref(), Some(""));
    assert_eq!(ev.checkpoint_id.as_deref(), Some("ck1"));
    assert_eq!(ev.task_id.as_deref(), Some("task-1"));
    assert_eq!(ev.channels, ["approved"]);
    assert_eq!(ev.blob_sha256.len(), 1);
    let reason = ev.detail["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("do not decode"), "{reason}");
}

#[test]
fn a_value_postgresql_reads_is_not_refused_as_undecodable() {
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL)]);
    assert_eq!(st.on_client(&write_bind_with_idx(b" 0")).unwrap(), None);
    assert!(st.ready_events.is_empty(), "{:?}", st.ready_events);
}

#[test]
fn an_undecodable_write_passes_when_no_leg_reads_it() {
    let mut st = state();
    client(&mut st, &[parse("w", WRITE_SQL)]);
    assert_eq!(st.on_client(&write_bind_with_idx(b"zero")).unwrap(), None);
    assert!(st.ready_events.is_empty(), "{:?}", st.ready_events);
}

/// Parses, binds and runs a blob the gate refuses (msgpack `[None]` in
/// `items`), its refusal left waiting.
fn run_invalid_blob(st: &mut SessionState) {
    client(st, &[parse("b", BLOB_SQL)]);
    assert_eq!(st.on_client(&blob_bind(b"\x91\xc0")).unwrap(), None);
    client(st, &[msg(b'D', b"P\0"), execute()]);
}

#[test]
fn a_commit_after_an_invalid_blob_is_refused_before_the_blob_commits() {
    let mut st = validating_state();
    run_invalid_blob(&mut st);
    // The COMMIT, before the Sync: the blob's refusal is raised in its
    // place, so the transaction holding the blob aborts.
    client(&mut st, &[parse("", "COMMIT")]);
    let injected = st
        .on_client(&bind("", &[], &[], &[]))
        .unwrap()
        .expect("refused in the COMMIT's place");
    assert!(is_raise(&injected));
    let text = crate::wire::reject::readable(&injected);
    assert!(text.contains("23514"), "{text}");
    assert!(text.contains("/items/type"), "{text}");
    assert_eq!(ops(&mut st), [Operation::WriteRejected]);
    // Nothing is left waiting: the Sync passes unchanged.
    client(&mut st, &[execute()]);
    assert_eq!(st.on_client(&msg(b'S', b"")).unwrap(), None);
    // The injected Parse and Bind answers are the proxy's; the raised
    // error answers the COMMIT's Execute.
    let routes = server_routes(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            msg(b'1', b""),
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'E', b"SERROR\0C23514\0Mrejected\0\0"),
            ready(b'I'),
        ],
    );
    let mut expected = [Route::Forward; 9];
    expected[5] = Route::Swallow;
    expected[6] = Route::Swallow;
    assert_eq!(routes, expected);
    assert!(st.is_idle());
}

#[test]
fn a_savepoint_rollback_after_an_invalid_blob_leaves_its_refusal_waiting() {
    let mut st = validating_state();
    run_invalid_blob(&mut st);
    client(&mut st, &[parse("", "ROLLBACK TO SAVEPOINT s")]);
    assert_eq!(st.on_client(&bind("", &[], &[], &[])).unwrap(), None);
    let injected = st.on_client(&msg(b'S', b"")).unwrap();
    assert!(injected.is_some_and(|bytes| is_raise(&bytes)));
}

#[test]
fn a_simple_query_after_an_invalid_blob_is_refused_as_a_sync_would_be() {
    let mut st = validating_state();
    run_invalid_blob(&mut st);
    let replaced = st
        .on_client(&msg(b'Q', b"COMMIT\0"))
        .unwrap()
        .expect("refused in the Query's place");
    assert_eq!(replaced[0], b'Q');
    let text = String::from_utf8_lossy(&replaced);
    assert!(text.contains("RAISE EXCEPTION"), "{text}");
    assert!(text.contains(&hex::encode("23514")), "{text}");
    assert_eq!(ops(&mut st), [Operation::WriteRejected]);
    // The next Query runs: nothing is left waiting.
    assert_eq!(st.on_client(&msg(b'Q', b"COMMIT\0")).unwrap(), None);
}

#[test]
fn a_rollback_after_an_invalid_blob_drops_its_refusal_with_the_blob() {
    // In a Parse/Bind: the ROLLBACK passes, and nothing is raised later.
    let mut st = validating_state();
    run_invalid_blob(&mut st);
    client(&mut st, &[parse("", "ROLLBACK")]);
    assert_eq!(st.on_client(&bind("", &[], &[], &[])).unwrap(), None);
    client(&mut st, &[execute()]);
    assert_eq!(st.on_client(&msg(b'S', b"")).unwrap(), None);
    assert!(ops(&mut st).is_empty());
    // In a simple Query: the same.
    let mut st = validating_state();
    run_invalid_blob(&mut st);
    assert_eq!(st.on_client(&msg(b'Q', b"ABORT\0")).unwrap(), None);
    assert_eq!(st.on_client(&msg(b'Q', b"SELECT 1\0")).unwrap(), None);
    assert!(ops(&mut st).is_empty());
}

#[test]
fn a_query_the_proxy_refuses_itself_takes_a_waiting_blob_refusal_with_it() {
    let mut st = validating_state();
    run_invalid_blob(&mut st);
    // Refused before the hooks see it (a write to the proxy's own schema):
    // the transaction holding the blob aborts with that error.
    let refused = st
        .on_client(&msg(b'Q', b"DELETE FROM resumeguard.claims\0"))
        .unwrap()
        .expect("refused");
    let text = String::from_utf8_lossy(&refused);
    assert!(!text.contains(&hex::encode("23514")), "{text}");
    // The blob's refusal does not land on the next statement: only the
    // Query's own refusal is recorded.
    assert_eq!(st.on_client(&msg(b'Q', b"SELECT 1\0")).unwrap(), None);
    assert_eq!(ops(&mut st), vec![Operation::StatementRefused]);
}
