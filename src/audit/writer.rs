//! The thread that drains one output's queue: batches of events written to
//! that output alone (an OS thread, not a tokio task: SQLite and the
//! PostgreSQL client block), its queue refusals turned into its gap
//! record, and its retention applied between batches.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use super::lane::{DoneGuard, LaneState, Msg};
use super::losses::{millis_to_rfc3339, now_millis};
use super::outputs::Output;
use super::pg_retention::PgRetention;
use super::sqlite_retention::SqliteRetention;
use crate::audit_event::AuditEvent;

/// Upper bound on events per transaction, so one huge backlog does not hold
/// a single write transaction (and its memory) for too long.
const MAX_BATCH: usize = 4096;

/// How long the idle writer sleeps before re-checking drop counters, the
/// stop flag and a failed output; only matters when no message arrives.
const IDLE_WAKE: Duration = Duration::from_millis(200);

/// The retention an output's writer applies between batches.
pub enum Upkeep {
    /// JSON Lines: left to the log rotation.
    None,
    Sqlite(SqliteRetention),
    /// The shared table, pruned in the name of this replica.
    Postgres(PgRetention, String),
}

impl Upkeep {
    fn is_active(&self) -> bool {
        match self {
            Upkeep::None => false,
            Upkeep::Sqlite(retention) => retention.is_active(),
            Upkeep::Postgres(retention, _) => retention.is_active(),
        }
    }

    /// One unit of retention work, when the output is settled (a prune of
    /// a failing output would fail too).
    fn tick(&mut self, output: &mut Output) {
        match self {
            Upkeep::None => {}
            Upkeep::Sqlite(retention) => {
                if let Some(store) = output.store_if_settled() {
                    retention.tick(store);
                }
            }
            Upkeep::Postgres(retention, proxy_id) => {
                if let Some(trail) = output.postgres_if_settled() {
                    retention.tick(trail, proxy_id);
                }
            }
        }
    }
}

pub struct Writer {
    pub rx: Receiver<Msg>,
    pub state: Arc<LaneState>,
    pub output: Output,
    pub upkeep: Upkeep,
    /// Test hook: wait for a message (or hang-up) here before reading the
    /// queue, so tests can fill it deterministically.
    pub gate: Option<Receiver<()>>,
}

impl Writer {
    pub fn run(mut self) {
        let _done = DoneGuard(Arc::clone(&self.state));
        if let Some(gate) = self.gate.take() {
            let _ = gate.recv();
        }
        let mut reported: u64 = 0;
        let mut lost_counted: u64 = 0;
        loop {
            let mut batch: Vec<Arc<AuditEvent>> = Vec::new();
            let mut disconnected = false;
            let mut caught_up = false;
            // With a prune under way, do not sleep: its next chunk is due.
            let first = if self.upkeep.is_active() {
                self.rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                self.rx.recv_timeout(IDLE_WAKE)
            };
            match first {
                Ok(Msg::Event(ev)) => batch.push(ev),
                Ok(Msg::Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => disconnected = true,
            }
            while !disconnected && batch.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(Msg::Event(ev)) => batch.push(ev),
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
            let dropped_total = self.state.dropped();
            if dropped_total > reported {
                self.note_queue_drops(dropped_total - reported);
            }
            reported = dropped_total;
            if self.output.write(&batch) {
                self.state.count_write_error();
            }
            drop(batch);
            let stopping = self.state.stopping();
            let exiting = disconnected || (caught_up && stopping);
            if exiting {
                // What is still unwritten is lost.
                self.output.abandon();
            } else if !stopping {
                self.upkeep.tick(&mut self.output);
            }
            {
                let mut progress = self.state.progress();
                progress.written += events;
                progress.dropped_reported = reported;
                progress.retained = self.output.retained() as u64;
                progress.unsettled = self.upkeep.is_active() || !self.output.is_settled();
                let lost = self.output.write_lost();
                self.state.count_lost(&progress, lost - lost_counted);
                lost_counted = lost;
            }
            self.state.notify();
            if exiting {
                return;
            }
        }
    }

    /// Count `n` queue refusals against the output, with their window.
    fn note_queue_drops(&mut self, n: u64) {
        let (first, last) = self.state.take_drop_window();
        // A refusal racing the swap leaves its time to the next window.
        let last = if last == 0 { now_millis() } else { last };
        let first = if first == 0 || first > last {
            last
        } else {
            first
        };
        let (first, last) = (millis_to_rfc3339(first), millis_to_rfc3339(last));
        self.output.note_queue_drops(n, &first, &last);
    }
}
