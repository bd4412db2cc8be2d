//! Evidence of a run, applied to the claim store off the data path.
//!
//! Committed checkpoint writes tell the store how a resume is going: a
//! run-level `__resume__` is progress (the holder is alive and answered),
//! the gated task's own writes consume the claim, a new checkpoint moves
//! the thread on, a deleted thread forgets its claims, a closed holder
//! session lets its claims lapse sooner. One worker thread per proxy
//! applies them in order, so the relay never waits on the store for them;
//! what arrives together is applied in one statement (`evidence_gather`);
//! what the store cannot take now is retried until it is applied
//! (`claims::evidence_retry`), and what is lost is counted and audited.
//! Where the claims schema is in the sessions' database, an answering
//! write has already consumed its claim in its own transaction
//! (`claims::postgres::answer_in_write`): its evidence then only reports
//! that consumption to the audit trail.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::evidence_gather::Gathered;
use super::evidence_retry::RetryQueue;
use super::failure_streak::{Failure, FailureStreak};
use super::postgres::{EvidenceItem, WriteEvidence};
use super::{ClaimRecord, ClaimStore, Now, StoreError, WrittenAt, NEXT_CHECKPOINT};
use crate::audit_event::{AuditEvent, Operation, SessionContext};
use crate::claims::timings::LiveClaimsTimings;
use crate::log_text::shown;
use crate::saver::checkpoint_ref::CheckpointRef;

/// What a committed write or a closed session means for claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// A run-level answer was recorded: the holder is alive.
    Progress {
        at: CheckpointRef,
        /// When the write passed the proxy.
        written_at: WrittenAt,
    },
    /// The gated task wrote its results: the interrupt is consumed.
    Consumed {
        at: CheckpointRef,
        what: String,
        /// When the write passed the proxy: claims taken later (on a newer
        /// interrupt of the same checkpoint) are not consumed by it.
        written_at: WrittenAt,
    },
    /// A checkpoint with this parent was written.
    MovedOn {
        /// The new checkpoint's parent.
        parent: CheckpointRef,
    },
    ThreadDeleted {
        thread_id: String,
    },
    HolderGone {
        session_id: u64,
    },
}

/// Where the worker's audit records (claims consumed, evidence lost) go:
/// `serve` passes one that hands them to the audit trail's sink.
pub type AuditRecorder = Arc<dyn Fn(AuditEvent) + Send + Sync>;

/// The sending side, cheap to clone; never blocks the relay.
#[derive(Clone)]
pub struct EvidenceSender {
    tx: SyncSender<Msg>,
    audit: AuditRecorder,
    /// Evidence sent to the worker and neither applied nor reported lost
    /// yet (shared with the worker).
    unapplied: Arc<AtomicUsize>,
}

/// What the worker is sent.
enum Msg {
    Apply(SessionContext, Evidence),
    /// Apply what is gathered now, then answer: a decision that reads what
    /// earlier evidence leaves in the store waits for it.
    Flush(SyncSender<()>),
    /// Shutdown: apply (retrying) what is queued until the deadline, report
    /// the rest lost, then answer.
    Finish {
        deadline: Instant,
        done: SyncSender<()>,
    },
}

impl EvidenceSender {
    pub fn send(&self, ctx: &SessionContext, ev: Evidence) {
        match self.tx.try_send(Msg::Apply(ctx.clone(), ev)) {
            Ok(()) => {
                self.unapplied.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(Msg::Apply(_, ev))) => {
                // The claim then lapses as it would without evidence.
                tracing::error!(
                    ?ev,
                    "claim evidence queue full: evidence lost, its claim will lapse"
                );
                lost(&self.audit, &ev, "queue_full");
            }
            Err(TrySendError::Disconnected(Msg::Apply(_, ev))) => {
                tracing::error!(
                    ?ev,
                    "claim evidence worker gone: evidence lost, its claim will lapse"
                );
                lost(&self.audit, &ev, "worker_gone");
            }
            Err(_) => {}
        }
    }

