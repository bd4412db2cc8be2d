//! What a session's writes leave for the audit and the claims store:
//! only what commits, at the ReadyForQuery that says so.

use super::*;

#[test]
fn a_committed_interrupt_write_is_audited_at_ready_for_query() {
    let mut st = state();
    client(
        &mut st,
        &[
            parse("_pg3_1", WRITE_SQL),
            interrupt_bind("_pg3_1"),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'2', b""), msg(b'n', b"")]);
    server(&mut st, &[msg(b'C', b"INSERT 0 1\0")]);
    assert!(
        ops(&mut st).is_empty(),
        "not durable before the Sync's answer"
    );
    server(&mut st, &[ready(b'I')]);
    let events = std::mem::take(&mut st.ready_events);
    let kinds: Vec<_> = events.iter().map(|e| e.operation).collect();
    assert_eq!(kinds, [Operation::WritesPut, Operation::InterruptParked]);
    assert_eq!(events[0].thread_id.as_deref(), Some("t1"));
    assert_eq!(events[0].task_id.as_deref(), Some("task-1"));
    assert_eq!(events[0].blob_sha256.len(), 1);
    assert!(st.is_idle());
}

#[test]
fn a_failed_segment_records_no_write() {
    let mut st = state();
    client(
        &mut st,
        &[
            parse("_pg3_1", WRITE_SQL),
            interrupt_bind("_pg3_1"),
            msg(b'D', b"P\0"),
            execute(),
            interrupt_bind("_pg3_1"),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            msg(b'E', b"SERROR\0C23505\0Mduplicate\0\0"),
            ready(b'I'),
        ],
    );
    assert!(
        ops(&mut st).is_empty(),
        "the first write rolled back with the segment"
    );
    assert!(st.is_idle());
}

#[test]
fn writes_in_an_explicit_transaction_wait_for_commit() {
    let mut st = state();
    client(&mut st, &[msg(b'Q', b"BEGIN\0")]);
    server(&mut st, &[msg(b'C', b"BEGIN\0"), ready(b'T')]);
    client(
        &mut st,
        &[
            parse("", WRITE_SQL),
            interrupt_bind(""),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'T'),
        ],
    );
    assert!(ops(&mut st).is_empty());
    assert!(!st.is_idle(), "a transaction is open");
    client(&mut st, &[msg(b'Q', b"COMMIT\0")]);
    server(&mut st, &[msg(b'C', b"COMMIT\0"), ready(b'I')]);
    assert_eq!(
        ops(&mut st),
        [Operation::WritesPut, Operation::InterruptParked]
    );
}

#[test]
fn rolled_back_transaction_records_nothing() {
    let mut st = state();
    client(&mut st, &[msg(b'Q', b"BEGIN\0")]);
    server(&mut st, &[msg(b'C', b"BEGIN\0"), ready(b'T')]);
    client(
        &mut st,
        &[
            parse("", WRITE_SQL),
            interrupt_bind(""),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'T'),
        ],
    );
    client(&mut st, &[msg(b'Q', b"ROLLBACK\0")]);
    server(&mut st, &[msg(b'C', b"ROLLBACK\0"), ready(b'I')]);
    assert!(ops(&mut st).is_empty());
}

/// An interrupt write inside the open transaction block, answered.
fn write_in_block(st: &mut SessionState) {
    client(
        st,
        &[
            parse("", WRITE_SQL),
            interrupt_bind(""),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'T'),
        ],
    );
}

/// A simple Query the server completes with `tag`, leaving the
/// transaction in `status`.
fn simple(st: &mut SessionState, sql: &str, tag: &str, status: u8) {
    client(st, &[msg(b'Q', format!("{sql}\0").as_bytes())]);
    server(
        st,
        &[msg(b'C', format!("{tag}\0").as_bytes()), ready(status)],
    );
}

#[test]
fn a_write_before_a_savepoint_commits_after_a_rollback_to_it() {
    let mut st = state();
    simple(&mut st, "BEGIN", "BEGIN", b'T');
    write_in_block(&mut st);
    simple(&mut st, "SAVEPOINT _pg3_1", "SAVEPOINT", b'T');
    client(&mut st, &[msg(b'Q', b"SELECT 1/0\0")]);
    let failed = msg(b'E', b"SERROR\0C22012\0Mdivision by zero\0\0");
    server(&mut st, &[failed, ready(b'E')]);
    simple(&mut st, "ROLLBACK TO _pg3_1", "ROLLBACK", b'T');
    assert!(ops(&mut st).is_empty(), "not before the commit");
    simple(&mut st, "COMMIT", "COMMIT", b'I');
    assert_eq!(
        ops(&mut st),
        [Operation::WritesPut, Operation::InterruptParked]
    );
}

