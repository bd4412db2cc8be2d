//! Reads of checkpoint heads under the consume-once leg: which rows are
//! held for a claim, what a claim's decision does to the answer, and who
//! never claims.

use super::*;

#[test]
fn a_read_of_a_parked_head_is_seen_as_parked() {
    let mut st = state();
    client(&mut st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    client(&mut st, &head_read(b"t1"));
    let pending = bytea_2d(&[&[
        b"task-1",
        b"__interrupt__",
        b"msgpack",
        b"\x90",
        b"~__pregel_pull, gate",
        b"-3",
    ]]);
    let row = crate::wire::messages::data_row::data_row(&[
        Some(b"t1"),
        Some(b"\x01{\"v\": 4}"),
        Some(b""),
        Some(b"ck1"),
        Some(b"ck0"),
        Some(b"\x01{}"),
        None,
        Some(&pending),
    ]);
    let verdicts = server(
        &mut st,
        &[
            msg(b'2', b""),
            msg(b'T', b"\0\0"),
            row.to_vec(),
            msg(b'C', b"SELECT 1\0"),
            ready(b'I'),
        ],
    );
    assert!(verdicts.iter().all(|v| v.route == Route::Forward));
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].operation, Operation::ReadLatest);
    assert_eq!(events[0].checkpoint_id.as_deref(), Some("ck1"));
    assert_eq!(events[0].detail["parked"], true);
    assert_eq!(events[0].detail["rows"], 1);
}

#[test]
fn a_head_with_tasks_to_run_asks_for_the_run_lease_and_a_finished_one_does_not() {
    let mut st = claiming_state(&[], "worker");
    let running = read_head(
        &mut st,
        br#"{"v": 4, "updated_channels": ["items", "branch:to:after"]}"#,
        None,
    );
    let req = running.claim.expect("the run lease is asked");
    assert_eq!(req.head, Head::Running);
    assert_eq!(
        (
            req.key.at.thread_id.as_str(),
            req.key.at.checkpoint_id.as_str()
        ),
        ("t1", "ck1")
    );
    assert!(req.key.fingerprint.is_empty());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    for finished in [
        &br#"{"v": 4, "updated_channels": ["items"]}"#[..],
        br#"{"v": 4}"#,
    ] {
        assert!(read_head(&mut st, finished, None).claim.is_none());
        server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    }
    // A parked head is a claim even if its last step wrote a trigger.
    assert_eq!(
        read_parked_head(&mut st).claim.map(|r| r.head),
        Some(Head::Parked)
    );
    // Inspection never asks.
    let mut st = claiming_state(&["^inspect"], "inspector-ui");
    let cp = br#"{"updated_channels": ["branch:to:after"]}"#;
    assert!(read_head(&mut st, cp, None).claim.is_none());
}

/// A refusal replaced the held row with a 55000 ErrorResponse, and the
/// rest of that statement's answer is swallowed up to ReadyForQuery.
fn assert_refused_and_rest_swallowed(st: &mut SessionState, error: Option<Bytes>) {
    let error = error.expect("an error replaces the row");
    let fields: Vec<_> = crate::wire::messages::error_response::error_fields(&error).collect();
    assert!(fields.contains(&(b'C', &b"55000"[..])));
    let routes = server_routes(st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(routes, [Route::Answered, Route::Forward]);
}

fn store_unavailable() -> Resolution {
    use crate::policy::claims::{ClaimDecision, Refusal};
    Resolution {
        decision: ClaimDecision::Refuse {
            reason: Refusal::StoreUnavailable("down".into()),
        },
        waited_ms: 0,
        held_already: false,
        displaced: None,
        epoch: None,
        lease_unknown: None,
        takeover: None,
    }
}

/// A claiming session that has opened a transaction block.
fn claiming_in_a_block() -> SessionState {
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[msg(b'Q', b"BEGIN\0")]);
    server(&mut st, &[msg(b'C', b"BEGIN\0"), ready(b'T')]);
    st
}

