//! The relay's event loops (`event_loops`, one per two cores by default):
//! threads each waiting on the sockets of many sessions at once, so one
//! wake-up serves whatever became ready on any of them, as PgBouncer's
//! loop does. A thread per direction per session instead wakes for every
//! message (docs/performance.md, "Where the CPU goes").
//!
//! A loop waits on an io_uring (`event_loop_io = "io_uring"`, the
//! default; see `ring.rs`), whose one system call a turn also submits the
//! turn's writes, or on epoll (through `mio`), with a system call per
//! write: where the kernel refuses a ring, and when configured.
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

use super::backend_keys::WaitEnds;
use super::guard::Ticket;
use super::loop_session::{LoopSession, Next};
use super::proxy::LoopIo;
use super::relayed::{Relay, Relayed, THREAD_STACK};
use super::ring::{Done, Ring, RingWaker};
use super::session_end::End;

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
    waker: Arc<LoopWaker>,
}

/// Wakes a loop from another thread (a session handed over, a claim
/// decided, the proxy's end).
enum LoopWaker {
    Epoll(Waker),
    Ring(RingWaker),
}

impl LoopWaker {
    fn wake(&self) -> io::Result<()> {
        match self {
            LoopWaker::Epoll(waker) => waker.wake(),
            LoopWaker::Ring(waker) => waker.wake(),
        }
    }
}

/// What a loop waits on, and the happenings of its last wait.
enum Waiter {
    Epoll {
        poll: Poll,
        events: Events,
        /// The last wait's readiness: (token, readable, closed, writable).
        ready: Vec<(usize, bool, bool, bool)>,
    },
    Ring {
        ring: Box<Ring>,
        /// Completions taken off the ring; those from `next` on are not
        /// acted on yet.
        done: Vec<Done>,
        next: usize,
    },
}

impl Waiter {
    /// The waiter `io` asks for on the calling thread: a ring, or epoll
    /// where the kernel refuses one (with why).
    fn new(io: LoopIo) -> io::Result<(Waiter, LoopWaker, Option<io::Error>)> {
        let refused = match io {
            LoopIo::IoUring => match Ring::new() {
                Ok(ring) => {
                    let waker = LoopWaker::Ring(ring.waker());
                    let done = Vec::with_capacity(EVENTS);
                    let ring = Box::new(ring);
                    let waiter = Waiter::Ring {
                        ring,
                        done,
                        next: 0,
                    };
                    return Ok((waiter, waker, None));
                }
                Err(e) => Some(e),
            },
            LoopIo::Epoll => None,
        };
        let poll = Poll::new()?;
        let waker = LoopWaker::Epoll(Waker::new(poll.registry(), WAKE)?);
        let events = Events::with_capacity(EVENTS);
        let ready = Vec::with_capacity(EVENTS);
        let waiter = Waiter::Epoll {
            poll,
            events,
            ready,
        };
        Ok((waiter, waker, refused))
    }
}

/// A ring request's tag: the session (its key, and its id's low bits to
/// tell it from a later one given the key), what the request is, and
/// which socket (`server`).
fn tag(key: usize, id: u64, kind: u64, server: bool) -> u64 {
    (id_bits(id) << 32) | ((key as u64 & 0x3fff_ffff) << 2) | (kind << 1) | u64::from(server)
}
/// A socket's readiness watch.
const WATCH: u64 = 0;
/// A send.
const SEND: u64 = 1;
/// A completion already acted on, left in the list (see
/// [`Worker::settle_sends`]).
const TAKEN: u64 = u64::MAX;

/// The bits of a session's id a ring tag carries.
fn id_bits(id: u64) -> u64 {
    id & 0xffff_ffff
}

/// A ring completion's (key, id's low bits, kind, server).
fn untag(tag: u64) -> (usize, u64, u64, bool) {
    (
        ((tag >> 2) & 0x3fff_ffff) as usize,
        tag >> 32,
        (tag >> 1) & 1,
        tag & 1 == 1,
    )
}

