//! Per-session protocol state: which SQL each prepared statement holds,
//! what each portal is bound to, the queue of expected responses, the
//! transaction status, and the audit events waiting for their commit.
//!
//! Everything here is synchronous and free of I/O: the relay feeds it one
//! framed message at a time and routes what it decides.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::backend::is_fatal;
use super::frame::cstr;
use super::response_queue::{Desync, Progress, ResponseQueue, Route};
use super::watch::Watch;
use crate::audit::{AuditEvent, SessionContext};
use crate::saver::bind::BoundParams;
use crate::saver::classify::{Classified, Classifier, StatementKind};
use crate::saver::decode_error::DecodeError;

/// A portal bound to a checkpoint statement (ordinary portals are not
/// remembered at all).
#[derive(Debug, Clone)]
struct Binding {
    class: Arc<Classified>,
    bound: Arc<BoundParams>,
}

/// A client message the proxy cannot let through.
#[derive(Debug)]
pub enum ClientError {
    /// A Bind of a checkpoint statement that does not decode: enforcement
    /// would be blind to it, so the session fails closed.
    UndecodableBind(DecodeError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::UndecodableBind(e) => {
                write!(f, "malformed Bind for a checkpoint statement: {e}")
            }
        }
    }
}

/// What the relay does with one server message.
#[derive(Debug, PartialEq, Eq)]
pub struct ServerVerdict {
    pub route: Route,
    /// Synthesized messages to send before this one.
    pub before: Vec<Bytes>,
    /// The message is a FATAL error: the server closes next.
    pub fatal: bool,
    /// BackendKeyData seen: (pid, key) for cancel routing.
    pub backend_key: Option<(i32, Vec<u8>)>,
}

pub struct SessionState {
    classifier: Arc<Classifier>,
    pub queue: ResponseQueue<Watch>,
    statements: HashMap<String, Arc<Classified>>,
    unnamed_statement: Arc<Classified>,
    portals: HashMap<String, Binding>,
    unnamed_portal: Option<Binding>,
    /// ReadyForQuery status: `I` idle, `T` in a transaction, `E` failed.
    pub txn_status: u8,
    pub ctx: SessionContext,
    /// Events of writes that have not committed yet.
    uncommitted: Vec<AuditEvent>,
    /// Events ready for the audit sink.
    pub ready_events: Vec<AuditEvent>,
    segment_failed: bool,
}

impl SessionState {
    pub fn new(classifier: Arc<Classifier>, ctx: SessionContext) -> Self {
        let other = classifier.other();
        SessionState {
            classifier,
            queue: ResponseQueue::new(),
            statements: HashMap::new(),
            unnamed_statement: other,
            portals: HashMap::new(),
            unnamed_portal: None,
            txn_status: b'I',
            ctx,
            uncommitted: Vec::new(),
            ready_events: Vec::new(),
            segment_failed: false,
        }
    }

    /// True when nothing is outstanding and no transaction is open: the
    /// session can be closed without losing work.
    pub fn is_idle(&self) -> bool {
        self.queue.idle() && self.txn_status == b'I'
    }

    /// Tracks one client message on its way to the server.
    pub fn on_client(&mut self, frame: &[u8]) -> Result<(), ClientError> {
        let tag = frame[0];
        let body = &frame[5..];
        match tag {
            b'P' => {
                if let Some((name, rest)) = cstr(body) {
                    let class = match cstr(rest).map(|(q, _)| std::str::from_utf8(q)) {
                        Some(Ok(sql)) => self.classifier.classify(sql),
                        // Not UTF-8: the server rejects it; nothing to enforce.
                        _ => self.classifier.other(),
                    };
                    if name.is_empty() {
                        self.unnamed_statement = class;
                    } else {
                        self.statements
                            .insert(String::from_utf8_lossy(name).into_owned(), class);
                    }
                }
                self.queue.push_for_client(tag, 0, None);
            }
            b'B' => {
                let (portal, stmt) = match cstr(body).and_then(|(p, rest)| Some((p, cstr(rest)?.0)))
                {
                    Some(names) => names,
                    None => (&b""[..], &b""[..]),
                };
                let class = self.statement(stmt);
                let binding = if class.kind.is_checkpoint_traffic() {
                    let bound = BoundParams::decode(frame).map_err(ClientError::UndecodableBind)?;
                    Some(Binding {
                        class,
                        bound: Arc::new(bound),
                    })
                } else {
                    None
                };
                if portal.is_empty() {
                    self.unnamed_portal = binding;
                } else {
                    let name = String::from_utf8_lossy(portal).into_owned();
                    match binding {
                        Some(b) => {
                            self.portals.insert(name, b);
                        }
                        None => {
                            self.portals.remove(&name);
                        }
                    }
                }
                self.queue.push_for_client(tag, 0, None);
            }
            b'E' => {
                let portal = cstr(body).map(|(p, _)| p).unwrap_or_default();
                let binding = if portal.is_empty() {
                    self.unnamed_portal.as_ref()
                } else {
                    std::str::from_utf8(portal)
                        .ok()
                        .and_then(|p| self.portals.get(p))
                };
                let watch =
                    binding.map(|b| Watch::new(Arc::clone(&b.class), Some(Arc::clone(&b.bound))));
                self.queue.push_for_client(tag, 0, watch);
            }
            b'D' => {
                let target = body.first().copied().unwrap_or(b'P');
                self.queue.push_for_client(tag, target, None);
            }
            b'C' => {
                if let (Some(&target), Some((name, _))) =
                    (body.first(), cstr(&body[1.min(body.len())..]))
                {
                    let name = String::from_utf8_lossy(name);
                    match (target, name.is_empty()) {
                        (b'S', true) => self.unnamed_statement = self.classifier.other(),
                        (b'S', false) => {
                            self.statements.remove(name.as_ref());
                        }
                        (_, true) => self.unnamed_portal = None,
                        (_, false) => {
                            self.portals.remove(name.as_ref());
                        }
                    }
                }
                self.queue.push_for_client(tag, 0, None);
            }
            b'Q' => {
                // A simple query replaces the unnamed statement and portal.
                self.unnamed_statement = self.classifier.other();
                self.unnamed_portal = None;
                let sql = cstr(body)
                    .and_then(|(q, _)| std::str::from_utf8(q).ok())
                    .unwrap_or_default();
                self.forget_deallocated(sql);
                let class = self.classifier.classify(sql);
                let watch = class
                    .kind
                    .is_checkpoint_traffic()
                    .then(|| Watch::new(class, None));
                self.queue.push_for_client(tag, 0, watch);
            }
            _ => {
                self.queue.push_for_client(tag, 0, None);
            }
        }
        Ok(())
    }