/// A session that sent the saver's read of `thread`'s head ending with a
/// Flush (psycopg's pipeline mode), then offered a statement behind it:
/// what the tracker did with that first message.
fn read_then_offer(thread: &[u8], flush: bool) -> (SessionState, ClientStep) {
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    let [read_bind, describe, read, _] = head_read(thread);
    client(&mut st, &[read_bind, describe, read]);
    if flush {
        client(&mut st, &[msg(b'H', b"")]);
    }
    let offered = st.0.on_client(&parse("", "SELECT 2"), false).unwrap();
    (st, offered)
}

#[test]
fn a_statement_behind_a_gated_read_waits_for_its_decision() {
    // Behind a read with no Flush: the proxy's Flush first, then it waits.
    let (mut st, offered) = read_then_offer(b"t1", false);
    assert_eq!(offered, ClientStep::Inject(b"H\0\0\0\x04".to_vec()));
    let offered = st.0.on_client(&parse("", "SELECT 2"), false).unwrap();
    assert_eq!(offered, ClientStep::AwaitServer);
    assert!(!st.0.settled());
    // The head is not parked: no hold, and once answered it goes on.
    let row = head_row(b"t1", br#"{"v": 4}"#, None);
    let answer = [
        msg(b'2', b""),
        msg(b'T', b"\0\0"),
        row,
        msg(b'C', b"SELECT 1\0"),
    ];
    assert!(server(&mut st, &answer).iter().all(|v| v.claim.is_none()));
    assert!(st.0.settled());
    let offered = st.0.on_client(&parse("", "SELECT 2"), false).unwrap();
    assert_eq!(offered, ClientStep::Forward);
    // Behind the client's own Flush it waits at once; a Sync never waits.
    let (mut st, offered) = read_then_offer(b"t1", true);
    assert_eq!(offered, ClientStep::AwaitServer);
    assert_eq!(
        st.0.on_client(&msg(b'S', b""), false).unwrap(),
        ClientStep::Forward
    );
    // An inspection read, or a read with consume-once off, is never
    // refused: nothing waits behind it.
    for mut st in [claiming_state(&["^inspect"], "inspect-ui"), state()] {
        client(&mut st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
        server(&mut st, &[msg(b'1', b""), ready(b'I')]);
        let [read_bind, describe, read, _] = head_read(b"t1");
        client(&mut st, &[read_bind, describe, read, parse("", "SELECT 2")]);
    }
}

#[test]
fn a_refusal_in_a_segment_the_server_has_not_ended_fails_that_segment() {
    let (mut st, offered) = read_then_offer(b"t1", true);
    assert_eq!(offered, ClientStep::AwaitServer);
    let answer = [msg(b'2', b""), msg(b'T', b"\0\0"), parked_head_row(b"t1")];
    let req = server(&mut st, &answer)[2].claim.clone().expect("held");
    let error = st.apply_claim(&req, &store_unavailable()).expect("refused");
    assert_eq!(
        server_routes(&mut st, &[msg(b'C', b"SELECT 1\0")]),
        [Route::Answered]
    );
    assert!(st.0.settled());
    // The server raises the refusal before the statement that waited, and
    // skips to Sync, as PostgreSQL does after a failed statement: only
    // the ReadyForQuery reaches the client.
    let sent = st
        .on_client(&parse("", "SELECT 2"))
        .unwrap()
        .expect("a raise first");
    assert!(is_raise(&sent), "{sent:?}");
    assert!(sent.ends_with(&parse("", "SELECT 2")));
    let fields: Vec<_> = crate::wire::messages::error_response::error_fields(&error).collect();
    assert!(fields.contains(&(b'C', &b"58000"[..])));
    assert!(String::from_utf8_lossy(&sent).contains(&hex::encode("58000")));
    client(
        &mut st,
        &[bind("", &[], &[], &[]), execute(), msg(b'S', b"")],
    );
    let raised = msg(b'E', b"SERROR\0C58000\0Mrefused\0\0");
    assert_eq!(
        server_routes(
            &mut st,
            &[msg(b'1', b""), msg(b'2', b""), raised, ready(b'I')]
        ),
        [
            Route::Swallow,
            Route::Swallow,
            Route::Answered,
            Route::Forward
        ]
    );
    assert!(st.is_idle());
    // Refused once its segment is ended, outside a transaction block,
    // nothing more is raised.
    let mut st = claiming_state(&[], "worker");
    let req = read_parked_head(&mut st).claim.expect("held");
    assert!(st.apply_claim(&req, &store_unavailable()).is_some());
    let ended = [msg(b'C', b"SELECT 1\0"), ready(b'I')];
    assert_eq!(
        server_routes(&mut st, &ended),
        [Route::Answered, Route::Forward]
    );
    assert_eq!(st.on_client(&msg(b'S', b"")).unwrap(), None);
}

#[test]
fn a_refusal_in_a_transaction_block_fails_the_block() {
    let mut st = claiming_in_a_block();
    let req = read_parked_head(&mut st).claim.expect("held");
    assert!(st.apply_claim(&req, &store_unavailable()).is_some());
    assert_eq!(
        server_routes(&mut st, &[msg(b'C', b"SELECT 1\0")]),
        [Route::Answered]
    );
    // The segment's ReadyForQuery says the block failed, as after an error.
    let at_ready = st.0.on_server(&ready(b'T')).unwrap();
    let told = at_ready.rare.as_ref().and_then(|r| r.replace.clone());
    assert_eq!(told.as_deref(), Some(&ready(b'E')[..]));
    // The server fails it before the client's next statement (which then
    // fails as in any failed block), in a segment of the proxy's own.
    let next = msg(b'Q', b"select 1\0");
    let sent = st.on_client(&next).unwrap().expect("a raise first");
    assert!(is_raise(&sent), "{sent:?}");
    assert!(sent.ends_with(&[&msg(b'S', b"")[..], &next].concat()));
    let raised = msg(b'E', b"SERROR\0C58000\0Mrefused\0\0");
    let proxys = [msg(b'1', b""), msg(b'2', b""), raised, ready(b'E')];
    let routes = [
        Route::Swallow,
        Route::Swallow,
        Route::Answered,
        Route::Swallow,
    ];
    assert_eq!(server_routes(&mut st, &proxys), routes);
    let aborted = msg(b'E', b"SERROR\0C25P02\0Mcurrent transaction is aborted\0\0");
    let clients = server_routes(&mut st, &[aborted, ready(b'E')]);
    assert_eq!(clients, [Route::Forward, Route::Forward]);
}

#[test]
fn what_a_client_pipelines_past_a_gated_reads_segment_waits_for_its_ready_for_query() {
    // In a block, a COMMIT pipelined past the read's Sync: it waits until
    // the segment's ReadyForQuery, then the block fails before it.
    let mut st = claiming_in_a_block();
    let req = read_parked_head(&mut st).claim.expect("held");
    let commit = msg(b'Q', b"COMMIT\0");
    for waits in [commit.clone(), msg(b'S', b""), msg(b'H', b"")] {
        let offered = st.0.on_client(&waits, false).unwrap();
        assert_eq!(offered, ClientStep::AwaitServer, "{waits:?}");
    }
    assert!(st.apply_claim(&req, &store_unavailable()).is_some());
    server(&mut st, &[msg(b'C', b"SELECT 1\0")]);
    assert!(!st.0.settled());
    server(&mut st, &[ready(b'T')]);
    assert!(st.0.settled());
    let sent = st.on_client(&commit).unwrap().expect("a raise first");
    assert!(is_raise(&sent), "{sent:?}");
    assert!(sent.ends_with(&[&msg(b'S', b"")[..], &commit].concat()));
    // Served, what waited goes on as it is; a Terminate never waits.
    let mut st = claiming_state(&[], "worker");
    let req = read_parked_head(&mut st).claim.expect("held");
    let next = parse("", "SELECT 2");
    let terminate = msg(b'X', b"");
    assert_eq!(
        st.0.on_client(&next, false).unwrap(),
        ClientStep::AwaitServer
    );
    assert_eq!(
        st.0.on_client(&terminate, false).unwrap(),
        ClientStep::Forward
    );
    let served = Resolution {
        decision: crate::policy::claims::ClaimDecision::Serve { takeover: false },
        ..store_unavailable()
    };
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(st.0.on_client(&next, false).unwrap(), ClientStep::Forward);
    // A read sent as a simple Query: the same wait behind it.
    let mut st = claiming_state(&[], "worker");
    let verdict = query_parked_head(&mut st);
    assert_eq!(
        st.0.on_client(&next, false).unwrap(),
        ClientStep::AwaitServer
    );
    assert!(refuse_parked_claim(&mut st, verdict).is_some());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(st.0.on_client(&next, false).unwrap(), ClientStep::Forward);
}

/// A running head served, its run lease checked (`None`) or unknown for
/// the store's error `lease_unknown`.
fn running_served(lease_unknown: Option<&str>) -> Resolution {
    Resolution {
        decision: crate::policy::claims::ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        held_already: false,
        displaced: None,
        epoch: None,
        lease_unknown: lease_unknown.map(str::to_owned),
        takeover: None,
    }
}

#[test]
fn a_refused_running_head_names_the_run_and_a_served_one_records_nothing() {
    use crate::claims::RunLease;
    use crate::policy::claims::{ClaimDecision, Refusal};
    let cp = br#"{"updated_channels": ["branch:to:after"]}"#;
    let mut st = claiming_state(&[], "worker");
    let req = read_head(&mut st, cp, None).claim.unwrap();
    assert!(st.apply_claim(&req, &running_served(None)).is_none());
    assert!(st.ready_events.is_empty(), "{:?}", st.ready_events);
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);

    let req = read_head(&mut st, cp, None).claim.unwrap();
    let lease = RunLease {
        thread_id: "t1".into(),
        checkpoint_ns: String::new(),
        answered_checkpoint_id: "ck0".into(),
        fingerprint: "0123456789abcdef".repeat(4),
        holder: other_session(),
        answered_at_ms: 0,
        last_write_ms: 5,
        until_ms: 10_005,
    };
    let refused = Resolution {
        decision: ClaimDecision::Refuse {
            reason: Refusal::RunInProgress { lease },
        },
        waited_ms: 0,
        held_already: false,
        displaced: None,
        epoch: None,
        lease_unknown: None,
        takeover: None,
    };
    let error = st.apply_claim(&req, &refused);
    assert_refused_and_rest_swallowed(&mut st, error);
    let refusal = st
        .ready_events
        .iter()
        .find(|e| e.operation == Operation::ClaimRefused)
        .expect("claim_refused");
    assert_eq!(refusal.detail["head"], "running");
    assert_eq!(refusal.detail["interrupt"], "0123456789ab");
}

#[test]
fn a_running_head_served_with_its_lease_unknown_is_audited_as_unchecked() {
    let cp = br#"{"updated_channels": ["branch:to:after"]}"#;
    let mut st = claiming_state(&[], "worker");
    let req = read_head(&mut st, cp, None).claim.unwrap();
    let served = running_served(Some("claim store unavailable: timed out"));
    assert!(st.apply_claim(&req, &served).is_none(), "the row goes on");
    let unchecked: Vec<_> = st
        .ready_events
        .iter()
        .filter(|e| e.operation == Operation::LeaseUnchecked)
        .collect();
    assert_eq!(unchecked.len(), 1, "{:?}", st.ready_events);
    assert_eq!(unchecked[0].thread_id.as_deref(), Some("t1"));
    assert_eq!(unchecked[0].detail["head"], "running");
    let reason = unchecked[0].detail["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("claim store failed: claim store unavailable: timed out"),
        "{reason}"
    );
}

#[test]
fn a_parked_head_asks_for_a_claim_keyed_by_its_interrupt() {
    let mut st = claiming_state(&[], "worker");
    let verdict = read_parked_head(&mut st);
    let req = verdict.claim.expect("a claim is requested");
    assert_eq!(
        (
            req.key.at.thread_id.as_str(),
            req.key.at.checkpoint_ns.as_str(),
            req.key.at.checkpoint_id.as_str()
        ),
        ("t1", "", "ck1")
    );
    assert_eq!(
        req.key.fingerprint,
        crate::claims::interrupt_fingerprint(&[("task-1", Some(&b"\x91\xa1q"[..]))])
    );
    assert_eq!(
        (req.holder.proxy_id.as_str(), req.holder.session_id),
        ("proxy-a", 7)
    );
}

#[test]
fn a_parked_head_whose_key_the_server_converts_is_refused_without_asking_the_store() {
    use crate::policy::claims::{ClaimDecision, Refusal};
    // What the claim of `thread`'s parked head is decided as before the
    // store is asked, once the server reported `encodings` for the client.
    let decided_at_once = |encodings: &[&str], thread: &[u8], pipelined: &[&str]| {
        let mut st = claiming_state(&[], "worker");
        let status = |name: &str, value: &str| msg(b'S', format!("{name}\0{value}\0").as_bytes());
        server(&mut st, &[status("server_encoding", "UTF8")]);
        for encoding in encodings {
            server(&mut st, &[status("client_encoding", encoding)]);
        }
        assert!(read_parked_head_of(&mut st, thread, pipelined)
            .claim
            .is_some());
        let ticket = st.held.take().expect("the row is held");
        ticket.resolution.get().map(|r| r.decision.clone())
    };
    // ﾃｩ is 0xC3 0xA9 in SJIS: read as UTF-8, é, another thread's id.
    let converted = decided_at_once(&["SJIS"], b"\xc3\xa9-1", &[]);
    assert!(
        matches!(
            &converted,
            Some(ClaimDecision::Refuse { reason: Refusal::ClientEncoding(e) }) if e == "SJIS"
        ),
        "{converted:?}"
    );
    // An ASCII key in that encoding, and the key once the session is back
    // in the database's encoding, are asked of the store.
    assert_eq!(decided_at_once(&["SJIS"], b"t1", &[]), None);
    assert_eq!(decided_at_once(&["SJIS", "UTF8"], b"\xc3\xa9-1", &[]), None);
    // Behind another statement in its pipeline, whose change of encoding
    // the server reports only after the row: refused as converted.
    let behind = decided_at_once(&["UTF8"], b"\xc3\xa9-1", &["SET client_encoding TO SJIS"]);
    assert!(
        matches!(
            &behind,
            Some(ClaimDecision::Refuse { reason: Refusal::ClientEncoding(e) }) if e.contains("pipeline")
        ),
        "{behind:?}"
    );
    assert_eq!(
        decided_at_once(&["UTF8"], b"t1", &["SET client_encoding TO SJIS"]),
        None
    );
}

#[test]
fn a_head_row_that_does_not_decode_is_refused_without_asking_the_store() {
    use crate::policy::claims::{ClaimDecision, Refusal};
    // SJIS 表 is 0x95 0x5C: its row's thread is not UTF-8.
    let thread = b"\x95\x5c-1";
    let mut st = claiming_state(&["^inspect"], "worker");
    let read = read_parked_head_of(&mut st, thread, &[]);
    assert!(read.claim.is_some(), "the row is held");
    let ticket = st.held.take().expect("the row is held");
    let decided = ticket.resolution.get().map(|r| &r.decision);
    assert!(
        matches!(
            decided,
            Some(ClaimDecision::Refuse { reason: Refusal::Undecodable(why) }) if why.contains("UTF-8")
        ),
        "{decided:?}"
    );
    assert_eq!(ticket.request.head, Head::Undecodable);
    assert_eq!(ticket.request.key.at.thread_id, "\u{f795}\\-1");
    // Marked as inspection, it is served unclaimed, as without the leg.
    let mut st = claiming_state(&["^inspect"], "inspect-ui");
    assert!(read_parked_head_of(&mut st, thread, &[]).claim.is_none());
    let mut st = state();
    assert!(read_parked_head_of(&mut st, thread, &[]).claim.is_none());
}

#[test]
fn an_earlier_segments_ready_for_query_does_not_settle_a_later_change() {
    use crate::policy::claims::{ClaimDecision, Refusal};
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    // Two segments sent at once: a plain statement; then SET and the read.
    let plain = [
        parse("", "SELECT 1"),
        bind("", &[], &[], &[]),
        execute(),
        msg(b'S', b""),
    ];
    let set = [
        parse("", "SET client_encoding TO SJIS"),
        bind("", &[], &[], &[]),
        execute(),
    ];
    client(&mut st, &[&plain[..], &set[..]].concat());
    client(&mut st, &head_read(b"\xc3\xa9-1"));
    // The first segment's ReadyForQuery comes before the change is made.
    let first = [
        msg(b'1', b""),
        msg(b'2', b""),
        msg(b'C', b"SELECT 1\0"),
        ready(b'I'),
    ];
    server(&mut st, &first);
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'C', b"SET\0"),
            msg(b'2', b""),
        ],
    );
    server(&mut st, &[msg(b'T', b"\0\0")]);
    assert!(st
        .on_server(&parked_head_row(b"\xc3\xa9-1"))
        .unwrap()
        .claim
        .is_some());
    let ticket = st.held.take().expect("the row is held");
    let decided = ticket.resolution.get().map(|r| &r.decision);
    assert!(
        matches!(
            decided,
            Some(ClaimDecision::Refuse {
                reason: Refusal::ClientEncoding(_)
            })
        ),
        "{decided:?}"
    );
}

