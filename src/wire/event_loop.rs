//! The relay's event loops (`event_loops`, one per two cores by default):
//! threads each waiting on the sockets of many sessions at once (epoll,
//! through `mio`), so one wake-up serves whatever became ready on any of
//! them, as PgBouncer's loop does.
//! A thread per direction per session instead wakes for every message
//! (docs/performance.md, "Where the CPU goes").
//!
//! Nothing on a loop blocks: sockets are non-blocking, a held row's claim
//! is decided on a thread of its own (which wakes the loop when done), and
//! a session whose guard may block (see
//! [`super::guard::ClientStep::Blocks`]) leaves its loop for threads of its
//! own before it does. Sessions are dealt to the loops in turn. The
//! startup deadline is kept by the loop: a session still authenticating
//! at its deadline is ended as a thread's timed-out read would end it.

use std::io;
use std::os::unix::io::AsRawFd;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use super::guard::Ticket;
use super::loop_session::{LoopSession, Next};
use super::relayed::{Relay, Relayed, THREAD_STACK};
use super::session_end::End;
use super::upstream::Upstream;

/// The token of a loop's waker.
const WAKE: Token = Token(usize::MAX);
/// Readiness events taken per wait.
const EVENTS: usize = 256;

/// The loops of one proxy; dropping it ends each loop once its last
/// session has ended.
pub struct EventLoops {
    loops: Vec<LoopHandle>,
    next: AtomicUsize,
}

/// How a session reaches a loop.
struct LoopHandle {
    adopt: Sender<Box<LoopSession>>,
    waker: Arc<Waker>,
}

/// The ticket of session `key`'s held message is decided (`id` tells
/// that session from a later one given the same key).
struct Decided {
    key: usize,
    id: u64,
}

impl EventLoops {
    /// Starts `count` loops (at least one); when one cannot start, those
    /// started end.
    pub fn start(count: usize) -> io::Result<EventLoops> {
        let mut started = EventLoops {
            loops: Vec::with_capacity(count.max(1)),
            next: AtomicUsize::new(0),
        };
        for n in 0..count.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
            let (adopt, adopted) = channel();
            let (decided_tx, decided) = channel();
            let worker = Worker {
                poll,
                adopted,
                decided,
                decided_tx,
                waker: Arc::clone(&waker),
                sessions: Slab::new(),
                starting: Vec::new(),
                again: Vec::new(),
            };
            std::thread::Builder::new()
                .name(format!("rg-loop-{n}"))
                .stack_size(THREAD_STACK)
                .spawn(move || worker.run())?;
            started.loops.push(LoopHandle { adopt, waker });
        }
        Ok(started)
    }

    /// The loops `count` asks for (none for 0); when they cannot start,
    /// none either, said as an ERROR: sessions then relay on threads of
    /// their own.
    pub fn configured(count: usize) -> Option<Arc<EventLoops>> {
        if count == 0 {
            return None;
        }
        match EventLoops::start(count) {
            Ok(loops) => {
                tracing::info!(event_loops = count, "relay event loops started");
                Some(Arc::new(loops))
            }
            Err(e) => {
                tracing::error!(error = %e, event_loops = count,
                    "cannot start the event loops: sessions relay on threads of their own");
                None
            }
        }
    }

    /// Hands a session to the next loop. A session without TLS on either
    /// side can be served by one; another, or one no loop took, comes
    /// back.
    pub(super) fn adopt(
        &self,
        session: Relayed,
        relay: Relay,
    ) -> Result<(), Box<(Relayed, Relay)>> {
        let plain =
            session.handle.client.plain().is_some() && session.handle.server.plain_fd().is_some();
        if !plain {
            return Err(Box::new((session, relay)));
        }
        if let Err(e) = nonblocking(&session, true) {
            tracing::warn!(error = %e, "a session's sockets stay blocking: it relays on threads");
            let _ = nonblocking(&session, false);
            return Err(Box::new((session, relay)));
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed) % self.loops.len();
        let to = &self.loops[n];
        match to.adopt.send(Box::new(LoopSession::new(session, relay))) {
            Ok(()) => {
                if let Err(e) = to.waker.wake() {
                    tracing::error!(error = %e, "cannot wake an event loop: a new session waits");
                }
                Ok(())
            }
            Err(std::sync::mpsc::SendError(back)) => {
                let (session, relay) = back.into_threads();
                let _ = nonblocking(&session, false);
                Err(Box::new((session, relay)))
            }
        }
    }
}

