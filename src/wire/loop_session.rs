//! One session relayed by an event loop: both sides' non-blocking reads,
//! the bytes routed and not yet written, and the steps that move them
//! (the same framing and tracking as the relay threads', without a
//! thread blocking anywhere). The loop calls [`LoopSession::drive`] when
//! either socket is ready; it returns when nothing more can move.
//!
//! Backpressure as on threads: a side is not read while what was routed
//! from it waits to be written, so a session buffers at most one read
//! per direction (plus what the guard put in place of it).
//!
//! On a loop waiting on io_uring the session's steps write nothing
//! themselves: what they route waits, and the loop sends it with its next
//! wait ([`LoopSession::next_send`]); until the send completes its bytes
//! still count as waiting to be written.

use std::io::{ErrorKind, Read, Write};
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use super::client_relay::{track_client, Limits, Refused, MAX_PRE_AUTH_MESSAGE};
use super::connection::Connection;
use super::guard::HeldTicket;
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::queued_writes::QueuedWrite;
use super::registry::{closable, StopReason};
use super::relayed::{Relay, Relayed};
use super::server_relay::{idle, track_server, Held, SHRINK_ABOVE, SHUTTING_DOWN};
use super::session_end::End;
use crate::log_text::shown;

/// Whether a socket may take a read or a write now: set by the loop's
/// readiness events, cleared when the socket says it would block.
#[derive(Debug, Clone, Copy)]
struct Ready {
    read: bool,
    write: bool,
    /// The peer closed its side (or the socket failed): reads go on until
    /// they say so, however short the one before.
    closed: bool,
}

impl Default for Ready {
    fn default() -> Self {
        Ready {
            read: true,
            write: true,
            closed: false,
        }
    }
}

impl Ready {
    /// A read brought less than the room it had: the kernel held no more,
    /// and the next bytes come with a readiness event, unless the peer's
    /// end already came with the last one.
    fn read_short(&mut self) {
        self.read = self.closed;
    }
}

/// What one step of a session did.
enum Step {
    /// Bytes moved: look again.
    Moved,
    /// Nothing can move until a socket is ready (or a decision is made).
    Stuck,
    Ended(End),
    /// The next client message may block its tracking (see
    /// [`super::guard::ClientStep::Blocks`]): the session goes to threads.
    ToThreads,
}

/// Rounds of steps one drive takes before the loop's other sessions get
/// their turn (each moves at most one read per direction).
const TURN: usize = 32;

/// Where the loop takes a session after driving it.
pub(super) enum Next {
    /// It waits for its sockets on the loop.
    Waits,
    /// It has more to move, after the loop's other sessions had a turn.
    Yields,
    Ended(End),
    /// It relays on threads from here (see [`LoopSession::into_threads`]).
    ToThreads,
}

/// One session on an event loop.
pub(super) struct LoopSession {
    pub session: Relayed,
    relay: Relay,
    client_ready: Ready,
    server_ready: Ready,
    /// What the guard put in place of client messages, by pass.
    rewritten: BytesMut,
    /// A client message waits for answers to an earlier Sync.
    awaiting: bool,
    /// The client sent its last byte (its side passed on as a half-close).
    client_done: bool,
    /// A server message held back while its ticket is decided off the
    /// loop; `decided` once it is.
    held: Option<Held>,
    decided: bool,
    /// The held message's ticket, until the loop takes it to decide.
    to_decide: Option<HeldTicket>,
    /// Authentication is over (before: the startup deadline applies).
    started: bool,
    /// On a ring loop: the bytes its sends are writing to each side
    /// (see [`LoopSession::write_through_ring`]).
    to_client_queued: QueuedWrite,
    to_server_queued: QueuedWrite,
}

impl LoopSession {
    pub fn new(session: Relayed, relay: Relay) -> Self {
        LoopSession {
            session,
            relay,
            client_ready: Ready::default(),
            server_ready: Ready::default(),
            rewritten: BytesMut::new(),
            awaiting: false,
            client_done: false,
            held: None,
            decided: false,
            to_decide: None,
            started: false,
            to_client_queued: QueuedWrite::default(),
            to_server_queued: QueuedWrite::default(),
        }
    }

    /// The loop writes for the session from here (a ring's sends, see
    /// [`LoopSession::next_send`]): the session's own steps only queue
    /// what they route, until [`LoopSession::settle_sends`].
    pub fn write_through_ring(&mut self) {
        self.client_ready.write = false;
        self.server_ready.write = false;
    }