/// The heads the session's claims leg knows parked.
fn parked_heads(st: &SessionState) -> Arc<crate::enforce::parked_heads::ParkedHeads> {
    match &st.shared.legs.claims {
        Some(leg) => Arc::clone(&leg.parked),
        None => panic!("the claims leg is on"),
    }
}

#[test]
fn a_committed_interrupt_write_parks_its_head_under_the_key_its_read_claims() {
    let mut st = claiming_state(&[], "worker");
    let parked = parked_heads(&st);
    client(
        &mut st,
        &[
            parse("_pg3_1", WRITE_SQL),
            interrupt_bind_of("_pg3_1", b"\x91\xa1q"),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'2', b""), msg(b'n', b"")]);
    server(&mut st, &[msg(b'C', b"INSERT 0 1\0")]);
    assert_eq!(parked.expected("t1", ""), None, "not before it committed");
    server(&mut st, &[ready(b'I')]);
    let expected = parked.expected("t1", "").expect("parked once committed");
    // A saver may put the checkpoint after its interrupts: that moves nothing.
    client(
        &mut st,
        &[
            parse("b", BLOB_SQL),
            parse("c", PUT_SQL),
            blob_bind(b"\x91\xc0"),
            execute(),
            put_bind_at(b"ck1"),
            execute(),
            msg(b'S', b""),
        ],
    );
    let (parsed, bound) = (msg(b'1', b""), msg(b'2', b""));
    let done = msg(b'C', b"INSERT 0 1\0");
    let answers = [
        parsed.clone(),
        parsed,
        bound.clone(),
        done.clone(),
        bound,
        done,
    ];
    server(&mut st, &answers);
    server(&mut st, &[ready(b'I')]);
    assert_eq!(parked.expected("t1", ""), Some(expected.clone()));
    let req = read_parked_head(&mut st)
        .claim
        .expect("a claim is requested");
    assert_eq!(expected, req.key, "the key the read of that head claims");
}

