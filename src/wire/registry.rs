//! The live sessions of one proxy process, so shutdown can reach them:
//! a session on threads of its own blocks in reads, and an event loop
//! waits for its sockets; closing a session's sockets wakes either.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::SystemTime;

use super::client_stream::ClientStream;
use super::draining::Draining;
use super::guard::{Guard, SessionInfo};
use super::upstream::Upstream;

/// Why a session's relay is stopping; the first reason set wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The proxy is shutting down: tell the client (FATAL 57P01).
    Shutdown,
    /// One relay direction ended (the client left, broke the protocol, or
    /// a write failed); the other ends without a word.
    Quiet,
}

/// What shutdown needs of one session: its sockets, its protocol state
/// (to see whether it is idle) and its stop flag.
pub struct SessionHandle {
    pub client: Arc<ClientStream>,
    pub server: Arc<Upstream>,
    pub state: Arc<Mutex<Box<dyn Guard>>>,
    /// Signalled when server answers were tracked: a client message
    /// waiting for an earlier Sync's answers looks again.
    pub answered: Condvar,
    /// The client thread waits on `answered` (read and written under the
    /// state lock).
    pub awaiting: AtomicBool,
    /// The client sent Terminate.
    pub client_terminated: AtomicBool,
    /// The client sent its last byte (end-of-file): the server closing
    /// once it has answered is expected.
    pub client_done: AtomicBool,
    /// Who the session is, once known (see [`Registry::snapshot`]).
    pub summary: OnceLock<SessionSummary>,
    stop: AtomicU8,
}

/// Who a live session is: its startup parameters and when it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    pub id: u64,
    pub peer: String,
    pub user: String,
    pub database: String,
    /// As the startup packet named it.
    pub application_name: String,
    pub inspection_listener: bool,
    pub started_at: SystemTime,
}

impl SessionSummary {
    /// The summary of a session starting now.
    pub fn of(info: &SessionInfo) -> Self {
        SessionSummary {
            id: info.session_id,
            peer: info.client_addr.clone(),
            user: info.user.clone(),
            database: info.database.clone(),
            application_name: info.application_name.clone(),
            inspection_listener: info.inspection_listener,
            started_at: SystemTime::now(),
        }
    }
}

const RUNNING: u8 = 0;
const SHUTDOWN: u8 = 1;
const QUIET: u8 = 2;

impl SessionHandle {
    pub fn new(
        client: Arc<ClientStream>,
        server: Arc<Upstream>,
        state: Arc<Mutex<Box<dyn Guard>>>,
    ) -> Self {
        SessionHandle {
            client,
            server,
            state,
            answered: Condvar::new(),
            awaiting: AtomicBool::new(false),
            client_terminated: AtomicBool::new(false),
            client_done: AtomicBool::new(false),
            summary: OnceLock::new(),
            stop: AtomicU8::new(RUNNING),
        }
    }

