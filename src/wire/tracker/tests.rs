//! The tracker driven with a stand-in for the layer above that annotates
//! every text mentioning `guarded` and refuses SQL forms of them: state
//! changes only on the server's answer.

use super::*;
use bytes::Bytes;

/// Hooks that mark texts containing `guarded` and record what they saw.
#[derive(Default)]
struct Marks {
    binds: Vec<bool>,
}

impl Hooks for Marks {
    type Statement = bool;
    type Portal = ();
    type Watch = ();

    fn parse(&mut self, sql: &str) -> (bool, Option<String>) {
        (sql.contains("guarded"), None)
    }
    fn plain(&self) -> bool {
        false
    }
    fn sql_prepare(&mut self, inner: &str) -> Result<bool, Refusal> {
        if inner.contains("guarded") {
            Err(refusal("prepare"))
        } else {
            Ok(false)
        }
    }
    fn sql_execute(&mut self, statement: &bool) -> Result<(), Refusal> {
        if *statement {
            Err(refusal("execute"))
        } else {
            Ok(())
        }
    }
    fn sql_declare(&mut self, inner: &str) -> Result<(), Refusal> {
        self.sql_prepare(inner).map(|_| ())
    }
    fn bind(&mut self, statement: &bool, _frame: &[u8]) -> Result<Bound<()>, ClientError> {
        self.binds.push(*statement);
        Ok(Bound::Forward(statement.then_some(())))
    }
    fn execute(&mut self, _portal: Option<&()>) -> Option<()> {
        None
    }
    fn describe_statement(&mut self, _statement: &bool) -> Option<()> {
        None
    }
    fn describe_portal(&mut self, _portal: Option<&()>) -> Option<()> {
        None
    }
    fn query(&mut self, _sql: &str) -> Result<Option<()>, Refusal> {
        Ok(None)
    }
    fn sync(&mut self) -> Option<Refusal> {
        None
    }
    fn row(&mut self, _watch: &mut (), _frame: &[u8], _step: &mut ServerStep) {}
    fn row_description(&mut self, _watch: &(), _frame: &[u8]) -> Option<Bytes> {
        None
    }
    fn completed(&mut self, _watch: (), _ok: bool) {}
    fn error(&mut self) {}
    fn ready(&mut self, _status: TxnStatus) {}
    fn rollback(&mut self) {}
    fn parameter_status(&mut self, _name: &[u8], _value: &[u8]) {}
}

fn refusal(what: &str) -> Refusal {
    Refusal {
        sqlstate: FEATURE_NOT_SUPPORTED,
        message: format!("refused {what}"),
        detail: String::new(),
    }
}

use crate::wire::frame::message as msg;

fn cs(parts: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    for p in parts {
        b.extend_from_slice(p.as_bytes());
        b.push(0);
    }
    b
}

fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = cs(&[name, sql]);
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'P', &b)
}

fn bind(stmt: &str) -> Vec<u8> {
    let mut b = cs(&["", stmt]);
    b.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    msg(b'B', &b)
}

fn close_statement(name: &str) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.extend(cs(&[name]));
    msg(b'C', &b)
}

fn query(sql: &str) -> Vec<u8> {
    msg(b'Q', &cs(&[sql]))
}

fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

fn complete(tag: &str) -> Vec<u8> {
    msg(b'C', &cs(&[tag]))
}

fn error() -> Vec<u8> {
    msg(b'E', b"SERROR\0VERROR\0C42P05\0Mx\0\0")
}

fn ready(status: u8) -> Vec<u8> {
    msg(b'Z', &[status])
}

fn tracker() -> Tracker<Marks> {
    let mut t = Tracker::new(Marks::default());
    t.expect_startup();
    t.on_server(&ready(b'I')).unwrap();
    t
}

fn client(t: &mut Tracker<Marks>, frames: &[Vec<u8>]) -> Vec<ClientStep> {
    frames.iter().map(|f| t.on_client(f).unwrap()).collect()
}

