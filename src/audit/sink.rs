//! The non-blocking front door of the audit trail.
//!
//! Connection tasks call [`AuditSink::record`], which only ever does a
//! `try_send` on a bounded channel: auditing can lose events under overload
//! but can never slow or stall the data path. One dedicated OS thread (not a
//! tokio task, because SQLite I/O is blocking) drains the queue in batches and
//! writes each batch in a single transaction. Drops are counted and reported
//! in-band as an `EventsDropped` event, so gaps in the trail are visible.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::config::AuditConfig;
use super::event::{AuditEvent, Operation, SessionContext};
use super::jsonl::JsonlWriter;
use super::sqlite_store::Store;

/// Upper bound on events per transaction, so one huge backlog does not hold
/// a single write transaction (and its memory) for too long.
const MAX_BATCH: usize = 4096;

/// How long the idle writer sleeps before re-checking drop counters and the
/// stop flag; only matters when no message arrives to wake it.
const IDLE_WAKE: Duration = Duration::from_millis(200);

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
    dropped: AtomicU64,
    write_errors: AtomicU64,
    stopping: AtomicBool,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
}

/// What the writer has finished; guarded so flushers can wait on it.
#[derive(Default)]
struct Progress {
    written: u64,
    dropped_reported: u64,
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
    /// Accepted events the writer has processed (written or failed).
    pub written: u64,
    /// Events refused because the queue was full or the writer was gone.
    pub dropped: u64,
    /// Batches whose write to an output failed.
    pub write_errors: u64,
}

impl AuditSink {
    /// A sink that discards everything; `record` is a no-op.
    pub fn disabled() -> AuditSink {
        AuditSink { inner: None }
    }

    /// Open the configured outputs and start the writer thread. Output
    /// errors (bad path, unwritable file) surface here, at startup, rather
    /// than as silent gaps later. With no output configured the sink is
    /// disabled.
    pub fn start(cfg: &AuditConfig) -> anyhow::Result<AuditSink> {
        AuditSink::start_with_gate(cfg, None)
    }

    fn start_with_gate(cfg: &AuditConfig, gate: Option<Receiver<()>>) -> anyhow::Result<AuditSink> {
        if !cfg.is_enabled() {
            return Ok(AuditSink::disabled());
        }
        let outputs = Outputs {
            store: cfg.sqlite.as_deref().map(Store::open).transpose()?,
            jsonl: cfg.jsonl.as_deref().map(JsonlWriter::open).transpose()?,
        };
        let (tx, rx) = mpsc::sync_channel(cfg.queue_capacity.max(1));
        let shared = Arc::new(Shared::default());
        let writer = Writer {
            rx,
            shared: Arc::clone(&shared),
            outputs,
            gate,
        };
        let handle = std::thread::Builder::new()
            .name("resumeguard-audit".to_string())
            .spawn(move || writer.run())
            .context("spawning audit writer thread")?;
        Ok(AuditSink {
            inner: Some(Arc::new(Inner {
                tx,
                shared,
                writer: Mutex::new(Some(handle)),
                log_values: cfg.log_values,
            })),
        })
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
    pub fn record(&self, ev: AuditEvent) {
        let Some(inner) = &self.inner else { return };
        if inner.shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        match inner.tx.try_send(Msg::Event(Box::new(ev))) {
            Ok(()) => {
                inner.shared.enqueued.fetch_add(1, Ordering::SeqCst);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                inner.shared.dropped.fetch_add(1, Ordering::SeqCst);
            }
        }
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
        }
    }

    /// [`AuditSink::flush_timeout`] with [`DEFAULT_FLUSH_TIMEOUT`].
    pub fn flush(&self) -> bool {
        self.flush_timeout(DEFAULT_FLUSH_TIMEOUT)
    }

