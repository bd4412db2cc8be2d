//! Statements the proxy refuses before they run each leave a
//! `statement_refused` record naming the session, the refusal and the
//! statement's kind: one on the proxy's own schema, a checkpoint statement
//! no profile recognizes, a guarded channel-history read, a checkpoint
//! statement in SQL DECLARE.

use serde_json::json;

use super::*;
use crate::audit::AuditEvent;
use crate::saver::classify::tests::housekeeping_sql::DELTA_STAGE2;

fn client_ctx() -> SessionContext {
    SessionContext {
        session_id: 9,
        client_addr: "10.0.0.9:5000".into(),
        user: "app".into(),
        database: "lg".into(),
        application_name: "worker".into(),
    }
}

fn session(classifier: Classifier) -> SessionState {
    SessionState::new(Arc::new(classifier), Legs::default(), client_ctx())
}

fn langgraph() -> Classifier {
    Classifier::new(vec![SaverProfile::langgraph_python()])
}

/// A simple Query the proxy replaces with its refusal.
fn refused_query(st: &mut SessionState, text: &[u8]) {
    let replaced = st.on_client(&msg(b'Q', text)).unwrap();
    assert!(replaced.is_some(), "refused");
}

/// The one record the refusal left, checked for the session it names.
fn the_refusal(st: &mut SessionState) -> AuditEvent {
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = events.into_iter().next().expect("one event");
    assert_eq!(ev.operation, Operation::StatementRefused);
    assert_eq!(
        (ev.session_id, ev.client_addr.as_str(), ev.user.as_str()),
        (9, "10.0.0.9:5000", "app")
    );
    assert_eq!(ev.application_name, "worker");
    ev
}

/// A client message the proxy refuses, saying `says` at WARN: the record
/// it left.
fn refused_at_warn(st: &mut SessionState, frame: &[u8], says: &str) -> AuditEvent {
    let (replaced, log) = crate::test_log::captured(|| st.on_client(frame).unwrap());
    assert!(replaced.is_some(), "refused");
    assert!(log.contains("WARN") && log.contains(says), "{log}");
    the_refusal(st)
}

