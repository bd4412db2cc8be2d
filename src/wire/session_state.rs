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
use super::backend::{error_response, Severity};
use super::claims_gate::{ClaimRequest, Head, Resolution};
use super::frame::cstr;
use super::proxy::Legs;
use super::reject::raising_statement;
use super::response_queue::Expect;
use super::response_queue::{Desync, Progress, ResponseQueue, Route};
use super::row_rewrite::drop_last_column_description;
use super::watch::{Watch, WriteDecode};
use crate::audit::{AuditEvent, BlobDigest, Operation, SessionContext};
use crate::claims::evidence::Evidence;
use crate::claims::{now_ms, Holder};
use crate::policy::claims::{has_inspection_hint, is_inspection, ClaimDecision, Refusal};
use crate::policy::write_check::{check_write, rejection_message, WriteKind};
use crate::policy::Violation;
use crate::saver::write_record::WriteRecord;

/// SQLSTATE of a rejected write: check_violation, what a CHECK constraint
/// on the column would have raised.
pub const CHECK_VIOLATION: &str = "23514";
use crate::saver::bind::BoundParams;
use crate::saver::classify::{Classified, Classifier, StatementKind};
use crate::saver::decode_error::DecodeError;

/// A prepared statement as the proxy knows it.
#[derive(Debug, Clone)]
struct Prepared {
    class: Arc<Classified>,
    /// Prepared as its fork rewrite (results carry the head column).
    rewritten: bool,
    /// The SQL carries the `resumeguard:inspect` comment hint.
    inspect_hint: bool,
}

/// A portal bound to a checkpoint statement (ordinary portals are not
/// remembered at all).
#[derive(Debug, Clone)]
struct Binding {
    class: Arc<Classified>,
    bound: Arc<BoundParams>,
    /// For a write, its row (decoded once, here).
    record: Option<WriteDecode>,
    rewritten: bool,
    inspect_hint: bool,
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
    /// Bytes the client gets in place of this message.
    pub replace: Option<Bytes>,
    /// A read of a parked head: hold this message until the claim is
    /// decided (see `apply_claim`).
    pub claim: Option<ClaimRequest>,
    /// BackendKeyData seen: (pid, key) for cancel routing.
    pub backend_key: Option<(i32, Vec<u8>)>,
}

pub struct SessionState {
    classifier: Arc<Classifier>,
    pub queue: ResponseQueue<Watch>,
    /// Which enforcement legs are on.
    legs: Legs,
    statements: HashMap<String, Prepared>,
    unnamed_statement: Prepared,
    portals: HashMap<String, Binding>,
    unnamed_portal: Option<Binding>,
    /// ReadyForQuery status: `I` idle, `T` in a transaction, `E` failed.
    pub txn_status: u8,
    pub ctx: SessionContext,
    /// Sessions of the inspection listener never claim.
    pub inspection_listener: bool,
    /// Events of writes that have not committed yet.
    uncommitted: Vec<AuditEvent>,
    /// Claim evidence of writes that have not committed yet.
    uncommitted_evidence: Vec<Evidence>,
    /// Claim evidence of committed writes, for the claims worker.
    pub ready_evidence: Vec<Evidence>,
    /// Events ready for the audit sink.
    pub ready_events: Vec<AuditEvent>,
    segment_failed: bool,
    /// A blob of this Sync segment broke a rule; see `validate`.
    doomed: Option<DoomedBlob>,
}

/// A rejected blob waiting for the row that names its checkpoint.
struct DoomedBlob {
    record: WriteRecord,
    violation: Violation,
}

impl SessionState {
    pub fn new(classifier: Arc<Classifier>, legs: Legs, ctx: SessionContext) -> Self {
        let other = classifier.other();
        SessionState {
            classifier,
            legs,
            queue: ResponseQueue::new(),
            statements: HashMap::new(),
            unnamed_statement: Prepared {
                class: other,
                rewritten: false,
                inspect_hint: false,
            },
            portals: HashMap::new(),
            unnamed_portal: None,
            txn_status: b'I',
            ctx,
            inspection_listener: false,
            uncommitted: Vec::new(),
            uncommitted_evidence: Vec::new(),
            ready_evidence: Vec::new(),
            ready_events: Vec::new(),
            segment_failed: false,
            doomed: None,
        }
    }

