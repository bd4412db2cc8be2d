//! One session's enforcer: the tracker's hooks. It annotates statements
//! the saver layer recognizes, decodes their parameters and rows, asks
//! the policy for verdicts and turns them into actions (replace these
//! bytes, refuse this statement, hold this row for a claim), keeping an
//! outbox of audit events and claim evidence until their writes commit.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::claim_ahead::AheadClaim;
use super::claim_gate::{apply_claim, ClaimRequest, ClaimTicket, Head, Resolution};
use super::events::rejected;
use super::evidence::continuation;
use super::fencing::{FenceCheck, FenceGate, FenceStep, Fenced};
use super::history::history_refusal;
use super::late_duplicate::{LateDuplicate, LateGate};
use super::parked_heads::Interrupt;
use super::shared_session::SharedSessionWatch;
use super::validity::{ValidityGate, CHECK_VIOLATION};
use super::watch::{parked_on, Watch, WriteDecode};
use super::Enforcement;
use crate::audit::{AuditEvent, SessionContext};
use crate::claims::evidence::{Evidence, EvidenceSender};
use crate::claims::Holder;
use crate::log_text::shown;
use crate::policy::claims::{
    has_inspection_hint, is_inspection, ClaimDecision, Refusal as ClaimRefusal,
};
use crate::saver::bind::BoundParams;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::{Classified, StatementKind};
use crate::saver::write_record::WriteRecord;
use crate::wire::guard::{ClientError, HeldTicket, ServerStep};
use crate::wire::messages::error_response::error_fields;
use crate::wire::messages::row_description::drop_last_column_description;
use crate::wire::tracker::{Bound, Hooks, Refusal, TxnStatus, FEATURE_NOT_SUPPORTED};

/// A prepared statement as the enforcer knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub class: Arc<Classified>,
    /// Prepared as its fork rewrite (results carry the head column).
    pub rewritten: bool,
    /// The SQL carries the `resumeguard:inspect` comment hint.
    pub inspect_hint: bool,
}

/// A portal bound to a checkpoint statement.
#[derive(Debug, Clone)]
pub struct Binding {
    class: Arc<Classified>,
    bound: Arc<BoundParams>,
    /// For a write, its row (decoded once, here).
    record: Option<WriteDecode>,
    rewritten: bool,
    inspect_hint: bool,
}

/// What the writes of the open transaction did: acted on once it commits,
/// dropped if it ends otherwise.
#[derive(Debug, Default)]
struct Uncommitted {
    /// Their audit events.
    events: Vec<AuditEvent>,
    /// Their claim evidence.
    evidence: Vec<Evidence>,
    /// The checkpoints they put.
    created: Vec<CheckpointRef>,
    /// Their `__interrupt__` writes: the heads they park (see
    /// `parked_heads`).
    parks: Vec<(CheckpointRef, Interrupt)>,
}

impl Uncommitted {
    fn clear(&mut self) {
        self.events.clear();
        self.evidence.clear();
        self.created.clear();
        self.parks.clear();
    }
}

pub struct SessionEnforcer {
    shared: Arc<Enforcement>,
    pub ctx: SessionContext,
    /// Sessions of the inspection listener never claim.
    pub inspection_listener: bool,
    /// What writes that have not committed yet did.
    uncommitted: Uncommitted,
    /// Claim evidence of committed writes, for the claims worker.
    pub ready_evidence: Vec<Evidence>,
    /// Events ready for the audit sink.
    pub ready_events: Vec<AuditEvent>,
    segment_failed: bool,
    validity: ValidityGate,
    /// The claims this session took and the verdicts of its current
    /// transaction, for fencing writes continuing claimed checkpoints.
    pub fencing: FenceGate,
    /// A claim was granted and its run has not committed a checkpoint
    /// since: shutdown lets the run reach it before closing the session.
    run_open: bool,
    /// The finished heads this session read, for late duplicate resumes.
    late: LateGate,
    /// Whether this session was seen carrying more than one client.
    shared_session: SharedSessionWatch,
}

