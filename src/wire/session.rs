//! One client connection: the startup handshake, then the relay of its
//! messages, client→server and server→client, sharing the session's
//! protocol state.
//!
//! Where it relays: a session without TLS goes to an event loop (each
//! serving many sessions; see `event_loop.rs`), which wakes
//! once for whatever is ready on any of them, where a thread per
//! direction wakes for every message (docs/performance.md, "Where the CPU
//! goes"). A session moves from its loop to threads of its own before its
//! guard may block (a call to the claim store: see
//! [`super::guard::Guard::may_block`]), and a TLS session relays on
//! threads from the start: two, one per direction, blocking in reads.
//! The state lock is never held across a read or a write.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;

use super::client_relay::client_to_server;
use super::client_stream::ClientStream;
use super::connection::Connection;
use super::first_packet::{read_first_packet, NotOpened, Opened};
use super::guard::SessionInfo;
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::messages::startup::{FirstPacket, StartupMessage};
use super::proxy::Proxy;
use super::registry::{LiveGuard, Registered, SessionHandle, SessionSummary, StopReason};
use super::sasl_plus;
use super::server_relay::server_to_client;
use super::session_end::End;
use super::unsupported_protocol::answer_unsupported;
use super::upstream::Upstream;
use crate::log_text::shown;

/// Stack of each relay thread: the deepest paths are sqlparser's recursive
/// descent (its own depth limit applies) and SQLite; only touched pages
/// count as resident.
pub const THREAD_STACK: usize = 1024 * 1024;

/// Serves one accepted client connection: its start on the calling thread,
/// then its relay on an event loop, or on this thread and one more (see
/// [`relay_session`]). `live` counts the session until it ends.
pub fn serve_client(
    proxy: Arc<Proxy>,
    client: TcpStream,
    peer: SocketAddr,
    inspection: bool,
    live: LiveGuard,
) {
    let _ = client.set_nodelay(true);
    proxy.config.keepalive.apply(&client, "client");
    let deadline = Instant::now() + proxy.config.startup_timeout;
    let tls = proxy.config.client_tls.as_ref();
    let Opened {
        client,
        first,
        early,
    } = match read_first_packet(client, tls, deadline) {
        Ok(opened) => opened,
        Err(NotOpened::Left) => return,
        Err(NotOpened::Unreadable(client, why)) => {
            // PostgreSQL's COMMERROR: a line in the log, not a word to the
            // client (node-postgres ending before its StartupMessage went
            // out sees a quiet close, not an error).
            tracing::info!(%peer, error = %why, "closed connection start without a word");
            client.close_notify();
            return;
        }
        Err(NotOpened::Refused(client, refusal)) => {
            tracing::info!(%peer, error = %refusal.message, "refused connection start");
            let err = error_response(Severity::Fatal, refusal.sqlstate, &refusal.message, None);
            let _ = (&client).write_all(&err);
            client.close_notify();
            return;
        }
    };
    match first {
        FirstPacket::Cancel { pid, key } => {
            proxy.forward_cancel(pid, key);
            client.close_notify();
        }
        FirstPacket::Unsupported(startup) => {
            answer_unsupported(&proxy, &client, &startup, deadline);
            client.close_notify();
        }
        FirstPacket::Startup(_) if proxy.sessions.live() > proxy.config.max_client_conn => {
            // PgBouncer's max_client_conn: threads and the server's connection
            // slots are finite; say so at the start instead of failing later.
            // (This thread counts itself; cancel requests still pass.)
            let limit = proxy.config.max_client_conn;
            tracing::warn!(%peer, limit, "max_client_conn reached: connection refused");
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED, "reason" => "max_client_conn")
                .increment(1);
            let msg =
                format!("resumeguard: too many client connections (max_client_conn = {limit})");
            let err = error_response(Severity::Fatal, sqlstate::TOO_MANY_CONNECTIONS, &msg, None);
            let _ = (&client).write_all(&err);
            client.close_notify();
        }
        FirstPacket::Startup(startup) => {
            if let Some(refusal) = proxy.guards.refuse_startup(&startup.params) {
                tracing::warn!(%peer, error = %shown(&refusal.message), detail = %shown(&refusal.detail), "refused connection start");
                let err = error_response(
                    Severity::Fatal,
                    refusal.sqlstate,
                    &format!("{}: {}", refusal.message, refusal.detail),
                    None,
                );
                let _ = (&client).write_all(&err);
                client.close_notify();
                return;
            }
            let start = Start {
                startup,
                early,
                deadline,
                inspection,
            };
            run_session(proxy, client, peer, start, live)
        }
        // read_first_packet answers negotiation requests itself.
        FirstPacket::SslRequest | FirstPacket::GssEncRequest => {}
    }
}