    /// The bytes to send to the client (`server`: to the server) now, if
    /// none are being sent: they stay unchanged until [`LoopSession::sent`].
    pub fn next_send(&mut self, server: bool) -> Option<&[u8]> {
        let pending = &mut self.relay.pending;
        if server {
            self.to_server_queued.next(&mut pending.to_server)
        } else {
            self.to_client_queued.next(&mut pending.to_client)
        }
    }

    /// The send to the client (`server`: to the server) completed with
    /// `result` (a count or a negated error number; `cancelled`: it was
    /// cancelled, having written `result` if that is a count).
    pub fn sent(&mut self, server: bool, result: i32, cancelled: bool) -> Result<(), End> {
        if server {
            self.to_server_queued
                .sent(result, cancelled)
                .map_err(|e| End::Error(format!("upstream write: {e}")))
        } else {
            self.to_client_queued
                .sent(result, cancelled)
                .map_err(|e| End::Error(format!("client write: {e}")))
        }
    }

    /// Whether a send to the client (`server`: to the server) is in flight.
    pub fn send_in_flight(&self, server: bool) -> bool {
        if server {
            self.to_server_queued.in_flight()
        } else {
            self.to_client_queued.in_flight()
        }
    }

    /// The session writes for itself again (it ends, or goes to threads),
    /// with what its sends left unwritten in front of what waits: false
    /// when a send could not be waited for, whose bytes (and what was to
    /// follow them) are dropped.
    pub fn settle_sends(&mut self) -> bool {
        let pending = &mut self.relay.pending;
        let client = self.to_client_queued.settle(&mut pending.to_client);
        let server = self.to_server_queued.settle(&mut pending.to_server);
        self.client_ready.write = true;
        self.server_ready.write = true;
        client && server
    }

    /// The loop saw readiness on the client's socket (`server`: on the
    /// server's): `read` for readable, `closed` for the peer's end or a
    /// failure, `write` for writable.
    pub fn ready(&mut self, server: bool, read: bool, closed: bool, write: bool) {
        let side = if server {
            &mut self.server_ready
        } else {
            &mut self.client_ready
        };
        side.read |= read || closed;
        side.closed |= closed;
        side.write |= write;
    }

    /// The ticket of the held message is decided.
    pub fn decided(&mut self) {
        self.decided = true;
    }

    /// The ticket of a message just held, for the loop to have decided
    /// off it; taken once.
    pub fn ticket_to_decide(&mut self) -> Option<HeldTicket> {
        self.to_decide.take()
    }

    /// Whether authentication is still going on past `now`'s deadline.
    pub fn startup_overdue(&mut self, now: Instant) -> bool {
        if !self.started {
            self.started = self
                .session
                .handle
                .state
                .lock()
                .map(|st| st.started())
                .unwrap_or(false);
        }
        !self.started && now >= self.session.deadline
    }

    /// Authentication is not over yet: the startup deadline applies.
    pub fn starting(&self) -> bool {
        !self.started
    }

    /// Moves bytes until nothing more can move, inside the session's span
    /// (entered only if something logs meanwhile: see `log_scope`).
    pub fn drive(&mut self) -> Next {
        let span = std::mem::replace(&mut self.session.span, tracing::Span::none());
        let next = crate::log_scope::in_scope(&span, || self.drive_steps());
        self.session.span = span;
        next
    }

    fn drive_steps(&mut self) -> Next {
        for _ in 0..TURN {
            if let Some(end) = self.stopped() {
                return Next::Ended(end);
            }
            let mut moved = match self.flush() {
                Ok(moved) => moved,
                Err(end) => return Next::Ended(end),
            };
            match self.server_step() {
                Step::Moved => moved = true,
                Step::Stuck => {}
                Step::Ended(end) => return Next::Ended(end),
                Step::ToThreads => return Next::ToThreads,
            }
            match self.client_step() {
                Step::Moved => moved = true,
                Step::Stuck => {}
                Step::Ended(end) => return Next::Ended(end),
                Step::ToThreads => return Next::ToThreads,
            }
            if !moved {
                return Next::Waits;
            }
        }
        Next::Yields
    }

    /// How the session ends when it was told to stop, or when a draining
    /// proxy finds it idle with everything routed written. Asked before
    /// every round: when neither is set, two loads and no more.
    #[inline]
    fn stopped(&mut self) -> Option<End> {
        let stopping = self.session.handle.stopping();
        let draining = self.session.proxy.sessions.draining();
        if stopping.is_none() && !draining {
            return None;
        }
        self.stopping(stopping, draining)
    }