    /// Asks the session's relay to stop: records `reason` unless another
    /// was recorded first, and closes the upstream socket, which wakes the
    /// thread reading it (or the event loop waiting for it). Returns
    /// whether this call set the reason.
    pub fn stop(&self, reason: StopReason) -> bool {
        let code = match reason {
            StopReason::Shutdown => SHUTDOWN,
            StopReason::Quiet => QUIET,
        };
        let first = self
            .stop
            .compare_exchange(RUNNING, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        self.server.shutdown(Shutdown::Both);
        first
    }

    /// The client reached end-of-file: the server is told the same way
    /// (its side of the connection half-closed), and the thread reading
    /// it relays its answers until it closes.
    pub fn client_finished(&self) {
        // Before the server can see the end, so its close is never news.
        self.client_done.store(true, Ordering::Release);
        self.server.half_close();
    }

    /// Whether the server closing now answers the client's own goodbye
    /// (Terminate, or its end-of-file).
    pub fn client_left(&self) -> bool {
        self.client_terminated.load(Ordering::Acquire) || self.client_done.load(Ordering::Acquire)
    }

    /// The reason recorded by [`SessionHandle::stop`], if any.
    pub fn stopping(&self) -> Option<StopReason> {
        match self.stop.load(Ordering::Acquire) {
            SHUTDOWN => Some(StopReason::Shutdown),
            QUIET => Some(StopReason::Quiet),
            _ => None,
        }
    }

    /// Wakes the client-reading thread (end-of-file) once the session is
    /// over; writes to the client still work.
    pub fn release_client_reader(&self) {
        let _ = self.client.shutdown(Shutdown::Read);
    }
}

/// Whether a draining proxy may close the session now: nothing is in
/// flight, and its guard holds no work that ends at a later exchange.
pub fn closable(guard: &dyn Guard) -> bool {
    guard.is_idle() && !guard.holds_work()
}

/// Every session counted, and the relaying ones reachable.
#[derive(Default)]
pub struct Registry {
    draining: Draining,
    /// Sessions alive, from their accept to their end (startup included),
    /// on whichever thread or loop serves them.
    live: Arc<AtomicUsize>,
    sessions: Arc<Mutex<HashMap<u64, Arc<SessionHandle>>>>,
}

/// Counts a session as live until dropped; it goes where the session
/// goes (its startup thread, an event loop, its relay threads).
pub struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Keeps a session reachable until dropped.
pub struct Registered {
    sessions: Arc<Mutex<HashMap<u64, Arc<SessionHandle>>>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut map) = self.sessions.lock() {
            map.remove(&self.id);
        }
    }
}

impl Registry {
    /// A registry whose shutdown sets `draining` (shared with what grants
    /// sessions work).
    pub fn with_draining(draining: Draining) -> Self {
        Registry {
            draining,
            ..Registry::default()
        }
    }

    /// Called by the listener before it spawns a session thread; the
    /// thread takes the guard with [`Registry::adopt`].
    pub fn spawning(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    /// The guard for a session counted by [`Registry::spawning`].
    pub fn adopt(&self) -> LiveGuard {
        LiveGuard(Arc::clone(&self.live))
    }

    /// Sessions still alive.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub fn register(&self, id: u64, handle: Arc<SessionHandle>) -> Registered {
        if let Ok(mut map) = self.sessions.lock() {
            map.insert(id, handle);
        }
        Registered {
            sessions: Arc::clone(&self.sessions),
            id,
        }
    }

    /// Whether shutdown has begun: sessions close at their next idle point.
    pub fn draining(&self) -> bool {
        self.draining.is_set()
    }

    /// Begins shutdown: idle sessions are closed now (they wait for reads); busy ones close when their work is done (see
    /// [`closable`]).
    pub fn begin_drain(&self) {
        self.draining.set();
        for handle in self.handles() {
            // Under the state lock, so the client thread cannot forward a
            // new request between the check and the stop.
            if let Ok(st) = handle.state.lock() {
                if closable(st.as_ref()) {
                    handle.stop(StopReason::Shutdown);
                }
            }
        }
    }

    /// Closes every remaining session without waiting for idleness; each
    /// is told why (FATAL 57P01) before its socket closes.
    pub fn close_all(&self) {
        for handle in self.handles() {
            handle.stop(StopReason::Shutdown);
            handle.release_client_reader();
        }
    }

    /// The relaying sessions, by id: one lock of the map and a copy of
    /// each summary; nothing on the data path waits for it.
    pub fn snapshot(&self) -> Vec<SessionSummary> {
        let mut out: Vec<SessionSummary> = self
            .handles()
            .iter()
            .filter_map(|h| h.summary.get().cloned())
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }

    fn handles(&self) -> Vec<Arc<SessionHandle>> {
        match self.sessions.lock() {
            Ok(map) => map.values().cloned().collect(),
            Err(_) => Vec::new(),
        }
    }
}