    /// True when nothing is outstanding and no transaction is open: the
    /// session can be closed without losing work.
    pub fn is_idle(&self) -> bool {
        self.queue.idle() && self.txn_status == b'I'
    }

    /// Tracks one client message on its way to the server. `Some` is the
    /// message the server gets instead (a rewritten Parse or Bind).
    pub fn on_client(&mut self, frame: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        let tag = frame[0];
        let body = &frame[5..];
        match tag {
            b'P' => {
                let mut replacement = None;
                if let Some((name, rest)) = cstr(body) {
                    let (class, oids) = match cstr(rest) {
                        Some((q, oids)) => match std::str::from_utf8(q) {
                            Ok(sql) => (self.classifier.classify(sql), oids),
                            // Not UTF-8: the server rejects it; nothing to enforce.
                            Err(_) => (self.classifier.other(), oids),
                        },
                        None => (self.classifier.other(), &b""[..]),
                    };
                    let rewritten = match (&class.fork_sql, self.legs.fork_filter) {
                        (Some(sql), true) => {
                            replacement = Some(parse_frame(name, sql, oids));
                            true
                        }
                        _ => false,
                    };
                    let inspect_hint = self
                        .legs
                        .claims
                        .as_ref()
                        .is_some_and(|l| l.inspection_sql_hint)
                        && class.kind.is_checkpoint_traffic()
                        && cstr(rest)
                            .and_then(|(q, _)| std::str::from_utf8(q).ok())
                            .is_some_and(has_inspection_hint);
                    let prepared = Prepared {
                        class,
                        rewritten,
                        inspect_hint,
                    };
                    if name.is_empty() {
                        self.unnamed_statement = prepared;
                    } else {
                        self.statements
                            .insert(String::from_utf8_lossy(name).into_owned(), prepared);
                    }
                }
                self.queue.push_for_client(tag, 0, None);
                return Ok(replacement);
            }
            b'B' => {
                let (portal, stmt) = match cstr(body).and_then(|(p, rest)| Some((p, cstr(rest)?.0)))
                {
                    Some(names) => names,
                    None => (&b""[..], &b""[..]),
                };
                let prepared = self.statement(stmt);
                let mut replacement = None;
                let binding = if prepared.class.kind.is_checkpoint_traffic() {
                    let mut bound =
                        BoundParams::decode(frame).map_err(ClientError::UndecodableBind)?;
                    let record: Option<WriteDecode> =
                        prepared.class.kind.insert_shape().map(|shape| {
                            WriteRecord::decode(shape, &bound)
                                .map(Arc::new)
                                .map_err(|e| e.to_string())
                        });
                    if let Some(injected) = self.validate(&prepared.class, record.as_ref()) {
                        return Ok(Some(injected));
                    }
                    if prepared.rewritten && bound.result_formats.len() > 1 {
                        // Per-column formats must cover the head column too.
                        bound.result_formats.push(0);
                        replacement = Some(bound.encode());
                    }
                    Some(Binding {
                        class: prepared.class,
                        bound: Arc::new(bound),
                        record,
                        rewritten: prepared.rewritten,
                        inspect_hint: prepared.inspect_hint,
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
                return Ok(replacement);
            }
            b'E' => {
                let portal = cstr(body).map(|(p, _)| p).unwrap_or_default();
                let inspect = self.inspecting();
                let claims_on = self.legs.claims.is_some();
                let binding = self.portal(portal);
                let watch = binding.map(|b| {
                    let mut w = Watch::new(
                        Arc::clone(&b.class),
                        Some(Arc::clone(&b.bound)),
                        b.rewritten,
                    );
                    w.record = b.record.clone();
                    w.inspect = inspect || b.inspect_hint;
                    if claims_on && !matches!(b.class.kind, StatementKind::Read(_)) {
                        w.sent_at_ms = now_ms();
                    }
                    w
                });
                self.queue.push_for_client(tag, 0, watch);
            }
            b'D' => {
                let target = body.first().copied().unwrap_or(b'P');
                let name = cstr(body.get(1..).unwrap_or_default())
                    .map(|(n, _)| n)
                    .unwrap_or_default();
                // Describing a rewritten statement or portal: its
                // RowDescription loses the head column on the way back.
                let rewritten_class = if target == b'S' {
                    let p = self.statement(name);
                    p.rewritten.then_some(p.class)
                } else {
                    self.portal(name)
                        .filter(|b| b.rewritten)
                        .map(|b| Arc::clone(&b.class))
                };
                let watch = rewritten_class.map(|c| Watch::new(c, None, true));
                self.queue.push_for_client(tag, target, watch);
            }
            b'C' => {
                if let (Some(&target), Some((name, _))) =
                    (body.first(), cstr(&body[1.min(body.len())..]))
                {
                    let name = String::from_utf8_lossy(name);
                    match (target, name.is_empty()) {
                        (b'S', true) => {
                            self.unnamed_statement = Prepared {
                                class: self.classifier.other(),
                                rewritten: false,
                                inspect_hint: false,
                            }
                        }
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
                self.unnamed_statement = Prepared {
                    class: self.classifier.other(),
                    rewritten: false,
                    inspect_hint: false,
                };
                self.unnamed_portal = None;
                let sql = cstr(body)
                    .and_then(|(q, _)| std::str::from_utf8(q).ok())
                    .unwrap_or_default();
                self.forget_deallocated(sql);
                let class = self.classifier.classify(sql);
                let watch = class
                    .kind
                    .is_checkpoint_traffic()
                    .then(|| Watch::new(class, None, false));
                self.queue.push_for_client(tag, 0, watch);
            }
            b'S' => {
                let replacement = self.on_sync(frame);
                self.queue.push_for_client(tag, 0, None);
                return Ok(replacement);
            }
            _ => {
                self.queue.push_for_client(tag, 0, None);
            }
        }
        Ok(None)
    }

    /// The validity gate: a write whose payload breaks a channel rule is
    /// replaced by a statement that fails in the server with 23514, so
    /// nothing of its transaction commits (see `reject`). Returns the
    /// bytes the server gets instead of the client's Bind.
    fn validate(&mut self, class: &Classified, record: Option<&WriteDecode>) -> Option<Vec<u8>> {
        if self.legs.validity.is_empty() {
            return None;
        }
        let kind = match &class.kind {
            StatementKind::BlobUpsert(_) => WriteKind::Blob,
            StatementKind::CheckpointUpsert(_) => WriteKind::Checkpoint,
            StatementKind::WritesUpsert(_) | StatementKind::WritesInsertIgnore(_) => {
                WriteKind::PendingWrite
            }
            _ => return None,
        };
        let record = match record? {
            Ok(r) => WriteRecord::clone(r),
            // Values the proxy cannot read cannot be checked; with rules
            // active that is a refusal, not a pass.
            Err(e) => {
                let message = format!(
                    "resumeguard: checkpoint write rejected: its parameters do not decode: {e}"
                );
                return Some(self.reject_write(&WriteRecord::default(), &message, None));
            }
        };
        let violation = check_write(&self.legs.validity, kind, &record);
        match (kind, violation, self.doomed.take()) {
            // A blob carries only a channel version: its rejection waits for
            // the checkpoint row of the same put, which names the checkpoint
            // (or for the Sync). The blob's own INSERT runs meanwhile, in
            // the transaction the rejection then aborts.
            (WriteKind::Blob, Some(violation), None) => {
                self.doomed = Some(DoomedBlob { record, violation });
                None
            }
            (WriteKind::Blob, _, doomed) => {
                self.doomed = doomed;
                None
            }
            (_, _, Some(doomed)) => {
                let mut named = doomed.record;
                named.checkpoint_id = record.checkpoint_id.or(named.checkpoint_id);
                named.metadata = record.metadata;
                let message = rejection_message(WriteKind::Blob, &doomed.violation, &named);
                Some(self.reject_write(&named, &message, Some(&doomed.violation)))
            }
            (kind, Some(violation), None) => {
                let message = rejection_message(kind, &violation, &record);
                Some(self.reject_write(&record, &message, Some(&violation)))
            }
            (_, None, None) => None,
        }
    }

    /// A Sync ends the segment: a blob rejection still waiting for its
    /// checkpoint row is raised before it.
    fn on_sync(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        let doomed = self.doomed.take()?;
        let message = rejection_message(WriteKind::Blob, &doomed.violation, &doomed.record);
        let mut bytes = self.reject_write(&doomed.record, &message, Some(&doomed.violation));
        bytes.extend_from_slice(frame);
        Some(bytes)
    }

    fn reject_write(
        &mut self,
        rec: &WriteRecord,
        message: &str,
        violation: Option<&Violation>,
    ) -> Vec<u8> {
        tracing::warn!(thread = ?rec.thread_id, checkpoint = ?rec.checkpoint_id, "{message}");
        let mut ev = AuditEvent::new(&self.ctx, Operation::WriteRejected);
        ev.thread_id = rec.thread_id.clone();
        ev.checkpoint_ns = rec.checkpoint_ns.clone();
        ev.checkpoint_id = rec.checkpoint_id.clone();
        ev.task_id = rec.task_id.clone();
        ev.channels = rec.channel.iter().cloned().collect();
        if let (Some(c), Some(b)) = (&rec.channel, &rec.blob) {
            ev.blob_sha256.push(BlobDigest::of(c.clone(), b));
        }
        ev.detail = serde_json::json!({
            "reason": message,
            "rule": violation.map(|v| v.rule.clone()),
            "schema_path": violation.map(|v| v.schema_path.clone()),
            "instance_path": violation.map(|v| v.instance_path.clone()),
        });
        self.ready_events.push(ev);
        // The injected Parse/Bind answers are the proxy's; the Execute's
        // error stands where the client expects its Bind's answer.
        self.queue.push(Expect::ParseComplete, Route::Swallow, None);
        self.queue.push(Expect::BindComplete, Route::Swallow, None);
        self.queue.push(Expect::Execute, Route::Forward, None);
        self.unnamed_statement = Prepared {
            class: self.classifier.other(),
            rewritten: false,
            inspect_hint: false,
        };
        self.unnamed_portal = None;
        let detail = violation.map_or(String::new(), |v| {
            format!(
                "rule {} failed at {} (value path {})",
                v.rule, v.schema_path, v.instance_path
            )
        });
        raising_statement(CHECK_VIOLATION, message, &detail)
    }

    fn statement(&self, name: &[u8]) -> Prepared {
        if name.is_empty() {
            return self.unnamed_statement.clone();
        }
        std::str::from_utf8(name)
            .ok()
            .and_then(|n| self.statements.get(n))
            .cloned()
            .unwrap_or_else(|| Prepared {
                class: self.classifier.other(),
                rewritten: false,
                inspect_hint: false,
            })
    }

    fn portal(&self, name: &[u8]) -> Option<&Binding> {
        if name.is_empty() {
            return self.unnamed_portal.as_ref();
        }
        std::str::from_utf8(name)
            .ok()
            .and_then(|p| self.portals.get(p))
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
            replace: None,
            claim: None,
            backend_key: None,
        };
        self.queue.take_synthesized(&mut verdict.before);
        if let Some(watch) = self.queue.front_payload_mut() {
            match tag {
                b'D' => {
                    verdict.replace = watch.on_data_row(frame);
                    if let Some(leg) = &self.legs.claims {
                        let gated = match watch.parked_claim_key() {
                            Some(key) => Some((key, Head::Parked)),
                            None if leg.run_lease => {
                                watch.running_head_key().map(|key| (key, Head::Running))
                            }
                            None => None,
                        };
                        verdict.claim = gated.map(|(key, head)| ClaimRequest {
                            key,
                            holder: Holder {
                                proxy_id: leg.proxy_id.clone(),
                                session_id: self.ctx.session_id,
                                client_addr: self.ctx.client_addr.clone(),
                                application_name: self.ctx.application_name.clone(),
                            },
                            head,
                        });
                    }
                }
                b'T' if watch.head_column => verdict.replace = drop_last_column_description(frame),
                _ => {}
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
                            if self.legs.claims.is_some() {
                                self.uncommitted_evidence.extend(watch.evidence());
                            }
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
            b'C' if frame.get(5..13) == Some(b"ROLLBACK") => {
                self.uncommitted.clear();
                self.uncommitted_evidence.clear();
            }
            b'K' => verdict.backend_key = backend_key(frame),
            _ => {}
        }
        self.queue.take_synthesized(&mut verdict.before);
        Ok(verdict)
    }

    /// Whether this session's reads are inspection (never claim).
    fn inspecting(&self) -> bool {
        match &self.legs.claims {
            Some(leg) => is_inspection(
                &self.ctx.application_name,
                &leg.inspection_patterns,
                false,
                self.inspection_listener,
            ),
            None => true,
        }
    }

    /// Applies the decided claim of a held row: `None` lets the row through;
    /// `Some` is the refusal the client gets instead, and the rest of that
    /// statement's answer is swallowed (its node must not run).
    pub fn apply_claim(&mut self, req: &ClaimRequest, res: &Resolution) -> Option<Bytes> {
        let key = &req.key;
        let event = |op| {
            AuditEvent::new(&self.ctx, op)
                .with_thread(key.thread_id.clone())
                .with_checkpoint(key.checkpoint_ns.clone(), key.checkpoint_id.clone())
        };
        if res.waited_ms > 0 {
            let ev = event(Operation::ClaimWaited).with_detail(serde_json::json!({
                "interrupt": key.short_fingerprint(),
                "waited_ms": res.waited_ms,
            }));
            self.ready_events.push(ev);
        }
        match &res.decision {
            ClaimDecision::Refuse { reason } => {
                let message = reason.message(key);
                tracing::info!(thread = %key.thread_id, "{message}");
                let interrupt = match reason {
                    Refusal::RunInProgress { lease } => lease.short_fingerprint().to_owned(),
                    _ => key.short_fingerprint().to_owned(),
                };
                let ev = event(Operation::ClaimRefused).with_detail(serde_json::json!({
                    "interrupt": interrupt,
                    "sqlstate": reason.sqlstate(),
                    "reason": message,
                    "head": match req.head { Head::Parked => "parked", Head::Running => "running" },
                }));
                self.ready_events.push(ev);
                self.queue.set_front_route(Route::Swallow);
                Some(error_response(
                    Severity::Error,
                    reason.sqlstate(),
                    &message,
                    Some(reason.hint()),
                ))
            }
            // A running head outside any lease: nothing was claimed.
            ClaimDecision::Serve { .. } if req.head == Head::Running => None,
            ClaimDecision::Serve { takeover } => {
                let op = if *takeover {
                    Operation::ClaimTakeover
                } else {
                    Operation::ClaimTaken
                };
                let displaced = res.displaced.as_ref().map(|h| {
                    serde_json::json!({"client_addr": h.client_addr, "application_name": h.application_name, "proxy_id": h.proxy_id, "session_id": h.session_id})
                });
                let ev = event(op).with_detail(serde_json::json!({
                    "interrupt": key.short_fingerprint(),
                    "displaced": displaced,
                    "takeover": res.takeover,
                }));
                self.ready_events.push(ev);
                None
            }
            ClaimDecision::RetryAfter { .. } => None,
        }
    }

    fn on_ready(&mut self, status: u8) {
        self.txn_status = status;
        match status {
            // Committed (or never in a transaction): writes are durable.
            b'I' if !self.segment_failed => {
                self.ready_events.append(&mut self.uncommitted);
                self.ready_evidence.append(&mut self.uncommitted_evidence);
            }
            b'I' | b'E' => {
                self.uncommitted.clear();
                self.uncommitted_evidence.clear();
            }
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

/// A Parse frame for `name` with new SQL and the original parameter types.
fn parse_frame(name: &[u8], sql: &str, oids: &[u8]) -> Vec<u8> {
    let len = 4 + name.len() + 1 + sql.len() + 1 + oids.len();
    let mut f = Vec::with_capacity(len + 1);
    f.push(b'P');
    f.extend_from_slice(&(len as i32).to_be_bytes());
    f.extend_from_slice(name);
    f.push(0);
    f.extend_from_slice(sql.as_bytes());
    f.push(0);
    f.extend_from_slice(oids);
    f
}

fn backend_key(frame: &[u8]) -> Option<(i32, Vec<u8>)> {
    let body = frame.get(5..)?;
    let pid = i32::from_be_bytes(body.get(..4)?.try_into().ok()?);
    Some((pid, body.get(4..)?.to_vec()))
}

#[cfg(test)]
mod tests;
