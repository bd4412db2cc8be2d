//! Statement bookkeeping and statements the proxy will not pass blind:
//! DEALLOCATE and Close, undecodable Binds, checkpoint statements no
//! profile recognizes, and session parameters.

use super::*;

#[test]
fn deallocate_all_forgets_named_statements() {
    let mut st = state();
    client(&mut st, &[parse("_pg3_1", WRITE_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    client(&mut st, &[msg(b'Q', b"DEALLOCATE ALL\0")]);
    server(&mut st, &[msg(b'C', b"DEALLOCATE ALL\0"), ready(b'I')]);
    // The name now means nothing to the proxy: even a malformed Bind of it
    // is passed on for the server to judge.
    st.on_client(&msg(b'B', b"\0_pg3_1\0\xff")).unwrap();
}

#[test]
fn close_forgets_a_statement() {
    let mut st = state();
    client(
        &mut st,
        &[parse("s1", WRITE_SQL), msg(b'C', b"Ss1\0"), msg(b'S', b"")],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'3', b""), ready(b'I')]);
    st.on_client(&msg(b'B', b"\0s1\0\xff")).unwrap();
}

#[test]
fn an_undecodable_bind_of_a_checkpoint_statement_fails_closed() {
    let mut st = state();
    client(&mut st, &[parse("s1", WRITE_SQL)]);
    let err = st.on_client(&msg(b'B', b"\0s1\0\0\x01")).unwrap_err();
    assert!(err.to_string().contains("checkpoint statement"), "{err}");
}

#[test]
fn backend_key_and_application_name_are_picked_up() {
    let mut st = state();
    st.0.expect_startup();
    let v = st
        .on_server(&msg(b'K', &[0, 0, 0, 42, 9, 9, 9, 9]))
        .unwrap();
    assert_eq!(v.backend_key, Some((42, vec![9, 9, 9, 9])));
    st.on_server(&msg(b'S', b"application_name\0worker-a\0"))
        .unwrap();
    assert_eq!(st.ctx.application_name, "worker-a");
    let fatal = st
        .on_server(&msg(b'E', b"SFATAL\0VFATAL\0C28P01\0Mno\0\0"))
        .unwrap();
    assert!(fatal.fatal);
}

/// A session whose classifier refuses checkpoint statements no profile
/// recognizes (`[enforce] unknown_saver = "refuse"`).
fn refusing_state() -> SessionState {
    use crate::saver::unknown::UnknownSaverPolicy;
    let classifier = Classifier::new(vec![SaverProfile::langgraph_python()])
        .with_unknown_policy(UnknownSaverPolicy::Refuse);
    SessionState::new(
        Arc::new(classifier),
        Legs::default(),
        SessionContext::default(),
    )
}

#[test]
fn an_unknown_checkpoint_statement_is_refused_under_refuse() {
    let mut st = refusing_state();
    // Extended protocol: the server raises the refusal in place of the Bind.
    client(
        &mut st,
        &[parse("u1", "UPDATE checkpoints SET metadata = '{}'")],
    );
    let injected = st
        .on_client(&bind("u1", &[], &[], &[]))
        .unwrap()
        .expect("refused at Bind");
    assert_eq!(
        &injected[..1],
        b"P",
        "a raising statement replaces the Bind"
    );
    // Simple query: the whole text is replaced by a raising one.
    let replaced = st
        .on_client(&msg(
            b'Q',
            b"DELETE FROM checkpoints WHERE metadata ? 'x'\0",
        ))
        .unwrap()
        .expect("refused");
    assert_eq!(replaced[0], b'Q');
    assert!(!String::from_utf8_lossy(&replaced).contains("DELETE FROM"));
    // Recognized and ordinary traffic passes.
    assert_eq!(st.on_client(&msg(b'Q', b"select 1\0")).unwrap(), None);
    assert_eq!(st.on_client(&parse("w", WRITE_SQL)).unwrap(), None);
}

#[test]
fn an_unknown_checkpoint_statement_passes_under_warn() {
    let mut st = state();
    client(
        &mut st,
        &[parse("u1", "UPDATE checkpoints SET metadata = '{}'")],
    );
    assert_eq!(st.on_client(&bind("u1", &[], &[], &[])).unwrap(), None);
    assert_eq!(
        st.on_client(&msg(
            b'Q',
            b"DELETE FROM checkpoints WHERE metadata ? 'x'\0"
        ))
        .unwrap(),
        None
    );
}

#[test]
fn a_parse_text_sent_again_prepares_the_same_and_the_next_text_anew() {
    let mut st = state();
    for _ in 0..2 {
        let (plain, rewrite) = Hooks::parse(&mut *st, "COMMIT");
        assert_eq!(plain.ends_transaction, Some(TransactionEnd::Commit));
        assert!(!plain.class.kind.is_checkpoint_traffic() && rewrite.is_none());
    }
    for _ in 0..2 {
        let (write, _) = Hooks::parse(&mut *st, WRITE_SQL);
        assert!(write.class.kind.is_checkpoint_traffic());
        assert_eq!(write.ends_transaction, None);
    }
    assert_eq!(Hooks::parse(&mut *st, "select 1").0.ends_transaction, None);
}
