//! COPY FROM STDIN through the tracker as libpq sends it over the
//! extended protocol: the server ignores the Sync it reads in copy-in
//! mode, and the session stays in step.

use super::*;

fn copy_data() -> Vec<u8> {
    msg(b'd', b"1\n")
}

fn copy_done() -> Vec<u8> {
    msg(b'c', b"")
}

fn copy_in_response() -> Vec<u8> {
    msg(b'G', &[0, 0, 0])
}

#[test]
fn extended_copy_from_stdin_answers_one_ready_for_query_for_two_syncs() {
    let mut t = tracker();
    client(
        &mut t,
        &[
            parse("", "copy t from stdin"),
            bind(""),
            execute(""),
            sync(),
        ],
    );
    server(
        &mut t,
        &[msg(b'1', b""), msg(b'2', b""), copy_in_response()],
    );
    client(&mut t, &[copy_data(), copy_done(), sync()]);
    server(&mut t, &[complete("COPY 1"), ready(b'I')]);
    assert!(t.is_idle());
    client(&mut t, &[query("select 1")]);
    server(&mut t, &[complete("SELECT 1"), ready(b'I')]);
    assert!(t.is_idle());
}
