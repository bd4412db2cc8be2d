//! Writes continuing a claimed checkpoint: fenced while the claims store
//! cannot answer or cannot be asked for the key, kept from lapsing while
//! the holder's write commits, and the work a granted claim holds open.

use super::*;

/// The gated task's pending write on `checkpoint_id` of thread t1.
fn task_write_bind(checkpoint_id: &[u8]) -> Vec<u8> {
    write_bind(b"t1", checkpoint_id, b"task-1", b"approved")
}

/// The pending write of `task` to `channel` on `checkpoint_id` of `thread`.
fn write_bind(thread: &[u8], checkpoint_id: &[u8], task: &[u8], channel: &[u8]) -> Vec<u8> {
    bind(
        "w",
        &[0, 0, 0, 0, 0, 1, 0, 0, 1],
        &[
            Some(thread),
            Some(b""),
            Some(checkpoint_id),
            Some(task),
            Some(b"~__pregel_pull, gate"),
            Some(&[0, 0]),
            Some(channel),
            Some(b"msgpack"),
            Some(&[0xc3]),
        ],
        &[],
    )
}

#[test]
fn a_write_continuing_a_claimed_checkpoint_fails_closed_while_the_store_cannot_answer() {
    use crate::policy::claims::ClaimDecision;
    // The store's path does not exist: every lookup fails.
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL)]);
    // A checkpoint nothing says is claimed: the write passes.
    assert_eq!(st.on_client(&task_write_bind(b"ck0")).unwrap(), None);
    assert!(st.ready_events.is_empty(), "{:?}", st.ready_events);
    client(&mut st, &[msg(b'D', b"P\0"), execute(), msg(b'S', b"")]);
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'I'),
        ],
    );
    std::mem::take(&mut st.ready_events);
    // This session was served the claim on ck1 (before the store failed).
    let req = read_parked_head(&mut st).claim.unwrap();
    let served = Resolution {
        decision: ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        held_already: false,
        displaced: None,
        epoch: Some(1),
        lease_unknown: None,
        takeover: None,
    };
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    std::mem::take(&mut st.ready_events);
    // Its task's write on ck1 cannot be checked against the holder: refused.
    let injected = st
        .on_client(&task_write_bind(b"ck1"))
        .unwrap()
        .expect("refused");
    assert!(is_raise(&injected));
    let text = crate::wire::reject::readable(&injected);
    assert!(text.contains("58000"), "{text}");
    assert!(text.contains("claim store unavailable"), "{text}");
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].operation, Operation::WriteFenced);
    assert_eq!(events[0].detail["fence"], "store_unavailable");
    assert_eq!(events[0].detail["continues"], "ck1");
    assert_eq!(events[0].task_id.as_deref(), Some("task-1"));
}