impl Drop for EventLoops {
    fn drop(&mut self) {
        for l in &self.loops {
            let _ = l.waker.wake();
        }
    }
}

/// Makes both sockets of a session non-blocking (`on`) or blocking.
fn nonblocking(session: &Relayed, on: bool) -> io::Result<()> {
    if let Some(client) = session.handle.client.plain() {
        client.set_nonblocking(on)?;
    }
    session.handle.server.set_nonblocking(on)
}

/// One loop's thread and what it owns.
struct Worker {
    poll: Poll,
    adopted: Receiver<Box<LoopSession>>,
    decided: Receiver<Decided>,
    /// For the threads that decide tickets, to report back.
    decided_tx: Sender<Decided>,
    waker: Arc<Waker>,
    sessions: Slab<Box<LoopSession>>,
    /// The sessions still authenticating (key and id), whose startup
    /// deadline the loop keeps.
    starting: Vec<(usize, u64)>,
    /// The sessions that yielded with more to move (key and id): driven
    /// again after the next wait, which then does not wait.
    again: Vec<(usize, u64)>,
}

/// The sockets of a session: the client's token is `2 × key`, the
/// server's the next.
fn tokens(key: usize) -> (Token, Token) {
    (Token(2 * key), Token(2 * key + 1))
}

impl Worker {
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        let mut orphaned = false;
        loop {
            let timeout = if self.again.is_empty() {
                self.next_deadline().map(|at| {
                    at.saturating_duration_since(Instant::now()) + Duration::from_millis(1)
                })
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "an event loop cannot wait: its sessions end");
                    self.end_all(&format!("event loop: {e}"));
                    return;
                }
            }
            for event in events.iter() {
                if event.token() == WAKE {
                    continue;
                }
                let key = event.token().0 / 2;
                let server = event.token().0 % 2 == 1;
                let closed = event.is_read_closed() || event.is_error();
                let write = event.is_writable() || event.is_write_closed() || event.is_error();
                if let Some(s) = self.sessions.get_mut(key) {
                    s.ready(server, event.is_readable(), closed, write);
                    self.drive(key);
                }
            }
            orphaned |= self.take_sessions();
            self.take_decisions();
            for (key, id) in std::mem::take(&mut self.again) {
                if self.sessions.get(key).is_some_and(|s| s.session.id == id) {
                    self.drive(key);
                }
            }
            self.end_overdue();
            if orphaned && self.sessions.is_empty() {
                return;
            }
        }
    }

    /// Takes the sessions handed over; true once the proxy dropped its
    /// loops (no more will come).
    fn take_sessions(&mut self) -> bool {
        loop {
            match self.adopted.try_recv() {
                Ok(session) => self.adopt(session),
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => return true,
            }
        }
    }

    fn adopt(&mut self, session: Box<LoopSession>) {
        let entry = self.sessions.vacant_entry();
        let key = entry.key();
        let (client_token, server_token) = tokens(key);
        let (client_fd, server_fd) = fds(&session);
        let interest = Interest::READABLE | Interest::WRITABLE;
        let registry = self.poll.registry();
        let registered = registry
            .register(&mut SourceFd(&client_fd), client_token, interest)
            .and_then(|()| registry.register(&mut SourceFd(&server_fd), server_token, interest));
        self.starting.push((key, session.session.id));
        entry.insert(session);
        if let Err(e) = registered {
            tracing::error!(error = %e, "an event loop cannot watch a session: it relays on threads");
            self.move_to_threads(key);
            return;
        }
        // Bytes may have come with the StartupMessage, and the server's
        // first answer may be in already.
        self.drive(key);
    }

    fn take_decisions(&mut self) {
        while let Ok(Decided { key, id }) = self.decided.try_recv() {
            let Some(s) = self.sessions.get_mut(key) else {
                continue;
            };
            if s.session.id == id {
                s.decided();
                self.drive(key);
            }
        }
    }

    /// Moves session `key`'s bytes, then does what that left to do.
    fn drive(&mut self, key: usize) {
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let next = s.drive();
        let id = s.session.id;
        let held = s
            .ticket_to_decide()
            .map(|ticket| (ticket, Arc::clone(&s.session.handle.server)));
        match next {
            Next::Waits => {}
            Next::Yields => self.again.push((key, id)),
            Next::Ended(end) => return self.end(key, end),
            Next::ToThreads => return self.move_to_threads(key),
        }
        let Some((ticket, server)) = held else {
            return;
        };
        if let Err(e) = self.decide(key, id, Arc::clone(&ticket.0), Arc::clone(&server)) {
            tracing::error!(error = %e, "cannot start a thread to decide a claim: deciding it \
                on the event loop, whose other sessions wait meanwhile");
            ticket.0.decide(&|| server.peer_closed());
            if let Some(s) = self.sessions.get_mut(key) {
                s.decided();
            }
            self.drive(key);
        }
    }

    /// Has a held message's ticket decided on a thread of its own (it may
    /// wait for a store, or for another holder), which wakes the loop
    /// when done.
    fn decide(
        &self,
        key: usize,
        id: u64,
        ticket: Arc<dyn Ticket>,
        server: Arc<Upstream>,
    ) -> io::Result<()> {
        let (report, waker) = (self.decided_tx.clone(), Arc::clone(&self.waker));
        std::thread::Builder::new()
            .name("rg-decide".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                ticket.decide(&|| server.peer_closed());
                // The loop has ended when nobody receives.
                if report.send(Decided { key, id }).is_ok() {
                    if let Err(e) = waker.wake() {
                        tracing::error!(error = %e, "cannot wake an event loop: a decided claim waits");
                    }
                }
            })
            .map(drop)
    }

    /// Stops watching session `key` and removes it.
    fn remove(&mut self, key: usize) -> Box<LoopSession> {
        let session = self.sessions.remove(key);
        let (client_fd, server_fd) = fds(&session);
        let registry = self.poll.registry();
        let _ = registry.deregister(&mut SourceFd(&client_fd));
        let _ = registry.deregister(&mut SourceFd(&server_fd));
        session
    }

    fn end(&mut self, key: usize, end: End) {
        let mut session = self.remove(key);
        let end = session.settle_end(end);
        let (relayed, _) = session.into_threads();
        relayed.finish(end);
    }

    /// Session `key` relays on threads of its own from here.
    fn move_to_threads(&mut self, key: usize) {
        metrics::counter!(crate::metrics::RELAYED_SESSIONS, "relay" => "moved_to_threads")
            .increment(1);
        let session = self.remove(key);
        let (relayed, relay) = session.into_threads();
        if let Err(e) = nonblocking(&relayed, false) {
            return relayed.finish(End::Error(format!("session to threads: {e}")));
        }
        let span = relayed.span.clone();
        let moved = Arc::new(Mutex::new(Some((relayed, relay))));
        let on_thread = Arc::clone(&moved);
        let spawned = std::thread::Builder::new()
            .name("rg-session".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let _entered = span.enter();
                if let Some((relayed, relay)) = on_thread.lock().ok().and_then(|mut m| m.take()) {
                    relayed.on_threads(relay);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a session's threads: the session ends");
            if let Some((relayed, _)) = moved.lock().ok().and_then(|mut m| m.take()) {
                relayed.finish(End::Error(format!("starting the session's threads: {e}")));
            }
        }
    }

    /// The earliest startup deadline of a session still authenticating.
    fn next_deadline(&self) -> Option<Instant> {
        self.starting
            .iter()
            .filter_map(|&(key, id)| self.sessions.get(key).filter(|s| s.session.id == id))
            .map(|s| s.session.deadline)
            .min()
    }

    /// Ends each session still authenticating at its deadline, and stops
    /// keeping the deadline of those done with it (or gone).
    fn end_overdue(&mut self) {
        if self.starting.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut overdue = Vec::new();
        let sessions = &mut self.sessions;
        self.starting.retain(|&(key, id)| {
            let Some(s) = sessions.get_mut(key).filter(|s| s.session.id == id) else {
                return false;
            };
            if s.startup_overdue(now) {
                overdue.push(key);
                return false;
            }
            s.starting()
        });
        for key in overdue {
            self.end(
                key,
                End::ClientProtocol("resumeguard: authentication timed out".into()),
            );
        }
    }

    /// Ends every session (the loop cannot go on).
    fn end_all(&mut self, why: &str) {
        let keys: Vec<usize> = self.sessions.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.end(key, End::Error(why.to_owned()));
        }
    }
}

/// The descriptors of a session's sockets (both plain: see
/// [`EventLoops::adopt`]).
fn fds(session: &LoopSession) -> (RawFd, RawFd) {
    let handle = &session.session.handle;
    let client = handle.client.plain().map_or(-1, |s| s.as_raw_fd());
    let server = handle.server.plain_fd().unwrap_or(-1);
    (client, server)
}
