//! The protocol tracker: a session's prepared statements, portals and
//! transaction status as the server has confirmed them, and the queue of
//! answers it still owes.
//!
//! A client message only proposes a change. A Parse defines its statement
//! when the server answers ParseComplete, a Bind its portal at
//! BindComplete, a Close at CloseComplete, SQL `PREPARE` / `DEALLOCATE` at
//! their CommandComplete; whatever the server skipped after an error is
//! dropped with its queue entry and never applied. A message that names a
//! statement whose fate hangs on an earlier Sync's answers waits for them.
//!
//! The tracker knows nothing of what the layer above watches for: it asks
//! its [`Hooks`] to annotate statements and portals and to watch responses.
//! It is itself the session's guard: its [`Guard`] methods are the entry
//! points the relay drives, and the hooks supply what only the layer above
//! can decide. The SQL text of a Parse or Query is read in `sql_text`,
//! in whatever encoding the client sends it (see [`client_text`]).

use bytes::Bytes;

use super::client_text;
use super::guard::{ClientError, ClientStep, Guard, ServerStep};
use super::injected::{Answer, Injection, ANSWERS};
use super::last_text::LastText;
use super::messages::backend::Backend;
use super::messages::bind::Bind;
use super::messages::error_response::error_fields;
use super::messages::extended_query::{parse_frame, FLUSH, SYNC};
use super::messages::frontend::{Frontend, Target};
use super::messages::read::HEADER_LEN;
use super::messages::write::EncodeError;
use super::reject::raising_statement;
use super::response_queue::{Desync, Expect, Progress, ResponseQueue, Route};

mod names;
mod sql_changes;
mod sql_text;
mod unanswered;

pub use super::hooks::{Bound, Guarded, Hooks, SavepointChange, TxnStatus};
pub use super::refusal::{
    Refusal, FEATURE_NOT_SUPPORTED, INVALID_STATEMENT_NAME, UNDEFINED_CURSOR,
};
use names::{
    apply_command, commands_of, Change, Executes, Lookup, Names, Pending, Portal, Statement,
};
use sql_changes::SqlChanges;
use unanswered::Unanswered;

/// The ReadyForQuery of a failed transaction block.
const FAILED_BLOCK_READY: &[u8] = b"Z\0\0\0\x05E";

/// How much of a Bind's body may hold its portal and statement names.
const BIND_NAMES_WITHIN: usize = 64 * 1024;

pub struct Tracker<H: Hooks> {
    pub hooks: H,
    queue: ResponseQueue<Pending<H>>,
    /// What the changes in `queue` will do, by name.
    unanswered: Unanswered<H>,
    statements: Names<Statement<H::Statement>>,
    portals: Names<Portal<H::Portal, H::Statement>>,
    segment: u64,
    txn: TxnStatus,
    /// The first ReadyForQuery arrived: authentication is over.
    started: bool,
    /// The last Parse text found without SQL-level commands.
    plain_text: LastText<()>,
    /// The error the proxy answered a statement with in place of its
    /// answer, which the server raises before it reads the client's next
    /// message: in the statement's own segment, or (`sync`) in one of its
    /// own, to fail the transaction block the statement ran in.
    fail_next: Option<Failing>,
    /// The error the proxy answered a statement with, in a segment the
    /// server had ended: if that segment's ReadyForQuery says a
    /// transaction block is open, the client is told it failed, and the
    /// server fails it before the client's next message.
    fail_at_ready: Option<Bytes>,
    /// An Execute or a Query the proxy may refuse was sent, and not all
    /// of what was sent up to it is answered yet.
    behind_refusable: Option<BehindRefusable>,
}

/// An error the server raises for the proxy before the client's next
/// message; with `sync`, followed by a Sync of the proxy's.
#[derive(Debug)]
struct Failing {
    error: Bytes,
    sync: bool,
}

/// Where the client sent an Execute or a Query the proxy may answer with
/// a refusal in place of a row: what it sends behind it waits until the
/// server answered everything sent (within the statement's segment, a
/// Flush of the proxy's asks it to) and the row is decided, so that a
/// refusal fails it as PostgreSQL fails what follows an error: the rest
/// of the segment, or of the transaction block the segment left open.
#[derive(Debug, Clone, Copy)]
struct BehindRefusable {
    segment: u64,
    /// The proxy's Flush went to the server after it.
    flushed: bool,
}

