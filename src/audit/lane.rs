//! One output's own path through the sink: its bounded queue, the counters
//! its producers and its writer thread share, and the waits on that
//! thread (flush, exit), so an output that stalls holds up only itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use super::losses::now_millis;
use super::stats::AuditStats;
use crate::audit_event::AuditEvent;

/// One allocation per event, shared by every output's queue: an empty
/// slot costs a pointer, and an event waiting for two outputs is held once.
pub enum Msg {
    Event(Arc<AuditEvent>),
    /// Nudge the writer to report drops / notice shutdown now.
    Wake,
}

/// State shared between producers, flushers and one output's writer.
#[derive(Default)]
pub struct LaneState {
    enqueued: AtomicU64,
    /// Events this output's queue refused.
    dropped: AtomicU64,
    /// Milliseconds since the epoch of the first and latest refusal not
    /// yet taken by the writer (0: none). Set before `dropped` is counted.
    drop_first_ms: AtomicU64,
    drop_last_ms: AtomicU64,
    write_errors: AtomicU64,
    /// Events this output lost: refused, given up after failed writes, or
    /// left with a writer that did not exit at shutdown.
    lost: AtomicU64,
    stopping: AtomicBool,
    /// Whether the log has said this output's writer thread is gone.
    writer_gone_logged: AtomicBool,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
}

/// What the writer has finished; guarded so flushers can wait on it.
#[derive(Default)]
pub struct Progress {
    /// Accepted events the writer has processed (written, kept for a
    /// retry, or given up).
    pub written: u64,
    pub dropped_reported: u64,
    /// Events the output keeps for a retry.
    pub retained: u64,
    /// The output holds events for a retry or losses not yet recorded in
    /// it, or a prune is under way.
    pub unsettled: bool,
    pub writer_done: bool,
    /// Shutdown stopped waiting for the writer and counted what it had
    /// not written as lost: the writer adds no more losses.
    pub left_behind: bool,
}

impl LaneState {
    pub fn progress(&self) -> MutexGuard<'_, Progress> {
        // A poisoned lock only means a panic elsewhere; the counters are
        // still meaningful, and audit must not cascade panics.
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wake everyone waiting on [`LaneState::progress`].
    pub fn notify(&self) {
        self.progress_cv.notify_all();
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// The window of refusals not yet taken: (first, last) in
    /// milliseconds since the epoch, 0 when unknown.
    pub fn take_drop_window(&self) -> (u64, u64) {
        let first = self.drop_first_ms.swap(0, Ordering::SeqCst);
        (first, self.drop_last_ms.load(Ordering::SeqCst))
    }

    pub fn count_write_error(&self) {
        self.write_errors.fetch_add(1, Ordering::SeqCst);
    }

    /// Count `n` events the writer gave up on, unless shutdown already
    /// counted them (`progress` is the writer's hold on the lock).
    pub fn count_lost(&self, progress: &Progress, n: u64) {
        if !progress.left_behind {
            self.lost.fetch_add(n, Ordering::SeqCst);
        }
    }
}

/// Marks the writer finished even if it panics, so flushers stop waiting.
pub struct DoneGuard(pub Arc<LaneState>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.progress().writer_done = true;
        self.0.notify();
    }
}

/// The sink's handle on one output's queue and writer thread.
pub struct Lane {
    name: &'static str,
    tx: SyncSender<Msg>,
    state: Arc<LaneState>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// What [`Lane::flush_mark`] saw: the point a flush waits for.
pub struct FlushMark {
    written: u64,
    reported: u64,
}

impl Lane {
    pub fn new(
        name: &'static str,
        tx: SyncSender<Msg>,
        state: Arc<LaneState>,
        writer: JoinHandle<()>,
    ) -> Lane {
        Lane {
            name,
            tx,
            state,
            writer: Mutex::new(Some(writer)),
        }
    }

