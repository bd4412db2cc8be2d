//! The non-blocking front door of the audit trail.
//!
//! Connection tasks call [`AuditSink::record`], which only ever does a
//! `try_send` on a bounded channel: auditing can lose events under overload
//! but can never slow or stall the data path. One dedicated OS thread (not a
//! tokio task, because SQLite I/O is blocking) drains the queue in batches,
//! writes each batch to every output (`outputs.rs`: retried, and if still
//! failing counted as lost, never silently) and applies retention
//! (`prune.rs`, `pg_retention.rs`). Every event is stamped with the
//! replica's proxy id on its way out. Every loss ends up as an `events_dropped` gap record in the
//! output that lost it, and in [`AuditSink::dropped_total`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::approver;
use super::config::AuditConfig;
use super::error::AuditError;
use super::event::AuditEvent;
use super::jsonl::JsonlWriter;
use super::losses::{millis_to_rfc3339, now_millis};
use super::outputs::{Output, Target};
use super::pg_retention::PgRetention;
use super::postgres_store::{PgTrail, TargetSlot};
use super::prune;
use super::sqlite_store::Store;
use crate::claims::postgres::PgTarget;
use crate::error_chain::chain;

/// Upper bound on events per transaction, so one huge backlog does not hold
/// a single write transaction (and its memory) for too long.
const MAX_BATCH: usize = 4096;

/// How long the idle writer sleeps before re-checking drop counters, the
/// stop flag and failed outputs; only matters when no message arrives.
const IDLE_WAKE: Duration = Duration::from_millis(200);

/// How long [`AuditSink::shutdown`] waits for the writer to exit after
/// asking it to stop.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// Bound used by [`AuditSink::flush`].
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Handle for recording audit events. Cloning is cheap (one `Arc`).
#[derive(Clone, Default)]
pub struct AuditSink {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("enabled", &self.is_enabled())
            .field("stats", &self.stats())
            .finish()
    }
}

struct Inner {
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    log_values: bool,
    approver_keys: Vec<String>,
    /// The PostgreSQL output's database, once known.
    postgres: Option<TargetSlot>,
}

/// Boxed so each preallocated channel slot costs a pointer, not a whole
/// event: a 65536-deep queue stays cheap while empty.
enum Msg {
    Event(Box<AuditEvent>),
    /// Nudge the writer to report drops / notice shutdown now.
    Wake,
}

/// State shared between producers, flushers and the writer thread.
#[derive(Default)]
struct Shared {
    enqueued: AtomicU64,
    /// Events the queue refused.
    dropped: AtomicU64,
    /// Milliseconds since the epoch of the first and latest refusal not
    /// yet taken by the writer (0: none). Set before `dropped` is counted.
    drop_first_ms: AtomicU64,
    drop_last_ms: AtomicU64,
    write_errors: AtomicU64,
    /// See [`AuditSink::dropped_total`].
    lost: AtomicU64,
    stopping: AtomicBool,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
}

/// What the writer has finished; guarded so flushers can wait on it.
#[derive(Default)]
struct Progress {
    written: u64,
    dropped_reported: u64,
    /// Some output holds events for a retry or losses not yet recorded in
    /// it, or a prune is under way.
    unsettled: bool,
    writer_done: bool,
}

impl Shared {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        // A poisoned lock only means a panic elsewhere; the counters are
        // still meaningful, and audit must not cascade panics.
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Events accepted into the queue.
    pub enqueued: u64,
    /// Accepted events the writer has processed (written, kept for a
    /// retry, or given up).
    pub written: u64,
    /// Events refused because the queue was full or the writer was gone.
    pub dropped: u64,
    /// Failed write attempts, over all outputs.
    pub write_errors: u64,
    /// [`AuditSink::dropped_total`].
    pub lost: u64,
}

/// Test hooks of the writer thread.
#[derive(Default)]
struct WriterHooks {
    /// The writer waits for a message (or hang-up) here before reading the
    /// queue, so tests can fill the queue deterministically.
    gate: Option<Receiver<()>>,
    /// Replaces the store's lock wait, so lock tests run quickly.
    busy_timeout: Option<Duration>,
}

impl AuditSink {
    /// A sink that discards everything; `record` is a no-op.
    pub fn disabled() -> AuditSink {
        AuditSink { inner: None }
    }