impl BehindRefusable {
    fn at(segment: u64) -> Self {
        BehindRefusable {
            segment,
            flushed: false,
        }
    }
}

impl<H: Hooks> Tracker<H> {
    pub fn new(hooks: H) -> Self {
        Tracker {
            hooks,
            queue: ResponseQueue::new(),
            unanswered: Unanswered::default(),
            statements: Names::default(),
            portals: Names::default(),
            segment: 0,
            txn: TxnStatus::Idle,
            started: false,
            plain_text: LastText::default(),
            fail_next: None,
            fail_at_ready: None,
            behind_refusable: None,
        }
    }

    /// Expects the startup exchange, up to the first ReadyForQuery.
    pub fn expect_startup(&mut self) {
        self.queue.push(Expect::Startup, Route::Forward, None);
    }

    pub fn txn_status(&self) -> TxnStatus {
        self.txn
    }

    /// A statement name as the server will see it when it reaches the
    /// message being tracked now.
    fn statement(&self, name: &[u8]) -> Lookup<Statement<H::Statement>> {
        match self
            .unanswered
            .statement(name, self.statements.get(name), self.segment)
        {
            Lookup::Known(s) => Lookup::Known(s.cloned()),
            Lookup::Ambiguous => Lookup::Ambiguous,
        }
    }

    /// Whether an unnamed statement or portal exists, or may exist once
    /// the server answers what it was sent: a simple Query drops both.
    fn unnamed_in_use(&self) -> bool {
        self.statements.get(b"").is_some()
            || self.portals.get(b"").is_some()
            || self.unanswered.names_unnamed()
    }

    /// The proxy answered the front statement with `error` in place of
    /// the rest of its answer, which is routed away from the client. When
    /// the server has not ended the statement's pipeline segment (no Sync
    /// sent since), what it ran there after the statement is routed away
    /// too, and the server raises the error before the client's next
    /// message: it skips to Sync, as PostgreSQL does after a failed
    /// statement, and the segment's transaction fails. When it has, the
    /// segment's ReadyForQuery decides (a transaction block still open
    /// must fail, as after an error).
    pub fn answered_front(&mut self, error: &Bytes) {
        if self.queue.answer_front() {
            self.fail_next = Some(Failing {
                error: error.clone(),
                sync: false,
            });
            // What follows fails at the server: nothing waits to learn it.
            self.behind_refusable = None;
        } else {
            self.fail_at_ready = Some(error.clone());
        }
    }

    /// What the relay does with a client message behind an Execute (or a
    /// Query) the proxy may refuse: any message goes on once the server
    /// answered everything sent (the decision is made, or none was
    /// needed), and a Terminate always. Until then, in the statement's own
    /// segment a Sync or a Flush goes on, and any other message waits
    /// behind a Flush of the proxy's (unless the client sent one); past
    /// the segment's end every message waits for its ReadyForQuery, which
    /// says whether a transaction block the refusal fails is open.
    fn behind_refusable(&mut self, message: &Frontend<'_>) -> Option<ClientStep> {
        let behind = self.behind_refusable.as_mut()?;
        if self.queue.is_empty() {
            self.behind_refusable = None;
            return None;
        }
        let ended = behind.segment != self.segment;
        match message {
            Frontend::Terminate => return None,
            Frontend::Flush if !ended => {
                behind.flushed = true;
                return None;
            }
            Frontend::Sync if !ended => return None,
            _ => {}
        }
        if !ended && !behind.flushed {
            behind.flushed = true;
            return Some(ClientStep::Inject(FLUSH.to_vec()));
        }
        Some(ClientStep::AwaitServer)
    }

    fn push(&mut self, expect: Expect, route: Route, change: Option<Change<H>>) {
        let payload = change.map(|change| Pending {
            segment: self.segment,
            change,
        });
        if self.queue.push(expect, route, payload) {
            if let Some(pending) = self.queue.back_payload() {
                self.unanswered.add(pending);
            }
        }
    }