    /// Wait until every event queued before this call has been written and
    /// every drop counted so far has been reported, or until `timeout`.
    /// Returns whether it completed. Blocking: call it from shutdown code,
    /// never from a session's relay threads.
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
            if progress.written >= want_written && progress.dropped_reported >= want_reported {
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

    /// Flush (bounded by `timeout`), then stop the writer thread. Later
    /// `record` calls on any clone are discarded. The thread is joined only
    /// if the flush completed, so a wedged output cannot hang shutdown.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        let flushed = self.flush_timeout(timeout);
        inner.shared.stopping.store(true, Ordering::SeqCst);
        let _ = inner.tx.try_send(Msg::Wake);
        if flushed {
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

/// Where batches go; each output fails independently.
struct Outputs {
    store: Option<Store>,
    jsonl: Option<JsonlWriter>,
}

impl Outputs {
    /// Write `batch` everywhere; returns how many outputs failed.
    fn write(&mut self, batch: &[AuditEvent]) -> u64 {
        let mut failures = 0;
        if let Some(store) = &mut self.store {
            if let Err(error) = store.append(batch) {
                failures += 1;
                tracing::warn!(%error, events = batch.len(), "audit sqlite write failed");
            }
        }
        if let Some(jsonl) = &mut self.jsonl {
            if let Err(error) = jsonl.append(batch) {
                failures += 1;
                tracing::warn!(%error, events = batch.len(), "audit jsonl write failed");
            }
        }
        failures
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
    outputs: Outputs,
    /// Test hook: the writer waits for a message (or hang-up) here before
    /// reading the queue, so tests can fill the queue deterministically.
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
            match self.rx.recv_timeout(IDLE_WAKE) {
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

            // Drops happened after the queued events were accepted, so the
            // report goes after them. At most one report per batch.
            let dropped_total = self.shared.dropped.load(Ordering::SeqCst);
            if dropped_total > reported {
                let n = dropped_total - reported;
                tracing::warn!(dropped = n, "audit queue full: events dropped");
                batch.push(
                    AuditEvent::new(&SessionContext::internal(), Operation::EventsDropped)
                        .with_detail(serde_json::json!({ "dropped": n })),
                );
            }

            if !batch.is_empty() {
                let failures = self.outputs.write(&batch);
                if failures > 0 {
                    self.shared
                        .write_errors
                        .fetch_add(failures, Ordering::SeqCst);
                }
            }
            reported = dropped_total;
            {
                let mut progress = self.shared.progress();
                progress.written += events;
                progress.dropped_reported = reported;
            }
            self.shared.progress_cv.notify_all();

            if disconnected || (caught_up && self.shared.stopping.load(Ordering::SeqCst)) {
                return;
            }
        }
    }
}

#[cfg(test)]
impl AuditSink {
    /// Start a sink whose writer does not read the queue until the returned
    /// sender sends `()` (or is dropped).
    fn start_paused(cfg: &AuditConfig) -> anyhow::Result<(AuditSink, mpsc::Sender<()>)> {
        let (release, gate) = mpsc::channel();
        Ok((AuditSink::start_with_gate(cfg, Some(gate))?, release))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::jsonl::read_jsonl;
    use crate::audit::sqlite_store::{all_events, thread_events};
    use crate::audit::test_util::{remove_db, temp_path};

    fn ctx() -> SessionContext {
        SessionContext {
            session_id: 1,
            client_addr: "127.0.0.1:5555".into(),
            user: "lg".into(),
            database: "db".into(),
            application_name: "test".into(),
        }
    }

    fn numbered(n: u64) -> AuditEvent {
        AuditEvent::new(&ctx(), Operation::CheckpointPut)
            .with_thread("t")
            .with_detail(serde_json::json!({ "n": n }))
    }

    fn sqlite_cfg(path: &std::path::Path, capacity: usize) -> AuditConfig {
        AuditConfig {
            sqlite: Some(path.to_path_buf()),
            queue_capacity: capacity,
            ..AuditConfig::default()
        }
    }

    #[test]
    fn flush_waits_until_everything_is_written_in_order() {
        let path = temp_path("sink-flush", "db");
        let sink = AuditSink::start(&sqlite_cfg(&path, 65_536)).unwrap();
        for n in 0..2_000 {
            sink.record(numbered(n));
        }
        assert!(sink.flush());
        // No sleeps: flush returning is the only synchronisation.
        let events = thread_events(&path, "t").unwrap();
        let ns: Vec<u64> = events
            .iter()
            .map(|e| e.detail["n"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, (0..2_000).collect::<Vec<_>>());
        assert_eq!(
            sink.stats(),
            AuditStats {
                enqueued: 2_000,
                written: 2_000,
                dropped: 0,
                write_errors: 0
            }
        );
        assert!(sink.shutdown(Duration::from_secs(10)));
        remove_db(&path);
    }

    #[test]
    fn full_queue_drops_without_blocking_then_reports_count() {
        let path = temp_path("sink-drop", "db");
        let (sink, release) = AuditSink::start_paused(&sqlite_cfg(&path, 4)).unwrap();
        // The writer is parked before its first read, so exactly 4 fit.
        for n in 0..10 {
            sink.record(numbered(n));
        }
        let stats = sink.stats();
        assert_eq!((stats.enqueued, stats.dropped, stats.written), (4, 6, 0));
        // Flush is bounded: it gives up while the writer cannot progress.
        assert!(!sink.flush_timeout(Duration::from_millis(20)));

        release.send(()).unwrap();
        assert!(sink.flush());
        let events = all_events(&path).unwrap();
        let ops: Vec<Operation> = events.iter().map(|e| e.operation).collect();
        let mut want = vec![Operation::CheckpointPut; 4];
        want.push(Operation::EventsDropped);
        assert_eq!(ops, want);
        let kept: Vec<u64> = events[..4]
            .iter()
            .map(|e| e.detail["n"].as_u64().unwrap())
            .collect();
        assert_eq!(kept, vec![0, 1, 2, 3]);
        let report = &events[4];
        assert_eq!(report.detail, serde_json::json!({ "dropped": 6 }));
        assert_eq!(report.application_name, "resumeguard");
        assert_eq!(report.thread_id, None);

        // Once reported, drops are not reported again.
        sink.record(numbered(10));
        assert!(sink.flush());
        let events = all_events(&path).unwrap();
        assert_eq!(events.len(), 6);
        assert_eq!(events[5].operation, Operation::CheckpointPut);
        assert!(sink.shutdown(Duration::from_secs(10)));
        remove_db(&path);
    }

    #[test]
    fn writes_to_sqlite_and_jsonl_together() {
        let db = temp_path("sink-both", "db");
        let jl = temp_path("sink-both", "jsonl");
        let cfg = AuditConfig {
            sqlite: Some(db.clone()),
            jsonl: Some(jl.to_string_lossy().into_owned()),
            ..AuditConfig::default()
        };
        let sink = AuditSink::start(&cfg).unwrap();
        let clone = sink.clone();
        sink.record(numbered(1));
        clone.record(numbered(2));
        assert!(sink.flush());
        let from_db = all_events(&db).unwrap();
        assert_eq!(from_db.len(), 2);
        assert_eq!(read_jsonl(&jl).unwrap(), from_db);
        assert!(sink.shutdown(Duration::from_secs(10)));
        remove_db(&db);
        let _ = std::fs::remove_file(&jl);
    }

    #[test]
    fn shutdown_stops_writer_and_discards_later_events() {
        let path = temp_path("sink-shutdown", "db");
        let sink = AuditSink::start(&sqlite_cfg(&path, 16)).unwrap();
        sink.record(numbered(0));
        assert!(sink.shutdown(Duration::from_secs(10)));
        sink.record(numbered(1));
        assert_eq!(all_events(&path).unwrap().len(), 1);
        assert_eq!(sink.stats().enqueued, 1);
        // Writer is gone: flush reports completion of what was accepted.
        assert!(sink.flush_timeout(Duration::from_millis(10)));
        remove_db(&path);
    }

    #[test]
    fn disabled_and_unconfigured_sinks_are_no_ops() {
        for sink in [
            AuditSink::disabled(),
            AuditSink::start(&AuditConfig::default()).unwrap(),
        ] {
            assert!(!sink.is_enabled());
            assert!(!sink.log_values());
            sink.record(numbered(0));
            assert!(sink.flush());
            assert_eq!(sink.stats(), AuditStats::default());
        }
    }

    #[test]
    fn bad_output_path_fails_at_start() {
        let cfg = AuditConfig {
            jsonl: Some("/nonexistent-dir-resumeguard/x.jsonl".into()),
            ..AuditConfig::default()
        };
        assert!(AuditSink::start(&cfg).is_err());
    }
}
