//! Writes continuing a claimed checkpoint: fenced while the claims store
//! cannot answer, kept from lapsing while the holder's write commits, and
//! the work a granted claim holds open.

use super::*;

/// The gated task's pending write on `checkpoint_id` of thread t1.
fn task_write_bind(checkpoint_id: &[u8]) -> Vec<u8> {
    bind(
        "w",
        &[0, 0, 0, 0, 0, 1, 0, 0, 1],
        &[
            Some(b"t1"),
            Some(b""),
            Some(checkpoint_id),
            Some(b"task-1"),
            Some(b"~__pregel_pull, gate"),
            Some(&[0, 0]),
            Some(b"approved"),
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

#[test]
fn a_holders_write_keeps_its_claim_from_lapsing_until_the_write_can_commit() {
    use crate::claims::clock::wall_clock_ms as now_ms;
    use crate::claims::ClaimOutcome;
    use crate::policy::claims::{ClaimDecision, COMMIT_COVER_MS};

    // The test server runs on this host: its clock is this host's.
    let db = crate::test_pg_server::PgSchema::new("session-cover");
    let store = Arc::new(db.open());
    let mut st = claiming_state_on(store.clone(), &[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    let req = read_parked_head(&mut st).claim.expect("a claim is asked");
    // The claim was taken long enough ago that it lapses within the cover.
    let taken_at = now_ms() - 29_500;
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
        takeover: None,
    };
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
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
    let other = crate::claims::Holder {
        proxy_id: "proxy-b".into(),
        session_id: 9,
        client_addr: "10.0.0.9:5009".into(),
        application_name: "racer".into(),
    };
    let racer = store
        .try_claim(&req.key, &other, taken_at + 30_000, 30_000)
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
