//! Savepoint commands reach the hooks as what the server confirmed: each
//! at its own CommandComplete, in text order, never one the server skipped,
//! and a `ROLLBACK TO` never as a whole rollback.

use super::{
    bind, client, complete, error, execute, msg, parse, query, ready, server, sync, tracker,
};

fn told(t: &super::Tracker<super::Marks>) -> Vec<&str> {
    t.hooks.transaction.iter().map(String::as_str).collect()
}

#[test]
fn each_savepoint_command_is_told_at_its_completion() {
    let mut t = tracker();
    client(
        &mut t,
        &[query(
            "BEGIN; SAVEPOINT a; select 1; ROLLBACK TO a; RELEASE SAVEPOINT A; ROLLBACK",
        )],
    );
    server(&mut t, &[complete("BEGIN"), complete("SAVEPOINT")]);
    assert_eq!(told(&t), ["set a"]);
    server(
        &mut t,
        &[
            complete("SELECT 1"),
            complete("ROLLBACK"),
            complete("RELEASE"),
            complete("ROLLBACK"),
            ready(b'I'),
        ],
    );
    assert_eq!(
        told(&t),
        ["set a", "rolled back to a", "released a", "rollback"]
    );
}

/// `BEGIN; SAVEPOINT a; select 1/0` and then `rest` in one Query, the
/// division failing: the block is left failed.
fn failed_in_savepoint(t: &mut super::Tracker<super::Marks>, rest: &str) {
    client(
        t,
        &[query(&format!("BEGIN; SAVEPOINT a; select 1/0{rest}"))],
    );
    let answer = [
        complete("BEGIN"),
        complete("SAVEPOINT"),
        error(),
        ready(b'E'),
    ];
    server(t, &answer);
}

#[test]
fn a_savepoint_command_the_server_skipped_is_never_told() {
    let mut t = tracker();
    failed_in_savepoint(&mut t, "; RELEASE a");
    assert_eq!(told(&t), ["set a"]);
    client(&mut t, &[query("ROLLBACK TO a")]);
    server(&mut t, &[complete("ROLLBACK"), ready(b'T')]);
    assert_eq!(told(&t), ["set a", "rolled back to a"]);
}

#[test]
fn a_prepared_rollback_to_is_told_at_each_execute_that_completes() {
    let mut t = tracker();
    client(&mut t, &[query("BEGIN; SAVEPOINT _pg3_1")]);
    server(
        &mut t,
        &[complete("BEGIN"), complete("SAVEPOINT"), ready(b'T')],
    );
    client(
        &mut t,
        &[
            parse("r", "ROLLBACK TO SAVEPOINT _pg3_1"),
            bind("r"),
            execute(""),
            sync(),
        ],
    );
    server(
        &mut t,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            complete("ROLLBACK"),
            ready(b'T'),
        ],
    );
    assert_eq!(told(&t), ["set _pg3_1", "rolled back to _pg3_1"]);
    // A second run fails (say the savepoint was released meanwhile): not
    // told, and no whole rollback either.
    client(&mut t, &[bind("r"), execute(""), sync()]);
    server(&mut t, &[msg(b'2', b""), error(), ready(b'E')]);
    assert_eq!(told(&t), ["set _pg3_1", "rolled back to _pg3_1"]);
}

#[test]
fn a_failed_commit_is_a_whole_rollback() {
    let mut t = tracker();
    failed_in_savepoint(&mut t, "");
    client(&mut t, &[query("COMMIT")]);
    server(&mut t, &[complete("ROLLBACK"), ready(b'I')]);
    assert_eq!(told(&t), ["set a", "rollback"]);
}