impl SessionEnforcer {
    pub fn new(shared: Arc<Enforcement>, ctx: SessionContext) -> Self {
        let show_values = shared.audit.log_values();
        SessionEnforcer {
            shared,
            ctx,
            inspection_listener: false,
            uncommitted: Uncommitted::default(),
            ready_evidence: Vec::new(),
            ready_events: Vec::new(),
            segment_failed: false,
            validity: ValidityGate::new(show_values),
            fencing: FenceGate::default(),
            run_open: false,
            late: LateGate::default(),
            shared_session: SharedSessionWatch::default(),
        }
    }

    /// Whether a run this session was granted has yet to commit its next
    /// checkpoint (see [`crate::wire::guard::Guard::holds_work`]).
    pub fn run_open(&self) -> bool {
        self.run_open
    }

    pub fn shared(&self) -> &Enforcement {
        &self.shared
    }

    /// Takes a reloaded rule set for the statements to come (see
    /// `enforce::reload`: only while the session is idle).
    pub fn rebase(&mut self, shared: Arc<Enforcement>) {
        self.shared = shared;
    }

    /// Where committed writes' claim evidence goes, with consume-once on.
    pub fn evidence_sender(&self) -> Option<&EvidenceSender> {
        self.shared.legs.claims.as_ref()?.evidence.as_ref()
    }

    fn prepared(&self, class: Arc<Classified>) -> Prepared {
        Prepared {
            class,
            rewritten: false,
            inspect_hint: false,
        }
    }

    /// Whether this session's reads are inspection (never claim).
    fn inspecting(&self) -> bool {
        match &self.shared.legs.claims {
            Some(leg) => is_inspection(
                &self.ctx.application_name,
                &leg.inspection_patterns,
                false,
                self.inspection_listener,
            ),
            None => true,
        }
    }

    /// A checkpoint statement in a form the proxy cannot watch: refused
    /// while any leg is on.
    fn unwatchable(&self, class: &Classified, form: &str) -> Result<(), Refusal> {
        if !class.kind.is_checkpoint_traffic() || !self.shared.legs.any() {
            return Ok(());
        }
        Err(Refusal {
            sqlstate: FEATURE_NOT_SUPPORTED,
            message: format!("resumeguard: checkpoint statements cannot run through {form}"),
            detail: "prepare checkpoint statements with the protocol's Parse, as the savers do"
                .into(),
        })
    }

    fn refuse_write(&mut self, rejection: super::validity::Rejection) -> Refusal {
        tracing::warn!(
            thread = ?rejection.record.thread_id.as_deref().map(shown),
            checkpoint = ?rejection.record.checkpoint_id.as_deref().map(shown),
            "{}",
            shown(&rejection.message)
        );
        self.ready_events.push(rejected(&self.ctx, &rejection));
        metrics::counter!("resumeguard_writes_rejected_total").increment(1);
        Refusal {
            sqlstate: CHECK_VIOLATION,
            detail: rejection.detail(),
            message: rejection.message,
        }
    }

    /// This session as a claim holder.
    fn holder(&self, proxy_id: &str) -> Holder {
        Holder {
            proxy_id: proxy_id.to_owned(),
            session_id: self.ctx.session_id,
            client_addr: self.ctx.client_addr.clone(),
            application_name: self.ctx.application_name.clone(),
        }
    }

    /// The claim request a decoded head row asks for, if any.
    fn claim_request(&self, watch: &Watch) -> Option<ClaimRequest> {
        let leg = self.shared.legs.claims.as_ref()?;
        let (key, head) = match watch.parked_claim_key() {
            Some(key) => (key, Head::Parked),
            None if leg.run_lease() => (watch.running_head_key()?, Head::Running),
            None => return None,
        };
        Some(ClaimRequest {
            key,
            holder: self.holder(&leg.proxy_id),
            head,
        })
    }