fn server(t: &mut Tracker<Marks>, frames: &[Vec<u8>]) {
    for f in frames {
        t.on_server(f).unwrap();
    }
}

/// What a Bind of `name` gets now (the hooks record whether they saw a
/// guarded statement).
fn bind_sees(t: &mut Tracker<Marks>, name: &str) -> ClientStep {
    t.hooks.binds.clear();
    t.on_client(&bind(name)).unwrap()
}

fn defined_guarded(t: &mut Tracker<Marks>) {
    client(t, &[parse("s1", "insert guarded"), sync()]);
    server(t, &[msg(b'1', b""), ready(b'I')]);
}

#[test]
fn a_failed_redefinition_keeps_the_confirmed_statement() {
    let mut t = tracker();
    defined_guarded(&mut t);
    // The server refuses to redefine s1 (42P05) and keeps the INSERT.
    client(&mut t, &[parse("s1", "select 1"), sync()]);
    server(&mut t, &[error(), ready(b'I')]);
    assert_eq!(bind_sees(&mut t, "s1"), ClientStep::Forward);
    assert_eq!(t.hooks.binds, [true]);
}

#[test]
fn a_close_skipped_after_an_error_is_not_applied() {
    let mut t = tracker();
    defined_guarded(&mut t);
    client(
        &mut t,
        &[parse("", "bad sql"), close_statement("s1"), sync()],
    );
    server(&mut t, &[error(), ready(b'I')]);
    bind_sees(&mut t, "s1");
    assert_eq!(t.hooks.binds, [true]);
}

#[test]
fn a_close_the_server_confirms_forgets_the_statement() {
    let mut t = tracker();
    defined_guarded(&mut t);
    client(&mut t, &[close_statement("s1"), sync()]);
    server(&mut t, &[msg(b'3', b""), ready(b'I')]);
    // Unknown now: the Bind is refused by the server itself (26000).
    assert!(matches!(bind_sees(&mut t, "s1"), ClientStep::Replace(_)));
    assert!(t.hooks.binds.is_empty());
}

#[test]
fn deallocate_in_an_aborted_transaction_is_not_applied() {
    let mut t = tracker();
    defined_guarded(&mut t);
    client(&mut t, &[query("BEGIN; select 1/0; DEALLOCATE s1")]);
    server(&mut t, &[complete("BEGIN"), error(), ready(b'E')]);
    client(&mut t, &[query("ROLLBACK")]);
    server(&mut t, &[complete("ROLLBACK"), ready(b'I')]);
    bind_sees(&mut t, "s1");
    assert_eq!(t.hooks.binds, [true]);
}

#[test]
fn deallocate_the_server_confirms_is_applied() {
    let mut t = tracker();
    defined_guarded(&mut t);
    client(&mut t, &[query("DEALLOCATE s1")]);
    server(&mut t, &[complete("DEALLOCATE"), ready(b'I')]);
    assert!(matches!(bind_sees(&mut t, "s1"), ClientStep::Replace(_)));
}

#[test]
fn sql_prepare_of_a_guarded_text_is_refused() {
    let mut t = tracker();
    let steps = client(&mut t, &[query("PREPARE s4 AS insert guarded")]);
    let [ClientStep::Replace(bytes)] = steps.as_slice() else {
        panic!("{steps:?}")
    };
    assert_eq!(bytes[0], b'Q', "a raising query replaces it");
    assert!(!String::from_utf8_lossy(bytes).contains("guarded"));
}

#[test]
fn sql_prepare_of_plain_text_defines_the_name_on_its_answer() {
    let mut t = tracker();
    client(&mut t, &[query("PREPARE s4 AS select 1")]);
    server(&mut t, &[complete("PREPARE"), ready(b'I')]);
    assert_eq!(bind_sees(&mut t, "s4"), ClientStep::Forward);
    assert_eq!(t.hooks.binds, [false]);
}