/// A session on `store` served the claim on the parked ck1 of t1, which
/// the store took for it at `taken_at`, for 30 s: the session and the
/// claim it asked.
fn holding_the_claim(
    store: &Arc<crate::claims::ClaimStore>,
    taken_at: i64,
) -> (SessionState, ClaimRequest) {
    use crate::claims::ClaimOutcome;
    use crate::policy::claims::ClaimDecision;

    let mut st = claiming_state_on(Arc::clone(store), &[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    let req = read_parked_head(&mut st).claim.expect("a claim is asked");
    let outcome = store
        .try_claim(&req.key, &req.holder, taken_at, 30_000)
        .expect("claim");
    assert!(matches!(outcome, ClaimOutcome::Taken(_)), "{outcome:?}");
    let served = Resolution {
        decision: ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        held_already: false,
        displaced: None,
        epoch: Some(1),
        lease_unknown: None,
        takeover: None,
    };
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    (st, req)
}

/// Another proxy's session, racing for the same claim.
fn racing_holder() -> crate::claims::Holder {
    crate::claims::Holder {
        proxy_id: "proxy-b".into(),
        session_id: 9,
        client_addr: "10.0.0.9:5009".into(),
        application_name: "racer".into(),
    }
}

#[test]
fn a_holders_write_keeps_its_claim_from_lapsing_until_the_write_can_commit() {
    use crate::claims::clock::wall_clock_ms as now_ms;
    use crate::claims::ClaimOutcome;
    use crate::policy::claims::COMMIT_COVER_MS;

    // The test server runs on this host: its clock is this host's.
    let db = crate::test_pg_server::PgSchema::new("session-cover");
    let store = Arc::new(db.open());
    // The claim was taken long enough ago that it lapses within the cover.
    let taken_at = now_ms() - 29_500;
    let (mut st, req) = holding_the_claim(&store, taken_at);
    // The holder's task write on the parked checkpoint passes...
    let before = now_ms();
    assert_eq!(st.on_client(&task_write_bind(b"ck1")).unwrap(), None);
    // ...and its claim cannot lapse before the write has had time to commit.
    let row = store.get(&req.key).expect("read").expect("row");
    assert!(
        row.lapse_at_ms >= before + COMMIT_COVER_MS,
        "lapse {} < {}",
        row.lapse_at_ms,
        before + COMMIT_COVER_MS
    );
    let racer = store
        .try_claim(&req.key, &racing_holder(), taken_at + 30_000, 30_000)
        .expect("claim");
    assert!(matches!(racer, ClaimOutcome::Busy(_)), "{racer:?}");
}

#[test]
fn a_granted_claim_holds_work_and_a_refused_one_does_not() {
    use crate::policy::claims::{ClaimDecision, Refusal};
    let resolution = |decision| Resolution {
        decision,
        waited_ms: 0,
        held_already: false,
        displaced: None,
        epoch: Some(1),
        lease_unknown: None,
        takeover: None,
    };
    let mut st = claiming_state(&[], "worker");
    let req = read_parked_head(&mut st).claim.unwrap();
    let refused = resolution(ClaimDecision::Refuse {
        reason: Refusal::ShuttingDown,
    });
    assert!(st.apply_claim(&req, &refused).is_some());
    assert!(!st.run_open(), "a refused reader has no run to finish");
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);

    let req = read_parked_head(&mut st).claim.unwrap();
    let served = resolution(ClaimDecision::Serve { takeover: false });
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert!(
        st.run_open(),
        "the holder's run has not written its next checkpoint"
    );
}

/// A session whose fence checks the server runs in the write's own
/// transaction (the claims schema is in the session's database).
fn fencing_in_transaction_state() -> SessionState {
    use crate::enforce::claim_gate::InTransactionFence;
    let mut st = claiming_state(&[], "worker");
    let database = st.ctx.database.clone();
    let shared = Arc::get_mut(&mut st.shared).expect("the session's only enforcement");
    let leg = shared.legs.claims.as_mut().expect("the claims leg");
    Arc::get_mut(leg)
        .expect("the session's only leg")
        .fence_in_transaction = Some(InTransactionFence {
        database,
        schema: "resumeguard".into(),
    });
    st
}

/// The server's answers, up to ReadyForQuery, to a write sent behind its
/// fence check when the check raises `error` (an ErrorResponse body).
fn check_raised(error: &[u8]) -> [Vec<u8>; 6] {
    [
        msg(b'1', b""),
        msg(b'3', b""),
        msg(b'1', b""),
        msg(b'2', b""),
        msg(b'E', error),
        ready(b'I'),
    ]
}

/// Whether the client's Bind went out behind the server's fence check.
fn injects_fence_check(step: Option<Vec<u8>>) -> bool {
    step.is_some_and(|bytes| String::from_utf8_lossy(&bytes).contains(".fence_write("))
}

#[test]
fn a_pipelined_write_after_a_sync_is_fenced_again_in_its_own_transaction() {
    let mut st = fencing_in_transaction_state();
    client(&mut st, &[parse("w", WRITE_SQL)]);
    // put_writes answering the interrupt on ck1: the server checks it.
    let writes = st.on_client(&task_write_bind(b"ck1")).unwrap();
    assert!(injects_fence_check(writes), "put_writes is checked");
    client(&mut st, &[execute()]);
    // A second write of the same transaction rides on that check.
    let again = st.on_client(&task_write_bind(b"ck1")).unwrap();
    assert_eq!(again, None, "checked once per transaction");
    // The Sync ends the implicit transaction; the child of ck1, sent
    // before any answer, runs in the next one and is checked there.
    client(&mut st, &[execute(), msg(b'S', b""), parse("c", PUT_SQL)]);
    let child = st.on_client(&put_bind_of(b"ck2", Some(b"ck1"))).unwrap();
    assert!(
        injects_fence_check(child),
        "the child is checked in its own transaction"
    );
    client(&mut st, &[execute(), msg(b'S', b"")]);
    // The first transaction commits; in the second the server's check
    // finds the claim taken over: the child's audit names what it continued.
    let checked = [
        msg(b'3', b""),
        msg(b'1', b""),
        msg(b'2', b""),
        msg(b'D', &[0, 1, 0, 0, 0, 1, b't']),
        msg(b'C', b"SELECT 1\0"),
        msg(b'3', b""),
        msg(b'3', b""),
    ];
    let write = [msg(b'2', b""), msg(b'C', b"INSERT 0 1\0")];
    let first: Vec<Vec<u8>> = [
        &[msg(b'1', b"")][..],
        &checked,
        &write,
        &write,
        &[ready(b'I')],
    ]
    .concat();
    server(&mut st, &first);
    std::mem::take(&mut st.ready_events);
    let second =
        check_raised(b"SERROR\0CRGF01\0Mwrite fenced\0Dtaken over\0Hsuperseded_holder\0\0");
    server(&mut st, &second);
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].operation, Operation::WriteFenced);
    assert_eq!(events[0].detail["continues"], "ck1");
    assert_eq!(events[0].detail["fence"], "superseded_holder");
}