    /// Waits (at most `within`) until the write evidence sent so far has
    /// gone to the store, gathered or not: a decision that reads its
    /// result must not race the gathering. Evidence the store could not
    /// take waits for its retry as before; what is still queued when
    /// `within` passes is said (WARN) and the decision reads the store as
    /// it is.
    pub fn flush(&self, within: Duration) {
        let (done, flushed) = sync_channel(1);
        let answered = match self.tx.try_send(Msg::Flush(done)) {
            Ok(()) => flushed.recv_timeout(within).is_ok(),
            Err(_) => false,
        };
        if !answered {
            metrics::counter!(crate::metrics::EVIDENCE_FLUSH_TIMEOUTS).increment(1);
            tracing::warn!(
                within_ms = within.as_millis() as u64,
                "claim evidence not flushed in time: the decision reads the claim store as it is"
            );
        }
    }

    /// At shutdown, after the last session closed: waits (at most
    /// `within`) until the evidence sent so far is applied; what cannot be
    /// is reported lost (ERROR, `evidence_lost`). A worker that does not
    /// answer (stuck in a store call, or gone) cannot report what it
    /// holds: that is reported here, as a count.
    pub fn finish(&self, within: Duration) {
        let (done, finished) = sync_channel(1);
        let deadline = Instant::now() + within;
        // The worker answers by the deadline, after its last store call.
        let answered = self.tx.send(Msg::Finish { deadline, done }).is_ok()
            && finished.recv_timeout(within + FINISH_GRACE).is_ok();
        if !answered {
            self.unanswered(within);
        }
    }

    /// The worker did not answer the shutdown: what it still held is lost
    /// with the process, counted and audited as one gap.
    fn unanswered(&self, within: Duration) {
        let unapplied = self.unapplied.load(Ordering::Relaxed);
        tracing::error!(
            unapplied,
            within_ms = (within + FINISH_GRACE).as_millis() as u64,
            "claim evidence worker did not answer at shutdown: the evidence it still held \
             (unapplied) may be lost, their claims will lapse"
        );
        if unapplied == 0 {
            return;
        }
        metrics::counter!(crate::metrics::EVIDENCE_LOST, "reason" => "shutdown")
            .increment(unapplied as u64);
        let e = AuditEvent::new(&SessionContext::internal(), Operation::EvidenceLost);
        (self.audit)(e.with_detail(json!({
            "evidence": "unknown",
            "reason": "shutdown",
            "unapplied": unapplied,
        })));
    }
}

/// Evidence waiting for a retry, at most: beyond it the oldest is lost
/// (reported).
const MAX_PENDING: usize = 10_000;

/// How long past its deadline a shutdown waits for the worker's answer:
/// the store call it is in may take that long (a statement timeout).
const FINISH_GRACE: Duration = Duration::from_secs(5);

/// Starts the worker for `store`; it ends when every sender is dropped.
/// Each piece of evidence is applied with the progress hold and holder-gone
/// grace `timings` holds when it is applied (a reload may change them).
pub fn start(
    store: Arc<ClaimStore>,
    proxy_id: String,
    timings: Arc<LiveClaimsTimings>,
    audit: AuditRecorder,
) -> EvidenceSender {
    let (tx, rx) = sync_channel(65_536);
    let unapplied = Arc::new(AtomicUsize::new(0));
    let sender = EvidenceSender {
        tx,
        audit: Arc::clone(&audit),
        unapplied: Arc::clone(&unapplied),
    };
    let worker = Worker {
        store,
        proxy_id,
        timings,
        audit,
        pending: RetryQueue::new(MAX_PENDING),
        gathered: Gathered::new(),
        failing: FailureStreak::default(),
        lost_since_failing: 0,
        unapplied,
    };
    let spawned = std::thread::Builder::new()
        .name("resumeguard-claims".into())
        .spawn(move || worker.run(rx));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the claim evidence worker: claims will only lapse");
    }
    sender
}

