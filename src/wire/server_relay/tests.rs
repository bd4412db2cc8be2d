//! Which server messages pass the guard unread, and stream, and what of them goes on
//! at once: a real session guard (the Python saver's profile).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{stream_row, track_server};
use crate::saver::classify::saver_sql::SELECT_SQL;
use crate::wire::backend_keys::BackendKeys;
use crate::wire::client_relay::tests::{msg, session};
use crate::wire::connection::{Passing, STREAM_ABOVE};
use crate::wire::guard::{ClientError, ClientStep, Guard, HeldTicket, ServerStep, Ticket, WaitEnd};
use crate::wire::response_queue::Desync;
use crate::wire::response_queue::Route;
use crate::wire::session::tests::{nowhere, proxy};

#[test]
fn a_row_nobody_watches_streams_from_its_front() {
    let mut st = session();
    st.on_client(&msg(b'Q', b"select repeat('x', 1000000)\0"), false)
        .unwrap();
    st.on_server(&msg(b'T', b"\0\0")).unwrap();
    assert_eq!(Guard::unwatched_row(&st, b'D'), Some(Route::Forward));
    let row = msg(b'D', &vec![b'x'; 4 * STREAM_ABOVE]);
    let mut buf = BytesMut::from(&row[..1000]);
    let mut out = BytesMut::new();
    let passing = stream_row(&mut buf, &mut out, Route::Forward, row.len());
    assert!(buf.is_empty());
    assert_eq!(&out[..], &row[..1000]);
    assert_eq!(
        passing,
        Passing {
            left: row.len() - 1000,
            forward: true
        }
    );
    // The tracker followed it: the answer completes as usual.
    st.on_server(&msg(b'C', b"SELECT 1\0")).unwrap();
    st.on_server(&msg(b'Z', b"I")).unwrap();
    assert!(st.is_idle());
}

#[test]
fn rows_of_a_watched_answer_are_read_whole() {
    let mut st = session();
    let sql = format!("{SELECT_SQL}WHERE thread_id = 't' AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1\0");
    st.on_client(&msg(b'Q', sql.as_bytes()), false).unwrap();
    st.on_server(&msg(b'T', b"\0\0")).unwrap();
    assert_eq!(Guard::unwatched_row(&st, b'D'), None);
    assert_eq!(Guard::unwatched_row(&st, b'd'), None);
}

#[test]
fn only_rows_and_copy_data_stream() {
    let mut st = session();
    st.on_client(&msg(b'Q', b"select 1\0"), false).unwrap();
    for tag in [b'T', b'C', b'E', b'N', b'Z', b'S', b'A'] {
        assert_eq!(Guard::unwatched_row(&st, tag), None, "{}", tag as char);
    }
}

/// Routes by type byte: rows pass unread ('D' on, 'd' dropped), 'N' is
/// swallowed, 'T' replaced, 'H' held; anything else goes on.
struct ByTag;

#[derive(Debug)]
struct Undecided;

impl Ticket for Undecided {
    fn decide(&self, _: &dyn Fn() -> Option<WaitEnd>) {}
}

impl Guard for ByTag {
    fn on_client(&mut self, _: &[u8], _: bool) -> Result<ClientStep, ClientError> {
        Ok(ClientStep::Forward)
    }
    fn on_server(&mut self, frame: &[u8]) -> Result<ServerStep, Desync> {
        let mut step = ServerStep::default();
        match frame[0] {
            b'D' | b'd' => panic!("a row that passes unread was read"),
            b'N' => step.route = Route::Swallow,
            b'T' => step.set_replace(Some(Bytes::from_static(b"new T"))),
            b'H' => step.set_hold(HeldTicket(Arc::new(Undecided))),
            _ => {}
        }
        Ok(step)
    }
    fn client_streams(&mut self, _: &[u8]) -> bool {
        false
    }
    fn unwatched_row(&self, tag: u8) -> Option<Route> {
        match tag {
            b'D' => Some(Route::Forward),
            b'd' => Some(Route::Swallow),
            _ => None,
        }
    }
    fn release(&mut self) -> Option<Bytes> {
        None
    }
    fn is_idle(&self) -> bool {
        true
    }
    fn holds_work(&self) -> bool {
        false
    }
    fn settled(&self) -> bool {
        true
    }
    fn started(&self) -> bool {
        true
    }
    fn flush(&mut self) {}
    fn closed(&mut self) {}
}