#[test]
fn a_write_after_a_rollback_in_the_same_segment_is_fenced_again() {
    let mut st = fencing_in_transaction_state();
    client(
        &mut st,
        &[
            parse("w", WRITE_SQL),
            parse("r", "ROLLBACK"),
            msg(b'S', b""),
        ],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'1', b""), ready(b'I')]);
    client(&mut st, &[msg(b'Q', b"BEGIN\0")]);
    let writes = st.on_client(&task_write_bind(b"ck1")).unwrap();
    assert!(injects_fence_check(writes), "put_writes is checked");
    client(&mut st, &[execute(), bind("r", &[], &[], &[]), execute()]);
    // Sent before any answer: the write after the ROLLBACK runs in
    // another transaction, checked there.
    let again = st.on_client(&task_write_bind(b"ck1")).unwrap();
    assert!(
        injects_fence_check(again),
        "checked again after the ROLLBACK"
    );
}

#[test]
fn a_pipelined_write_after_a_sync_is_looked_up_again_and_sees_a_takeover() {
    use crate::claims::clock::wall_clock_ms as now_ms;
    use crate::claims::ClaimOutcome;

    let db = crate::test_pg_server::PgSchema::new("session-pipelined-fence");
    let store = Arc::new(db.open());
    let (mut st, req) = holding_the_claim(&store, now_ms());
    // The holder's put_writes passes; its Sync goes out.
    assert_eq!(st.on_client(&task_write_bind(b"ck1")).unwrap(), None);
    client(&mut st, &[execute(), msg(b'S', b"")]);
    // Another session takes the claim over before the child is sent.
    store.release("t1", Some("ck1")).expect("release");
    let racer = store
        .try_claim(&req.key, &racing_holder(), now_ms(), 30_000)
        .expect("claim");
    assert!(matches!(racer, ClaimOutcome::Taken(_)), "{racer:?}");
    // The child, in the next transaction, is asked of the store again.
    client(&mut st, &[parse("c", PUT_SQL)]);
    let child = st
        .on_client(&put_bind_of(b"ck2", Some(b"ck1")))
        .unwrap()
        .expect("fenced");
    assert!(is_raise(&child));
    let text = crate::wire::reject::readable(&child);
    assert!(text.contains("RGF01"), "{text}");
}

#[test]
fn a_fence_check_that_fails_for_another_reason_is_not_recorded_as_fenced() {
    let mut st = fencing_in_transaction_state();
    client(&mut st, &[parse("w", WRITE_SQL)]);
    let writes = st.on_client(&task_write_bind(b"ck1")).unwrap();
    assert!(injects_fence_check(writes), "put_writes is checked");
    client(&mut st, &[execute(), msg(b'S', b"")]);
    // The check waits out its lock timeout: the write's transaction fails
    // with that error, and nothing was fenced.
    let answers = check_raised(b"SERROR\0C55P03\0Mcanceling statement due to lock timeout\0\0");
    let routes = server_routes(&mut st, &answers);
    assert!(routes.contains(&Route::Forward), "{routes:?}");
    assert!(
        ops(&mut st).is_empty(),
        "a failed check is not a fenced write"
    );
}