#[test]
fn inspection_sessions_never_claim() {
    let mut st = claiming_state(&["^inspect"], "inspector-ui");
    assert!(read_parked_head(&mut st).claim.is_none());
    let mut st = claiming_state(&["^inspect"], "worker");
    st.inspection_listener = true;
    assert!(read_parked_head(&mut st).claim.is_none());
}

#[test]
fn a_refused_claim_replaces_the_row_and_swallows_the_rest_of_its_answer() {
    let mut st = claiming_state(&[], "worker");
    let verdict = read_parked_head(&mut st);
    let refusal = refuse_parked_claim(&mut st, verdict);
    assert_refused_and_rest_swallowed(&mut st, refusal);
    // The refusal is the read's record: the client never got the row.
    assert_eq!(ops(&mut st), [Operation::ClaimRefused]);
    assert!(st.is_idle());
    // The next read of the head, served, is recorded as one.
    read_parked_head(&mut st);
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(ops(&mut st), [Operation::ReadLatest]);
}

/// A parked head's claim served without a wait or a takeover, to a
/// reader that took it now or (`held_already`) held it before.
fn served_at_once(held_already: bool) -> Resolution {
    Resolution {
        decision: crate::policy::claims::ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        held_already,
        displaced: None,
        epoch: Some(1),
        lease_unknown: None,
        takeover: None,
    }
}