    /// [`LoopSession::stopped`] once a stop or a drain is set.
    #[cold]
    fn stopping(&mut self, stopping: Option<StopReason>, draining: bool) -> Option<End> {
        match stopping {
            Some(StopReason::Shutdown) => return Some(self.close_for_shutdown()),
            Some(StopReason::Quiet) => return Some(End::Quiet),
            None => {}
        }
        let drained = self.relay.pending.to_client.is_empty()
            && self.to_client_queued.is_empty()
            && self.held.is_none();
        if draining && drained && idle(&self.session.handle.state) {
            return Some(self.close_for_shutdown());
        }
        None
    }

    /// Tells the client the proxy is shutting down (FATAL 57P01), after
    /// what already waits for it.
    fn close_for_shutdown(&mut self) -> End {
        self.tell_client(&error_response(
            Severity::Fatal,
            sqlstate::ADMIN_SHUTDOWN,
            SHUTTING_DOWN,
            None,
        ));
        End::Shutdown
    }

    /// Queues `message` for the client after what waits for it, and
    /// writes what the socket takes now: the session is ending, and a
    /// client that does not read loses it.
    fn tell_client(&mut self, message: &[u8]) {
        let pending = &mut self.relay.pending.to_client;
        pending.extend_from_slice(message);
        let client = &*self.session.handle.client;
        let _ = write_some(pending, &mut self.client_ready, |b| (&*client).write(b));
    }

    /// What the client still has to be told before an `end` is written
    /// to it by the session's close, and whether it was: a client that
    /// does not read is not told, rather than told in the middle of a
    /// message.
    pub fn settle_end(&mut self, end: End) -> End {
        let client = &*self.session.handle.client;
        let pending = &mut self.relay.pending.to_client;
        let _ = write_some(pending, &mut self.client_ready, |b| (&*client).write(b));
        match end {
            End::ClientProtocol(msg) if !pending.is_empty() => End::Error(msg),
            other => other,
        }
    }

    /// Writes what each side may take of what waits for it.
    fn flush(&mut self) -> Result<bool, End> {
        let handle = &self.session.handle;
        let pending = &mut self.relay.pending;
        let to_server = write_some(&mut pending.to_server, &mut self.server_ready, |b| {
            handle.server.write(b)
        })
        .map_err(|e| End::Error(format!("upstream write: {e}")))?;
        let to_client = write_some(&mut pending.to_client, &mut self.client_ready, |b| {
            (&*handle.client).write(b)
        })
        .map_err(|e| End::Error(format!("client write: {e}")))?;
        Ok(to_server || to_client)
    }

    /// Reads the server once and routes what it sent, as the server-side
    /// relay thread does.
    fn server_step(&mut self) -> Step {
        if self.held.is_some() {
            if !self.decided {
                return Step::Stuck;
            }
            return self.release_held();
        }
        // What was routed goes out before more is read.
        if !self.relay.pending.to_client.is_empty()
            || !self.to_client_queued.is_empty()
            || !self.server_ready.read
        {
            return Step::Stuck;
        }
        match read_ready(&mut self.relay.server, &mut self.server_ready) {
            Got::Bytes => {}
            Got::Nothing => return Step::Stuck,
            Got::Again => return Step::Moved,
            Got::End => return Step::Ended(self.server_gone(None)),
            Got::Failed(e) => return Step::Ended(self.server_gone(Some(e))),
        }
        if stream_into(&mut self.relay.server, &mut self.relay.pending.to_client) {
            return Step::Moved;
        }
        self.route_server()
    }