/// The server reported that it converts the session's SJIS to the
/// database's UTF8.
fn converting(st: &mut SessionState) {
    let status = |name: &str, value: &str| msg(b'S', format!("{name}\0{value}\0").as_bytes());
    server(
        st,
        &[
            status("server_encoding", "UTF8"),
            status("client_encoding", "SJIS"),
        ],
    );
}

/// The SQLSTATE of a refusal the session raised in place of a statement.
fn raised_sqlstate(step: Option<Vec<u8>>) -> String {
    let raised = step.expect("refused");
    assert!(is_raise(&raised));
    let text = crate::wire::reject::readable(&raised);
    ["0A000", "58000", "RGF01"]
        .into_iter()
        .find(|code| text.contains(code))
        .unwrap_or("none")
        .to_owned()
}

// ﾃｩ is 0xC3 0xA9 in SJIS: read as UTF-8, é, another thread's id.
const CONVERTED_THREAD: &[u8] = b"\xc3\xa9-1";

#[test]
fn a_write_whose_key_the_server_converts_is_refused_where_the_store_would_be_asked() {
    // The store's path does not exist: a lookup fails, and a write it
    // fails for passes unless its session knows the checkpoint claimed.
    let write = |thread: &[u8], converts: bool| {
        let mut st = claiming_state(&[], "worker");
        if converts {
            converting(&mut st);
        }
        client(&mut st, &[parse("w", WRITE_SQL)]);
        let step = st
            .on_client(&write_bind(thread, b"ck1", b"task-1", b"approved"))
            .unwrap();
        (step, std::mem::take(&mut st.ready_events))
    };
    let (step, events) = write(CONVERTED_THREAD, true);
    assert_eq!(raised_sqlstate(step), "0A000");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].operation, Operation::WriteFenced);
    assert_eq!(events[0].detail["fence"], "client_encoding");
    assert_eq!(events[0].thread_id.as_deref(), Some("é-1"));
    // An ASCII key in that session, and the key in the database's
    // encoding, are looked up.
    assert_eq!(write(b"t1", true).0, None);
    assert_eq!(write(CONVERTED_THREAD, false).0, None);
    // Checked in the write's transaction, the server converts the check's
    // arguments as the write's: asked there.
    let mut st = fencing_in_transaction_state();
    converting(&mut st);
    client(&mut st, &[parse("w", WRITE_SQL)]);
    let step = st
        .on_client(&write_bind(
            CONVERTED_THREAD,
            b"ck1",
            b"task-1",
            b"approved",
        ))
        .unwrap();
    assert!(injects_fence_check(step), "checked in its transaction");
}

#[test]
fn a_late_duplicate_whose_key_the_server_converts_is_refused_without_asking_the_store() {
    use crate::saver::reserved::{NULL_TASK, RESUME};
    // A bare resume's write onto the finished head this session read;
    // the store's path does not exist, so its question fails 58000.
    let resume = |converts: bool| {
        let mut st = claiming_state(&[], "worker");
        if converts {
            converting(&mut st);
        }
        let finished = br#"{"v": 4, "updated_channels": ["items"]}"#;
        let read = read_head_of(&mut st, CONVERTED_THREAD, finished, None, &[]);
        assert!(read.claim.is_none(), "a finished head asks nothing");
        server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
        client(&mut st, &[parse("w", WRITE_SQL)]);
        let bind = write_bind(
            CONVERTED_THREAD,
            b"ck1",
            NULL_TASK.as_bytes(),
            RESUME.as_bytes(),
        );
        let step = st.on_client(&bind).unwrap();
        (step, std::mem::take(&mut st.ready_events))
    };
    let (step, events) = resume(true);
    assert_eq!(raised_sqlstate(step), "0A000");
    let fenced: Vec<_> = events
        .iter()
        .filter(|e| e.operation == Operation::WriteFenced)
        .collect();
    assert_eq!(fenced.len(), 1, "{events:?}");
    assert_eq!(fenced[0].detail["fence"], "client_encoding");
    let text = fenced[0].detail["reason"].as_str().unwrap_or_default();
    assert!(
        text.contains("whether its interrupt was answered"),
        "{text}"
    );
    // In the database's encoding the store is asked.
    assert_eq!(raised_sqlstate(resume(false).0), "58000");
}
