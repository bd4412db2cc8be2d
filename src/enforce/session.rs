//! One session's enforcer: the tracker's hooks. It annotates statements
//! the saver layer recognizes, decodes their parameters and rows, asks
//! the policy for verdicts and turns them into actions (replace these
//! bytes, refuse this statement, hold this row for a claim), keeping an
//! outbox of audit events and claim evidence until their writes commit.
//!
//! This file keeps the session's state; each hook calls one handler, in
//! a file per message family (`parse`, `bind`, `execute`, `rows`,
//! `completed`, `ready`, …), as `family::handler(session, …)`.

mod admit;
mod bind;
mod completed;
mod describe;
mod encodings;
mod execute;
mod outbox;
mod parameter_status;
mod parse;
mod query;
mod ready;
mod release;
mod rows;
mod sql_forms;
mod sync;
mod uncommitted;
mod unknown_saver;

use std::sync::Arc;

use bytes::Bytes;

use super::claim_gate::ClaimTicket;
use super::fencing::FenceGate;
use super::late_duplicate::LateGate;
use super::reload::FollowedRules;
use super::shared_session::SharedSessionWatch;
use super::transaction_end::TransactionEnd;
use super::validity::ValidityGate;
use super::watch::{Watch, WriteDecode};
use super::Enforcement;
use crate::audit::{AuditEvent, SessionContext};
use crate::claims::evidence::{Evidence, EvidenceSender};
use crate::saver::bind::BoundParams;
use crate::saver::classify::Classified;
use crate::wire::client_text;
use crate::wire::guard::{ClientError, ServerStep};
use crate::wire::last_text::LastText;
use crate::wire::messages::bind::Bind;
use crate::wire::tracker::{Bound, Hooks, Refusal, SavepointChange, TxnStatus};
use encodings::Encodings;
use uncommitted::Uncommitted;

/// A prepared statement as the enforcer knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub class: Arc<Classified>,
    /// Prepared as its fork rewrite (results carry the head column).
    pub rewritten: bool,
    /// The SQL carries the `resumeguard:inspect` comment hint.
    pub inspect_hint: bool,
    /// Whether the SQL commits (or prepares) or rolls back the open
    /// transaction (see `transaction_end`).
    pub ends_transaction: Option<TransactionEnd>,
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

pub struct SessionEnforcer {
    shared: Arc<Enforcement>,
    pub ctx: SessionContext,
    /// Sessions of the inspection listener never claim.
    pub inspection_listener: bool,
    /// Where a replaced rule set comes from (SIGHUP), if it can be; the
    /// session takes it at its next idle point, so a transaction is
    /// judged by one set from its first statement to its last.
    pub rules: Option<FollowedRules>,
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
    /// The claim of the head row held back from the client, until the
    /// relay releases it decided.
    held: Option<Arc<ClaimTicket>>,
    /// The last Parse text classified as ordinary traffic (under
    /// `shared`), with how it ends the transaction. Only texts `admit`
    /// let through are parsed, so it is admitted too.
    plain_parse: LastText<Option<TransactionEnd>>,
    /// The last statement text screened (under `shared`), and whether it
    /// was ordinary: the relay's test before a message, the tracker's
    /// command scan and each hook ask it of the same text in turn.
    screened: LastText<bool>,
    /// The client and database encodings the server last reported.
    encodings: Encodings,
    /// A row of the answer in front was refused (the client got the
    /// refusal instead): that answer's completion records no read, the
    /// refusal's record (`claim_refused`, `statement_refused`) standing
    /// for it.
    row_refused: bool,
}

impl SessionEnforcer {
    pub fn new(shared: Arc<Enforcement>, ctx: SessionContext) -> Self {
        let show_values = shared.audit.log_values();
        SessionEnforcer {
            shared,
            ctx,
            inspection_listener: false,
            rules: None,
            uncommitted: Uncommitted::default(),
            ready_evidence: Vec::new(),
            ready_events: Vec::new(),
            segment_failed: false,
            validity: ValidityGate::new(show_values),
            fencing: FenceGate::default(),
            run_open: false,
            late: LateGate::default(),
            shared_session: SharedSessionWatch::default(),
            held: None,
            row_refused: false,
            encodings: Encodings::default(),
            plain_parse: LastText::default(),
            screened: LastText::default(),
        }
    }

    /// Whether a run this session was granted has yet to commit its next
    /// checkpoint (see [`crate::wire::guard::Guard::holds_work`]).
    pub fn run_open(&self) -> bool {
        self.run_open
    }

    /// Where committed writes' claim evidence goes, with consume-once on.
    fn evidence_sender(&self) -> Option<&EvidenceSender> {
        self.shared.legs.claims.as_ref()?.evidence.as_ref()
    }

    /// Whether `sql` is ordinary traffic under the current rule set (see
    /// [`Enforcement::ordinary`]), screened once however often it is asked.
    fn is_ordinary(&mut self, sql: &[u8]) -> bool {
        if let Some(ordinary) = self.screened.get(sql) {
            return ordinary;
        }
        let ordinary = self.shared.ordinary(sql);
        self.screened.remember(sql, ordinary);
        ordinary
    }