/// What a session starts from: the client's StartupMessage, the bytes it
/// sent right after it, and when authentication must be over.
struct Start {
    startup: StartupMessage,
    early: BytesMut,
    deadline: Instant,
    inspection: bool,
}

fn run_session(
    proxy: Arc<Proxy>,
    client: ClientStream,
    peer: SocketAddr,
    start: Start,
    live: LiveGuard,
) {
    let (startup, inspection) = (&start.startup, start.inspection);
    let session_id = proxy.next_session_id.fetch_add(1, Ordering::Relaxed);
    let info = SessionInfo {
        session_id,
        client_addr: peer.to_string(),
        user: startup.user().to_owned(),
        database: startup.database().to_owned(),
        application_name: startup.param("application_name").unwrap_or("").to_owned(),
        inspection_listener: inspection,
    };
    // Names from the StartupMessage are the client's: escaped and cut.
    let span = tracing::info_span!("session", id = session_id, %peer, user = %shown(&info.user), db = %shown(&info.database));
    let _entered = span.enter();
    tracing::info!(app = %shown(&info.application_name), inspection, "login");
    relay_session(proxy, client, start, info, &span, live);
}

/// The session proper, inside its tracing span: the upstream connection
/// and the StartupMessage, then the relay, on an event loop when one
/// serves it (see [`super::event_loop`]), else on threads of its own.
fn relay_session(
    proxy: Arc<Proxy>,
    client: ClientStream,
    start: Start,
    info: SessionInfo,
    span: &tracing::Span,
    live: LiveGuard,
) {
    let session_id = info.session_id;
    let opened = Instant::now();
    let client = Arc::new(client);
    let server = match proxy.connect_upstream() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "kind" => "connect").increment(1);
            tracing::warn!(error = %e, "upstream unreachable");
            let msg = format!("resumeguard: cannot reach the upstream server: {e}");
            let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
            let _ = (&*client).write_all(&err);
            return;
        }
    };
    if let Err(e) = server.write_all(&start.startup.raw) {
        metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "kind" => "connect").increment(1);
        let msg = format!("resumeguard: upstream failed during startup: {e}");
        let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
        let _ = (&*client).write_all(&err);
        return;
    }

    let summary = SessionSummary::of(&info);
    let state = Arc::new(Mutex::new(proxy.guards.guard(info)));
    let handle = Arc::new(SessionHandle::new(
        Arc::clone(&client),
        Arc::clone(&server),
        Arc::clone(&state),
    ));
    let _ = handle.summary.set(summary);
    let registered = proxy.sessions.register(session_id, Arc::clone(&handle));
    let relay = Relay {
        client: Connection::new(Arc::clone(&client), &start.early),
        read_client: start.early.is_empty(),
        server: Connection::new(Arc::clone(&server), &[]),
        server_said_fatal: false,
        pending: Pending::default(),
    };
    let session = Relayed {
        id: session_id,
        proxy: Arc::clone(&proxy),
        handle,
        span: span.clone(),
        opened,
        deadline: start.deadline,
        keys: Mutex::new(Vec::new()),
        _registered: registered,
        _live: live,
    };
    let (session, relay) = match proxy.event_loops() {
        Some(loops) => match loops.adopt(session, relay) {
            Ok(()) => {
                metrics::counter!(crate::metrics::RELAYED_SESSIONS, "relay" => "event_loop")
                    .increment(1);
                return;
            }
            Err(back) => *back,
        },
        None => (session, relay),
    };
    metrics::counter!(crate::metrics::RELAYED_SESSIONS, "relay" => "threads").increment(1);
    session.on_threads(relay);
}

/// A session past its startup packet, wherever it relays: what ends it
/// needs, and what keeps it counted and reachable until then.
pub(super) struct Relayed {
    pub id: u64,
    pub proxy: Arc<Proxy>,
    pub handle: Arc<SessionHandle>,
    pub span: tracing::Span,
    pub opened: Instant,
    /// When authentication must be over.
    pub deadline: Instant,
    /// The BackendKeyData the server sent, for cancel requests.
    pub keys: Mutex<Vec<(i32, Vec<u8>)>>,
    _registered: Registered,
    _live: LiveGuard,
}