    /// The server closed (`error`: or its socket failed).
    fn server_gone(&mut self, error: Option<std::io::Error>) -> End {
        if let Some(end) = self.stopped() {
            return end;
        }
        let fatal =
            |msg: &str| error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, msg, None);
        match error {
            None if self.session.handle.client_left() => End::ClientClosed,
            None => {
                if !self.relay.server_said_fatal {
                    self.tell_client(&fatal(
                        "resumeguard: the upstream server closed the connection unexpectedly",
                    ));
                }
                End::ServerClosed
            }
            Some(e) => {
                metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "kind" => "lost").increment(1);
                let msg = format!("resumeguard: lost the upstream connection: {e}");
                self.tell_client(&fatal(&msg));
                End::Error(msg)
            }
        }
    }

    /// Frames, tracks and routes the server's buffered messages, up to a
    /// held one.
    fn route_server(&mut self) -> Step {
        let Relayed {
            proxy,
            handle,
            keys,
            ..
        } = &self.session;
        let relay = &mut self.relay;
        let outcome = match handle.state.lock() {
            Ok(mut st) => {
                let tracked = track_server(
                    proxy,
                    st.as_mut(),
                    keys,
                    (relay.server.buffered_mut(), &mut relay.pending.to_client),
                    true,
                );
                st.flush();
                tracked
            }
            Err(_) => return Step::Ended(End::Error("session state poisoned".into())),
        };
        match outcome {
            Ok(tracked) => {
                relay.server_said_fatal |= tracked.fatal;
                relay.server.stream_on(tracked.passing);
                if let Some(held) = tracked.held {
                    self.to_decide = Some(HeldTicket(Arc::clone(&held.ticket.0)));
                    self.held = Some(held);
                    self.decided = false;
                }
                relay.server.shrink_if_drained();
                // What was routed goes out now, as the client side's does,
                // not a round later.
                let client = &*handle.client;
                let wrote = write_some(&mut relay.pending.to_client, &mut self.client_ready, |b| {
                    (&*client).write(b)
                });
                match wrote {
                    Ok(_) => Step::Moved,
                    Err(e) => Step::Ended(End::Error(format!("client write: {e}"))),
                }
            }
            Err(lost) => {
                // What this batch routed is dropped, as on threads: the
                // client hears why after what it had before.
                let msg = lost.to_string();
                tracing::error!(error = %shown(&msg), "closing session");
                relay.pending.to_client.clear();
                let message = format!("resumeguard: {msg}");
                self.tell_client(&error_response(
                    Severity::Fatal,
                    sqlstate::INTERNAL_ERROR,
                    &message,
                    None,
                ));
                Step::Ended(End::Error(msg))
            }
        }
    }

    /// Lets the decided held message through (or what the guard put in
    /// its place), then routes what came after it.
    fn release_held(&mut self) -> Step {
        let Some(held) = self.held.take() else {
            return Step::Stuck;
        };
        self.decided = false;
        let refusal = match self.session.handle.state.lock() {
            Ok(mut st) => {
                let refusal = st.release();
                st.flush();
                refusal
            }
            Err(_) => return Step::Ended(End::Error("session state poisoned".into())),
        };
        let to_client = &mut self.relay.pending.to_client;
        match refusal {
            Some(error) => to_client.extend_from_slice(&error),
            None => to_client.extend_from_slice(held.replace.as_deref().unwrap_or(&held.frame)),
        }
        self.route_server()
    }

    /// Reads the client once (unless what it holds waits to be offered)
    /// and forwards what it sent, as the client-side relay thread does.
    fn client_step(&mut self) -> Step {
        if self.awaiting {
            let settled = self
                .session
                .handle
                .state
                .lock()
                .map(|st| st.settled())
                .unwrap_or(true);
            if !settled {
                return Step::Stuck;
            }
            self.awaiting = false;
            self.relay.read_client = false;
        }
        // What was forwarded goes out before more is read; nothing is
        // offered while a server message waits for its decision.
        if !self.relay.pending.to_server.is_empty()
            || !self.to_server_queued.is_empty()
            || self.held.is_some()
            || self.client_done
        {
            return Step::Stuck;
        }
        let mut read = false;
        if self.relay.read_client {
            if !self.client_ready.read {
                return Step::Stuck;
            }
            match read_ready(&mut self.relay.client, &mut self.client_ready) {
                Got::Bytes => {}
                Got::Nothing => return Step::Stuck,
                Got::Again => return Step::Moved,
                Got::End => {
                    // Passed on as PostgreSQL's own client would end; the
                    // server's answers still come back until it closes.
                    self.client_done = true;
                    self.session.handle.client_finished();
                    return Step::Moved;
                }
                Got::Failed(e) => return Step::Ended(End::Error(format!("client read: {e}"))),
            }
            read = true;
        }
        self.relay.read_client = true;
        if stream_into(&mut self.relay.client, &mut self.relay.pending.to_server) {
            return Step::Moved;
        }
        self.route_client(read)
    }

    /// Frames, tracks and forwards the client's buffered messages.
    fn route_client(&mut self, read: bool) -> Step {
        let Relayed { proxy, handle, .. } = &self.session;
        let relay = &mut self.relay;
        let tracked = match handle.state.lock() {
            // Shutting down and nothing in flight: close instead of
            // starting new work (checked under the lock the drain uses).
            Ok(st) if proxy.sessions.draining() && closable(st.as_ref()) => None,
            Ok(mut st) => {
                self.started |= st.started();
                let max = if self.started {
                    proxy.config.max_message_bytes
                } else {
                    MAX_PRE_AUTH_MESSAGE
                };
                let limits = Limits {
                    max,
                    upstream_tls: false,
                    on_loop: true,
                };
                Some(track_client(
                    st.as_mut(),
                    relay.client.buffered(),
                    &mut self.rewritten,
                    limits,
                ))
            }
            Err(_) => return Step::Ended(End::Error("session state poisoned".into())),
        };
        let Some(tracked) = tracked else {
            return Step::Ended(self.close_for_shutdown());
        };
        let Relayed { handle, .. } = &self.session;
        let relay = &mut self.relay;
        if tracked.terminated {
            // Before the server sees it, so its close is never news.
            handle.client_terminated.store(true, Ordering::Release);
        }
        let sent = if self.rewritten.is_empty() {
            send(
                &mut relay.pending.to_server,
                &mut self.server_ready,
                &relay.client.buffered()[..tracked.ready],
                |b| handle.server.write(b),
            )
        } else {
            let sent = send(
                &mut relay.pending.to_server,
                &mut self.server_ready,
                &self.rewritten,
                |b| handle.server.write(b),
            );
            self.rewritten.clear();
            sent
        };
        if let Err(e) = sent {
            return Step::Ended(End::Error(format!("upstream write: {e}")));
        }
        relay.client.consume(tracked.ready);
        match tracked.refused {
            Some(Refused::Invalid(reason)) => {
                return Step::Ended(End::ClientProtocol(format!(
                    "resumeguard: invalid client message: {reason}"
                )))
            }
            Some(Refused::ChannelBinding(refusal)) => {
                return Step::Ended(End::ClientRefused(refusal))
            }
            None => {}
        }
        relay.client.stream_on(tracked.passing);
        relay.client.shrink_if_drained();
        if tracked.may_block {
            relay.read_client = false;
            return Step::ToThreads;
        }
        if tracked.awaiting {
            self.awaiting = true;
            relay.read_client = false;
            return Step::Moved;
        }
        if read || tracked.ready > 0 {
            Step::Moved
        } else {
            Step::Stuck
        }
    }

    /// The session, to relay on threads from where the loop left it.
    pub fn into_threads(self) -> (Relayed, Relay) {
        (self.session, self.relay)
    }
}

