//! Which server messages stream past the guard, and what of them goes on
//! at once: a real session guard (the Python saver's profile).

use bytes::BytesMut;

use super::stream_server;
use crate::saver::classify::saver_sql::SELECT_SQL;
use crate::wire::client_relay::tests::{msg, session};
use crate::wire::connection::{Passing, STREAM_ABOVE};
use crate::wire::guard::Guard;

#[test]
fn a_row_nobody_watches_streams_from_its_front() {
    let mut st = session();
    st.on_client(&msg(b'Q', b"select repeat('x', 1000000)\0"))
        .unwrap();
    st.on_server(&msg(b'T', b"\0\0")).unwrap();
    assert!(Guard::server_streams(&mut st, b'D'));
    let row = msg(b'D', &vec![b'x'; 4 * STREAM_ABOVE]);
    let mut buf = BytesMut::from(&row[..1000]);
    let mut out = BytesMut::new();
    let passing = stream_server(&mut st, &mut buf, &mut out, row.len()).unwrap();
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
    st.on_client(&msg(b'Q', sql.as_bytes())).unwrap();
    st.on_server(&msg(b'T', b"\0\0")).unwrap();
    assert!(!Guard::server_streams(&mut st, b'D'));
    assert!(!Guard::server_streams(&mut st, b'd'));
}

#[test]
fn only_rows_and_copy_data_stream() {
    let mut st = session();
    st.on_client(&msg(b'Q', b"select 1\0")).unwrap();
    for tag in [b'T', b'C', b'E', b'N', b'Z', b'S', b'A'] {
        assert!(!Guard::server_streams(&mut st, tag), "{}", tag as char);
    }
}