/// Applies evidence in arrival order; what the store cannot take now is
/// retried (see [`RetryQueue`]) until it is applied.
struct Worker {
    store: Arc<ClaimStore>,
    proxy_id: String,
    timings: Arc<LiveClaimsTimings>,
    audit: AuditRecorder,
    pending: RetryQueue<(SessionContext, Evidence)>,
    /// Write evidence arrived together, applied in one statement when due.
    gathered: Gathered<(SessionContext, Evidence)>,
    /// Evidence has failed since the queue was last empty, and why last.
    failing: FailureStreak,
    lost_since_failing: u64,
    /// The sender's count of evidence neither applied nor reported lost.
    unapplied: Arc<AtomicUsize>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            let now = Instant::now();
            let wait = [self.pending.due_in(now), self.gathered.due_in(now)]
                .into_iter()
                .flatten()
                .min();
            let next = match wait {
                None => match rx.recv() {
                    Ok(item) => Some(item),
                    Err(_) => break,
                },
                Some(wait) => match rx.recv_timeout(wait) {
                    Ok(item) => Some(item),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                },
            };
            match next {
                Some(Msg::Apply(ctx, ev)) => self.take(ctx, ev),
                Some(Msg::Flush(done)) => {
                    self.apply_gathered();
                    let _ = done.send(());
                }
                Some(Msg::Finish { deadline, done }) => {
                    self.apply_gathered();
                    self.finish(deadline);
                    let _ = done.send(());
                }
                None => {}
            }
            if self.gathered.due_in(Instant::now()) == Some(Duration::ZERO) {
                self.apply_gathered();
            }
            if self.pending.due_in(Instant::now()) == Some(Duration::ZERO) {
                self.retry();
            }
        }
        self.apply_gathered();
        self.finish(Instant::now());
    }

    /// Retries what waits until it is applied or `deadline` passes; what
    /// is left then is lost, said loudly.
    fn finish(&mut self, deadline: Instant) {
        while !self.pending.is_empty() {
            let now = Instant::now();
            let wait = self.pending.due_in(now).unwrap_or_default();
            if now + wait > deadline {
                break;
            }
            std::thread::sleep(wait);
            self.retry();
        }
        let left: Vec<_> = self.pending.drain().collect();
        for (_, ev) in &left {
            tracing::error!(
                ?ev,
                "claim evidence not applied before exit: lost, its claim will lapse"
            );
            lost(&self.audit, ev, "shutdown");
        }
        self.settled(left.len());
        metrics::gauge!(crate::metrics::EVIDENCE_PENDING).set(0.0);
    }

    /// `n` pieces of evidence were applied or reported lost.
    fn settled(&self, n: usize) {
        let _ = self
            .unapplied
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(n))
            });
    }

    /// New evidence: a write's is gathered with what arrives with it,
    /// anything else applied now (after what was gathered), unless earlier
    /// evidence of its session waits (order is kept) or the store cannot
    /// take it.
    fn take(&mut self, ctx: SessionContext, ev: Evidence) {
        let lane = ctx.session_id;
        if item(&ev).is_some() && !self.pending.holds_lane(lane) {
            if self.gathered.push((ctx, ev), Instant::now()) {
                self.apply_gathered();
            }
            return;
        }
        // What was gathered comes first; if it could not be applied, its
        // session's later evidence waits behind it.
        self.apply_gathered();
        if self.pending.holds_lane(lane) {
            self.queue(lane, ctx, ev);
            return;
        }
        self.apply_or_queue(ctx, ev);
    }

    fn apply_or_queue(&mut self, ctx: SessionContext, ev: Evidence) {
        match self.apply(&ctx, &ev) {
            Ok(()) => self.settled(1),
            Err(e) => {
                self.failed(&e, &ev);
                self.queue(ctx.session_id, ctx, ev);
            }
        }
    }

    /// Evidence the store did not take: the first failure of a run and
    /// one for another cause are ERRORs (until it is applied its claim
    /// may lapse and another resume take over), the rest of the run
    /// debug.
    fn failed(&mut self, e: &StoreError, ev: &Evidence) {
        match self.failing.failed(e) {
            Failure::Began => tracing::error!(error = %e, ?ev,
                "claim evidence not applied: retrying until the claim store takes it; until \
                 then its claim may lapse and another resume take over"),
            Failure::CauseChanged => tracing::error!(error = %e, ?ev,
                "claim evidence still not applied, now for another cause: retrying"),
            Failure::Continues => tracing::debug!(error = %e, ?ev, pending = self.pending.len(),
                retries = self.pending.retries(), "claim evidence still not applied"),
        }
    }

    /// What was gathered, in one statement; when the store cannot take
    /// it, every item is retried in order.
    fn apply_gathered(&mut self) {
        let gathered = self.gathered.take();
        let batch: Vec<_> = gathered.iter().map(|(ctx, ev)| (ctx, ev)).collect();
        let Some(&(_, first)) = batch.first() else {
            return;
        };
        match self.apply_writes(&batch) {
            Ok(()) => self.settled(batch.len()),
            Err(e) => {
                self.failed(&e, first);
                for (ctx, ev) in gathered {
                    self.queue(ctx.session_id, ctx, ev);
                }
            }
        }
    }

    fn queue(&mut self, lane: u64, ctx: SessionContext, ev: Evidence) {
        if let Some((_, dropped)) = self.pending.push(lane, (ctx, ev), Instant::now()) {
            if self.lost_since_failing == 0 {
                tracing::error!(pending = self.pending.len(), ?dropped,
                    "claim evidence retry queue full: the oldest evidence is lost, its claim will lapse");
            }
            self.lost_since_failing += 1;
            lost(&self.audit, &dropped, "retry_queue_full");
            self.settled(1);
        }
        metrics::gauge!(crate::metrics::EVIDENCE_PENDING).set(self.pending.len() as f64);
    }

    fn retry(&mut self) {
        let mut last_failure = None;
        let mut pending = std::mem::replace(&mut self.pending, RetryQueue::new(1));
        let round = pending.retry(Instant::now(), |(ctx, ev)| {
            metrics::counter!(crate::metrics::EVIDENCE_RETRIES).increment(1);
            match self.apply(ctx, ev) {
                Ok(()) => true,
                Err(e) => {
                    last_failure = Some((e, ev.clone()));
                    false
                }
            }
        });
        self.pending = pending;
        self.settled(round.applied);
        metrics::gauge!(crate::metrics::EVIDENCE_PENDING).set(self.pending.len() as f64);
        if self.pending.is_empty() {
            if self.failing.succeeded() {
                tracing::info!(
                    applied = round.applied,
                    lost = self.lost_since_failing,
                    "claim evidence applied again: the claim store takes it, nothing pending"
                );
            }
            self.lost_since_failing = 0;
        } else if let Some((e, ev)) = last_failure {
            self.failed(&e, &ev);
        }
    }

    fn apply(&self, ctx: &SessionContext, ev: &Evidence) -> Result<(), StoreError> {
        match ev {
            Evidence::ThreadDeleted { thread_id } => self.store.forget_thread(thread_id).map(drop),
            Evidence::HolderGone { session_id } => self
                .store
                .holder_gone(
                    &self.proxy_id,
                    *session_id,
                    Now::STORE,
                    self.timings.current().holder_gone_grace_ms,
                )
                .map(drop),
            _ => self.apply_writes(&[(ctx, ev)]),
        }
    }

    /// Writes' evidence in one statement (`apply_evidence`), in order; the
    /// claims it consumed are audited with the session whose write
    /// consumed them. Only writes' evidence is passed here (see `take`).
    fn apply_writes(&self, batch: &[(&SessionContext, &Evidence)]) -> Result<(), StoreError> {
        let writes: Vec<_> = batch
            .iter()
            .filter_map(|&(ctx, ev)| Some((ctx, ev, item(ev)?)))
            .collect();
        let items: Vec<_> = writes.iter().map(|&(_, _, item)| item).collect();
        let hold_ms = self.timings.current().progress_hold_ms;
        let consumed = self.store.apply_evidence(&items, Now::STORE, hold_ms)?;
        crate::metrics::claims_consumed(consumed.len());
        for (i, record) in consumed {
            if let Some(&(ctx, ev, _)) = writes.get(i) {
                (self.audit)(consumed_event(ctx, ev, &record));
            }
        }
        Ok(())
    }
}