    /// For a read of a head this proxy last saw parked, and whose claim
    /// this session is not known to hold: that claim, asked now, beside
    /// the read (see `claim_ahead`).
    fn claim_ahead(&self, watch: &Watch) -> Option<AheadClaim> {
        let leg = self.shared.legs.claims.as_ref()?;
        if leg.draining.is_set() || !leg.store.live() {
            return None;
        }
        let (thread, ns) = watch.head_address()?;
        let key = leg.parked.expected(&thread, &ns)?;
        let holder = self.holder(&leg.proxy_id);
        if leg.held.answer(&key, &holder, Instant::now()).is_some() {
            return None;
        }
        AheadClaim::ask(Arc::clone(&leg.store), key, holder, leg.lapse_ms)
    }

    /// A held head row's claim was decided: what this session now holds
    /// is remembered for fencing, the decision audited; returns the
    /// refusal the client gets instead of the row, if any.
    pub fn claim_resolved(&mut self, req: &ClaimRequest, res: &Resolution) -> Option<Bytes> {
        if req.head == Head::Parked {
            match res.epoch {
                Some(epoch) => self.fencing.took(&req.key, epoch),
                None => self.fencing.read_parked(&req.key),
            }
            if matches!(res.decision, ClaimDecision::Serve { .. }) {
                self.run_open = true;
            }
        }
        let remedy = match (&res.decision, self.shared.legs.claims.as_deref()) {
            (
                ClaimDecision::Refuse {
                    reason: ClaimRefusal::RunInProgress { .. },
                },
                Some(leg),
            ) => Some(leg.inspection_remedy()),
            _ => None,
        };
        apply_claim(
            &self.ctx,
            req,
            res,
            remedy.as_deref(),
            &mut self.ready_events,
        )
    }

    /// With consume-once on: a write continuing a claimed checkpoint from
    /// a session other than its holder is refused (see `fencing`).
    fn fence(&mut self, kind: &StatementKind, record: Option<&WriteDecode>) -> FenceStep {
        let Some(leg) = self.shared.legs.claims.as_ref().map(Arc::clone) else {
            return FenceStep::Pass;
        };
        let Some(Ok(rec)) = record else {
            return FenceStep::Pass;
        };
        match parked_on(rec) {
            // From now on a reader may claim this checkpoint.
            Some(at) if kind.is_pending_write() => self.fencing.parks(&at),
            _ => leg.parked.write_passed(kind, rec),
        }
        let Some(cont) = continuation(kind, rec) else {
            return FenceStep::Pass;
        };
        // Claims on it may change with this write: asked of the store again.
        leg.held.forget(&cont.at);
        let session = self.holder(&leg.proxy_id);
        self.fencing
            .check(&leg, &self.ctx, &session, (&cont, kind.label(), rec))
    }

    /// With consume-once on: a bare resume's `__resume__` write onto a
    /// finished head this session read, of an answered interrupt, is
    /// refused (see `late_duplicate`).
    fn late_duplicate(
        &self,
        kind: &StatementKind,
        record: Option<&WriteDecode>,
    ) -> Option<LateDuplicate> {
        let leg = self.shared.legs.claims.as_ref()?;
        let Some(Ok(rec)) = record else {
            return None;
        };
        let audit = &self.shared.audit;
        self.late
            .check(leg, &self.ctx, |m| audit.approver_in(m), (kind, rec))
    }

    /// The audit record of a write the server fenced in its transaction.
    fn fenced_in_transaction(&mut self, check: &FenceCheck) {
        let (message, detail, reason) = check.raised.clone().unwrap_or_default();
        tracing::warn!(thread = %shown(&check.continues.thread_id),
            checkpoint = %shown(&check.continues.checkpoint_id), "{}", shown(&message));
        crate::admin::metrics::fenced_in_transaction(&reason);
        let fence = match reason.as_str() {
            "superseded_holder" | "other_proxy" | "other_client" => reason.as_str(),
            _ => "in_transaction",
        };
        // The audit names the holder the server found: asked of the store
        // only now, on this rare path.
        let at = &check.continues;
        let current = self.shared.legs.claims.as_ref().and_then(|leg| {
            leg.store
                .current_holder(&at.thread_id, &at.checkpoint_ns, &at.checkpoint_id)
                .ok()
                .flatten()
        });
        if current.is_none() {
            tracing::debug!(%detail, "fenced write's holder not found again for the audit");
        }
        let event = super::events::fenced(
            &self.ctx,
            &super::events::FencedWrite {
                record: &check.record,
                continues: at,
                statement: check.statement,
                sqlstate: crate::policy::claims::SQLSTATE_WRITE_FENCED,
                message: &message,
                fence,
                current: current.as_ref(),
            },
        );
        self.ready_events.push(event);
    }
}