/// The ticket of session `key`'s held message is decided (`id` tells
/// that session from a later one given the same key).
struct Decided {
    key: usize,
    id: u64,
}

impl EventLoops {
    /// Starts `count` loops (at least one) waiting as `io` asks, with why
    /// the kernel refused a ring if it did; when one cannot start, those
    /// started end.
    pub fn start(count: usize, io: LoopIo) -> io::Result<(EventLoops, Option<io::Error>)> {
        let mut started = EventLoops {
            loops: Vec::with_capacity(count.max(1)),
            next: AtomicUsize::new(0),
        };
        let mut refused = None;
        for n in 0..count.max(1) {
            let (adopt, adopted) = channel();
            let (made_tx, made) = channel();
            std::thread::Builder::new()
                .name(format!("rg-loop-{n}"))
                .stack_size(THREAD_STACK)
                .spawn(move || {
                    // Made on the loop's thread: only it submits to a ring.
                    let (waiter, waker, refused) = match Waiter::new(io) {
                        Ok(made) => made,
                        Err(e) => return drop(made_tx.send(Err(e))),
                    };
                    let waker = Arc::new(waker);
                    let (decided_tx, decided) = channel();
                    let worker = Worker {
                        waiter,
                        adopted,
                        decided,
                        decided_tx,
                        waker: Arc::clone(&waker),
                        sessions: Slab::new(),
                        starting: Vec::new(),
                        again: Vec::new(),
                    };
                    if made_tx.send(Ok((waker, refused))).is_ok() {
                        worker.run();
                    }
                })?;
            let (waker, why) = made
                .recv()
                .map_err(|_| io::Error::other("an event loop ended as it started"))??;
            refused = refused.or(why);
            started.loops.push(LoopHandle { adopt, waker });
        }
        Ok((started, refused))
    }