#[test]
fn a_head_read_served_after_a_wait_and_a_takeover_records_the_row_the_client_got() {
    use crate::policy::claims::{ClaimDecision, TAKEOVER_LAPSED};
    let mut st = claiming_state(&[], "worker");
    let req = read_parked_head(&mut st)
        .claim
        .expect("a claim is requested");
    let served = Resolution {
        decision: ClaimDecision::Serve { takeover: true },
        waited_ms: 40,
        displaced: Some(other_session()),
        takeover: Some(TAKEOVER_LAPSED),
        ..served_at_once(false)
    };
    assert!(st.apply_claim(&req, &served).is_none());
    let routes = server_routes(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(routes, [Route::Forward, Route::Forward]);
    let events = std::mem::take(&mut st.ready_events);
    let ops: Vec<_> = events.iter().map(|e| e.operation).collect();
    assert_eq!(
        ops,
        [
            Operation::ClaimWaited,
            Operation::ClaimTakeover,
            Operation::ReadLatest
        ]
    );
    assert_eq!(events[1].detail["displaced"]["proxy_id"], "proxy-b");
    assert_eq!(events[1].detail["takeover"], TAKEOVER_LAPSED);
    assert_eq!(events[2].detail["rows"], 1);
    assert_eq!(events[2].detail["parked"], true);
}

#[test]
fn a_holder_reading_its_head_again_records_the_read_and_no_second_claim() {
    let mut st = claiming_state(&[], "worker");
    for held_already in [false, true] {
        let req = read_parked_head(&mut st)
            .claim
            .expect("a claim is requested");
        assert!(st
            .apply_claim(&req, &served_at_once(held_already))
            .is_none());
        server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    }
    assert_eq!(
        ops(&mut st),
        [
            Operation::ClaimTaken,
            Operation::ReadLatest,
            Operation::ReadLatest
        ]
    );
}

/// A READ(latest) of t1's parked head sent as a simple Query with
/// literals (psql, psycopg's `ClientCursor`); returns the verdict of its
/// DataRow (text format, as every simple Query's rows are).
fn query_parked_head(st: &mut SessionState) -> ServerVerdict {
    use crate::saver::classify::saver_sql::SELECT_SQL;
    let sql = format!(
        "{SELECT_SQL}WHERE thread_id = 't1' AND checkpoint_ns = '' \
         ORDER BY checkpoint_id DESC LIMIT 1\0"
    );
    client(st, &[msg(b'Q', sql.as_bytes())]);
    server(st, &[msg(b'T', b"\0\0")]);
    let pending = ByteaArray {
        dims: vec![1, 6],
        elements: [
            &b"task-1"[..],
            b"__interrupt__",
            b"msgpack",
            b"\x91\xa1q",
            b"~__pregel_pull, gate",
            b"-3",
        ]
        .iter()
        .map(|e| Some(Bytes::copy_from_slice(e)))
        .collect(),
    }
    .encode_text();
    let row = crate::wire::messages::data_row::data_row(&[
        Some(b"t1"),
        Some(br#"{"v": 4}"#),
        Some(b""),
        Some(b"ck1"),
        None,
        Some(b"{}"),
        None,
        Some(pending.as_bytes()),
    ]);
    st.on_server(&row).unwrap()
}

/// A session of another proxy, the claim's holder before this one.
fn other_session() -> crate::claims::Holder {
    crate::claims::Holder {
        proxy_id: "proxy-b".into(),
        session_id: 3,
        client_addr: "10.0.0.9:5000".into(),
        application_name: "approver".into(),
    }
}

/// The claim the parked head's row is held for, refused: the error the
/// client gets instead of the row.
fn refuse_parked_claim(st: &mut SessionState, verdict: ServerVerdict) -> Option<Bytes> {
    use crate::policy::claims::{ClaimDecision, Refusal};
    let req = verdict.claim.expect("a claim is requested");
    st.apply_claim(
        &req,
        &Resolution {
            decision: ClaimDecision::Refuse {
                reason: Refusal::Answered {
                    by: other_session(),
                    at_ms: 0,
                },
            },
            waited_ms: 0,
            held_already: false,
            displaced: None,
            epoch: None,
            lease_unknown: None,
            takeover: None,
        },
    )
}

#[test]
fn a_refused_head_read_in_a_simple_query_still_ends_at_ready_for_query() {
    let mut st = claiming_state(&[], "worker");
    let verdict = query_parked_head(&mut st);
    let refusal = refuse_parked_claim(&mut st, verdict);
    assert_refused_and_rest_swallowed(&mut st, refusal);
    assert!(st.is_idle());
}

#[test]
fn a_refused_head_read_in_a_transaction_block_reports_the_servers_status() {
    let mut st = claiming_in_a_block();
    let verdict = query_parked_head(&mut st);
    let refusal = refuse_parked_claim(&mut st, verdict);
    assert!(refusal.is_some());
    let routes = server_routes(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'T')]);
    assert_eq!(routes, [Route::Answered, Route::Forward]);
    assert_eq!(st.0.txn_status(), TxnStatus::InBlock);
}

