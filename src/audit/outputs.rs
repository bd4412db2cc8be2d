//! One destination of the trail, written so that no loss goes unrecorded.
//!
//! A batch that fails to write is kept and retried with the next write.
//! It is given up, its events counted as lost, after [`MAX_ATTEMPTS`]
//! writes the output refused, once it has failed for [`RETRY_BUDGET`], or
//! when too many events wait. A write that could not reach the output (the
//! PostgreSQL database restarting, failing over, or not known yet while
//! the managed server starts) costs no attempt: such an outage is retried
//! for the whole budget. Losses, including events the
//! queue refused, sit in the output's [`LossLedger`] until a write
//! succeeds: that write carries an `events_dropped` gap record saying how
//! many were lost, why, and when. Failing and recovering are logged at
//! ERROR once each, not per batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::AuditError;
use super::jsonl::JsonlWriter;
use super::losses::{LossLedger, LossReason};
use super::postgres_store::PgTrail;
use super::sqlite_store::Store;
use crate::audit_event::AuditEvent;
use crate::error_chain::chain;

/// Writes the output may refuse a retained event before it is counted as
/// lost; a write that could not reach the output is not one of them.
pub const MAX_ATTEMPTS: u32 = 3;

/// How long events that failed to write are retried before they are
/// counted as lost: long enough to ride out a database restart or a
/// replica's promotion (tens of seconds), short enough that the loss
/// counter and the log tell of a longer outage while it lasts.
pub const RETRY_BUDGET: Duration = Duration::from_secs(60);

/// Most events kept for retry; beyond this they are counted as lost at
/// once, so a dead output cannot hold unbounded memory.
pub const MAX_RETAINED: usize = 16_384;

/// Where one output's events go.
pub enum Target {
    Sqlite(Store),
    Jsonl(JsonlWriter),
    /// Boxed: its connection is large beside the others.
    Postgres(Box<PgTrail>),
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Sqlite(_) => "sqlite",
            Target::Jsonl(_) => "jsonl",
            Target::Postgres(_) => "postgres",
        }
    }

    /// Write `events` in order. On failure, also how many leading events
    /// did reach the output (SQLite, PostgreSQL: none, the batch is one
    /// transaction).
    fn write(&mut self, events: &[&AuditEvent]) -> Result<(), (usize, AuditError)> {
        match self {
            Target::Sqlite(store) => store.append(events.iter().copied()).map_err(|e| (0, e)),
            Target::Jsonl(jsonl) => jsonl.append(events.iter().copied()),
            Target::Postgres(trail) => trail.append(events).map_err(|e| (0, e)),
        }
    }
}

/// One output with its retry buffer and unrecorded losses.
pub struct Output {
    target: Target,
    /// Events that failed to write, oldest first, awaiting a retry.
    retained: Vec<Arc<AuditEvent>>,
    /// Refused writes of the oldest retained events.
    attempts: u32,
    /// When the oldest retained events first failed to write.
    failing_since: Option<Instant>,
    /// [`RETRY_BUDGET`], shorter in tests.
    retry_budget: Duration,
    ledger: LossLedger,
    /// Whether the last write failed.
    failing: bool,
    /// Events this output gave up on since start (queue drops excluded).
    write_lost: u64,
    /// The replica's name, stamped on the gap records it writes.
    proxy_id: String,
}

impl Output {
    pub fn new(target: Target, proxy_id: &str) -> Output {
        Output {
            target,
            retained: Vec::new(),
            attempts: 0,
            failing_since: None,
            retry_budget: RETRY_BUDGET,
            ledger: LossLedger::default(),
            failing: false,
            write_lost: 0,
            proxy_id: proxy_id.to_owned(),
        }
    }

    /// This output retrying for `budget` instead of [`RETRY_BUDGET`].
    #[cfg(test)]
    pub fn with_retry_budget(mut self, budget: Duration) -> Output {
        self.retry_budget = budget;
        self
    }