/// Where a session's relay stands: both sides' read state and what is
/// still to be written to each.
pub(super) struct Relay {
    pub client: Connection<Arc<ClientStream>>,
    /// Read the client before offering what `client` holds.
    pub read_client: bool,
    pub server: Connection<Arc<Upstream>>,
    /// The server sent a FATAL error: it closes next.
    pub server_said_fatal: bool,
    pub pending: Pending,
}

/// Bytes routed and not yet written.
#[derive(Default)]
pub(super) struct Pending {
    pub to_server: BytesMut,
    pub to_client: BytesMut,
}

impl Relayed {
    /// Relays on two threads, this one (server → client) and one more
    /// (client → server), until the session ends.
    pub(super) fn on_threads(self, relay: Relay) {
        let Relay {
            client,
            read_client,
            server,
            server_said_fatal,
            pending,
        } = relay;
        let handle = &self.handle;
        if let Err(e) = (&*handle.client).write_all(&pending.to_client) {
            return self.finish(End::Error(format!("client write: {e}")));
        }
        if let Err(e) = handle.server.write_all(&pending.to_server) {
            return self.finish(End::Error(format!("upstream write: {e}")));
        }
        let up = {
            let (proxy, handle, span) = (
                Arc::clone(&self.proxy),
                Arc::clone(&self.handle),
                self.span.clone(),
            );
            let deadline = self.deadline;
            std::thread::Builder::new()
                .name("rg-client".into())
                .stack_size(THREAD_STACK)
                .spawn(move || {
                    let _entered = span.enter();
                    client_to_server(&proxy, &handle, client, read_client, deadline)
                })
        };
        let up = match up {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the session's client thread");
                let msg = format!("resumeguard: out of resources for a new session: {e}");
                let err =
                    error_response(Severity::Fatal, sqlstate::TOO_MANY_CONNECTIONS, &msg, None);
                let _ = (&*handle.client).write_all(&err);
                handle.server.shutdown(Shutdown::Both);
                return;
            }
        };
        let down = server_to_client(&self.proxy, handle, &self.keys, server, server_said_fatal);
        // Whichever direction ended first, the other must end too.
        handle.stop(StopReason::Quiet);
        handle.release_client_reader();
        let up = up
            .join()
            .unwrap_or_else(|_| End::Error("client thread panicked".into()));
        let end = match down {
            End::Quiet => up,
            other => other,
        };
        self.finish(end);
    }

    /// Ends the session once nothing relays it any more: tells the client
    /// what it must know, forgets its cancel keys, closes its guard and
    /// logs why it ended.
    pub(super) fn finish(self, end: End) {
        let handle = &self.handle;
        handle.stop(StopReason::Quiet);
        let client = &*handle.client;
        if let End::ClientProtocol(msg) = &end {
            // The server side is done, so the client is free to hear why.
            tracing::warn!(error = %shown(msg), "closing session");
            let err = error_response(Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, msg, None);
            let _ = (&*client).write_all(&err);
        }
        if let End::ClientRefused(refusal) = &end {
            tracing::info!(error = %refusal.message, "refused channel binding");
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED, "reason" => "channel_binding")
                .increment(1);
            let err = error_response(
                Severity::Fatal,
                sqlstate::REJECTED_CONNECTION,
                &refusal.message,
                Some(sasl_plus::BINDING_HINT),
            );
            let _ = (&*client).write_all(&err);
        }
        // The relay is done: nothing else writes to the client now.
        client.close_notify();
        for (pid, key) in self.keys.into_inner().unwrap_or_default() {
            self.proxy.cancel_keys.remove(&(pid, key));
        }
        if let Ok(mut st) = handle.state.lock() {
            if st.started() && matches!(end, End::ServerClosed) {
                metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "kind" => "lost").increment(1);
            }
            st.closed();
            st.flush();
        }
        let age_ms = self.opened.elapsed().as_millis() as u64;
        match end {
            End::Error(e) | End::ClientProtocol(e) => {
                tracing::info!(error = %e, age_ms, "session closed")
            }
            End::ClientRefused(_) => {
                tracing::info!(age_ms, "session closed: channel binding refused")
            }
            End::ClientClosed | End::ServerClosed | End::Shutdown | End::Quiet => {
                tracing::info!(reason = ?end, age_ms, "session closed")
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
