//! The non-blocking front door of the audit trail.
//!
//! Connection tasks call [`AuditSink::record`], which only ever does a
//! `try_send` on bounded channels: auditing can lose events under overload
//! but can never slow or stall the data path. Each output (SQLite, JSONL,
//! PostgreSQL) has its own queue and its own writer thread (`lane.rs`,
//! `writer.rs`), so an output that is slow or unreachable delays and loses
//! only its own events while the others stay current. A writer drains its
//! queue in batches, writes them to its output (`outputs.rs`: retried, and
//! if still failing counted as lost, never silently) and applies that
//! output's retention (`sqlite_retention.rs`, `pg_retention.rs`). Every
//! event is stamped with the replica's proxy id as it is recorded. Every
//! loss ends up as an `events_dropped` gap record in the output that lost
//! it, and in [`AuditSink::dropped_total`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::approver;
use super::config::AuditConfig;
use super::error::AuditError;
use super::jsonl::{JsonlSwap, JsonlWriter};
use super::lane::{Lane, LaneState};
use super::outputs::{Output, Target};
use super::pg_retention::PgRetention;
use super::postgres_store::{PgTrail, TargetSlot, TrailDatabase};
use super::question;
use super::sqlite_retention::SqliteRetention;
use super::sqlite_store::Store;
use super::stats::AuditStats;
use super::writer::{Upkeep, Writer};
use crate::audit_event::{AuditEvent, Operation};
use crate::pg::{PgTarget, SchemaMigrations};

/// How long [`AuditSink::shutdown`] waits for the writers to exit after
/// asking them to stop.
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
    /// One per output, in the order SQLite, JSONL, PostgreSQL.
    lanes: Vec<Lane>,
    stopping: AtomicBool,
    proxy_id: String,
    log_values: bool,
    approver_keys: Vec<String>,
    approver_pointers: Vec<String>,
    /// The PostgreSQL output's database, once known.
    postgres: Option<TargetSlot>,
    /// Replaces the JSONL output's file (a reload).
    jsonl: Option<JsonlSwap>,
}

/// Test hooks of the writer threads.
#[derive(Default)]
struct WriterHooks {
    /// The first output's writer waits for a message (or hang-up) here
    /// before reading its queue, so tests can fill it deterministically.
    gate: Option<Receiver<()>>,
    /// Replaces the store's lock wait, so lock tests run quickly.
    busy_timeout: Option<Duration>,
}

impl AuditSink {
    /// A sink that discards everything; `record` is a no-op.
    pub fn disabled() -> AuditSink {
        AuditSink { inner: None }
    }