    /// Queue `ev` without blocking; a full queue (or a writer gone)
    /// refuses it and the refusal is counted against this output only.
    pub fn offer(&self, ev: &Arc<AuditEvent>) {
        let s = &self.state;
        match self.tx.try_send(Msg::Event(Arc::clone(ev))) {
            Ok(()) => {
                s.enqueued.fetch_add(1, Ordering::SeqCst);
            }
            Err(refused) => {
                if matches!(refused, TrySendError::Disconnected(_)) {
                    self.writer_gone();
                }
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

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The writer thread ended while the sink runs (it panicked): every
    /// later event of this output is lost, and no gap record can say so.
    /// Logged at ERROR once.
    fn writer_gone(&self) {
        let s = &self.state;
        if !s.stopping() && !s.writer_gone_logged.swap(true, Ordering::SeqCst) {
            tracing::error!(
                output = self.name,
                "audit writer thread is gone (it panicked): this output's events are lost \
                 from now on, counted as dropped and lost but recorded in no gap record"
            );
        }
    }

    /// Best effort: if the queue is full the writer is busy anyway.
    pub fn wake(&self) {
        let _ = self.tx.try_send(Msg::Wake);
    }

    /// Events this output lost since start.
    pub fn lost(&self) -> u64 {
        self.state.lost.load(Ordering::SeqCst)
    }

    /// This output's counters.
    pub fn stats(&self) -> AuditStats {
        let s = &self.state;
        AuditStats {
            enqueued: s.enqueued.load(Ordering::SeqCst),
            written: s.progress().written,
            dropped: s.dropped(),
            write_errors: s.write_errors.load(Ordering::SeqCst),
            lost: self.lost(),
        }
    }

    /// What a flush started now waits for.
    pub fn flush_mark(&self) -> FlushMark {
        FlushMark {
            written: self.state.enqueued.load(Ordering::SeqCst),
            reported: self.state.dropped(),
        }
    }

    /// Wait until the writer has got past `mark` with nothing unsettled,
    /// or until `deadline`; whether it did.
    pub fn wait_flushed(&self, mark: &FlushMark, deadline: Instant) -> bool {
        let mut progress = self.state.progress();
        loop {
            if progress.written >= mark.written
                && progress.dropped_reported >= mark.reported
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
            progress = self
                .state
                .progress_cv
                .wait_timeout(progress, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Ask the writer to finish what is queued and exit.
    pub fn stop(&self) {
        self.state.stopping.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Wait for the writer to exit until `deadline`, then join it. One
    /// that does not exit in time is left running (a wedged output cannot
    /// hang shutdown): what it had not written is counted as lost now and
    /// logged at ERROR, the only place left to say so.
    pub fn wait_exit(&self, deadline: Instant) {
        let exited = {
            let timeout = deadline.saturating_duration_since(Instant::now());
            let progress = self.state.progress();
            let (mut progress, _) = self
                .state
                .progress_cv
                .wait_timeout_while(progress, timeout, |p| !p.writer_done)
                .unwrap_or_else(PoisonError::into_inner);
            if !progress.writer_done && !progress.left_behind {
                progress.left_behind = true;
                let enqueued = self.state.enqueued.load(Ordering::SeqCst);
                let unwritten = enqueued.saturating_sub(progress.written) + progress.retained;
                self.state.lost.fetch_add(unwritten, Ordering::SeqCst);
                if unwritten > 0 {
                    tracing::error!(
                        output = self.name,
                        dropped = unwritten,
                        "audit output still busy at shutdown: its unwritten events are lost \
                         and not recorded in the trail"
                    );
                } else {
                    tracing::warn!(
                        output = self.name,
                        "audit output still busy at shutdown (nothing unwritten); left running"
                    );
                }
            }
            progress.writer_done
        };
        if exited {
            let handle = self
                .writer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(handle) = handle {
                if handle.join().is_err() {
                    tracing::warn!(output = self.name, "audit writer thread panicked");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::sync_channel;

    use super::*;
    use crate::audit_event::{Operation, SessionContext};

    /// A lane whose writer thread has ended, having run `writer`.
    fn lane_after(writer: impl FnOnce() + Send + 'static) -> Lane {
        let (tx, rx) = sync_channel(4);
        let writer = std::thread::spawn(move || {
            let _queue = rx;
            writer();
        });
        while !writer.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Lane::new("sqlite", tx, Arc::default(), writer)
    }

    /// The log of offering `lane` three events.
    fn offer_three(lane: &Lane) -> String {
        let ev = Arc::new(AuditEvent::new(
            &SessionContext::internal(),
            Operation::ReadLatest,
        ));
        let ((), log) = crate::test_log::captured(|| {
            for _ in 0..3 {
                lane.offer(&ev);
            }
        });
        log
    }

    #[test]
    fn events_offered_after_the_writer_panicked_are_lost_and_logged_once() {
        let lane = lane_after(|| panic!("an audit writer that fails"));
        let log = offer_three(&lane);
        assert_eq!((lane.stats().dropped, lane.lost()), (3, 3));
        assert_eq!(log.matches("ERROR").count(), 1, "{log}");
        assert!(log.contains("output=\"sqlite\""), "{log}");
        assert!(log.contains("writer thread is gone"), "{log}");
    }

    #[test]
    fn a_writer_stopped_at_shutdown_is_not_reported_gone() {
        let lane = lane_after(|| {});
        lane.stop();
        let log = offer_three(&lane);
        assert_eq!(lane.lost(), 3);
        assert!(!log.contains("ERROR"), "{log}");
    }
}