    fn bind(&mut self, bind: &Bind<'_>, frame: &[u8]) -> Result<ClientStep, ClientError> {
        let name = bind.statement;
        let statement = match self.statement(name) {
            Lookup::Ambiguous => return Ok(ClientStep::AwaitServer),
            Lookup::Known(Some(s)) => s,
            Lookup::Known(None) if name.is_empty() => Statement::new(self.hooks.plain()),
            Lookup::Known(None) => {
                let refusal = never_prepared(&String::from_utf8_lossy(name));
                return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
            }
        };
        let refused = match &statement.refused {
            Some(r) => Some(Refusal::clone(r)),
            // A text without SQL commands runs no EXECUTE to check.
            None => match statement.commands.as_deref() {
                None => None,
                Some(commands) => match self.executes(commands, &[]) {
                    Executes::Allowed => None,
                    Executes::Refused(r) => Some(r),
                    Executes::Ambiguous => return Ok(ClientStep::AwaitServer),
                },
            },
        };
        if let Some(refusal) = refused {
            return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
        }
        let (annotation, step) = match self.hooks.bind(&statement.annotation, bind)? {
            Bound::Forward(a) => (a, ClientStep::Forward),
            Bound::Replace(bytes, a) => (a, ClientStep::Replace(bytes)),
            Bound::Guarded(guarded) => {
                let Guarded {
                    injection,
                    watch,
                    portal,
                } = *guarded;
                (
                    portal,
                    ClientStep::Replace(self.inject(&injection, watch, frame)?),
                )
            }
            Bound::Refuse(refusal) => {
                return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
            }
        };
        let change = Change::Bind {
            portal: bind.portal.to_vec(),
            binding: Portal {
                annotation: annotation.map(Box::new),
                commands: statement.commands.clone(),
            },
        };
        self.push(Expect::BindComplete, Route::Forward, Some(change));
        Ok(step)
    }

    /// The bytes that make the server raise `refusal` in place of a Bind
    /// (or a Parse),
    /// with the answers to the injected Parse and Bind swallowed.
    fn inject_refusal(&mut self, refusal: &Refusal) -> Result<Vec<u8>, ClientError> {
        let raised = [refusal.sqlstate, &refusal.message, &refusal.detail];
        self.inject_raise(raised, Route::Forward)
    }

    /// The bytes that make the server raise the error the proxy already
    /// answered the client with (then Sync, with `sync`): nothing of what
    /// they are answered reaches the client.
    fn inject_answered(&mut self, failing: &Failing) -> Result<Vec<u8>, ClientError> {
        let field = |code: u8| {
            error_fields(&failing.error)
                .find(|&(c, _)| c == code)
                .map(|(_, text)| String::from_utf8_lossy(text))
                .unwrap_or_default()
        };
        let raised = [&*field(b'C'), &*field(b'M'), &*field(b'D')];
        let mut bytes = self.inject_raise(raised, Route::Answered)?;
        if failing.sync {
            bytes.extend_from_slice(SYNC);
            self.push(Expect::Sync, Route::Swallow, None);
            self.segment += 1;
        }
        Ok(bytes)
    }

    /// The bytes that make the server raise `[sqlstate, message, detail]`,
    /// the answers to the injected Parse and Bind swallowed, the error
    /// routed by `route`.
    fn inject_raise(&mut self, raised: [&str; 3], route: Route) -> Result<Vec<u8>, ClientError> {
        let [sqlstate, message, detail] = raised;
        let bytes = raising_statement(sqlstate, message, detail).map_err(unsendable)?;
        let define = Change::Define {
            name: Vec::new(),
            statement: Statement::new(self.hooks.plain()),
        };
        self.push(Expect::ParseComplete, Route::Swallow, Some(define));
        let bind = Change::Bind {
            portal: Vec::new(),
            binding: Portal {
                annotation: None,
                commands: None,
            },
        };
        self.push(Expect::BindComplete, Route::Swallow, Some(bind));
        self.push(Expect::Execute, route, None);
        Ok(bytes)
    }