#[test]
fn sql_execute_of_a_guarded_statement_is_refused() {
    let mut t = tracker();
    defined_guarded(&mut t);
    let steps = client(&mut t, &[query("EXECUTE s1('t', 1)")]);
    assert!(matches!(steps[0], ClientStep::Replace(_)), "{steps:?}");
    // Through Parse as well: refused at its Bind.
    server(&mut t, &[error(), ready(b'I')]);
    client(&mut t, &[parse("", "execute s1('t')")]);
    server(&mut t, &[msg(b'1', b"")]);
    assert!(matches!(bind_sees(&mut t, ""), ClientStep::Replace(_)));
}

#[test]
fn sql_execute_of_an_unknown_name_is_refused_and_of_a_plain_one_passes() {
    let mut t = tracker();
    assert!(matches!(
        client(&mut t, &[query("EXECUTE nowhere")])[0],
        ClientStep::Replace(_)
    ));
    let mut t = tracker();
    let steps = client(&mut t, &[query("PREPARE p AS select 1; EXECUTE p")]);
    assert_eq!(steps, [ClientStep::Forward]);
}

#[test]
fn a_bind_waits_when_an_earlier_sync_may_have_changed_its_statement() {
    let mut t = tracker();
    defined_guarded(&mut t);
    // Pipelined: the redefinition's fate is unknown when the Bind arrives.
    let steps = client(&mut t, &[parse("s1", "select 1"), sync()]);
    assert_eq!(steps, [ClientStep::Forward, ClientStep::Forward]);
    assert!(!t.settled());
    assert_eq!(t.on_client(&bind("s1")).unwrap(), ClientStep::AwaitServer);
    server(&mut t, &[error(), ready(b'I')]);
    assert!(t.settled());
    assert_eq!(bind_sees(&mut t, "s1"), ClientStep::Forward);
    assert_eq!(t.hooks.binds, [true]);
}

#[test]
fn a_change_in_the_same_segment_is_certain() {
    let mut t = tracker();
    // If the Parse fails, the server skips the Bind: no need to wait.
    let steps = client(&mut t, &[parse("s2", "insert guarded"), bind("s2")]);
    assert_eq!(steps, [ClientStep::Forward, ClientStep::Forward]);
    assert_eq!(t.hooks.binds, [true]);
}

#[test]
fn changes_that_cannot_matter_never_wait() {
    let mut t = tracker();
    client(&mut t, &[parse("a", "select 1"), sync()]);
    server(&mut t, &[msg(b'1', b""), ready(b'I')]);
    // Whether or not the second Parse succeeds, `a` is plain.
    client(&mut t, &[parse("a", "select 2"), sync()]);
    assert_eq!(t.on_client(&bind("a")).unwrap(), ClientStep::Forward);
}

#[test]
fn discard_all_forgets_every_statement() {
    let mut t = tracker();
    defined_guarded(&mut t);
    client(&mut t, &[query("DISCARD ALL")]);
    server(&mut t, &[complete("DISCARD ALL"), ready(b'I')]);
    assert!(matches!(bind_sees(&mut t, "s1"), ClientStep::Replace(_)));
}

#[test]
fn transaction_status_follows_ready_for_query() {
    let mut t = tracker();
    client(&mut t, &[query("BEGIN")]);
    server(&mut t, &[complete("BEGIN"), ready(b'T')]);
    assert_eq!(t.txn_status(), TxnStatus::InBlock);
    assert!(!t.is_idle());
    client(&mut t, &[query("select 1/0")]);
    server(&mut t, &[error(), ready(b'E')]);
    assert_eq!(t.txn_status(), TxnStatus::Failed);
}

#[test]
fn a_malformed_message_the_server_answers_ends_the_session() {
    let mut t = tracker();
    // A Query without its NUL, a Describe of neither S nor P: PostgreSQL
    // answers them, so forwarding them untracked would shift every answer.
    assert!(t.on_client(&msg(b'Q', b"select 1")).is_err());
    assert!(t.on_client(&msg(b'D', b"Xname\0")).is_err());
    // Messages nobody answers pass as they are.
    assert_eq!(t.on_client(&msg(b'H', b"")).unwrap(), ClientStep::Forward);
}

mod lookups;