/// A write's evidence as one item of a gathered statement; `None` for
/// evidence that is not a write's (applied alone).
fn item(ev: &Evidence) -> Option<EvidenceItem<'_>> {
    Some(match ev {
        Evidence::Progress { at, written_at } => EvidenceItem {
            kind: WriteEvidence::Progress,
            at,
            what: PROGRESS,
            written_at: Some(*written_at),
        },
        Evidence::Consumed {
            at,
            what,
            written_at,
        } => EvidenceItem {
            kind: WriteEvidence::Consumed,
            at,
            what,
            written_at: Some(*written_at),
        },
        Evidence::MovedOn { parent } => EvidenceItem {
            kind: WriteEvidence::MovedOn,
            at: parent,
            what: NEXT_CHECKPOINT,
            written_at: None,
        },
        Evidence::ThreadDeleted { .. } | Evidence::HolderGone { .. } => return None,
    })
}

/// What progress evidence records on a claim.
const PROGRESS: &str = "run-level __resume__ recorded";

/// Evidence that will never be applied: counted and audited
/// (`evidence_lost`), so the trail shows which checkpoint's claim lapses
/// instead of being consumed or released.
fn lost(audit: &AuditRecorder, ev: &Evidence, reason: &'static str) {
    audit(lost_event(&SessionContext::internal(), ev, reason));
}