#[test]
fn an_interrupt_write_whose_text_is_not_utf8_is_still_seen() {
    let mut st = claiming_state(&[], "worker");
    let parked = parked_heads(&st);
    // A LATIN1 client's comment: the server runs the text as it is.
    let mut body = b"_pg3_1\0".to_vec();
    body.extend_from_slice(WRITE_SQL.as_bytes());
    body.extend_from_slice(b" -- r\xe9sum\xe9\0\0\0");
    client(
        &mut st,
        &[
            msg(b'P', &body),
            interrupt_bind_of("_pg3_1", b"\x91\xa1q"),
            execute(),
            msg(b'S', b""),
        ],
    );
    let answers = [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"INSERT 0 1\0")];
    server(&mut st, &answers);
    server(&mut st, &[ready(b'I')]);
    assert!(
        parked.expected("t1", "").is_some(),
        "the write parked its head"
    );
}

#[test]
fn only_texts_naming_saver_tables_may_block_and_only_with_consume_once_on() {
    use crate::wire::guard::Guard;
    // Offered on a loop: whether the message is refused to the loop.
    let blocks = |st: &mut SessionState, frame: &[u8]| {
        matches!(st.0.on_client(frame, true), Ok(ClientStep::Blocks))
    };
    let query = |sql: &str| msg(b'Q', format!("{sql}\0").as_bytes());
    let pgbench = "SELECT abalance FROM pgbench_accounts WHERE aid = 7";
    let prepare = format!("PREPARE r AS {READ_SQL}");
    let mut claiming = claiming_state(&[], "app");
    for (frame, blocking) in [
        (parse("s", READ_SQL), true),
        (parse("w", WRITE_SQL), true),
        (query(&prepare), true),
        (parse("p", pgbench), false),
        (query(pgbench), false),
        (bind("s", &[], &[Some(b"t1"), Some(b"")], &[1]), false),
        (execute(), false),
        // A LATIN1 text, not UTF-8: the same verdict from its bytes.
        (msg(b'Q', b"SELECT '\xe9' FROM checkpoints\0"), true),
        (msg(b'Q', b"SELECT '\xe9' FROM t\0"), false),
    ] {
        assert_eq!(blocks(&mut claiming, &frame), blocking, "{frame:?}");
    }
    // Asked twice, the same text gets the same answer (the second from
    // the session's memory of it).
    assert!(blocks(&mut claiming, &query(&prepare)));
    assert!(blocks(&mut claiming, &query(&prepare)));
    assert!(!blocks(&mut claiming, &query(pgbench)));
    assert!(!blocks(&mut claiming, &query(pgbench)));
    // Without consume-once no hook reaches a store.
    let mut plain = state();
    assert!(!blocks(&mut plain, &parse("s", READ_SQL)));
    assert!(!blocks(&mut plain, &query(&prepare)));
}

#[test]
fn a_message_that_blocks_on_a_loop_is_tracked_only_when_offered_off_it() {
    use crate::wire::guard::Guard;
    let mut st = claiming_state(&[], "app");
    let frame = parse("s", READ_SQL);
    assert!(matches!(
        st.0.on_client(&frame, true),
        Ok(ClientStep::Blocks)
    ));
    assert!(st.0.is_idle(), "nothing was tracked on the loop");
    assert!(matches!(
        st.0.on_client(&frame, false),
        Ok(ClientStep::Forward)
    ));
    assert!(!st.0.is_idle(), "the Parse waits for its answer");
}
