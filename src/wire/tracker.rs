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
//! It is itself the session's guard (`as_guard`): the relay drives it,
//! and the hooks supply what only the layer above can decide.

use std::sync::Arc;

use super::guard::{ClientError, ClientStep, ServerStep};
use super::injected::{Answer, Injection, ANSWERS};
use super::messages::backend::Backend;
use super::messages::extended_query::parse_frame;
use super::messages::frontend::{Frontend, Target};
use super::messages::write::EncodeError;
use super::reject::{raising_query, raising_statement};
use super::response_queue::{Desync, Expect, Progress, ResponseQueue, Route};
use super::sql_commands::{scan, SqlCommand};

mod as_guard;
mod names;
mod sql_changes;
mod unanswered;

pub use super::hooks::{Bound, Hooks, TxnStatus};
pub use super::refusal::{Refusal, FEATURE_NOT_SUPPORTED, INVALID_STATEMENT_NAME};
use names::{
    apply_command, commands_of, Change, Executes, Lookup, Names, Pending, Portal, Statement,
};
use sql_changes::SqlChanges;
use unanswered::Unanswered;

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
        }
    }

    pub fn started(&self) -> bool {
        self.started
    }

    /// Expects the startup exchange, up to the first ReadyForQuery.
    pub fn expect_startup(&mut self) {
        self.queue.push(Expect::Startup, Route::Forward, None);
    }

    pub fn txn_status(&self) -> TxnStatus {
        self.txn
    }

    pub fn is_idle(&self) -> bool {
        self.queue.idle() && self.txn == TxnStatus::Idle
    }

    /// No answer is owed for a message sent before the latest Sync.
    pub fn settled(&self) -> bool {
        self.unanswered.settled(self.segment)
    }

    /// A statement name as the server will see it when it reaches the
    /// message being tracked now.
    fn statement(&self, name: &[u8]) -> Lookup<Statement<H::Statement>> {
        self.unanswered
            .statement(name, self.statements.get(name), self.segment)
    }

    /// A portal name as the server will see it when it reaches the
    /// message being tracked now.
    fn portal(&self, name: &[u8]) -> Lookup<Portal<H::Portal, H::Statement>> {
        self.unanswered
            .portal(name, self.portals.get(name), self.segment)
    }

    /// Routes the rest of the front statement's answer away from the
    /// client (the proxy answered it).
    pub fn swallow_front(&mut self) {
        self.queue.set_front_route(Route::Answered);
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

    /// Tracks one client message on its way to the server.
    pub fn on_client(&mut self, frame: &[u8]) -> Result<ClientStep, ClientError> {
        self.hooks.next_client_message(self.is_idle());
        match Frontend::read(frame) {
            Frontend::Parse {
                name,
                sql,
                param_types,
            } => {
                // Not UTF-8 (another client encoding): the ASCII of SQL
                // syntax is read all the same.
                if let Err(refusal) = self.hooks.admit(&String::from_utf8_lossy(sql)) {
                    // Refused at the Parse: the server raises the error in
                    // its place and skips to Sync; the statement never
                    // exists.
                    return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
                }
                let (statement, replacement) = self.prepare_text(sql);
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
            Frontend::Bind { portal, statement } => self.bind(portal, statement, frame),
            Frontend::Execute { portal } => {
                let binding = match self.portal(portal) {
                    Lookup::Known(b) => b,
                    Lookup::Ambiguous => return Ok(ClientStep::AwaitServer),
                };
                let watch = self
                    .hooks
                    .execute(binding.as_ref().and_then(|b| b.annotation.as_ref()));
                let commands = binding
                    .map(|b| SqlChanges::new(commands_of(&b.commands).iter().cloned(), false))
                    .unwrap_or_default();
                let change = Change::Answer {
                    watch: watch.map(Box::new),
                    commands,
                    resets_unnamed: false,
                };
                self.push(Expect::Execute, Route::Forward, Some(change));
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
                    Target::Portal => match self.portal(name) {
                        Lookup::Known(b) => self
                            .hooks
                            .describe_portal(b.as_ref().and_then(|b| b.annotation.as_ref())),
                        Lookup::Ambiguous => return Ok(ClientStep::AwaitServer),
                    },
                };
                let expect = match target {
                    Target::Statement => Expect::DescribeStatement,
                    Target::Portal => Expect::DescribePortal,
                };
                let change = Change::Answer {
                    watch: watch.map(Box::new),
                    commands: SqlChanges::default(),
                    resets_unnamed: false,
                };
                self.push(expect, Route::Forward, Some(change));
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
            Frontend::Flush | Frontend::Terminate | Frontend::Copy | Frontend::Other(_) => {
                Ok(ClientStep::Forward)
            }
        }
    }

    /// A Parse's text: its statement (annotation, SQL-level commands,
    /// refusal) and the replacement text.
    fn prepare_text(&mut self, sql: &[u8]) -> (Statement<H::Statement>, Option<String>) {
        let Ok(text) = std::str::from_utf8(sql) else {
            // Not UTF-8: the server rejects it.
            return (Statement::new(self.hooks.plain()), None);
        };
        let (annotation, replacement) = self.hooks.parse(text);
        let mut statement = Statement::new(annotation);
        match scan(text) {
            Ok(found) if found.is_empty() => {}
            Ok(found) => {
                // One statement per Parse; its EXECUTEs are checked when a
                // portal of it is bound.
                let mut commands = Vec::with_capacity(found.len());
                for command in found {
                    match self.definition(&command) {
                        Ok(defines) => commands.push((command, defines)),
                        Err(refusal) => {
                            statement.refused = Some(Box::new(refusal));
                            break;
                        }
                    }
                }
                statement.commands = Some(Arc::new(commands));
            }
            Err(e) => statement.refused = Some(Box::new(unreadable(&e.0))),
        }
        (statement, replacement)
    }

    /// Checks a PREPARE or DECLARE body: for PREPARE, the annotation of
    /// the statement it defines.
    fn definition(&mut self, command: &SqlCommand) -> Result<Option<H::Statement>, Refusal> {
        match command {
            SqlCommand::Prepare { inner, .. } => self.hooks.sql_prepare(inner).map(Some),
            SqlCommand::Declare { inner, .. } => self.hooks.sql_declare(inner).map(|_| None),
            _ => Ok(None),
        }
    }

    fn bind(
        &mut self,
        portal: &[u8],
        name: &[u8],
        frame: &[u8],
    ) -> Result<ClientStep, ClientError> {
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
            None => match self.executes(commands_of(&statement.commands), &[]) {
                Executes::Allowed => None,
                Executes::Refused(r) => Some(r),
                Executes::Ambiguous => return Ok(ClientStep::AwaitServer),
            },
        };
        if let Some(refusal) = refused {
            return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
        }
        let (annotation, step) = match self.hooks.bind(&statement.annotation, frame)? {
            Bound::Forward(a) => (a, ClientStep::Forward),
            Bound::Replace(bytes, a) => (a, ClientStep::Replace(bytes)),
            Bound::Guarded {
                injection,
                watch,
                portal,
            } => (
                portal,
                ClientStep::Replace(self.inject(&injection, watch, frame)?),
            ),
            Bound::Refuse(refusal) => {
                return Ok(ClientStep::Replace(self.inject_refusal(&refusal)?));
            }
        };
        let change = Change::Bind {
            portal: portal.to_vec(),
            binding: Portal {
                annotation,
                commands: statement.commands.clone(),
            },
        };
        self.push(Expect::BindComplete, Route::Forward, Some(change));
        Ok(step)
    }

    /// Checks the SQL `EXECUTE`s among `commands`: refused when they run a
    /// statement the hooks refuse, or one the proxy never saw prepared.
    /// `defined`: names (re)defined earlier in the same text.
    fn executes(
        &mut self,
        commands: &[(SqlCommand, Option<H::Statement>)],
        defined: &[(String, Option<H::Statement>)],
    ) -> Executes {
        for (command, _) in commands {
            let SqlCommand::Execute { name } = command else {
                continue;
            };
            let annotation = match defined.iter().rev().find(|(n, _)| n == name) {
                Some((_, s)) => s.clone(),
                None => match self.statement(name.as_bytes()) {
                    Lookup::Known(s) => s.map(|s| s.annotation),
                    Lookup::Ambiguous => return Executes::Ambiguous,
                },
            };
            let Some(annotation) = annotation else {
                return Executes::Refused(never_prepared(name));
            };
            if let Err(refusal) = self.hooks.sql_execute(&annotation) {
                return Executes::Refused(refusal);
            }
        }
        Executes::Allowed
    }

    fn query(&mut self, sql: &[u8]) -> Result<ClientStep, ClientError> {
        let text = std::str::from_utf8(sql).unwrap_or_default();
        let mut commands = Vec::new();
        let mut refusal = self.hooks.admit(&String::from_utf8_lossy(sql)).err();
        let scanned = match refusal {
            Some(_) => Ok(Vec::new()),
            None => scan(text),
        };
        match scanned {
            Ok(found) => {
                let mut defined: Vec<(String, Option<H::Statement>)> = Vec::new();
                for command in found {
                    let entry = [(command, None)];
                    match self.executes(&entry, &defined) {
                        Executes::Allowed => {}
                        Executes::Refused(r) => {
                            refusal = Some(r);
                            break;
                        }
                        Executes::Ambiguous => return Ok(ClientStep::AwaitServer),
                    }
                    let [(command, _)] = entry;
                    let defines = match self.definition(&command) {
                        Ok(d) => d,
                        Err(r) => {
                            refusal = Some(r);
                            break;
                        }
                    };
                    match &command {
                        SqlCommand::Prepare { name, .. } => {
                            defined.push((name.clone(), defines.clone()))
                        }
                        SqlCommand::Deallocate { name } => defined.push((name.clone(), None)),
                        _ => {}
                    }
                    commands.push((command, defines));
                }
            }
            Err(e) => refusal = Some(unreadable(&e.0)),
        }
        let watched = match refusal {
            Some(r) => Err(r),
            None => self.hooks.query(text),
        };
        let (step, watch) = match watched {
            Ok(watch) => (ClientStep::Forward, watch),
            Err(r) => {
                commands.clear();
                let bytes = raising_query(r.sqlstate, &r.message, &r.detail).map_err(unsendable)?;
                (ClientStep::Replace(bytes), None)
            }
        };
        let change = Change::Answer {
            watch: watch.map(Box::new),
            commands: SqlChanges::new(commands, true),
            resets_unnamed: true,
        };
        self.push(Expect::Query, Route::Forward, Some(change));
        self.segment += 1;
        Ok(step)
    }

    /// The bytes that make the server raise `refusal` in place of a Bind
    /// (or a Parse),
    /// with the answers to the injected Parse and Bind swallowed.
    fn inject_refusal(&mut self, refusal: &Refusal) -> Result<Vec<u8>, ClientError> {
        let bytes = raising_statement(refusal.sqlstate, &refusal.message, &refusal.detail)
            .map_err(unsendable)?;
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
        self.push(Expect::Execute, Route::Forward, None);
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

    /// Tracks one server message on its way to the client.
    pub fn on_server(&mut self, frame: &[u8]) -> Result<ServerStep, Desync> {
        let tag = frame.first().copied().unwrap_or(0);
        let message = Backend::read(frame);
        let mut step = ServerStep::default();
        if let Some(Pending {
            change: Change::Answer {
                watch, commands, ..
            },
            ..
        }) = self.queue.front_payload_mut()
        {
            match (message, watch.as_mut()) {
                (Backend::DataRow, Some(w)) => self.hooks.row(w, frame, &mut step),
                (Backend::RowDescription, Some(w)) => {
                    step.replace = self.hooks.row_description(w, frame)
                }
                (Backend::ErrorResponse { .. }, Some(w)) => self.hooks.answer_error(w, frame),
                (Backend::CommandComplete { tag: completion }, _) => {
                    if let Some(confirmed) = commands.confirm_next(completion) {
                        self.unanswered.sql_confirmed(&confirmed, commands);
                        apply_command(&mut self.statements, confirmed.command, confirmed.defines);
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
                self.started = true;
                self.txn = TxnStatus::from_byte(status);
                if self.txn == TxnStatus::Idle {
                    // The transaction ended, and its portals with it.
                    self.portals.clear();
                }
                self.hooks.ready(self.txn);
            }
            // ROLLBACK (also what COMMIT of a failed transaction reports):
            // nothing written in the transaction survives. A savepoint
            // rollback reports the same tag and is treated alike.
            Backend::CommandComplete { tag } if tag.starts_with(b"ROLLBACK") => {
                self.hooks.rollback()
            }
            Backend::BackendKeyData { pid, key } => step.backend_key = Some((pid, key.to_vec())),
            _ => {}
        }
        Ok(step)
    }

    /// Applies a change the server answered (`tag`: with what).
    fn confirm(&mut self, change: Change<H>, tag: u8) {
        match change {
            Change::Define { name, statement } if tag == b'1' => {
                self.statements.insert(name, statement);
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

fn never_prepared(name: &str) -> Refusal {
    Refusal {
        sqlstate: INVALID_STATEMENT_NAME,
        message: format!("prepared statement \"{name}\" does not exist"),
        detail:
            "resumeguard runs only statements prepared on this connection by Parse or SQL PREPARE"
                .into(),
    }
}

/// A message of the proxy's own that cannot be written ends the session.
fn unsendable(error: EncodeError) -> ClientError {
    ClientError(format!("the proxy's statement cannot be sent: {error}"))
}

fn unreadable(error: &str) -> Refusal {
    Refusal {
        sqlstate: FEATURE_NOT_SUPPORTED,
        message: "resumeguard cannot read this text's PREPARE, EXECUTE or DECLARE".into(),
        detail: format!("tokenizer: {error}"),
    }
}

#[cfg(test)]
mod tests;
