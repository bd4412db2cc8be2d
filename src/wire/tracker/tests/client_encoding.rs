//! Texts and names in a client encoding other than UTF-8 (LATIN1 here,
//! or any text on an SQL_ASCII database): the server runs them, so the
//! tracker reads their SQL and keeps their names apart byte for byte.

use super::super::*;
use super::{bind_sees, client, complete, msg, ready, server, sync, tracker, Marks};

/// NUL-terminated `parts`, then `tail`.
fn body(parts: &[&[u8]], tail: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for part in parts {
        body.extend_from_slice(part);
        body.push(0);
    }
    body.extend_from_slice(tail);
    body
}

fn query_bytes(sql: &[u8]) -> Vec<u8> {
    msg(b'Q', &body(&[sql], b""))
}

fn parse_bytes(name: &[u8], sql: &[u8]) -> Vec<u8> {
    msg(b'P', &body(&[name, sql], &0i16.to_be_bytes()))
}

/// Sends the SQL `PREPARE` text `sql`, which the server confirms.
fn prepare(t: &mut Tracker<Marks>, sql: &[u8]) {
    client(t, &[query_bytes(sql)]);
    server(t, &[complete("PREPARE"), ready(b'I')]);
}

#[test]
fn a_prepare_whose_text_is_not_utf8_is_recorded_and_its_execute_passes() {
    let mut t = tracker();
    prepare(&mut t, b"PREPARE p AS SELECT '\xe9'");
    let steps = client(&mut t, &[query_bytes(b"EXECUTE p")]);
    assert_eq!(steps, [ClientStep::Forward]);
}

#[test]
fn names_that_are_not_utf8_stay_apart() {
    let mut t = tracker();
    prepare(&mut t, b"PREPARE \"\xe9\" AS select 1");
    let other = client(&mut t, &[query_bytes(b"EXECUTE \"\xe8\"")]);
    assert!(matches!(other[..], [ClientStep::Replace(_)]), "{other:?}");
    server(&mut t, &[msg(b'E', b"SERROR\0C26000\0Mx\0\0"), ready(b'I')]);
    let same = client(&mut t, &[query_bytes(b"EXECUTE \"\xe9\"")]);
    assert_eq!(same, [ClientStep::Forward]);
    server(&mut t, &[complete("SELECT 1"), ready(b'I')]);
    // A protocol Parse's name is the same name as SQL's.
    client(&mut t, &[parse_bytes(b"\xe7", b"select 1"), sync()]);
    server(&mut t, &[msg(b'1', b""), ready(b'I')]);
    let steps = client(&mut t, &[query_bytes(b"EXECUTE \"\xe7\"")]);
    assert_eq!(steps, [ClientStep::Forward]);
}

#[test]
fn a_guarded_text_with_a_byte_that_is_not_utf8_is_still_seen() {
    let mut t = tracker();
    client(
        &mut t,
        &[parse_bytes(b"s1", b"insert guarded -- \xe9"), sync()],
    );
    server(&mut t, &[msg(b'1', b""), ready(b'I')]);
    bind_sees(&mut t, "s1");
    assert_eq!(t.hooks.binds, [true]);
    let steps = client(
        &mut t,
        &[query_bytes(b"PREPARE s4 AS insert guarded /* \xe9 */")],
    );
    assert!(matches!(steps[..], [ClientStep::Replace(_)]), "{steps:?}");
}

#[test]
fn a_rewritten_text_keeps_the_clients_bytes() {
    let mut t = tracker();
    t.hooks.rewrite = true;
    let steps = client(
        &mut t,
        &[parse_bytes(b"s1", b"select guarded -- r\xe9sum\xe9")],
    );
    let rewritten = parse_bytes(b"s1", b"select rewritten -- r\xe9sum\xe9");
    assert_eq!(steps, [ClientStep::Replace(rewritten)]);
}