    fn prepared(&self, class: Arc<Classified>) -> Prepared {
        Prepared {
            class,
            rewritten: false,
            inspect_hint: false,
            ends_transaction: None,
        }
    }
}

impl Hooks for SessionEnforcer {
    type Statement = Prepared;
    type Portal = Binding;
    type Watch = Watch;

    fn admit(&mut self, sql: &str) -> Result<(), Refusal> {
        admit::handle(self, sql)
    }

    fn parse(&mut self, sql: &str) -> (Prepared, Option<String>) {
        parse::handle(self, sql)
    }

    fn plain(&self) -> Prepared {
        self.prepared(self.shared.classifier.other())
    }

    fn sql_prepare(&mut self, inner: &str) -> Result<Prepared, Refusal> {
        sql_forms::prepare(self, inner)
    }

    fn sql_execute(&mut self, statement: &Prepared) -> Result<(), Refusal> {
        sql_forms::execute(self, statement)
    }

    fn sql_declare(&mut self, inner: &str) -> Result<(), Refusal> {
        sql_forms::declare(self, inner)
    }

    fn sql_fetch(&mut self, portal: &Binding) -> Result<(), Refusal> {
        sql_forms::fetch(self, portal)
    }

    fn bind(
        &mut self,
        statement: &Prepared,
        bind: &Bind<'_>,
    ) -> Result<Bound<Binding, Watch>, ClientError> {
        bind::handle(self, statement, bind)
    }

    fn execute(&mut self, portal: Option<&Binding>) -> Option<Watch> {
        execute::handle(self, portal)
    }

    fn describe_statement(&mut self, statement: &Prepared) -> Option<Watch> {
        describe::statement(self, statement)
    }

    fn describe_portal(&mut self, portal: Option<&Binding>) -> Option<Watch> {
        describe::portal(self, portal)
    }

    fn query(&mut self, sql: &str) -> Result<Option<Watch>, Refusal> {
        query::handle(self, sql)
    }

    fn query_refused(&mut self) {
        query::refused(self)
    }

    fn sync(&mut self) -> Option<Refusal> {
        sync::handle(self)
    }

    fn row(&mut self, watch: &mut Watch, frame: &[u8], step: &mut ServerStep) {
        rows::row(self, watch, frame, step)
    }

    fn row_description(&mut self, watch: &Watch, frame: &[u8]) -> Option<Bytes> {
        rows::description(self, watch, frame)
    }

    fn command_complete(&mut self, watch: &mut Watch, tag: &[u8]) {
        completed::command_complete(watch, tag)
    }

    fn completed(&mut self, watch: Watch, ok: bool) {
        completed::handle(self, watch, ok)
    }

    fn answer_error(&mut self, watch: &mut Watch, frame: &[u8]) {
        completed::answer_error(self, watch, frame)
    }

    fn error(&mut self) {
        ready::error(self)
    }

    fn ready(&mut self, status: TxnStatus) {
        ready::handle(self, status)
    }

    fn rollback(&mut self) {
        ready::rollback(self)
    }

    fn savepoint(&mut self, change: SavepointChange<'_>) {
        ready::savepoint(self, change)
    }

    fn parameter_status(&mut self, name: &[u8], value: &[u8]) {
        parameter_status::handle(self, name, value)
    }

    /// A replaced rule set is taken at the session's idle points.
    fn next_client_message(&mut self, idle: bool) {
        if let Some(shared) = self.rules.as_mut().and_then(|r| r.replaced(idle)) {
            self.shared = shared;
            self.plain_parse.forget();
            self.screened.forget();
        }
    }

    fn reads_bind(&self, statement: &Prepared) -> bool {
        bind::reads(self, statement)
    }

    fn may_refuse(&self, watch: &Watch) -> bool {
        watch.head_column || (self.shared.legs.claims.is_some() && watch.is_gated())
    }

    fn release(&mut self) -> Option<Bytes> {
        release::handle(self)
    }

    fn holds_work(&self) -> bool {
        self.run_open
    }

    /// With consume-once on, the hooks of checkpoint statements ask the
    /// claim store (fence lookups, late duplicates, withdrawn claims); a
    /// text naming none of the savers' tables never becomes one.
    fn may_block(&mut self, sql: &[u8]) -> bool {
        self.shared.legs.claims.is_some()
            && !self.is_ordinary(sql)
            && self
                .shared
                .classifier
                .names_saver_tables(&client_text::decode(sql))
    }

    fn ordinary(&mut self, sql: &str) -> bool {
        self.is_ordinary(sql.as_bytes())
    }

    fn function_call(&mut self) {
        // It may call set_config: the client encoding may change.
        self.encodings.unsettle();
    }

    fn drained(&mut self) {
        // Every change of encoding sent has been reported.
        self.encodings.settle();
    }

    fn flush(&mut self) {
        outbox::flush(self)
    }

    fn closed(&mut self) {
        outbox::closed(self)
    }
}

#[cfg(test)]
mod tests;