/// `buf` tracked by [`ByTag`]: what went to the client, and what was
/// held.
fn tracked(buf: &mut BytesMut) -> (Vec<u8>, Option<Vec<u8>>) {
    let proxy = proxy(nowhere());
    let keys = BackendKeys::default();
    let mut out = BytesMut::new();
    let tracked = track_server(&proxy, &mut ByTag, &keys, (buf, &mut out), false).unwrap();
    (out.to_vec(), tracked.held.map(|h| h.frame.to_vec()))
}

#[test]
fn every_message_takes_its_own_route_among_runs_that_go_on_unchanged() {
    let part = |tag: u8, body: &[u8]| msg(tag, body);
    let messages = [
        part(b'1', b""),
        part(b'D', b"row 1"),
        part(b'N', b"notice"),
        part(b'D', b"row 2"),
        part(b'd', b"copy"),
        part(b'T', b"old T"),
        part(b'D', b"row 3"),
        part(b'C', b"SELECT 3\0"),
    ];
    let mut buf = BytesMut::from(&messages.concat()[..]);
    let (out, held) = tracked(&mut buf);
    let expected = [
        &messages[0][..],
        &messages[1],
        &messages[3],
        b"new T",
        &messages[6],
        &messages[7],
    ]
    .concat();
    assert_eq!(out, expected);
    assert_eq!(held, None);
    assert!(buf.is_empty());
}

#[test]
fn a_held_message_stops_the_run_and_what_follows_it_stays_buffered() {
    let before = [
        msg(b'D', b"row 1"),
        msg(b'N', b"notice"),
        msg(b'D', b"row 2"),
    ];
    let hold = msg(b'H', b"held");
    let after = [msg(b'D', b"row 3"), msg(b'C', b"SELECT 3\0")].concat();
    let incomplete = &msg(b'D', b"row 4")[..7];
    let mut buf = BytesMut::from(&[&before.concat()[..], &hold, &after, incomplete].concat()[..]);
    let (out, held) = tracked(&mut buf);
    assert_eq!(out, [&before[0][..], &before[2]].concat());
    assert_eq!(held, Some(hold));
    assert_eq!(&buf[..], &[&after[..], incomplete].concat()[..]);
    // Tracked again later, the rest goes on up to the incomplete row.
    let (out, held) = tracked(&mut buf);
    assert_eq!(out, after);
    assert_eq!(held, None);
    assert_eq!(&buf[..], incomplete);
}

#[test]
fn the_step_of_a_plain_message_is_two_words_wide_and_owns_nothing() {
    // Every server message the guard reads returns a step: its rare parts
    // live behind one pointer, made only for the messages that have them.
    assert!(std::mem::size_of::<ServerStep>() <= 2 * std::mem::size_of::<usize>());
    let mut step = ServerStep::default();
    step.set_replace(None);
    assert_eq!(step.rare, None, "no replacement, nothing made");
    step.set_replace(Some(Bytes::from_static(b"new T")));
    let replace = step.rare.and_then(|r| r.replace);
    assert_eq!(replace.as_deref(), Some(&b"new T"[..]));
}

#[test]
fn a_read_that_goes_on_unchanged_trades_buffers_instead_of_copying() {
    let proxy = proxy(nowhere());
    let keys = BackendKeys::default();
    let messages = [
        msg(b'1', b""),
        msg(b'D', b"row 1"),
        msg(b'C', b"SELECT 1\0"),
    ]
    .concat();
    let mut buf = BytesMut::from(&messages[..]);
    let read_at = buf.as_ptr();
    let mut out = BytesMut::with_capacity(64);
    track_server(&proxy, &mut ByTag, &keys, (&mut buf, &mut out), false).unwrap();
    assert_eq!(&out[..], &messages[..]);
    assert_eq!(out.as_ptr(), read_at, "the bytes read are the bytes sent");
    assert!(buf.is_empty());
    assert!(buf.capacity() >= 64, "the read side keeps the other's room");

    // Something already waiting for the client comes first: the read is
    // appended after it.
    let mut buf = BytesMut::from(&messages[..]);
    let mut out = BytesMut::from(&b"waiting"[..]);
    track_server(&proxy, &mut ByTag, &keys, (&mut buf, &mut out), false).unwrap();
    assert_eq!(&out[..], &[&b"waiting"[..], &messages].concat()[..]);
    assert!(buf.is_empty());
}