    /// Open the configured outputs and start a writer thread for each;
    /// every event is stamped with `proxy_id`. Output errors (bad path,
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
        mut hooks: WriterHooks,
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
            let upkeep = Upkeep::Sqlite(SqliteRetention::new(cfg));
            outputs.push((Target::Sqlite(store), upkeep));
        }
        let mut jsonl_swap = None;
        if let Some(target) = &cfg.jsonl {
            let jsonl = JsonlWriter::open(target)?;
            jsonl_swap = Some(jsonl.swap());
            outputs.push((Target::Jsonl(jsonl), Upkeep::None));
        }
        let postgres = cfg.postgres.then(TargetSlot::default);
        if let Some(slot) = &postgres {
            let trail = PgTrail::new(Arc::clone(slot));
            let upkeep = Upkeep::Postgres(PgRetention::new(cfg), proxy_id.to_owned());
            outputs.push((Target::Postgres(Box::new(trail)), upkeep));
        }
        let mut lanes = Vec::new();
        for (target, upkeep) in outputs {
            let output = Output::new(target, proxy_id);
            let name = output.name();
            let (tx, rx) = mpsc::sync_channel(cfg.queue_capacity.max(1));
            let state = Arc::new(LaneState::default());
            let writer = Writer {
                rx,
                state: Arc::clone(&state),
                output,
                upkeep,
                gate: hooks.gate.take(),
            };
            let started = std::thread::Builder::new()
                .name(format!("rg-audit-{name}"))
                .spawn(move || writer.run());
            // Writers already started stop when their queues hang up.
            let handle = started.map_err(AuditError::SpawnWriter)?;
            lanes.push(Lane::new(name, tx, state, handle));
        }
        Ok(AuditSink {
            inner: Some(Arc::new(Inner {
                lanes,
                stopping: AtomicBool::new(false),
                proxy_id: proxy_id.to_owned(),
                log_values: cfg.log_values,
                approver_keys: cfg.approver_keys.clone(),
                approver_pointers: cfg.approver_pointers.clone(),
                postgres,
                jsonl: jsonl_swap,
            })),
        })
    }

    /// The database of the PostgreSQL output (`[audit] postgres`), known
    /// once the proxy knows its upstream; until then that output's writes
    /// fail (retried, then counted as lost); `migrations` bring the schema
    /// it shares with the claims up to date. Returns whether the sink has
    /// such an output still waiting for it.
    pub fn connect_postgres(&self, target: PgTarget, migrations: SchemaMigrations) -> bool {
        let slot = self.inner.as_ref().and_then(|i| i.postgres.as_ref());
        let database = TrailDatabase { target, migrations };
        slot.is_some_and(|s| s.set(database).is_ok())
    }

    /// Opens `target` (a path, or `-` for stdout) for the JSONL output, which
    /// writes its next batch there: after logrotate moved the file (no
    /// copytruncate), the same path again. Returns whether there is a JSONL
    /// output; one that does not open leaves the output as it was.
    pub fn reopen_jsonl(&self, target: &str) -> Result<bool, AuditError> {
        match self.inner.as_ref().and_then(|i| i.jsonl.as_ref()) {
            Some(swap) => swap.reopen(target).map(|()| true),
            None => Ok(false),
        }
    }

    /// Whether events go anywhere; lets callers skip building events.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The approver `[audit] approver_keys` (or, with the audit off, the
    /// default keys) finds in a checkpoint's metadata JSON.
    pub fn approver_in(&self, metadata_json: &str) -> Option<String> {
        match &self.inner {
            Some(inner) => approver::named_in(metadata_json, &inner.approver_keys),
            None => approver::named_in(metadata_json, &approver::default_keys()),
        }
    }

    /// Whether producers may include parameter values in `detail`.
    pub fn log_values(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.log_values)
    }

    /// Queue `ev` for every output. Never blocks: an output whose queue is
    /// full drops the event and counts it, and its writer later records
    /// how many it lost. After [`AuditSink::shutdown`] events are
    /// discarded.
    pub fn record(&self, mut ev: AuditEvent) {
        let Some(inner) = &self.inner else { return };
        if inner.stopping.load(Ordering::Relaxed) {
            return;
        }
        approver::stamp(&mut ev, &inner.approver_keys);
        if ev.operation == Operation::InterruptParked {
            let asked = ev.answer.take();
            if inner.log_values {
                question::stamp(&mut ev, asked);
            }
        }
        approver::stamp_answer(&mut ev, &inner.approver_pointers);
        if ev.proxy_id.is_empty() {
            ev.proxy_id.clone_from(&inner.proxy_id);
        }
        let ev = Arc::new(ev);
        for lane in &inner.lanes {
            lane.offer(&ev);
        }
    }

    /// Events lost since start by the output that lost the most (refused
    /// by its queue, given up after failed writes, or left with its writer
    /// at shutdown): the largest gap in any one output. Each of them is
    /// (or, while the output still fails, will be) counted in an
    /// `events_dropped` record there, except those left at shutdown, which
    /// are logged. [`AuditSink::output_stats`] has each output's figure.
    pub fn dropped_total(&self) -> u64 {
        self.inner
            .as_ref()
            .and_then(|i| i.lanes.iter().map(Lane::lost).max())
            .unwrap_or(0)
    }

    /// The sink's counters (all zero when disabled): each summed over the
    /// outputs, except `lost`, which is [`AuditSink::dropped_total`].
    pub fn stats(&self) -> AuditStats {
        let mut sum = AuditStats::default();
        for (_, s) in self.output_stats() {
            sum.enqueued += s.enqueued;
            sum.written += s.written;
            sum.dropped += s.dropped;
            sum.write_errors += s.write_errors;
        }
        sum.lost = self.dropped_total();
        sum
    }

    /// Each output's counters, by name (`sqlite`, `jsonl`, `postgres`).
    pub fn output_stats(&self) -> Vec<(&'static str, AuditStats)> {
        let Some(inner) = &self.inner else {
            return Vec::new();
        };
        inner.lanes.iter().map(|l| (l.name(), l.stats())).collect()
    }

    /// [`AuditSink::flush_timeout`] with [`DEFAULT_FLUSH_TIMEOUT`].
    pub fn flush(&self) -> bool {
        self.flush_timeout(DEFAULT_FLUSH_TIMEOUT)
    }

    /// Wait until every event queued before this call is in every output
    /// or counted in a gap record written there, every prune has finished,
    /// or until `timeout` (one bound for all outputs). Returns whether it
    /// completed (not while an output keeps failing). Blocking: call it
    /// from shutdown code, never from a session's relay threads.
    pub fn flush_timeout(&self, timeout: Duration) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        let marks: Vec<_> = inner.lanes.iter().map(Lane::flush_mark).collect();
        for lane in &inner.lanes {
            lane.wake();
        }
        let deadline = Instant::now() + timeout;
        // Every output is waited for, also after one has timed out, so a
        // stuck output does not cut the others' flush short.
        let mut done = true;
        for (lane, mark) in inner.lanes.iter().zip(&marks) {
            done &= lane.wait_flushed(mark, deadline);
        }
        done
    }

    /// Flush (bounded by `timeout`), then stop the writer threads, each of
    /// which makes a last attempt at failed writes and logs at ERROR
    /// whatever is still lost and unrecorded. Later `record` calls on any
    /// clone are discarded. A thread is joined only if it exits within a
    /// bound (one for all of them), so a wedged output cannot hang
    /// shutdown; what such an output had not written is counted as lost
    /// and logged. Returns whether the flush completed.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        let flushed = self.flush_timeout(timeout);
        inner.stopping.store(true, Ordering::SeqCst);
        for lane in &inner.lanes {
            lane.stop();
        }
        let deadline = Instant::now() + EXIT_WAIT;
        for lane in &inner.lanes {
            lane.wait_exit(deadline);
        }
        flushed
    }
}

#[cfg(test)]
impl AuditSink {
    /// Start a sink whose first output's writer does not read its queue
    /// until the returned sender sends `()` (or is dropped).
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