    fn statement(&self, name: &[u8]) -> Arc<Classified> {
        if name.is_empty() {
            return Arc::clone(&self.unnamed_statement);
        }
        std::str::from_utf8(name)
            .ok()
            .and_then(|n| self.statements.get(n))
            .map(Arc::clone)
            .unwrap_or_else(|| self.classifier.other())
    }

    /// `DEALLOCATE [PREPARE] name | ALL` sent as a simple query.
    fn forget_deallocated(&mut self, sql: &str) {
        let mut words = sql
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| !w.is_empty());
        if !words
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("deallocate"))
        {
            return;
        }
        let mut target = words.next();
        if target.is_some_and(|w| w.eq_ignore_ascii_case("prepare")) {
            target = words.next();
        }
        match target {
            Some(t) if t.eq_ignore_ascii_case("all") => self.statements.clear(),
            Some(t) => {
                let name = t.trim_matches('"');
                self.statements.remove(name);
            }
            None => {}
        }
    }

    /// Tracks one server message on its way to the client.
    pub fn on_server(&mut self, frame: &[u8]) -> Result<ServerVerdict, Desync> {
        let tag = frame[0];
        let mut verdict = ServerVerdict {
            route: Route::Forward,
            before: Vec::new(),
            fatal: false,
            backend_key: None,
        };
        self.queue.take_synthesized(&mut verdict.before);
        if tag == b'D' {
            if let Some(watch) = self.queue.front_payload_mut() {
                watch.on_data_row(frame);
            }
        }
        match self.queue.on_server(tag)? {
            Progress::Async => {
                if tag == b'S' {
                    self.on_parameter_status(frame);
                }
            }
            Progress::Within { route } => verdict.route = route,
            Progress::Completed { route, done } => {
                verdict.route = route;
                if let Some(watch) = done.payload {
                    if tag != b'E' {
                        let events = watch.events(&self.ctx);
                        if matches!(watch.class.kind, StatementKind::Read(_)) {
                            self.ready_events.extend(events);
                        } else {
                            self.uncommitted.extend(events);
                        }
                    }
                }
            }
        }
        match tag {
            b'E' => {
                self.segment_failed = true;
                verdict.fatal = is_fatal(frame);
            }
            b'Z' => self.on_ready(frame.get(5).copied().unwrap_or(b'I')),
            // ROLLBACK (also what COMMIT of a failed transaction reports):
            // nothing written in the transaction survives. A savepoint
            // rollback reports the same tag and is treated alike.
            b'C' if frame.get(5..13) == Some(b"ROLLBACK") => self.uncommitted.clear(),
            b'K' => verdict.backend_key = backend_key(frame),
            _ => {}
        }
        self.queue.take_synthesized(&mut verdict.before);
        Ok(verdict)
    }

    fn on_ready(&mut self, status: u8) {
        self.txn_status = status;
        match status {
            // Committed (or never in a transaction): writes are durable.
            b'I' if !self.segment_failed => self.ready_events.append(&mut self.uncommitted),
            b'I' | b'E' => self.uncommitted.clear(),
            _ => {}
        }
        if status != b'T' {
            self.segment_failed = false;
        }
    }

    fn on_parameter_status(&mut self, frame: &[u8]) {
        if let Some((name, rest)) = cstr(&frame[5..]) {
            if name == b"application_name" {
                if let Some((value, _)) = cstr(rest) {
                    self.ctx.application_name = String::from_utf8_lossy(value).into_owned();
                }
            }
        }
    }
}

fn backend_key(frame: &[u8]) -> Option<(i32, Vec<u8>)> {
    let body = frame.get(5..)?;
    let pid = i32::from_be_bytes(body.get(..4)?.try_into().ok()?);
    Some((pid, body.get(4..)?.to_vec()))
}

#[cfg(test)]
mod tests;