    pub fn name(&self) -> &'static str {
        self.target.name()
    }

    /// The SQLite store, for pruning, unless it is failing (a prune would
    /// fail too) or holds events for a retry.
    pub fn store_if_settled(&mut self) -> Option<&mut Store> {
        let settled = self.is_settled();
        match &mut self.target {
            Target::Sqlite(store) if settled => Some(store),
            _ => None,
        }
    }

    /// The PostgreSQL table, for its retention, when settled (as
    /// [`Output::store_if_settled`]).
    pub fn postgres_if_settled(&mut self) -> Option<&mut PgTrail> {
        let settled = self.is_settled();
        match &mut self.target {
            Target::Postgres(trail) if settled => Some(trail),
            _ => None,
        }
    }

    /// Events given up on since start.
    pub fn write_lost(&self) -> u64 {
        self.write_lost
    }

    /// Events kept for a retry.
    pub fn retained(&self) -> usize {
        self.retained.len()
    }

    /// Nothing waits for a retry and every loss is recorded.
    pub fn is_settled(&self) -> bool {
        self.retained.is_empty() && self.ledger.is_empty()
    }

    /// `n` events refused by the queue between the two times.
    pub fn note_queue_drops(&mut self, n: u64, first: &str, last: &str) {
        if n > 0 && self.ledger.is_empty() {
            tracing::error!(
                output = self.name(),
                "audit queue full: events are being dropped; a gap record will say how many"
            );
        }
        self.ledger.add(LossReason::QueueFull, n, first, last);
    }

    /// Write the retained events, then `batch`, then a gap record if
    /// losses are pending. Returns whether the write failed.
    pub fn write(&mut self, batch: &[Arc<AuditEvent>]) -> bool {
        let gap = (!self.ledger.is_empty()).then(|| {
            let mut gap = self.ledger.gap_record();
            gap.proxy_id.clone_from(&self.proxy_id);
            gap
        });
        let mut list: Vec<&AuditEvent> = self.retained.iter().chain(batch).map(|e| &**e).collect();
        let events = list.len();
        if events == 0 && gap.is_none() {
            return false;
        }
        list.extend(gap.as_ref());
        match self.target.write(&list) {
            Ok(()) => {
                self.recovered(gap.is_some());
                self.retained.clear();
                self.attempts = 0;
                self.failing_since = None;
                false
            }
            Err((written, error)) => {
                drop(list);
                self.failed(batch, written.min(events), &error);
                true
            }
        }
    }

    fn recovered(&mut self, wrote_gap: bool) {
        if wrote_gap {
            self.log_lost("audit events were lost; events_dropped gap record written");
            self.ledger = LossLedger::default();
        } else if self.failing {
            tracing::warn!(
                output = self.name(),
                "audit output writes again; its retried events were written, nothing was lost"
            );
        }
        self.failing = false;
    }

    /// Keep what was not written for a retry, or give it up.
    fn failed(&mut self, batch: &[Arc<AuditEvent>], written: usize, error: &AuditError) {
        let reached = !error.is_unreachable();
        let error = chain(error).to_string();
        if !self.failing {
            tracing::error!(
                output = self.name(),
                %error,
                "audit output failed to write; retrying, then counting events as lost"
            );
            self.failing = true;
        }
        self.ledger.note_error(&error);
        let from_retained = written.min(self.retained.len());
        self.retained.drain(..from_retained);
        let skip = written - from_retained;
        self.retained.extend(batch.iter().skip(skip).cloned());
        if self.retained.is_empty() {
            // Only the gap record failed: nothing new to give up.
            return;
        }
        if reached {
            self.attempts += 1;
        }
        let failing_since = *self.failing_since.get_or_insert_with(Instant::now);
        if self.attempts >= MAX_ATTEMPTS
            || failing_since.elapsed() >= self.retry_budget
            || self.retained.len() > MAX_RETAINED
        {
            self.give_up();
        }
    }

    /// Count every retained event as lost.
    fn give_up(&mut self) {
        let n = self.retained.len() as u64;
        if n > 0 {
            let first = self.retained.iter().map(|e| e.time.as_str()).min();
            let last = self.retained.iter().map(|e| e.time.as_str()).max();
            let (first, last) = (first.unwrap_or_default(), last.unwrap_or_default());
            self.ledger.add(LossReason::WriteFailed, n, first, last);
        }
        self.retained.clear();
        self.attempts = 0;
        self.failing_since = None;
        self.write_lost += n;
    }

    /// At shutdown: what could not be written is lost; say so in the log,
    /// the only place left.
    pub fn abandon(&mut self) {
        self.give_up();
        if !self.ledger.is_empty() {
            self.log_lost(
                "audit events lost and not recorded in the trail: the output still failed at shutdown",
            );
        }
    }

    /// Logs the events the ledger counts as lost, `message` saying what
    /// became of them.
    fn log_lost(&self, message: &str) {
        tracing::error!(
            output = self.name(),
            dropped = self.ledger.count(),
            reason = self.ledger.reason(),
            first_lost = self.ledger.first_lost(),
            last_lost = self.ledger.last_lost(),
            "{message}"
        );
    }
}