/// Counts `ev` as never to be applied, for `reason`, and returns its
/// `evidence_lost` audit event, recorded for `ctx`.
pub fn lost_event(ctx: &SessionContext, ev: &Evidence, reason: &'static str) -> AuditEvent {
    metrics::counter!(crate::metrics::EVIDENCE_LOST, "reason" => reason).increment(1);
    let mut e = AuditEvent::new(ctx, Operation::EvidenceLost);
    if let Some(thread) = ev.thread_id() {
        e = e.with_thread(thread.to_owned());
    }
    // The checkpoint whose claim the evidence was for, where it names one.
    if let Evidence::Progress { at, .. }
    | Evidence::Consumed { at, .. }
    | Evidence::MovedOn { parent: at } = ev
    {
        e = e.with_checkpoint(at.checkpoint_ns.clone(), at.checkpoint_id.clone());
    }
    e.with_detail(json!({ "evidence": ev.kind(), "reason": reason }))
}

impl Evidence {
    /// The thread the evidence is about, when it names one.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            Evidence::Progress { at, .. } | Evidence::Consumed { at, .. } => Some(&at.thread_id),
            Evidence::MovedOn { parent } => Some(&parent.thread_id),
            Evidence::ThreadDeleted { thread_id } => Some(thread_id),
            Evidence::HolderGone { .. } => None,
        }
    }

    /// The thread a deletion removed, for thread deletion evidence.
    pub fn deleted_thread(&self) -> Option<&str> {
        match self {
            Evidence::ThreadDeleted { thread_id } => Some(thread_id),
            _ => None,
        }
    }

    /// Its kind, as the audit trail names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Evidence::Progress { .. } => "progress",
            Evidence::Consumed { .. } => "consumed",
            Evidence::MovedOn { .. } => "moved_on",
            Evidence::ThreadDeleted { .. } => "thread_deleted",
            Evidence::HolderGone { .. } => "holder_gone",
        }
    }
}