#[test]
fn a_statement_on_the_proxys_schema_is_audited() {
    let mut st = session(langgraph());
    refused_query(&mut st, b"DELETE FROM resumeguard.claims\0");
    let ev = the_refusal(&mut st);
    assert_eq!(ev.detail["refusal"], "own_schema");
    assert_eq!(ev.detail["sqlstate"], "42501");
    let reason = ev.detail["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("belongs to resumeguard"), "{reason}");
    assert_eq!(
        ev.detail["why"],
        "DELETE names it; clients may only SELECT from it"
    );
    assert_eq!(ev.detail["statement"], json!(null));
    assert!(
        !ev.detail.to_string().contains("resumeguard.claims"),
        "{}",
        ev.detail
    );
}

#[test]
fn an_unknown_checkpoint_statement_refused_is_audited() {
    use crate::saver::unknown::UnknownSaverPolicy;
    let mut st = session(langgraph().with_unknown_policy(UnknownSaverPolicy::Refuse));
    refused_query(&mut st, b"UPDATE checkpoints SET metadata = '{}'\0");
    let ev = the_refusal(&mut st);
    assert_eq!(ev.detail["refusal"], "unknown_saver");
    assert_eq!(
        ev.detail["sqlstate"],
        crate::saver::unknown::REFUSAL_SQLSTATE
    );
    assert_eq!(ev.detail["statement"], "unrecognized");
    assert!(!ev.detail.to_string().contains("UPDATE"), "{}", ev.detail);
}

#[test]
fn a_history_read_naming_resume_is_audited_and_logged() {
    let mut st = session(langgraph());
    client(&mut st, &[parse("h", DELTA_STAGE2)]);
    let mut params: Vec<Option<&[u8]>> = vec![Some(b"x"); 12];
    params[6] = Some(b"__resume__");
    let ev = refused_at_warn(&mut st, &bind("h", &[], &params, &[]), "__resume__");
    assert_eq!(ev.detail["refusal"], "channel_history");
    assert_eq!(ev.detail["sqlstate"], "0A000");
    let reason = ev.detail["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("names channel __resume__"), "{reason}");
}

#[test]
fn a_checkpoint_statement_in_a_cursor_is_audited_and_logged() {
    let mut st = session(langgraph());
    let declare = format!("DECLARE c CURSOR FOR {READ_SQL}\0");
    let refusal = "cannot run through a cursor";
    let ev = refused_at_warn(&mut st, &msg(b'Q', declare.as_bytes()), refusal);
    assert_eq!(ev.detail["refusal"], "sql_form");
    assert_eq!(ev.detail["sqlstate"], "0A000");
    assert_eq!(ev.detail["statement"], "read_latest");
}

#[test]
fn a_text_admitted_before_admits_no_other() {
    let mut st = session(langgraph());
    for _ in 0..2 {
        let parsed = st.on_client(&msg(b'P', b"\0select 1\0\0\0")).unwrap();
        assert!(parsed.is_none(), "admitted");
    }
    refused_query(&mut st, b"DELETE FROM resumeguard.claims\0");
    assert_eq!(the_refusal(&mut st).detail["refusal"], "own_schema");
}

#[test]
fn a_read_by_id_whose_row_does_not_decode_is_refused_in_its_place() {
    use crate::wire::messages::data_row::data_row;
    let by_id = READ_SQL.replace(
        "ORDER BY checkpoint_id DESC LIMIT 1",
        "AND checkpoint_id = $3",
    );
    let mut st = session(langgraph());
    assert!(
        st.on_client(&parse("f", &by_id)).unwrap().is_some(),
        "rewritten"
    );
    client(&mut st, &[msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    // SJIS 表 is 0x95 0x5C: the row's thread is not UTF-8.
    let thread = b"\x95\x5c-1";
    let params = [Some(&thread[..]), Some(b""), Some(b"ck1")];
    client(&mut st, &[bind("f", &[], &params, &[1]), execute()]);
    // A statement behind it waits for its row, behind a Flush.
    let behind = st.0.on_client(&parse("", "SELECT 2"), false).unwrap();
    assert_eq!(behind, ClientStep::Inject(b"H\0\0\0\x04".to_vec()));
    client(&mut st, &[msg(b'S', b"")]);
    server(&mut st, &[msg(b'2', b"")]);
    // The row carries the head's id last, as the rewrite asks.
    let fields = [Some(&thread[..]), Some(b"\x01{}"), Some(b""), Some(b"ck1")];
    let rest = [None, Some(&b"\x01{}"[..]), None, None, Some(b"ck2")];
    let row = data_row(&[&fields[..], &rest[..]].concat());
    let (step, log) = crate::test_log::captured(|| st.0.on_server(&row).unwrap());
    let error = step.answer().expect("the row is answered by a refusal");
    let fields: Vec<_> = crate::wire::messages::error_response::error_fields(error).collect();
    assert!(fields.contains(&(b'C', &b"0A000"[..])), "{fields:?}");
    assert_eq!(step.route, Route::Forward);
    assert!(
        log.contains("WARN") && log.contains("by id refused"),
        "{log}"
    );
    // Nothing more of its answer reaches the client, but its ReadyForQuery.
    let rest = server_routes(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(rest, [Route::Answered, Route::Forward]);
    let ev = the_refusal(&mut st);
    assert_eq!(ev.detail["refusal"], "undecodable_row");
    assert_eq!(ev.detail["statement"], "read_by_id");
    assert_eq!(
        (ev.thread_id.as_deref(), ev.checkpoint_id.as_deref()),
        (Some("\u{f795}\\-1"), Some("ck1"))
    );
}