impl Hooks for SessionEnforcer {
    type Statement = Prepared;
    type Portal = Binding;
    type Watch = Watch;

    fn admit(&mut self, sql: &str) -> Result<(), Refusal> {
        let own = &self.shared.legs.own_schema;
        own.check(sql).map_err(|breach| {
            tracing::warn!(
                schema = own.name(),
                sql = %shown(sql.trim()),
                "statement on the proxy's schema refused: {}",
                shown(&breach.to_string())
            );
            metrics::counter!("resumeguard_own_schema_refused_total").increment(1);
            own.refusal(&breach)
        })
    }

    fn parse(&mut self, sql: &str) -> (Prepared, Option<String>) {
        let class = self.shared.classifier.classify(sql);
        let replacement = match (&class.fork_sql, self.shared.legs.fork_filter) {
            (Some(sql), true) => Some(sql.clone()),
            _ => None,
        };
        let inspect_hint = self
            .shared
            .legs
            .claims
            .as_ref()
            .is_some_and(|l| l.inspection_sql_hint)
            && class.kind.is_checkpoint_traffic()
            && has_inspection_hint(sql);
        let prepared = Prepared {
            class,
            rewritten: replacement.is_some(),
            inspect_hint,
        };
        (prepared, replacement)
    }

    fn plain(&self) -> Prepared {
        self.prepared(self.shared.classifier.other())
    }

    fn sql_prepare(&mut self, inner: &str) -> Result<Prepared, Refusal> {
        // Bound through the protocol, a statement prepared in SQL is
        // watched like any other, except a read by id: its fork rewrite
        // happens at Parse, which SQL PREPARE does not pass through.
        let class = self.shared.classifier.classify(inner);
        if class.fork_sql.is_some() && self.shared.legs.fork_filter {
            self.unwatchable(&class, "SQL PREPARE")?;
        }
        Ok(self.prepared(class))
    }

    fn sql_execute(&mut self, statement: &Prepared) -> Result<(), Refusal> {
        self.unwatchable(&statement.class, "SQL EXECUTE")
    }

    fn sql_declare(&mut self, inner: &str) -> Result<(), Refusal> {
        let class = self.shared.classifier.classify(inner);
        self.unwatchable(&class, "a cursor")
    }