    /// Open the configured outputs and start the writer thread, which
    /// stamps every event with `proxy_id`. Output errors (bad path,
    /// unwritable file) surface here, at startup, rather than as silent
    /// gaps later; the PostgreSQL output connects once it is given its
    /// database ([`AuditSink::connect_postgres`]). With no output
    /// configured the sink is disabled.
    pub fn start(cfg: &AuditConfig, proxy_id: &str) -> Result<AuditSink, AuditError> {
        AuditSink::start_with(cfg, proxy_id, WriterHooks::default())
    }

    fn start_with(
        cfg: &AuditConfig,
        proxy_id: &str,
        hooks: WriterHooks,
    ) -> Result<AuditSink, AuditError> {
        if !cfg.is_enabled() {
            return Ok(AuditSink::disabled());
        }
        let mut outputs = Vec::new();
        if let Some(path) = &cfg.sqlite {
            let store = Store::open(path)?;
            if let Some(timeout) = hooks.busy_timeout {
                store.set_busy_timeout(timeout)?;
            }
            outputs.push(Output::new(Target::Sqlite(store), proxy_id));
        }
        if let Some(target) = &cfg.jsonl {
            let jsonl = JsonlWriter::open(target)?;
            outputs.push(Output::new(Target::Jsonl(jsonl), proxy_id));
        }
        let postgres = cfg.postgres.then(TargetSlot::default);
        if let Some(slot) = &postgres {
            let trail = PgTrail::new(Arc::clone(slot));
            outputs.push(Output::new(Target::Postgres(Box::new(trail)), proxy_id));
        }
        let (tx, rx) = mpsc::sync_channel(cfg.queue_capacity.max(1));
        let shared = Arc::new(Shared::default());
        let writer = Writer {
            rx,
            shared: Arc::clone(&shared),
            outputs,
            retention: Retention::new(cfg),
            pg_retention: PgRetention::new(cfg),
            proxy_id: proxy_id.to_owned(),
            lost_by_outputs: 0,
            gate: hooks.gate,
        };
        let handle = std::thread::Builder::new()
            .name("resumeguard-audit".to_string())
            .spawn(move || writer.run())
            .map_err(AuditError::SpawnWriter)?;
        Ok(AuditSink {
            inner: Some(Arc::new(Inner {
                tx,
                shared,
                writer: Mutex::new(Some(handle)),
                log_values: cfg.log_values,
                approver_keys: cfg.approver_keys.clone(),
                postgres,
            })),
        })
    }

    /// The database of the PostgreSQL output (`[audit] postgres`), known
    /// once the proxy knows its upstream; until then that output's writes
    /// fail (retried, then counted as lost). Returns whether the sink has
    /// such an output still waiting for it.
    pub fn connect_postgres(&self, target: PgTarget) -> bool {
        let slot = self.inner.as_ref().and_then(|i| i.postgres.as_ref());
        slot.is_some_and(|s| s.set(target).is_ok())
    }