    /// The proxy's own statement ahead of the client's Bind `frame`: its
    /// answers are queued swallowed (the Execute's watched, so an error
    /// reaches the client) and the bytes to send are returned.
    fn inject(
        &mut self,
        injection: &Injection,
        watch: H::Watch,
        frame: &[u8],
    ) -> Result<Vec<u8>, ClientError> {
        let mut bytes = injection.encode().map_err(unsendable)?;
        let mut watch = Some(watch);
        for answer in ANSWERS {
            let (expect, change) = match answer {
                Answer::Close => (Expect::CloseComplete, None),
                Answer::Parse => (Expect::ParseComplete, None),
                Answer::Bind => (Expect::BindComplete, None),
                Answer::Execute => (
                    Expect::Execute,
                    watch.take().map(|w| Change::Answer {
                        watch: Some(Box::new(w)),
                        commands: SqlChanges::default(),
                        resets_unnamed: false,
                    }),
                ),
            };
            self.push(expect, Route::Swallow, change);
        }
        bytes.extend_from_slice(frame);
        Ok(bytes)
    }

    /// Applies a change the server answered (`tag`: with what).
    fn confirm(&mut self, change: Change<H>, tag: u8) {
        match change {
            Change::Define { name, statement } if tag == b'1' => {
                self.statements.insert(name, statement);
            }
            // The server drops the unnamed statement before it parses the
            // text that replaces it, so a failed Parse leaves none.
            Change::Define { name, .. } if tag == b'E' && name.is_empty() => {
                self.statements.remove(b"");
            }
            Change::Bind { portal, binding } if tag == b'2' => {
                self.portals.insert(portal, binding);
            }
            Change::Close {
                target: Target::Statement,
                name,
            } if tag == b'3' => {
                self.statements.remove(&name);
            }
            Change::Close {
                target: Target::Portal,
                name,
            } if tag == b'3' => {
                self.portals.remove(&name);
            }
            Change::Answer {
                watch,
                resets_unnamed,
                ..
            } => {
                if resets_unnamed {
                    self.statements.remove(b"");
                    self.portals.remove(b"");
                }
                if let Some(w) = watch {
                    self.hooks.completed(*w, tag != b'E');
                }
            }
            _ => {}
        }
    }
}