    fn bind(
        &mut self,
        statement: &Prepared,
        frame: &[u8],
    ) -> Result<Bound<Binding, Watch>, ClientError> {
        if !statement.class.kind.is_checkpoint_traffic() {
            return Ok(Bound::Forward(None));
        }
        // [enforce] unknown_saver = "refuse": a checkpoint statement no
        // profile recognizes fails here, before anything of it runs.
        if let Some(refusal) = unknown_refusal(&statement.class) {
            return Ok(Bound::Refuse(refusal));
        }
        // A checkpoint Bind that does not decode would leave enforcement
        // blind: the session fails closed.
        let mut bound = BoundParams::decode(frame)
            .map_err(|e| ClientError(format!("malformed Bind for a checkpoint statement: {e}")))?;
        if let Some(refusal) = history_refusal(&statement.class.kind, &bound) {
            return Ok(Bound::Refuse(refusal));
        }
        let record: Option<WriteDecode> = statement.class.kind.insert_shape().map(|shape| {
            WriteRecord::decode(shape, &bound)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        if let Some(decoded) = &record {
            let rules = Arc::clone(&self.shared.legs.validity);
            let checked = decoded.as_deref().map_err(String::as_str);
            if let Some(rejection) = self.validity.check(&rules, &statement.class.kind, checked) {
                return Ok(Bound::Refuse(self.refuse_write(rejection)));
            }
        }
        if let Some(late) = self.late_duplicate(&statement.class.kind, record.as_ref()) {
            let LateDuplicate { refusal, event } = late;
            self.ready_events.push(event);
            return Ok(Bound::Refuse(refusal));
        }
        let guard = match self.fence(&statement.class.kind, record.as_ref()) {
            FenceStep::Pass => None,
            FenceStep::Refuse(fenced) => {
                let Fenced { refusal, event } = *fenced;
                self.ready_events.push(event);
                return Ok(Bound::Refuse(refusal));
            }
            FenceStep::InTransaction(guarded) => Some(*guarded),
        };
        let mut replacement = None;
        if statement.rewritten && bound.result_formats.len() > 1 {
            // Per-column formats must cover the head column too.
            bound.result_formats.push(0);
            replacement = Some(bound.encode().map_err(|e| {
                ClientError(format!("the Bind with the head column cannot be sent: {e}"))
            })?);
        }
        let binding = Binding {
            class: Arc::clone(&statement.class),
            bound: Arc::new(bound),
            record,
            rewritten: statement.rewritten,
            inspect_hint: statement.inspect_hint,
        };
        Ok(match (guard, replacement) {
            (Some((injection, check)), _) => {
                // Writes are never rewritten: only reads by id are.
                let mut watch = Watch::new(self.shared.classifier.other(), None, false);
                watch.fence = Some(check);
                Bound::Guarded {
                    injection,
                    watch,
                    portal: Some(binding),
                }
            }
            (None, Some(bytes)) => Bound::Replace(bytes, Some(binding)),
            (None, None) => Bound::Forward(Some(binding)),
        })
    }

    fn execute(&mut self, portal: Option<&Binding>) -> Option<Watch> {
        let b = portal?;
        let mut w = Watch::new(
            Arc::clone(&b.class),
            Some(Arc::clone(&b.bound)),
            b.rewritten,
        );
        w.record = b.record.clone();
        w.inspect = self.inspecting() || b.inspect_hint;
        w.executed_at = Some(Instant::now());
        if !w.inspect {
            w.ahead = self.claim_ahead(&w);
        }
        if self.shared.legs.claims.is_some() && !matches!(b.class.kind, StatementKind::Read(_)) {
            w.sent_at = w.executed_at;
        }
        Some(w)
    }

    fn describe_statement(&mut self, statement: &Prepared) -> Option<Watch> {
        // A rewritten statement's RowDescription loses the head column.
        statement
            .rewritten
            .then(|| Watch::new(Arc::clone(&statement.class), None, true))
    }

    fn describe_portal(&mut self, portal: Option<&Binding>) -> Option<Watch> {
        let b = portal.filter(|b| b.rewritten)?;
        Some(Watch::new(Arc::clone(&b.class), None, true))
    }

    fn query(&mut self, sql: &str) -> Result<Option<Watch>, Refusal> {
        let class = self.shared.classifier.classify(sql);
        if let Some(refusal) = unknown_refusal(&class) {
            return Err(refusal);
        }
        Ok(class.kind.is_checkpoint_traffic().then(|| Watch {
            executed_at: Some(Instant::now()),
            ..Watch::new(class, None, false)
        }))
    }

    fn sync(&mut self) -> Option<Refusal> {
        let rejection = self.validity.at_sync()?;
        Some(self.refuse_write(rejection))
    }

    fn row(&mut self, watch: &mut Watch, frame: &[u8], step: &mut ServerStep) {
        if watch.fence.is_some() {
            return;
        }
        step.replace = watch.on_data_row(frame);
        if let Some(request) = self.claim_request(watch) {
            if let Some(leg) = &self.shared.legs.claims {
                step.hold = Some(HeldTicket(Box::new(ClaimTicket::new(
                    Arc::clone(leg),
                    request,
                    watch.ahead.take(),
                ))));
            }
        }
    }

    fn row_description(&mut self, watch: &Watch, frame: &[u8]) -> Option<Bytes> {
        if watch.head_column {
            drop_last_column_description(frame)
        } else {
            None
        }
    }

    fn completed(&mut self, watch: Watch, ok: bool) {
        if let Some(check) = &watch.fence {
            if !ok {
                self.fenced_in_transaction(check);
            }
            return;
        }
        crate::admin::metrics::statement_completed(&watch.class.kind, watch.executed_at);
        if !ok {
            return;
        }
        crate::admin::metrics::forks_served(watch.forks.len());
        let events = watch.events(&self.ctx);
        if let Some(leg) = &self.shared.legs.claims {
            if let Some(row) = watch.finished_head() {
                self.late.read_finished(&row.at, &row.metadata);
            }
            if let Some((thread, ns, parked)) = watch.head_seen() {
                leg.parked.read(&thread, &ns, parked);
            }
        }
        if matches!(watch.class.kind, StatementKind::Read(_)) {
            self.ready_events.extend(events);
        } else {
            self.uncommitted.events.extend(events);
            if let Some(leg) = &self.shared.legs.claims {
                let evidence = watch.evidence();
                for gone in evidence.iter().filter_map(Evidence::deleted_thread) {
                    leg.parked.thread_deleted(gone);
                }
                self.uncommitted.evidence.extend(evidence);
                if let Some(at) = watch.created_checkpoint() {
                    self.uncommitted.created.push(at);
                }
                if let Some(parks) = watch.interrupt_written() {
                    self.uncommitted.parks.push(parks);
                }
            }
        }
    }

    fn answer_error(&mut self, watch: &mut Watch, frame: &[u8]) {
        let Some(check) = watch.fence.as_mut() else {
            return;
        };
        let (mut message, mut detail, mut hint) = (String::new(), String::new(), String::new());
        for (code, value) in error_fields(frame) {
            let text = String::from_utf8_lossy(value).into_owned();
            match code {
                b'M' => message = text,
                b'D' => detail = text,
                b'H' => hint = text,
                _ => {}
            }
        }
        check.raised = Some((message, detail, hint));
    }

    fn error(&mut self) {
        self.segment_failed = true;
    }

    fn ready(&mut self, status: TxnStatus) {
        match status {
            // Committed (or never in a transaction): writes are durable.
            TxnStatus::Idle if !self.segment_failed => {
                let done = &mut self.uncommitted;
                self.ready_events.append(&mut done.events);
                self.ready_evidence.append(&mut done.evidence);
                // The granted run reached a durable checkpoint.
                self.run_open &= done.created.is_empty();
                for at in done.created.drain(..) {
                    self.fencing.created(at);
                }
                if let Some(leg) = &self.shared.legs.claims {
                    for (at, interrupt) in done.parks.drain(..) {
                        leg.parked.interrupt_written(&at, interrupt);
                    }
                }
            }
            TxnStatus::Idle | TxnStatus::Failed => self.uncommitted.clear(),
            TxnStatus::InBlock => {}
        }
        if status != TxnStatus::InBlock {
            self.segment_failed = false;
            self.fencing.end_transaction();
        }
    }

    fn rollback(&mut self) {
        self.uncommitted.clear();
        self.fencing.end_transaction();
    }

    fn parameter_status(&mut self, name: &[u8], value: &[u8]) {
        if name == b"application_name" {
            let to = String::from_utf8_lossy(value).into_owned();
            if self.shared.legs.claims.is_some() {
                self.shared_session
                    .application_name(&self.ctx.application_name, &to);
            }
            self.ctx.application_name = to;
        }
    }
}

/// Under `[enforce] unknown_saver = "refuse"`: the refusal of a
/// checkpoint statement no profile recognizes.
fn unknown_refusal(class: &Classified) -> Option<Refusal> {
    let message = class.refusal.as_ref()?;
    Some(Refusal {
        sqlstate: crate::saver::unknown::REFUSAL_SQLSTATE,
        message: message.clone(),
        detail: class
            .unenforced
            .as_ref()
            .map(|u| format!("legs off for it: {}", u.legs_off))
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
