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
//! [`super::guard::ClientStep::Blocks`]), and a TLS session relays on
//! threads from the start: two, one per direction, blocking in reads.
//! The state lock is never held across a read or a write.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;

use super::backend_keys::BackendKeys;
use super::client_stream::ClientStream;
use super::connection::Connection;
use super::event_loop::EventLoops;
use super::first_packet::{read_first_packet, NotOpened, Opened};
use super::guard::SessionInfo;
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::messages::startup::{FirstPacket, StartupMessage};
use super::proxy::Proxy;
use super::registry::{LiveGuard, SessionHandle, SessionSummary};
use super::relayed::{Pending, Relay, Relayed};
use super::unsupported_protocol::answer_unsupported;
use crate::log_text::shown;

/// Serves one accepted client connection: its start on the calling thread,
/// then its relay on an event loop, or on this thread and one more (see
/// [`relay_session`]). `live` counts the session until it ends.
pub fn serve_client(
    proxy: Arc<Proxy>,
    loops: Option<Arc<EventLoops>>,
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
            run_session(proxy, loops, client, (peer, start), live)
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
    loops: Option<Arc<EventLoops>>,
    client: ClientStream,
    (peer, start): (SocketAddr, Start),
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
    relay_session(proxy, loops.as_deref(), client, (start, info), &span, live);
}

/// The session proper, inside its tracing span: the upstream connection
/// and the StartupMessage, then the relay, on an event loop when one
/// serves it (see [`super::event_loop`]), else on threads of its own.
fn relay_session(
    proxy: Arc<Proxy>,
    loops: Option<&EventLoops>,
    client: ClientStream,
    (start, info): (Start, SessionInfo),
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
        keys: BackendKeys::default(),
        _registered: registered,
        _live: live,
    };
    let (session, relay) = match loops {
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

#[cfg(test)]
pub(super) mod tests;