/// An interrupt write in savepoint `a`, which `end` ends, then a commit:
/// the operations recorded.
fn write_in_savepoint(end: &[(&str, &str)]) -> Vec<Operation> {
    let mut st = state();
    simple(&mut st, "BEGIN", "BEGIN", b'T');
    simple(&mut st, "SAVEPOINT a", "SAVEPOINT", b'T');
    write_in_block(&mut st);
    for (sql, tag) in end {
        simple(&mut st, sql, tag, b'T');
    }
    simple(&mut st, "COMMIT", "COMMIT", b'I');
    ops(&mut st)
}

#[test]
fn a_write_a_rollback_to_undid_is_not_recorded() {
    let undone = [
        ("ROLLBACK TO SAVEPOINT a", "ROLLBACK"),
        ("RELEASE a", "RELEASE"),
    ];
    assert!(write_in_savepoint(&undone).is_empty());
}

#[test]
fn a_write_in_a_released_savepoint_commits_with_the_transaction() {
    assert_eq!(
        write_in_savepoint(&[("RELEASE a", "RELEASE")]),
        [Operation::WritesPut, Operation::InterruptParked]
    );
}

#[test]
fn a_whole_rollback_before_a_rollback_to_in_one_text_drops_the_writes() {
    let mut st = state();
    simple(&mut st, "BEGIN", "BEGIN", b'T');
    write_in_block(&mut st);
    client(
        &mut st,
        &[msg(b'Q', b"SAVEPOINT a; ROLLBACK; ROLLBACK TO a\0")],
    );
    let no_transaction = msg(b'E', b"SERROR\0C25P01\0Mno transaction\0\0");
    server(
        &mut st,
        &[
            msg(b'C', b"SAVEPOINT\0"),
            msg(b'C', b"ROLLBACK\0"),
            no_transaction,
            ready(b'I'),
        ],
    );
    assert!(ops(&mut st).is_empty());
    assert!(st.is_idle());
}

#[test]
fn a_rollback_to_an_unknown_savepoint_drops_the_writes_and_audits_their_evidence_lost() {
    let mut st = claiming_state(&[], "app");
    simple(&mut st, "BEGIN", "BEGIN", b'T');
    client(
        &mut st,
        &[
            parse("c", PUT_SQL),
            put_bind_of(b"ck2", Some(b"ck1")),
            execute(),
            msg(b'S', b""),
        ],
    );
    let put = [
        msg(b'1', b""),
        msg(b'2', b""),
        msg(b'C', b"INSERT 0 1\0"),
        ready(b'T'),
    ];
    server(&mut st, &put);
    // Set where the proxy could not read it (say a spelling it does not
    // fold as the server does): the server knows it, the session does not.
    simple(&mut st, "ROLLBACK TO b", "ROLLBACK", b'T');
    let lost = std::mem::take(&mut st.ready_events);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].operation, Operation::EvidenceLost);
    assert_eq!(lost[0].thread_id.as_deref(), Some("t1"));
    assert_eq!(lost[0].detail["reason"], "unknown_savepoint");
    simple(&mut st, "COMMIT", "COMMIT", b'I');
    assert!(ops(&mut st).is_empty(), "the put is not acted on");
}

#[test]
fn a_blob_write_that_inserted_no_row_is_recorded_as_not_written_and_counted() {
    // The same blob key twice: the server keeps the first row
    // (`ON CONFLICT … DO NOTHING`) and answers the second `INSERT 0 0`.
    let blob_put = |st: &mut SessionState, tag: &[u8]| {
        client(st, &[blob_bind(b"\x91\xc0"), execute(), msg(b'S', b"")]);
        server(st, &[msg(b'2', b""), msg(b'C', tag), ready(b'I')]);
        std::mem::take(&mut st.ready_events)
    };
    let mut st = state();
    client(&mut st, &[parse("b", BLOB_SQL)]);
    server(&mut st, &[msg(b'1', b"")]);
    let (events, counted) = crate::test_metrics::recorded(|| {
        let written = blob_put(&mut st, b"INSERT 0 1\0");
        let kept = blob_put(&mut st, b"INSERT 0 0\0");
        (written, kept)
    });
    let (written, kept) = events;
    for (events, detail) in [(&written, None), (&kept, Some(false))] {
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].operation, Operation::BlobPut);
        assert_eq!(events[0].detail["written"].as_bool(), detail, "{events:?}");
    }
    assert!(
        crate::test_metrics::has_line(&counted, "resumeguard_blobs_kept_total 1"),
        "{counted}"
    );
}
