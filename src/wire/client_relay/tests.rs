//! Which client messages stream past the guard: a real session guard (the
//! Python saver's profile) offered the front of large messages.

use std::sync::Arc;

use bytes::BytesMut;

use super::{track_client, Limits};
use crate::audit::{AuditSink, SessionContext};
use crate::enforce::{Enforcement, Legs, SessionGuard};
use crate::saver::classify::saver_sql::UPSERT_BLOBS;
use crate::saver::classify::Classifier;
use crate::saver::profile::SaverProfile;
use crate::wire::connection::{Passing, STREAM_ABOVE};
use crate::wire::guard::Guard;

const MAX: usize = 1 << 30;

pub(in crate::wire) use crate::wire::connection::message as msg;

fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for s in [name, sql] {
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    }
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'P', &b)
}

/// A Bind of `stmt` with one text parameter of `size` bytes.
fn bind(stmt: &str, size: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(size + 32);
    b.push(0);
    b.extend_from_slice(stmt.as_bytes());
    b.push(0);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes());
    b.extend_from_slice(&(size as i32).to_be_bytes());
    b.resize(b.len() + size, b'x');
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'B', &b)
}

/// A started session with `plain` (not checkpoint traffic) and `blobs`
/// (the saver's blob upsert) prepared.
pub(in crate::wire) fn session() -> SessionGuard {
    let shared = Arc::new(Enforcement::new(
        Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()])),
        Legs::default(),
        AuditSink::disabled(),
    ));
    let mut st = shared.session(SessionContext::default(), false);
    st.on_server(&msg(b'Z', b"I")).unwrap();
    for f in [
        parse("plain", "select $1::text"),
        parse("blobs", UPSERT_BLOBS),
        msg(b'S', b""),
    ] {
        st.on_client(&f, false).unwrap();
    }
    for f in [msg(b'1', b""), msg(b'1', b""), msg(b'Z', b"I")] {
        st.on_server(&f).unwrap();
    }
    st
}

/// Offers the first `have` bytes of `frame` (a pass of the relay).
fn offer(st: &mut SessionGuard, frame: &[u8], have: usize) -> (usize, Option<Passing>, BytesMut) {
    let mut out = BytesMut::new();
    let limits = Limits {
        max: MAX,
        upstream_tls: false,
        on_loop: false,
    };
    let tracked = track_client(st, &frame[..have], &mut out, limits);
    assert_eq!(tracked.refused, None);
    (tracked.ready, tracked.passing, out)
}

#[test]
fn a_large_bind_of_an_unwatched_statement_streams_from_its_front() {
    let mut st = session();
    let frame = bind("plain", 4 * STREAM_ABOVE);
    let (ready, passing, out) = offer(&mut st, &frame, 4096);
    assert_eq!(ready, 4096, "the front goes on at once");
    assert!(out.is_empty(), "forwarded as it is");
    assert_eq!(
        passing,
        Some(Passing {
            left: frame.len() - 4096,
            forward: true
        })
    );
}

#[test]
fn a_large_bind_of_a_checkpoint_statement_is_read_whole() {
    let mut st = session();
    let frame = bind("blobs", 4 * STREAM_ABOVE);
    let (ready, passing, _) = offer(&mut st, &frame, 4096);
    assert_eq!((ready, passing), (0, None), "buffered until whole");
    assert!(!Guard::client_streams(&mut st, &frame[..frame.len() - 1]));
}

#[test]
fn a_bind_streams_only_once_its_names_are_in() {
    let mut st = session();
    let frame = bind("plain", 4 * STREAM_ABOVE);
    assert_eq!(offer(&mut st, &frame, 8).1, None, "statement name cut");
    assert!(offer(&mut st, &frame, 12).1.is_some());
}

#[test]
fn parse_and_query_texts_are_read_whole() {
    let mut st = session();
    let text = "x".repeat(2 * STREAM_ABOVE);
    let p = parse("big", &format!("select '{text}'"));
    assert_eq!(offer(&mut st, &p, 4096).1, None);
    let q = msg(b'Q', format!("select '{text}'\0").as_bytes());
    assert_eq!(offer(&mut st, &q, 4096).1, None);
}

#[test]
fn copy_data_streams_and_small_messages_never_do() {
    let mut st = session();
    let copy = msg(b'd', &vec![b'r'; 2 * STREAM_ABOVE]);
    let (ready, passing, _) = offer(&mut st, &copy, 100);
    assert_eq!(
        (ready, passing.map(|p| p.left)),
        (100, Some(copy.len() - 100))
    );
    let small = msg(b'd', &vec![b'r'; STREAM_ABOVE - 10]);
    assert_eq!(offer(&mut st, &small, 100), (0, None, BytesMut::new()));
}

#[test]
fn a_refused_bind_streams_into_nothing() {
    // A statement never prepared: the proxy raises the error in its place
    // and the parameters are dropped, never buffered.
    let mut st = session();
    let frame = bind("nobody", 4 * STREAM_ABOVE);
    let (ready, passing, out) = offer(&mut st, &frame, 4096);
    assert_eq!(ready, 4096);
    assert_eq!(passing.map(|p| p.forward), Some(false));
    assert!(
        !out.is_empty() && out[..] != frame[..4096],
        "the refusal goes instead"
    );
}

#[test]
fn messages_before_a_streamed_one_go_first() {
    let mut st = session();
    let mut buf = msg(b'H', b"");
    let frame = bind("plain", 4 * STREAM_ABOVE);
    buf.extend_from_slice(&frame[..1000]);
    let (ready, passing, _) = offer(&mut st, &buf, buf.len());
    assert_eq!(ready, buf.len());
    assert_eq!(passing.map(|p| p.left), Some(frame.len() - 1000));
}

#[test]
fn bytes_the_guard_puts_first_go_before_the_message_offered_again() {
    let injected = msg(b'H', b"");
    let sync = msg(b'S', b"");
    let frame = bind("plain", 4 * STREAM_ABOVE);
    let mut buf = sync.clone();
    buf.extend_from_slice(&frame[..1000]);
    let mut guard = crate::wire::session::tests::PassThrough {
        inject_before: Some((b'B', injected.clone())),
    };
    let mut out = BytesMut::new();
    let limits = Limits {
        max: MAX,
        upstream_tls: false,
        on_loop: false,
    };
    let tracked = track_client(&mut guard, &buf, &mut out, limits);
    assert_eq!(tracked.ready, buf.len());
    // The message still streams on: the rest of its body follows.
    assert_eq!(
        tracked.passing.map(|p| (p.left, p.forward)),
        Some((frame.len() - 1000, true))
    );
    assert_eq!(out[..], [&sync[..], &injected, &frame[..1000]].concat()[..]);
}