impl<H: Hooks> Guard for Tracker<H>
where
    Tracker<H>: Send,
{
    /// Tracks one client message on its way to the server. Only a
    /// statement text can make a session's later hooks reach a store: a
    /// Parse's or a Query's (a Query carries SQL PREPARE and DECLARE with
    /// their statements); on a loop, the hooks are asked before anything
    /// is tracked.
    fn on_client(&mut self, frame: &[u8], on_loop: bool) -> Result<ClientStep, ClientError> {
        if let Some(failing) = self.fail_next.take() {
            // Decided and failed at the server: nothing waits to learn it.
            self.behind_refusable = None;
            return Ok(ClientStep::Inject(self.inject_answered(&failing)?));
        }
        let message = Frontend::read(frame);
        if let Some(step) = self.behind_refusable(&message) {
            return Ok(step);
        }
        if on_loop {
            if let Frontend::Parse { sql, .. } | Frontend::Query { sql } = &message {
                if self.hooks.may_block(sql) {
                    return Ok(ClientStep::Blocks);
                }
            }
        }
        self.hooks.next_client_message(self.is_idle());
        match message {
            Frontend::Parse {
                name,
                sql,
                param_types,
            } => {
                let text = client_text::decode(sql);
                if let Err(refusal) = self.hooks.admit(&text) {
                    // Refused at the Parse: the server raises the error in
                    // its place and skips to Sync; the statement never
                    // exists.
                    return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
                }
                let (statement, replacement) = self.prepare_text(&text);
                let step = match replacement {
                    Some(new_sql) => ClientStep::Replace(
                        parse_frame(name, &new_sql, param_types).map_err(unsendable)?,
                    ),
                    None => ClientStep::Forward,
                };
                let change = Change::Define {
                    name: name.to_vec(),
                    statement,
                };
                self.push(Expect::ParseComplete, Route::Forward, Some(change));
                Ok(step)
            }
            Frontend::Bind(bind) => self.bind(&bind, frame),
            Frontend::Execute { portal } => {
                // The portal as the server will see it (read in place: the
                // hooks are a field of their own).
                let binding =
                    match self
                        .unanswered
                        .portal(portal, self.portals.get(portal), self.segment)
                    {
                        Lookup::Known(b) => b,
                        Lookup::Ambiguous => return Ok(ClientStep::AwaitServer),
                    };
                // Only a Bind makes the unnamed portal (a cursor cannot be
                // named ""), and every Bind is tracked: one the tracker
                // does not know of is either not there, or left by a text
                // the server read otherwise than the tracker (an empty
                // Query keeps it; a Query that fails to parse too). The
                // server's own error, without asking it.
                if binding.is_none() && portal.is_empty() {
                    return Ok(ClientStep::Replace(
                        self.inject_refusal(&no_unnamed_portal())?,
                    ));
                }
                let watch = self
                    .hooks
                    .execute(binding.and_then(|b| b.annotation.as_deref()));
                if watch.as_ref().is_some_and(|w| self.hooks.may_refuse(w)) {
                    self.behind_refusable = Some(BehindRefusable::at(self.segment));
                }
                let commands = binding
                    .map(|b| SqlChanges::new(commands_of(&b.commands).iter().cloned(), false))
                    .unwrap_or_default();
                self.push(
                    Expect::Execute,
                    Route::Forward,
                    Change::answer(watch, commands, false),
                );
                Ok(ClientStep::Forward)
            }
            Frontend::Describe { target, name } => {
                let watch = match target {
                    Target::Statement => match self.statement(name) {
                        Lookup::Known(s) => {
                            let s = s.map_or_else(|| self.hooks.plain(), |s| s.annotation);
                            self.hooks.describe_statement(&s)
                        }
                        Lookup::Ambiguous => return Ok(ClientStep::AwaitServer),
                    },
                    Target::Portal => {
                        match self
                            .unanswered
                            .portal(name, self.portals.get(name), self.segment)
                        {
                            Lookup::Known(b) => self
                                .hooks
                                .describe_portal(b.and_then(|b| b.annotation.as_deref())),
                            Lookup::Ambiguous => return Ok(ClientStep::AwaitServer),
                        }
                    }
                };
                let expect = match target {
                    Target::Statement => Expect::DescribeStatement,
                    Target::Portal => Expect::DescribePortal,
                };
                let change = Change::answer(watch, SqlChanges::default(), false);
                self.push(expect, Route::Forward, change);
                Ok(ClientStep::Forward)
            }
            Frontend::Close { target, name } => {
                let change = Change::Close {
                    target,
                    name: name.to_vec(),
                };
                self.push(Expect::CloseComplete, Route::Forward, Some(change));
                Ok(ClientStep::Forward)
            }
            Frontend::Query { sql } => self.query(sql),
            Frontend::Sync => {
                let mut step = ClientStep::Forward;
                if let Some(refusal) = self.hooks.sync() {
                    let mut bytes = self.inject_refusal(&refusal)?;
                    bytes.extend_from_slice(frame);
                    step = ClientStep::Replace(bytes);
                }
                self.push(Expect::Sync, Route::Forward, None);
                self.segment += 1;
                Ok(step)
            }
            Frontend::FunctionCall => {
                self.hooks.function_call();
                self.push(Expect::FunctionCall, Route::Forward, None);
                self.segment += 1;
                Ok(ClientStep::Forward)
            }
            // A message of a type the server answers whose body does not
            // read: the server answers it anyway, and every answer after
            // it would be matched one request off. The session ends.
            Frontend::Other(tag) if b"PBEDCQ".contains(&tag) => Err(ClientError(format!(
                "malformed {} message",
                char::from(tag)
            ))),
            Frontend::CopyEnd => {
                self.queue.copy_ended();
                Ok(ClientStep::Forward)
            }
            Frontend::Flush | Frontend::Terminate | Frontend::CopyData | Frontend::Other(_) => {
                Ok(ClientStep::Forward)
            }
        }
    }

    /// Tracks one server message on its way to the client.
    fn on_server(&mut self, frame: &[u8]) -> Result<ServerStep, Desync> {
        let tag = frame.first().copied().unwrap_or(0);
        let message = Backend::read(frame);
        let mut step = ServerStep::default();
        // A savepoint command this message confirmed: a `ROLLBACK TO`'s tag
        // is not a whole rollback's. (The tag of a whole ROLLBACK earlier in
        // the same text is taken for a later `ROLLBACK TO`'s confirmation;
        // that `ROLLBACK TO` then fails, its savepoint gone with the
        // transaction, and the failure drops what the transaction wrote, as
        // the whole rollback would have.)
        let mut savepoint_confirmed = false;
        // Nothing the proxy answered itself holds a row for a decision:
        // the client never sees it.
        let answered = self
            .queue
            .front()
            .is_some_and(|front| front.route == Route::Answered);
        if let Some(Pending {
            change: Change::Answer {
                watch, commands, ..
            },
            ..
        }) = self.queue.front_payload_mut()
        {
            match (message, watch.as_mut()) {
                (Backend::DataRow, Some(w)) if !answered => self.hooks.row(w, frame, &mut step),
                (Backend::RowDescription, Some(w)) => {
                    step.set_replace(self.hooks.row_description(w, frame))
                }
                (Backend::ErrorResponse { .. }, Some(w)) => self.hooks.answer_error(w, frame),
                (Backend::CommandComplete { tag: completion }, watch) => {
                    if let Some(w) = watch {
                        self.hooks.command_complete(w, completion);
                    }
                    if let Some(confirmed) = commands.confirm_next(completion) {
                        self.unanswered.sql_confirmed(&confirmed, commands);
                        match confirmed.command.savepoint() {
                            Some(change) => {
                                savepoint_confirmed = true;
                                self.hooks.savepoint(change);
                            }
                            None => apply_command(
                                &mut self.statements,
                                confirmed.command,
                                confirmed.defines,
                            ),
                        }
                    }
                }
                _ => {}
            }
        }
        let unanswered = &mut self.unanswered;
        let progress = self.queue.on_server_with(tag, |left| {
            if let Some(pending) = &left.payload {
                unanswered.forget_oldest(pending);
            }
        })?;
        match progress {
            Progress::Async => {
                if let Backend::ParameterStatus { name, value } = message {
                    self.hooks.parameter_status(name, value);
                }
            }
            Progress::Within { route } => step.route = route,
            Progress::Completed { route, done } => {
                step.route = route;
                if let Some(pending) = done.payload {
                    self.confirm(pending.change, tag);
                }
            }
        }
        if let Some(error) = step.answer() {
            let error = error.clone();
            self.answered_front(&error);
        }
        // A request the proxy injected failed: the server skips the
        // client's messages up to Sync, so this error is the client's
        // answer.
        if tag == b'E' && step.route == Route::Swallow {
            step.route = Route::Forward;
        }
        match message {
            Backend::ErrorResponse { fatal } => {
                self.hooks.error();
                step.fatal = fatal;
            }
            Backend::ReadyForQuery { status } => {
                if let Some(error) = self.fail_at_ready.take() {
                    if status == b'T' {
                        // The block goes on at the server until the
                        // proxy's raise, sent before anything else.
                        step.set_replace(Some(Bytes::from_static(FAILED_BLOCK_READY)));
                        self.fail_next = Some(Failing { error, sync: true });
                    }
                }
                self.started = true;
                self.txn = TxnStatus::from_byte(status);
                if self.txn == TxnStatus::Idle {
                    // The transaction ended, and its portals with it.
                    self.portals.clear();
                }
                self.hooks.ready(self.txn);
                if self.queue.idle() {
                    self.hooks.drained();
                }
            }
            // ROLLBACK (also what COMMIT of a failed transaction reports):
            // nothing written in the transaction survives. A `ROLLBACK TO`
            // reports the same tag, and was told to the hooks as what it is.
            Backend::CommandComplete { tag }
                if tag.starts_with(b"ROLLBACK") && !savepoint_confirmed =>
            {
                self.hooks.rollback()
            }
            Backend::BackendKeyData { pid, key } => step.set_backend_key(pid, key.to_vec()),
            _ => {}
        }
        Ok(step)
    }

    /// CopyData and FunctionCall bodies are never read; a Bind's only when
    /// the hooks read the parameters of the statement it names (a Bind
    /// that waits for earlier answers is asked again after them); anything
    /// else (Parse, Query: their text) is read whole.
    fn client_streams(&mut self, prefix: &[u8]) -> bool {
        match prefix.first() {
            Some(b'd' | b'F') => true,
            Some(b'B') => {
                // The names open the body; longer ones than this are
                // offered whole.
                let front = prefix.get(HEADER_LEN..).unwrap_or_default();
                let front = &front[..front.len().min(BIND_NAMES_WITHIN)];
                let Ok(bind) = Bind::read_body(front) else {
                    return false;
                };
                let name = bind.statement;
                match self.statement(name) {
                    Lookup::Ambiguous => true,
                    Lookup::Known(Some(s)) => !self.hooks.reads_bind(&s.annotation),
                    Lookup::Known(None) if name.is_empty() => {
                        !self.hooks.reads_bind(&self.hooks.plain())
                    }
                    // Never prepared: refused without reading it.
                    Lookup::Known(None) => true,
                }
            }
            _ => false,
        }
    }

    /// A DataRow or CopyData belongs to the front Execute or Query; with
    /// no watch on that answer, it takes the answer's route and changes
    /// nothing (the queue reads it as within the answer).
    fn unwatched_row(&self, tag: u8) -> Option<Route> {
        if !matches!(tag, b'D' | b'd') {
            return None;
        }
        let front = self.queue.front()?;
        let unwatched = match &front.payload {
            Some(Pending {
                change: Change::Answer { watch, .. },
                ..
            }) => watch.is_none(),
            Some(_) => false,
            None => true,
        };
        (unwatched && matches!(front.expect, Expect::Execute | Expect::Query))
            .then_some(front.route)
    }

    fn release(&mut self) -> Option<Bytes> {
        let refusal = self.hooks.release();
        if let Some(error) = &refusal {
            // The refused message's statement must not reach the client:
            // the rest of its answer is swallowed.
            self.answered_front(error);
        }
        refusal
    }

    fn is_idle(&self) -> bool {
        self.queue.idle() && self.txn == TxnStatus::Idle
    }

    fn holds_work(&self) -> bool {
        self.hooks.holds_work()
    }

    /// No change, and no watched answer, is owed for a message sent
    /// before the latest Sync; behind a statement the proxy may refuse,
    /// once a Sync or the proxy's Flush went after it, no answer at all.
    fn settled(&self) -> bool {
        let waits_behind_refusable = self
            .behind_refusable
            .is_some_and(|b| (b.segment != self.segment || b.flushed) && !self.queue.is_empty());
        self.unanswered.settled(self.segment) && !waits_behind_refusable
    }

    fn started(&self) -> bool {
        self.started
    }

    fn flush(&mut self) {
        self.hooks.flush()
    }

    fn closed(&mut self) {
        self.hooks.closed()
    }
}

/// An `EXECUTE` (or Bind) of a statement the proxy never saw prepared.
fn never_prepared(name: &str) -> Refusal {
    Refusal {
        sqlstate: INVALID_STATEMENT_NAME,
        message: format!("prepared statement \"{name}\" does not exist"),
        detail:
            "resumeguard runs only statements prepared on this connection by Parse or SQL PREPARE"
                .into(),
    }
}

/// An Execute of the unnamed portal where the proxy saw none bound.
fn no_unnamed_portal() -> Refusal {
    Refusal {
        sqlstate: UNDEFINED_CURSOR,
        message: "portal \"\" does not exist".into(),
        detail: "resumeguard runs only the unnamed portal a Bind on this connection made".into(),
    }
}

/// A message of the proxy's own that cannot be written ends the session.
fn unsendable(error: EncodeError) -> ClientError {
    ClientError(format!("the proxy's statement cannot be sent: {error}"))
}

#[cfg(test)]
mod tests;
