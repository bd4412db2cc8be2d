//! The seam between the relay and whatever watches the traffic: the relay
//! frames messages and hands them to a session's [`Guard`], then does what
//! it is told (forward, replace, hold, wait). It knows nothing of what the
//! guard enforces.

use std::sync::Arc;

use bytes::Bytes;

use super::refusal::Refusal;
use super::response_queue::{Desync, Route};

/// What the relay does with one client message.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientStep {
    /// Forward the message as it is.
    Forward,
    /// The server gets these bytes instead of the message.
    Replace(Vec<u8>),
    /// The server gets these bytes of the proxy's own first; nothing of
    /// the message was tracked, and the relay offers it again.
    Inject(Vec<u8>),
    /// The message names a statement or portal whose state depends on
    /// answers the server still owes for an earlier Sync: send what came
    /// before it, wait until the guard is settled, then offer it again.
    AwaitServer,
    /// Tracking the message may block the calling thread (a call to a
    /// store), and the relay serves many sessions on it: nothing was
    /// tracked. The relay moves the session to threads of its own and
    /// offers the message again there.
    Blocks,
}

/// A client message the proxy cannot let through; the session ends with
/// a protocol violation.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(pub String);

/// What the relay does with one server message.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ServerStep {
    pub route: Route,
    /// The message is a FATAL error: the server closes next.
    pub fatal: bool,
    /// What few messages ask for besides, boxed: the step of every other
    /// message stays two words wide, moved and dropped cheaply.
    pub rare: Option<Box<RareStep>>,
}

/// The parts of a [`ServerStep`] that few messages have.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RareStep {
    /// Bytes the client gets in place of this message.
    pub replace: Option<Bytes>,
    /// Those bytes are an error that answers the whole statement: nothing
    /// more of its answer reaches the client.
    pub answers: bool,
    /// BackendKeyData seen: (pid, key) for cancel routing.
    pub backend_key: Option<(i32, Vec<u8>)>,
    /// Hold this message (and everything after it) until the ticket is
    /// decided; see [`Guard::release`].
    pub hold: Option<HeldTicket>,
}

impl ServerStep {
    fn rare_mut(&mut self) -> &mut RareStep {
        self.rare.get_or_insert_with(Box::default)
    }

    /// The client gets `bytes` in place of this message (nothing changes
    /// when there are none).
    pub fn set_replace(&mut self, bytes: Option<Bytes>) {
        if bytes.is_some() {
            self.rare_mut().replace = bytes;
        }
    }

    /// The client gets the error `error` in place of this message, and
    /// nothing more of its statement's answer.
    pub fn set_answer(&mut self, error: Bytes) {
        let rare = self.rare_mut();
        rare.replace = Some(error);
        rare.answers = true;
    }

    /// The error that answers this message's statement, if the proxy
    /// answered it (see [`ServerStep::set_answer`]).
    pub fn answer(&self) -> Option<&Bytes> {
        let rare = self.rare.as_ref().filter(|r| r.answers)?;
        rare.replace.as_ref()
    }

    pub fn set_backend_key(&mut self, pid: i32, key: Vec<u8>) {
        self.rare_mut().backend_key = Some((pid, key));
    }

    pub fn set_hold(&mut self, ticket: HeldTicket) {
        self.rare_mut().hold = Some(ticket);
    }

    pub fn hold(&self) -> Option<&HeldTicket> {
        self.rare.as_ref()?.hold.as_ref()
    }

    pub fn backend_key(&self) -> Option<&(i32, Vec<u8>)> {
        self.rare.as_ref()?.backend_key.as_ref()
    }
}

/// A decision the guard takes outside the session's lock, because it may
/// block (a claim in a shared store, waiting for another holder). The
/// guard keeps the ticket too, and reads the decision from it when the
/// relay calls [`Guard::release`].
pub trait Ticket: Send + Sync + std::fmt::Debug {
    /// Decides; may block the calling relay thread (only it). `ends`
    /// tells, without reading, whether the wait must end undecided now.
    fn decide(&self, ends: &dyn Fn() -> Option<WaitEnd>);
}