    /// Whether events go anywhere; lets callers skip building events.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether producers may include parameter values in `detail`.
    pub fn log_values(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.log_values)
    }

    /// Queue `ev` for writing. Never blocks: if the queue is full the event
    /// is dropped and counted, and the writer later records how many were
    /// lost. After [`AuditSink::shutdown`] events are discarded.
    pub fn record(&self, mut ev: AuditEvent) {
        let Some(inner) = &self.inner else { return };
        approver::stamp(&mut ev, &inner.approver_keys);
        let s = &inner.shared;
        if s.stopping.load(Ordering::Relaxed) {
            return;
        }
        match inner.tx.try_send(Msg::Event(Box::new(ev))) {
            Ok(()) => {
                s.enqueued.fetch_add(1, Ordering::SeqCst);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                let now = now_millis();
                s.drop_last_ms.store(now, Ordering::SeqCst);
                let _ =
                    s.drop_first_ms
                        .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
                s.dropped.fetch_add(1, Ordering::SeqCst);
                s.lost.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Events lost since start: refused by the queue, plus those the output
    /// that lost the most gave up after failed writes — the largest gap in
    /// any one output. Each of them is (or, while the output still fails,
    /// will be) counted in an `events_dropped` record.
    pub fn dropped_total(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.shared.lost.load(Ordering::SeqCst))
    }

    /// Current counters (all zero when disabled).
    pub fn stats(&self) -> AuditStats {
        let Some(inner) = &self.inner else {
            return AuditStats::default();
        };
        let s = &inner.shared;
        AuditStats {
            enqueued: s.enqueued.load(Ordering::SeqCst),
            written: s.progress().written,
            dropped: s.dropped.load(Ordering::SeqCst),
            write_errors: s.write_errors.load(Ordering::SeqCst),
            lost: s.lost.load(Ordering::SeqCst),
        }
    }

    /// [`AuditSink::flush_timeout`] with [`DEFAULT_FLUSH_TIMEOUT`].
    pub fn flush(&self) -> bool {
        self.flush_timeout(DEFAULT_FLUSH_TIMEOUT)
    }

    /// Wait until every event queued before this call is in every output
    /// or counted in a gap record written there, every prune has finished,
    /// or until `timeout`. Returns whether it completed (not while an
    /// output keeps failing). Blocking: call it from shutdown code, never
    /// from a session's relay threads.
    pub fn flush_timeout(&self, timeout: Duration) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        let shared = &inner.shared;
        let want_written = shared.enqueued.load(Ordering::SeqCst);
        let want_reported = shared.dropped.load(Ordering::SeqCst);
        // Best effort: if the queue is full the writer is busy anyway.
        let _ = inner.tx.try_send(Msg::Wake);
        let deadline = Instant::now() + timeout;
        let mut progress = shared.progress();
        loop {
            if progress.written >= want_written
                && progress.dropped_reported >= want_reported
                && !progress.unsettled
            {
                return true;
            }
            if progress.writer_done {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            progress = shared
                .progress_cv
                .wait_timeout(progress, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Flush (bounded by `timeout`), then stop the writer thread, which
    /// makes a last attempt at failed writes and logs at ERROR whatever is
    /// still lost and unrecorded. Later `record` calls on any clone are
    /// discarded. The thread is joined only if it exits within a bound, so
    /// a wedged output cannot hang shutdown. Returns whether the flush
    /// completed.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        let flushed = self.flush_timeout(timeout);
        let shared = &inner.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        let _ = inner.tx.try_send(Msg::Wake);
        let exited = {
            let progress = shared.progress();
            let (progress, _) = shared
                .progress_cv
                .wait_timeout_while(progress, EXIT_WAIT, |p| !p.writer_done)
                .unwrap_or_else(PoisonError::into_inner);
            progress.writer_done
        };
        if exited {
            let handle = inner
                .writer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(handle) = handle {
                if handle.join().is_err() {
                    tracing::warn!("audit writer thread panicked");
                }
            }
        }
        flushed
    }
}

/// The writer's periodic prune of the SQLite output.
struct Retention {
    cfg: AuditConfig,
    interval: Duration,
    next: Instant,
    /// A declared prune still has rows to delete.
    active: bool,
}

impl Retention {
    fn new(cfg: &AuditConfig) -> Retention {
        Retention {
            cfg: cfg.clone(),
            interval: Duration::from_millis(cfg.prune_interval_ms.max(1)),
            next: Instant::now(),
            active: false,
        }
    }

    /// One unit of retention work: declare a prune when one is due, else
    /// delete one chunk of a declared one.
    fn tick(&mut self, store: &mut Store) {
        if self.active {
            match prune::step(store) {
                Ok(more) => self.active = more,
                Err(error) => {
                    tracing::warn!(
                        error = %chain(&error),
                        "audit prune step failed; retrying at the next interval"
                    );
                    self.active = false;
                }
            }
            return;
        }
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + self.interval;
        if let Some(rule) = self.cfg.prune_rule(SystemTime::now()) {
            match prune::begin(store, &rule, "retention") {
                Ok(Some(declared)) => tracing::info!(
                    rows = declared.rows,
                    below_id = declared.below_id,
                    "audit retention: pruning the oldest rows (audit_pruned recorded)"
                ),
                Ok(None) => {}
                Err(error) => tracing::warn!(error = %chain(&error), "audit prune failed"),
            }
        }
        self.active = prune::pending(store).unwrap_or(false);
    }
}

/// Marks the writer finished even if it panics, so flushers stop waiting.
struct DoneGuard(Arc<Shared>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.progress().writer_done = true;
        self.0.progress_cv.notify_all();
    }
}

struct Writer {
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    outputs: Vec<Output>,
    retention: Retention,
    pg_retention: PgRetention,
    proxy_id: String,
    /// The most events any output has given up, as added to `lost`.
    lost_by_outputs: u64,
    gate: Option<Receiver<()>>,
}

impl Writer {
    fn run(mut self) {
        let _done = DoneGuard(Arc::clone(&self.shared));
        if let Some(gate) = self.gate.take() {
            let _ = gate.recv();
        }
        let mut reported: u64 = 0;
        loop {
            let mut batch: Vec<AuditEvent> = Vec::new();
            let mut disconnected = false;
            let mut caught_up = false;
            // With a prune under way, do not sleep: its next chunk is due.
            let first = if self.retention.active || self.pg_retention.is_active() {
                self.rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                self.rx.recv_timeout(IDLE_WAKE)
            };
            match first {
                Ok(Msg::Event(ev)) => batch.push(*ev),
                Ok(Msg::Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => disconnected = true,
            }
            while !disconnected && batch.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(Msg::Event(ev)) => batch.push(*ev),
                    Ok(Msg::Wake) => {}
                    Err(TryRecvError::Empty) => {
                        caught_up = true;
                        break;
                    }
                    Err(TryRecvError::Disconnected) => disconnected = true,
                }
            }
            let events = batch.len() as u64;

            // Refusals happened after the queued events were accepted, so
            // their gap record is written after them.
            let dropped_total = self.shared.dropped.load(Ordering::SeqCst);
            if dropped_total > reported {
                self.note_queue_drops(dropped_total - reported);
            }
            reported = dropped_total;
            self.write(&mut batch);
            let stopping = self.shared.stopping.load(Ordering::SeqCst);
            if !stopping {
                let sqlite = self.outputs.iter_mut().find_map(Output::store_if_settled);
                if let Some(store) = sqlite {
                    self.retention.tick(store);
                }
                let pg = self
                    .outputs
                    .iter_mut()
                    .find_map(Output::postgres_if_settled);
                if let Some(trail) = pg {
                    self.pg_retention.tick(trail, &self.proxy_id);
                }
            }
            {
                let mut progress = self.shared.progress();
                progress.written += events;
                progress.dropped_reported = reported;
                progress.unsettled = self.retention.active
                    || self.pg_retention.is_active()
                    || self.outputs.iter().any(|o| !o.is_settled());
            }
            self.shared.progress_cv.notify_all();

            if disconnected || (caught_up && stopping) {
                self.abandon();
                return;
            }
        }
    }

    /// Count `n` queue refusals against every output, with their window.
    fn note_queue_drops(&mut self, n: u64) {
        let first = self.shared.drop_first_ms.swap(0, Ordering::SeqCst);
        let last = self.shared.drop_last_ms.load(Ordering::SeqCst);
        // A refusal racing this swap leaves its time to the next window.
        let last = if last == 0 { now_millis() } else { last };
        let first = if first == 0 || first > last {
            last
        } else {
            first
        };
        let (first, last) = (millis_to_rfc3339(first), millis_to_rfc3339(last));
        for output in &mut self.outputs {
            output.note_queue_drops(n, &first, &last);
        }
    }

    fn write(&mut self, batch: &mut [AuditEvent]) {
        for ev in batch.iter_mut().filter(|e| e.proxy_id.is_empty()) {
            ev.proxy_id.clone_from(&self.proxy_id);
        }
        for output in &mut self.outputs {
            if output.write(batch) {
                self.shared.write_errors.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.count_losses();
    }

    /// Add to `lost` what the output that lost the most newly gave up.
    fn count_losses(&mut self) {
        let most = self.outputs.iter().map(Output::write_lost).max();
        let most = most.unwrap_or(0);
        if most > self.lost_by_outputs {
            self.shared
                .lost
                .fetch_add(most - self.lost_by_outputs, Ordering::SeqCst);
            self.lost_by_outputs = most;
        }
    }

    /// At exit: what is still unwritten is lost.
    fn abandon(&mut self) {
        for output in &mut self.outputs {
            output.abandon();
        }
        self.count_losses();
    }
}

#[cfg(test)]
impl AuditSink {
    /// Start a sink whose writer does not read the queue until the returned
    /// sender sends `()` (or is dropped).
    fn start_paused(cfg: &AuditConfig) -> Result<(AuditSink, mpsc::Sender<()>), AuditError> {
        let (release, gate) = mpsc::channel();
        let hooks = WriterHooks {
            gate: Some(gate),
            ..WriterHooks::default()
        };
        Ok((AuditSink::start_with(cfg, "test-proxy", hooks)?, release))
    }

    /// Start a sink whose SQLite writes give up waiting for a lock after
    /// `timeout`.
    fn start_with_busy_timeout(
        cfg: &AuditConfig,
        timeout: Duration,
    ) -> Result<AuditSink, AuditError> {
        let hooks = WriterHooks {
            busy_timeout: Some(timeout),
            ..WriterHooks::default()
        };
        AuditSink::start_with(cfg, "test-proxy", hooks)
    }
}

#[cfg(test)]
mod tests;