    /// The loops `count` asks for (none for 0), waiting as `io` asks;
    /// when they cannot start, none either, said as an ERROR: sessions
    /// then relay on threads of their own.
    pub fn configured(count: usize, io: LoopIo) -> Option<Arc<EventLoops>> {
        if count == 0 {
            return None;
        }
        match EventLoops::start(count, io) {
            Ok((loops, refused)) => {
                let waits = match (io, &refused) {
                    (LoopIo::IoUring, None) => "io_uring",
                    _ => "epoll",
                };
                if let Some(e) = refused {
                    tracing::warn!(error = %e,
                        "the kernel refuses io_uring: the event loops wait on epoll");
                }
                tracing::info!(event_loops = count, io = waits, "relay event loops started");
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
    waiter: Waiter,
    adopted: Receiver<Box<LoopSession>>,
    decided: Receiver<Decided>,
    /// For the threads that decide tickets, to report back.
    decided_tx: Sender<Decided>,
    waker: Arc<LoopWaker>,
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
        let mut orphaned = false;
        loop {
            let backlog = matches!(&self.waiter, Waiter::Ring { done, .. } if !done.is_empty());
            let timeout = if self.again.is_empty() && !backlog {
                self.next_deadline().map(|at| {
                    at.saturating_duration_since(Instant::now()) + Duration::from_millis(1)
                })
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.wait(timeout) {
                tracing::error!(error = %e, "an event loop cannot wait: its sessions end");
                self.end_all(&format!("event loop: {e}"));
                return;
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

    /// Waits for at most `timeout` and acts on what happened.
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        match &mut self.waiter {
            Waiter::Epoll {
                poll,
                events,
                ready,
            } => {
                match poll.poll(events, timeout) {
                    Err(e) if e.kind() != io::ErrorKind::Interrupted => return Err(e),
                    _ => {}
                }
                ready.extend(events.iter().filter(|e| e.token() != WAKE).map(|event| {
                    let closed = event.is_read_closed() || event.is_error();
                    let write = event.is_writable() || event.is_write_closed() || event.is_error();
                    (event.token().0, event.is_readable(), closed, write)
                }));
                let mut happened = std::mem::take(ready);
                for (token, read, closed, write) in happened.drain(..) {
                    let (key, server) = (token / 2, token % 2 == 1);
                    if let Some(s) = self.sessions.get_mut(key) {
                        s.ready(server, read, closed, write);
                        self.drive(key);
                    }
                }
                if let Waiter::Epoll { ready, .. } = &mut self.waiter {
                    *ready = happened;
                }
            }
            Waiter::Ring { ring, done, .. } => {
                ring.wait(timeout, done)?;
                while let Some(d) = self.next_done() {
                    self.completed(d);
                }
            }
        }
        Ok(())
    }

    /// The next ring completion to act on, if any (the list is emptied
    /// when all were). Acting on one may take others of the list (a
    /// session's sends, when it ends) or add to it.
    fn next_done(&mut self) -> Option<Done> {
        let Waiter::Ring { done, next, .. } = &mut self.waiter else {
            return None;
        };
        let d = done.get(*next).copied();
        match d {
            Some(_) => *next += 1,
            None => {
                done.clear();
                *next = 0;
            }
        }
        d
    }

    /// Acts on a ring request's completion.
    fn completed(&mut self, done: Done) {
        if done.tag == TAKEN {
            return;
        }
        let (key, id, kind, server) = untag(done.tag);
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        if id_bits(s.session.id) != id {
            return;
        }
        if kind == SEND {
            if let Err(end) = s.sent(server, done.result, done.cancelled()) {
                return self.end(key, end);
            }
        } else if done.cancelled() {
            return;
        } else {
            let (read, closed) = done.readiness();
            s.ready(server, read, closed, false);
            if !done.more {
                // The kernel ended the watch (it does when it must):
                // watched again.
                let fd = fds(s);
                let fd = if server { fd.1 } else { fd.0 };
                let tag = tag(key, s.session.id, WATCH, server);
                if let Waiter::Ring { ring, .. } = &mut self.waiter {
                    if let Err(e) = ring.watch(fd, tag) {
                        return self.end(key, End::Error(format!("event loop: {e}")));
                    }
                }
            }
        }
        self.drive(key);
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

    fn adopt(&mut self, mut session: Box<LoopSession>) {
        let entry = self.sessions.vacant_entry();
        let key = entry.key();
        let (client_fd, server_fd) = fds(&session);
        let id = session.session.id;
        let registered = match &mut self.waiter {
            Waiter::Epoll { poll, .. } => {
                let (client_token, server_token) = tokens(key);
                let interest = Interest::READABLE | Interest::WRITABLE;
                let registry = poll.registry();
                registry
                    .register(&mut SourceFd(&client_fd), client_token, interest)
                    .and_then(|()| {
                        registry.register(&mut SourceFd(&server_fd), server_token, interest)
                    })
            }
            Waiter::Ring { ring, .. } => {
                session.write_through_ring();
                ring.watch(client_fd, tag(key, id, WATCH, false))
                    .and_then(|()| ring.watch(server_fd, tag(key, id, WATCH, true)))
            }
        };
        self.starting.push((key, id));
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
            .map(|ticket| (ticket, s.session.wait_ends()));
        match next {
            Next::Waits => {}
            Next::Yields => self.again.push((key, id)),
            Next::Ended(end) => return self.end(key, end),
            Next::ToThreads => return self.move_to_threads(key),
        }
        if let Err(e) = self.queue_sends(key) {
            return self.end(key, End::Error(format!("event loop: {e}")));
        }
        let Some((ticket, ends)) = held else {
            return;
        };
        if let Err(e) = self.decide(key, id, Arc::clone(&ticket.0), ends.clone()) {
            tracing::error!(error = %e, "cannot start a thread to decide a claim: deciding it \
                on the event loop, whose other sessions wait meanwhile");
            ticket.0.decide(&|| ends.now());
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
        ends: WaitEnds,
    ) -> io::Result<()> {
        let (report, waker) = (self.decided_tx.clone(), Arc::clone(&self.waker));
        std::thread::Builder::new()
            .name("rg-decide".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                ticket.decide(&|| ends.now());
                // The loop has ended when nobody receives.
                if report.send(Decided { key, id }).is_ok() {
                    if let Err(e) = waker.wake() {
                        tracing::error!(error = %e, "cannot wake an event loop: a decided claim waits");
                    }
                }
            })
            .map(drop)
    }

    /// On a ring: queues a send of what waits for each side of session
    /// `key`, if none is in flight.
    fn queue_sends(&mut self, key: usize) -> io::Result<()> {
        let Waiter::Ring { ring, .. } = &mut self.waiter else {
            return Ok(());
        };
        let Some(s) = self.sessions.get_mut(key) else {
            return Ok(());
        };
        let (client_fd, server_fd) = fds(s);
        let id = s.session.id;
        for (server, fd) in [(false, client_fd), (true, server_fd)] {
            if let Some(bytes) = s.next_send(server) {
                // Safety: the bytes stay unchanged in the session's
                // queued write until this send's completion is taken
                // (`sent`), or are never freed (`settle_sends`); a
                // session leaves the loop only after `settle_sends`.
                unsafe { ring.send(fd, bytes, tag(key, id, SEND, server)) }?;
            }
        }
        Ok(())
    }

    /// On a ring: cancels session `key`'s sends in flight and waits for
    /// their completions (what they wrote counts), so that the session
    /// writes for itself from here, what they did not write first. Other
    /// completions that come meanwhile join the list the loop acts on.
    fn settle_sends(&mut self, key: usize) {
        let Waiter::Ring {
            ring, done, next, ..
        } = &mut self.waiter
        else {
            return;
        };
        let Some(s) = self.sessions.get_mut(key) else {
            return;
        };
        let id = s.session.id;
        let take = |done: &mut [Done], s: &mut LoopSession| {
            for d in done {
                let (k, i, kind, server) = untag(d.tag);
                if d.tag != TAKEN && (k, i, kind) == (key, id_bits(id), SEND) {
                    let _ = s.sent(server, d.result, d.cancelled());
                    d.tag = TAKEN;
                }
            }
        };
        // Completions already taken off the ring and not acted on yet.
        take(&mut done[*next..], s);
        for server in [false, true] {
            if s.send_in_flight(server) {
                if let Err(e) = ring.cancel(tag(key, id, SEND, server)) {
                    tracing::error!(error = %e, "an event loop cannot cancel a send");
                }
            }
        }
        while s.send_in_flight(false) || s.send_in_flight(true) {
            let from = done.len();
            if let Err(e) = ring.wait(None, done) {
                tracing::error!(error = %e, "an event loop cannot wait for a session's sends");
                break;
            }
            take(&mut done[from..], s);
        }
        if !s.settle_sends() {
            tracing::error!("a session's bytes in the kernel's hands are dropped: it ends");
        }
    }

    /// Stops watching session `key` and removes it (on a ring, once its
    /// sends are settled: see [`Worker::settle_sends`]).
    fn remove(&mut self, key: usize) -> Box<LoopSession> {
        self.settle_sends(key);
        let session = self.sessions.remove(key);
        let (client_fd, server_fd) = fds(&session);
        match &mut self.waiter {
            Waiter::Epoll { poll, .. } => {
                let registry = poll.registry();
                let _ = registry.deregister(&mut SourceFd(&client_fd));
                let _ = registry.deregister(&mut SourceFd(&server_fd));
            }
            Waiter::Ring { ring, .. } => {
                // Submitted now: a watch holds its socket open, and the
                // session's end closes the descriptors next.
                for server in [false, true] {
                    if let Err(e) = ring.cancel(tag(key, session.session.id, WATCH, server)) {
                        tracing::error!(error = %e, "an event loop cannot stop watching a socket");
                    }
                }
            }
        }
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