/// Why a session's wait for a decision ends before the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The server ended the session.
    ServerClosed,
    /// The client sent a CancelRequest with the session's backend key.
    Canceled,
}

/// The relay's share of a ticket; compares by identity only, so steps
/// stay comparable.
#[derive(Debug)]
pub struct HeldTicket(pub Arc<dyn Ticket>);

impl PartialEq for HeldTicket {
    fn eq(&self, _: &Self) -> bool {
        false
    }
}
impl Eq for HeldTicket {}

/// One session's watcher, driven by the relay under the session's lock.
pub trait Guard: Send {
    /// `on_loop`: the relay serves many sessions on the calling thread, so
    /// a message whose tracking may block it is answered
    /// [`ClientStep::Blocks`] rather than tracked.
    fn on_client(&mut self, frame: &[u8], on_loop: bool) -> Result<ClientStep, ClientError>;
    fn on_server(&mut self, frame: &[u8]) -> Result<ServerStep, Desync>;
    /// Whether a client message too large to buffer cheaply may stream:
    /// `prefix` is its header and the body bytes read so far. True means
    /// the guard needs no more of it: [`Guard::on_client`] is then called
    /// with `prefix` alone, and the rest of the body goes to the server as
    /// it arrives (or is dropped, when the step replaced the message).
    /// False buffers more; the relay asks again after the next read, and
    /// a message never allowed to stream is offered whole.
    fn client_streams(&mut self, prefix: &[u8]) -> bool;
    /// The route of a server message with this type byte when it is a
    /// row (DataRow or CopyData) of an answer nobody watches: such a
    /// message changes nothing the guard follows, so the relay routes it
    /// without [`Guard::on_server`], and one too large to buffer cheaply
    /// streams (what of it has arrived goes on, the rest as it arrives).
    /// `None`: the message goes through [`Guard::on_server`] whole.
    fn unwatched_row(&self, tag: u8) -> Option<Route>;
    /// Applies the decided ticket of the held message: `None` lets the
    /// message through, `Some` is what the client gets instead (the rest
    /// of that statement's answer is then swallowed).
    fn release(&mut self) -> Option<Bytes>;
    /// Nothing outstanding and no transaction open: the session can close
    /// without losing work.
    fn is_idle(&self) -> bool;
    /// Work the guard granted outlasts the exchanges in flight (a run the
    /// session was let start, not yet at its next durable write): a
    /// draining proxy keeps the session open while it is idle, until the
    /// work is done or the grace period ends.
    fn holds_work(&self) -> bool;
    /// No answer the guard follows (one that changes a statement or
    /// portal, or one it watches) is owed for a Sync the client sent
    /// before its latest one (behind a statement the guard may refuse in
    /// place of a row, none at all): a message that waited
    /// ([`ClientStep::AwaitServer`]) reads the same now.
    fn settled(&self) -> bool;
    /// The startup exchange (authentication included) is over.
    fn started(&self) -> bool;
    /// Hands what the guard recorded to its stores; never blocks.
    fn flush(&mut self);
    /// The client connection is gone.
    fn closed(&mut self);
}

/// Who a session is, for the guard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionInfo {
    pub session_id: u64,
    pub client_addr: String,
    pub user: String,
    pub database: String,
    pub application_name: String,
    /// The session came in on the inspection listener.
    pub inspection_listener: bool,
}

/// Makes one guard per session.
pub trait GuardFactory: Send + Sync {
    fn guard(&self, info: SessionInfo) -> Box<dyn Guard>;

    /// Why a session with these StartupMessage parameters may not start
    /// (told FATAL, before the upstream is reached), if it may not.
    fn refuse_startup(&self, _params: &[(String, String)]) -> Option<Refusal> {
        None
    }
}
