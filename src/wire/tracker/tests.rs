//! The tracker driven with a stand-in for the layer above that annotates
//! every text mentioning `guarded` and refuses SQL forms of them: state
//! changes only on the server's answer.

use super::*;
use bytes::Bytes;

/// Hooks that mark texts containing `guarded` and record what they saw.
#[derive(Default)]
struct Marks {
    binds: Vec<bool>,
    /// Binds of marked statements run the proxy's own statement first.
    guard: bool,
    /// A marked Parse text reaches the server with `guarded` rewritten.
    rewrite: bool,
    /// What the guard's watch saw: errors, then completions (ok or not).
    guard_errors: usize,
    guard_completed: Vec<bool>,
    /// Whole rollbacks and savepoint changes, in order.
    transaction: Vec<String>,
}

impl Hooks for Marks {
    type Statement = bool;
    type Portal = ();
    /// Whether the answer watched is the guard's.
    type Watch = bool;

    fn admit(&mut self, sql: &str) -> Result<(), Refusal> {
        match sql.contains("forbidden") {
            true => Err(refusal("text")),
            false => Ok(()),
        }
    }
    fn parse(&mut self, sql: &str) -> (bool, Option<String>) {
        let marked = sql.contains("guarded");
        let rewritten = (marked && self.rewrite).then(|| sql.replace("guarded", "rewritten"));
        (marked, rewritten)
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
    fn sql_fetch(&mut self, _portal: &()) -> Result<(), Refusal> {
        Err(refusal("fetch"))
    }
    fn query_refused(&mut self) {}
    fn bind(&mut self, statement: &bool, _bind: &Bind<'_>) -> Result<Bound<(), bool>, ClientError> {
        self.binds.push(*statement);
        if self.guard && *statement {
            return Ok(Bound::Guarded(Box::new(Guarded {
                injection: Injection {
                    sql: "SELECT check($1)".into(),
                    params: vec![Some("t".into())],
                },
                watch: true,
                portal: Some(()),
            })));
        }
        Ok(Bound::Forward(statement.then_some(())))
    }
    fn execute(&mut self, _portal: Option<&()>) -> Option<bool> {
        None
    }
    fn describe_statement(&mut self, _statement: &bool) -> Option<bool> {
        None
    }
    fn describe_portal(&mut self, _portal: Option<&()>) -> Option<bool> {
        None
    }
    fn query(&mut self, _sql: &str) -> Result<Option<bool>, Refusal> {
        Ok(None)
    }
    fn sync(&mut self) -> Option<Refusal> {
        None
    }
    fn row(&mut self, _watch: &mut bool, _frame: &[u8], _step: &mut ServerStep) {}
    fn row_description(&mut self, _watch: &bool, _frame: &[u8]) -> Option<Bytes> {
        None
    }
    fn completed(&mut self, watch: bool, ok: bool) {
        if watch {
            self.guard_completed.push(ok);
        }
    }
    fn answer_error(&mut self, watch: &mut bool, _frame: &[u8]) {
        if *watch {
            self.guard_errors += 1;
        }
    }
    fn error(&mut self) {}
    fn ready(&mut self, _status: TxnStatus) {}
    fn rollback(&mut self) {
        self.transaction.push("rollback".into());
    }
    fn savepoint(&mut self, change: SavepointChange<'_>) {
        let (what, name) = match change {
            SavepointChange::Set(name) => ("set", name),
            SavepointChange::Released(name) => ("released", name),
            SavepointChange::RolledBackTo(name) => ("rolled back to", name),
        };
        self.transaction
            .push(format!("{what} {}", String::from_utf8_lossy(name)));
    }
    fn parameter_status(&mut self, _name: &[u8], _value: &[u8]) {}
}

fn refusal(what: &str) -> Refusal {
    Refusal {
        sqlstate: FEATURE_NOT_SUPPORTED,
        message: format!("refused {what}"),
        detail: String::new(),
    }
}

use crate::wire::connection::message as msg;

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

fn bind_to(portal: &str, statement: &str) -> Vec<u8> {
    let mut b = cs(&[portal, statement]);
    b.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    msg(b'B', &b)
}

fn execute(portal: &str) -> Vec<u8> {
    let mut b = cs(&[portal]);
    b.extend_from_slice(&0i32.to_be_bytes());
    msg(b'E', &b)
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

/// A tracker whose session is inside a transaction block.
fn in_block() -> Tracker<Marks> {
    let mut t = tracker();
    client(&mut t, &[query("BEGIN")]);
    server(&mut t, &[complete("BEGIN"), ready(b'T')]);
    t
}

fn client(t: &mut Tracker<Marks>, frames: &[Vec<u8>]) -> Vec<ClientStep> {
    frames
        .iter()
        .map(|f| t.on_client(f, false).unwrap())
        .collect()
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
    t.on_client(&bind(name), false).unwrap()
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
fn a_failed_parse_of_the_unnamed_statement_drops_the_previous_one() {
    let mut t = tracker();
    client(&mut t, &[parse("", "insert guarded"), sync()]);
    server(&mut t, &[msg(b'1', b""), ready(b'I')]);
    // PostgreSQL drops the unnamed statement before it parses the new text.
    client(&mut t, &[parse("", "bad sql"), sync()]);
    server(&mut t, &[error(), ready(b'I')]);
    bind_sees(&mut t, "");
    assert_eq!(t.hooks.binds, [false]);
}

#[test]
fn a_parse_of_the_unnamed_statement_skipped_after_an_error_keeps_it() {
    let mut t = tracker();
    client(&mut t, &[parse("", "insert guarded"), sync()]);
    server(&mut t, &[msg(b'1', b""), ready(b'I')]);
    // The Parse never reaches the server's parser: nothing is dropped.
    client(
        &mut t,
        &[parse("s1", "bad sql"), parse("", "select 1"), sync()],
    );
    server(&mut t, &[error(), ready(b'I')]);
    bind_sees(&mut t, "");
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

/// `sql` refused as a simple Query and, in a Parse, at its Bind (`after`:
/// the transaction status the refusal leaves).
fn refused_as_query_and_at_bind(t: &mut Tracker<Marks>, sql: &str, after: u8) {
    let steps = client(t, &[query(sql)]);
    assert!(
        matches!(steps[0], ClientStep::Replace(_)),
        "{sql}: {steps:?}"
    );
    server(t, &[error(), ready(after)]);
    client(t, &[parse("", sql)]);
    server(t, &[msg(b'1', b"")]);
    assert!(matches!(bind_sees(t, ""), ClientStep::Replace(_)), "{sql}");
}

#[test]
fn sql_execute_of_a_guarded_statement_is_refused() {
    let mut t = tracker();
    defined_guarded(&mut t);
    refused_as_query_and_at_bind(&mut t, "EXECUTE s1('t', 1)", b'I');
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
fn sql_fetch_of_a_watched_portal_is_refused_and_of_a_plain_one_passes() {
    let mut t = tracker();
    defined_guarded(&mut t);
    client(&mut t, &[query("BEGIN")]);
    server(&mut t, &[complete("BEGIN"), ready(b'T')]);
    let bound = [
        bind_to("w", "s1"),
        parse("p", "select 1"),
        bind_to("q", "p"),
        sync(),
    ];
    client(&mut t, &bound);
    // Before the server answers the Binds, which portals exist is not
    // known yet: the text waits.
    assert_eq!(
        t.on_client(&query("FETCH ALL FROM w"), false).unwrap(),
        ClientStep::AwaitServer
    );
    let answers = [msg(b'2', b""), msg(b'1', b""), msg(b'2', b""), ready(b'T')];
    server(&mut t, &answers);
    refused_as_query_and_at_bind(&mut t, "FETCH ALL FROM w", b'E');

    let mut t = in_block();
    client(&mut t, &bound[1..]);
    server(&mut t, &answers[1..]);
    let steps = client(&mut t, &[query("FETCH 10 FROM q; fetch all from nowhere")]);
    assert_eq!(steps, [ClientStep::Forward]);
}

#[test]
fn an_execute_of_an_unnamed_portal_no_bind_made_gets_the_servers_error_from_the_proxy() {
    let mut t = in_block();
    // Bound and executed in one pipeline: the Bind's answer is owed.
    let steps = client(
        &mut t,
        &[parse("", "select 1"), bind(""), execute(""), sync()],
    );
    assert!(steps.iter().all(|s| *s == ClientStep::Forward), "{steps:?}");
    server(
        &mut t,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            complete("SELECT 1"),
            ready(b'T'),
        ],
    );
    // The tracker drops the unnamed portal at a Query's answer (the server
    // keeps it through an empty Query): an Execute of it is refused
    // rather than run unseen.
    client(&mut t, &[query("select 2")]);
    server(&mut t, &[complete("SELECT 1"), ready(b'T')]);
    let steps = client(&mut t, &[execute("")]);
    let [ClientStep::Replace(bytes)] = steps.as_slice() else {
        panic!("{steps:?}")
    };
    let text = String::from_utf8_lossy(bytes);
    assert!(text.contains(&hex::encode("34000")), "{text}");
    // A named portal the tracker does not know may be a SQL cursor.
    assert_eq!(client(&mut t, &[execute("c")]), [ClientStep::Forward]);
}

#[test]
fn a_parse_text_sent_again_is_read_as_the_first_time_and_the_next_text_anew() {
    let mut t = tracker();
    for _ in 0..2 {
        assert_eq!(
            client(&mut t, &[parse("", "select 1")]),
            [ClientStep::Forward]
        );
        server(&mut t, &[msg(b'1', b"")]);
        assert_eq!(bind_sees(&mut t, ""), ClientStep::Forward);
        server(&mut t, &[msg(b'2', b"")]);
    }
    client(&mut t, &[parse("", "EXECUTE nowhere")]);
    server(&mut t, &[msg(b'1', b"")]);
    assert!(matches!(bind_sees(&mut t, ""), ClientStep::Replace(_)));
}

#[test]
fn a_bind_waits_when_an_earlier_sync_may_have_changed_its_statement() {
    let mut t = tracker();
    defined_guarded(&mut t);
    // Pipelined: the redefinition's fate is unknown when the Bind arrives.
    let steps = client(&mut t, &[parse("s1", "select 1"), sync()]);
    assert_eq!(steps, [ClientStep::Forward, ClientStep::Forward]);
    assert!(!t.settled());
    assert_eq!(
        t.on_client(&bind("s1"), false).unwrap(),
        ClientStep::AwaitServer
    );
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
    assert_eq!(t.on_client(&bind("a"), false).unwrap(), ClientStep::Forward);
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
fn a_query_drops_an_unnamed_statement_confirmed_or_still_unanswered() {
    let mut t = tracker();
    // Nothing unnamed exists: the answer changes nothing to follow.
    client(&mut t, &[query("select 1")]);
    assert!(t.unanswered.is_empty());
    assert!(t.settled());
    server(&mut t, &[complete("SELECT 1"), ready(b'I')]);

    // Confirmed before the Query.
    client(&mut t, &[parse("", "insert guarded"), sync()]);
    server(&mut t, &[msg(b'1', b""), ready(b'I')]);
    client(&mut t, &[query("select 1")]);
    assert!(!t.unanswered.is_empty());
    server(&mut t, &[complete("SELECT 1"), ready(b'I')]);
    bind_sees(&mut t, "");
    assert_eq!(t.hooks.binds, [false]);
    client(&mut t, &[sync()]);
    server(&mut t, &[msg(b'2', b""), ready(b'I')]);

    // Still unanswered when the Query is sent.
    client(
        &mut t,
        &[parse("", "insert guarded"), sync(), query("select 1")],
    );
    server(
        &mut t,
        &[
            msg(b'1', b""),
            ready(b'I'),
            complete("SELECT 1"),
            ready(b'I'),
        ],
    );
    bind_sees(&mut t, "");
    assert_eq!(t.hooks.binds, [false]);
}

#[test]
fn a_query_in_a_transaction_drops_the_unnamed_portal() {
    let mut t = in_block();
    client(&mut t, &[parse("s", "select 1"), bind("s"), sync()]);
    server(&mut t, &[msg(b'1', b""), msg(b'2', b""), ready(b'T')]);
    // The portal outlives its Sync inside the transaction; the Query
    // drops it, so its answer carries that change.
    client(&mut t, &[query("select 1")]);
    assert!(!t.unanswered.is_empty());
    server(&mut t, &[complete("SELECT 1"), ready(b'T')]);
    assert!(t.unanswered.is_empty());
}

#[test]
fn transaction_status_follows_ready_for_query() {
    let mut t = in_block();
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
    assert!(t.on_client(&msg(b'Q', b"select 1"), false).is_err());
    assert!(t.on_client(&msg(b'D', b"Xname\0"), false).is_err());
    // Messages nobody answers pass as they are.
    assert_eq!(
        t.on_client(&msg(b'H', b""), false).unwrap(),
        ClientStep::Forward
    );
}

#[test]
fn a_text_the_hooks_refuse_fails_at_its_parse_and_is_never_defined() {
    use super::super::response_queue::Route;
    let mut t = tracker();
    let steps = client(&mut t, &[parse("s1", "delete forbidden"), sync()]);
    let ClientStep::Replace(bytes) = &steps[0] else {
        panic!("{:?}", steps[0]);
    };
    // The server gets a raising Parse/Bind/Execute in place of the Parse.
    let raised = crate::wire::reject::readable(bytes);
    assert!(
        raised.contains("refused text") && !raised.contains("forbidden"),
        "{raised}"
    );
    assert_eq!(steps[1], ClientStep::Forward);
    // Its ParseComplete and BindComplete are the proxy's; the client hears
    // the error where its ParseComplete would be, then ReadyForQuery.
    let routes: Vec<Route> = [msg(b'1', b""), msg(b'2', b""), error(), ready(b'I')]
        .iter()
        .map(|f| t.on_server(f).unwrap().route)
        .collect();
    assert_eq!(
        routes,
        [
            Route::Swallow,
            Route::Swallow,
            Route::Forward,
            Route::Forward
        ]
    );
    // s1 never existed: its Bind is refused as never prepared.
    assert!(matches!(bind_sees(&mut t, "s1"), ClientStep::Replace(_)));
    assert!(t.hooks.binds.is_empty());
}

#[test]
fn a_query_text_the_hooks_refuse_never_reaches_the_server() {
    let mut t = tracker();
    let step = t
        .on_client(&query("delete forbidden; prepare p as select 1"), false)
        .unwrap();
    let ClientStep::Replace(bytes) = step else {
        panic!("{step:?}");
    };
    assert_eq!(bytes[0], b'Q');
    let sql = String::from_utf8_lossy(&bytes);
    assert!(
        !sql.contains("forbidden") && sql.contains("RAISE EXCEPTION"),
        "{sql}"
    );
    server(&mut t, &[error(), ready(b'I')]);
    // Nothing of the text was applied: p is not defined.
    assert!(matches!(bind_sees(&mut t, "p"), ClientStep::Replace(_)));
}

fn routes(t: &mut Tracker<Marks>, frames: &[Vec<u8>]) -> Vec<Route> {
    frames
        .iter()
        .map(|f| t.on_server(f).unwrap().route)
        .collect()
}

fn data_row() -> Vec<u8> {
    msg(b'D', &[0, 1, 0, 0, 0, 0])
}

/// A tracker whose hooks guard marked Binds, after a guarded Bind of s1
/// (and a Sync): what the Bind became.
fn guarded_bind_sent() -> (Tracker<Marks>, ClientStep) {
    let mut t = tracker();
    t.hooks.guard = true;
    defined_guarded(&mut t);
    let step = bind_sees(&mut t, "s1");
    client(&mut t, &[sync()]);
    (t, step)
}

#[test]
fn a_guarded_bind_sends_the_proxys_statement_first_and_hides_its_answers() {
    let (mut t, step) = guarded_bind_sent();
    let ClientStep::Replace(bytes) = step else {
        panic!("{step:?}");
    };
    // The proxy's six messages, then the client's Bind as sent.
    let tags: Vec<u8> = crate::wire::connection::messages(&bytes)
        .iter()
        .map(|m| m[0])
        .collect();
    assert_eq!(tags, b"CPBECCB");
    assert!(bytes.ends_with(&bind("s1")));
    let got = routes(
        &mut t,
        &[
            msg(b'3', b""),
            msg(b'1', b""),
            msg(b'2', b""),
            data_row(),
            complete("SELECT 1"),
            msg(b'3', b""),
            msg(b'3', b""),
            msg(b'2', b""),
            ready(b'I'),
        ],
    );
    use Route::{Forward as F, Swallow as S};
    assert_eq!(got, [S, S, S, S, S, S, S, F, F]);
    assert_eq!(t.hooks.guard_completed, [true]);
    assert_eq!(t.hooks.guard_errors, 0);
}

#[test]
fn the_error_of_the_proxys_statement_is_the_clients_answer() {
    let (mut t, _) = guarded_bind_sent();
    // The check raises: the server skips the rest up to Sync.
    let got = routes(
        &mut t,
        &[
            msg(b'3', b""),
            msg(b'1', b""),
            msg(b'2', b""),
            error(),
            ready(b'I'),
        ],
    );
    use Route::{Forward as F, Swallow as S};
    assert_eq!(got, [S, S, S, F, F]);
    assert_eq!(t.hooks.guard_errors, 1);
    assert_eq!(t.hooks.guard_completed, [false]);
    assert!(t.is_idle());
}

#[test]
fn an_error_at_the_proxys_parse_still_reaches_the_client() {
    let (mut t, _) = guarded_bind_sent();
    let got = routes(&mut t, &[msg(b'3', b""), error(), ready(b'I')]);
    use Route::{Forward as F, Swallow as S};
    assert_eq!(got, [S, F, F]);
    assert!(t.is_idle());
}

mod client_encoding;
mod copy_in;
mod lookups;
mod savepoints;