/// What one non-blocking read of a side brought.
enum Got {
    Bytes,
    /// Nothing waits (the side's readiness is cleared).
    Nothing,
    /// A signal came first: read again.
    Again,
    /// The peer's end.
    End,
    Failed(std::io::Error),
}

/// Reads `conn` once, keeping its readiness (`ready`) as the read found it.
fn read_ready<S>(conn: &mut Connection<S>, ready: &mut Ready) -> Got
where
    S: Deref,
    for<'a> &'a S::Target: Read,
{
    match conn.read() {
        Ok(0) => Got::End,
        Ok(_) => {
            if !conn.read_filled() {
                ready.read_short();
            }
            Got::Bytes
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            ready.read = false;
            Got::Nothing
        }
        Err(e) if e.kind() == ErrorKind::Interrupted => Got::Again,
        Err(e) => Got::Failed(e),
    }
}

/// Moves what `conn` holds of a message streaming past the guard into
/// `pending` (unless it is dropped): true while more of it is to come.
fn stream_into<S>(conn: &mut Connection<S>, pending: &mut BytesMut) -> bool
where
    S: Deref,
    for<'a> &'a S::Target: Read,
{
    let streaming = conn.pass_streaming(|chunk| {
        pending.extend_from_slice(chunk);
        Ok(())
    });
    matches!(streaming, Ok(true))
}

/// Writes `bytes` now as far as the socket takes them, keeping the rest
/// in `pending` (after what already waits there).
fn send(
    pending: &mut BytesMut,
    ready: &mut Ready,
    mut bytes: &[u8],
    mut write: impl FnMut(&[u8]) -> std::io::Result<usize>,
) -> std::io::Result<()> {
    if pending.is_empty() && ready.write {
        while !bytes.is_empty() {
            match write(bytes) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    ready.write = false;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    pending.extend_from_slice(bytes);
    Ok(())
}

/// Writes what the socket takes of `pending`: whether any of it went.
fn write_some(
    pending: &mut BytesMut,
    ready: &mut Ready,
    mut write: impl FnMut(&[u8]) -> std::io::Result<usize>,
) -> std::io::Result<bool> {
    let mut wrote = false;
    while !pending.is_empty() && ready.write {
        match write(pending) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes::Buf::advance(pending, n);
                wrote = true;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => ready.write = false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if pending.is_empty() && pending.capacity() > SHRINK_ABOVE {
        *pending = BytesMut::new();
    }
    Ok(wrote)
}

#[cfg(test)]
mod tests;