fn consumed_event(ctx: &SessionContext, ev: &Evidence, record: &ClaimRecord) -> AuditEvent {
    // The record as it was, with the time of its consumption.
    let late = record.consumed_after_lapse();
    if late {
        // The map form writes nothing until its node finished: a gate
        // longer than the lapse lets a second resume take over meanwhile.
        tracing::warn!(
            thread = %shown(&record.key.at.thread_id),
            checkpoint = %shown(&record.key.at.checkpoint_id),
            "claim consumed after it lapsed: a resume ran longer than claims.lapse_ms \
             (map-form resume with a slow gate?); raise claims.lapse_ms"
        );
    }
    let evidence = match ev {
        Evidence::Consumed { what, .. } => what.clone(),
        Evidence::MovedOn { .. } => super::NEXT_CHECKPOINT.to_owned(),
        other => format!("{other:?}"),
    };
    let mut e = AuditEvent::new(ctx, Operation::ClaimConsumed)
        .with_thread(record.key.at.thread_id.clone())
        .with_checkpoint(
            record.key.at.checkpoint_ns.clone(),
            record.key.at.checkpoint_id.clone(),
        );
    e.detail = json!({
        "interrupt": record.key.short_fingerprint(),
        "holder": {
            "client_addr": record.holder.client_addr,
            "application_name": record.holder.application_name,
            "proxy_id": record.holder.proxy_id,
            "session_id": record.holder.session_id,
        },
        "evidence": evidence,
        "after_lapse": late,
    });
    e
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::claims::postgres::tests::{holder, key};
    use crate::claims::timings::ClaimsTimings;
    use crate::claims::{ClaimKey, ClaimState};
    use crate::test_metrics::has_line;
    use crate::test_pg_server::PgSchema;

    /// A worker over a fresh store where session 7 of proxy `p1` holds a
    /// claim on each of `keys`, and the instant its writes passed: a
    /// client's round trip after the claims.
    struct Claimed {
        _db: PgSchema,
        store: Arc<ClaimStore>,
        sender: EvidenceSender,
        ctx: SessionContext,
        sent: WrittenAt,
    }

    fn claimed(schema: &str, keys: &[&ClaimKey]) -> Claimed {
        let db = PgSchema::new(schema);
        let store = Arc::new(db.open());
        let holder = holder("p1", 7);
        for k in keys {
            store
                .try_claim(k, &holder, Now::STORE, 600_000)
                .expect("claim");
        }
        let timings = LiveClaimsTimings::new(ClaimsTimings::default());
        let sender = start(store.clone(), "p1".into(), timings, Arc::new(drop));
        let ctx = SessionContext {
            session_id: 7,
            ..SessionContext::default()
        };
        std::thread::sleep(Duration::from_millis(5));
        Claimed {
            _db: db,
            store,
            sender,
            ctx,
            sent: WrittenAt::Sent(Instant::now()),
        }
    }

    impl Claimed {
        /// Sends `ev` as session 7's.
        fn send(&self, ev: Evidence) {
            self.sender.send(&self.ctx, ev);
        }
    }

    #[test]
    fn a_runs_writes_sent_together_are_all_applied_by_shutdown() {
        let (progressed, answered, moved) = (key("c1"), key("c2"), key("c3"));
        let w = claimed("gathered_worker", &[&progressed, &answered, &moved]);
        w.send(Evidence::Progress {
            at: progressed.at.clone(),
            written_at: w.sent,
        });
        w.send(Evidence::Consumed {
            at: answered.at.clone(),
            what: "task a wrote approved".into(),
            written_at: w.sent,
        });
        w.send(Evidence::MovedOn {
            parent: moved.at.clone(),
        });
        // Shutdown applies what is still gathered.
        w.sender.finish(Duration::from_secs(10));
        assert_eq!(w.sender.unapplied.load(Ordering::Relaxed), 0);
        let state = |k: &ClaimKey| {
            let r = w.store.get(k).expect("get").expect("row");
            (r.state, r.evidence)
        };
        assert_eq!(
            state(&progressed),
            (ClaimState::Held, Some(PROGRESS.to_owned()))
        );
        assert_eq!(
            state(&answered),
            (
                ClaimState::Consumed,
                Some("task a wrote approved".to_owned())
            )
        );
        assert_eq!(
            state(&moved),
            (ClaimState::Consumed, Some(NEXT_CHECKPOINT.to_owned()))
        );
    }

    #[test]
    fn evidence_not_taken_is_an_error_first_and_again_when_its_cause_changes() {
        let mut worker = Worker {
            store: Arc::new(crate::test_pg_server::unreachable()),
            proxy_id: "p1".into(),
            timings: LiveClaimsTimings::new(ClaimsTimings::default()),
            audit: Arc::new(drop),
            pending: RetryQueue::new(MAX_PENDING),
            gathered: Gathered::new(),
            failing: FailureStreak::default(),
            lost_since_failing: 0,
            unapplied: Arc::default(),
        };
        let down = |reason: &str| StoreError::Postgres {
            at: "claims".into(),
            op: "apply_evidence",
            reason: reason.into(),
        };
        let ev = Evidence::HolderGone { session_id: 7 };
        let errors = |log: &str| log.lines().filter(|l| l.contains("ERROR")).count();
        let ((), log) = crate::test_log::captured(|| {
            worker.failed(&down("connection refused"), &ev);
            worker.failed(&down("connection refused"), &ev);
        });
        assert_eq!(errors(&log), 1, "{log}");
        let ((), log) =
            crate::test_log::captured(|| worker.failed(&down("statement timeout"), &ev));
        assert_eq!(errors(&log), 1, "{log}");
    }

    #[test]
    fn a_worker_that_does_not_answer_the_shutdown_has_its_evidence_counted_lost() {
        let (tx, rx) = sync_channel(4);
        let audited = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = Arc::clone(&audited);
        let sender = EvidenceSender {
            tx,
            audit: Arc::new(move |e| into.lock().unwrap().push(e)),
            unapplied: Arc::default(),
        };
        let ctx = SessionContext::default();
        for session_id in [1, 2] {
            sender.send(&ctx, Evidence::HolderGone { session_id });
        }
        // The worker is gone with what it was sent.
        drop(rx);
        let (((), body), log) = crate::test_log::captured(|| {
            crate::test_metrics::recorded(|| sender.finish(Duration::ZERO))
        });
        assert!(
            log.lines()
                .any(|l| l.contains("ERROR") && l.contains("unapplied=2")),
            "{log}"
        );
        assert!(
            has_line(
                &body,
                "resumeguard_evidence_lost_total{reason=\"shutdown\"} 2"
            ),
            "{body}"
        );
        let audited = audited.lock().unwrap();
        assert_eq!(audited.len(), 1);
        assert_eq!(audited[0].operation, Operation::EvidenceLost);
        assert_eq!(audited[0].detail["unapplied"], 2);
    }

    #[test]
    fn lost_evidence_names_its_checkpoint() {
        let audited = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = Arc::clone(&audited);
        let audit: AuditRecorder = Arc::new(move |e| into.lock().unwrap().push(e));
        let parent = CheckpointRef {
            thread_id: "t1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "c1".into(),
        };
        lost(&audit, &Evidence::MovedOn { parent }, "queue_full");
        let audited = audited.lock().unwrap();
        assert_eq!(audited.len(), 1);
        assert_eq!(audited[0].operation, Operation::EvidenceLost);
        assert_eq!(audited[0].thread_id.as_deref(), Some("t1"));
        assert_eq!(audited[0].checkpoint_ns.as_deref(), Some(""));
        assert_eq!(audited[0].checkpoint_id.as_deref(), Some("c1"));
        assert_eq!(audited[0].detail["reason"], "queue_full");
    }

    #[test]
    fn a_claim_consumed_after_it_lapsed_names_its_thread_escaped() {
        let forged = ClaimKey {
            at: CheckpointRef {
                thread_id: "t1\nERROR forged line".into(),
                checkpoint_ns: String::new(),
                checkpoint_id: "c1".into(),
            },
            fingerprint: "f".into(),
        };
        let mut record = ClaimRecord::taken(&forged, &holder("p1", 7), 0, 1_000, 1);
        record.consumed_at_ms = Some(2_000);
        let ev = Evidence::MovedOn {
            parent: forged.at.clone(),
        };
        let (_, log) =
            crate::test_log::captured(|| consumed_event(&SessionContext::default(), &ev, &record));
        assert!(log.contains("consumed after it lapsed"), "{log}");
        assert!(
            !log.lines().any(|l| l.starts_with("ERROR forged line")),
            "{log}"
        );
    }

    #[test]
    fn a_flush_applies_what_is_gathered_before_it_answers() {
        let answered = key("c1");
        let w = claimed("flushed_worker", &[&answered]);
        w.send(Evidence::Consumed {
            at: answered.at.clone(),
            what: "task a wrote approved".into(),
            written_at: w.sent,
        });
        // Gathered, not yet due; the flush applies it at once.
        w.sender.flush(Duration::from_secs(10));
        let r = w.store.get(&answered).expect("get").expect("row");
        assert_eq!(r.state, ClaimState::Consumed);
        w.sender.finish(Duration::from_secs(10));
    }
}
