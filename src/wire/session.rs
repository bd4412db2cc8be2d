//! One client connection: the startup handshake, then two relay loops,
//! client→server and server→client, each on a thread of its own, sharing
//! the session's protocol state.
//!
//! Blocking threads: a thread blocked in `recv` is woken by the kernel
//! straight onto whichever core is free, where one event loop serializes
//! every session on one core. One loop per core owning its sessions wakes
//! less often and costs less per transaction (docs/performance.md, "Where
//! the CPU goes"); the session's blocking steps (a claim's store call,
//! waiting for answers, the startup deadline) are written for threads.
//! The state lock is never held across a read or a write.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;

use super::client_relay::client_to_server;
use super::client_stream::ClientStream;
use super::first_packet::{read_first_packet, NotOpened, Opened};
use super::guard::SessionInfo;
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::messages::startup::{FirstPacket, StartupMessage};
use super::proxy::Proxy;
use super::registry::{SessionHandle, SessionSummary, StopReason};
use super::sasl_plus;
use super::server_relay::server_to_client;
use super::session_end::End;
use super::unsupported_protocol::answer_unsupported;
use crate::log_text::shown;

/// Stack of each relay thread: the deepest paths are sqlparser's recursive
/// descent (its own depth limit applies) and SQLite; only touched pages
/// count as resident.
pub const THREAD_STACK: usize = 1024 * 1024;

/// Serves one accepted client connection to completion, on the calling
/// thread (plus one more for the client→server direction).
pub fn serve_client(proxy: Arc<Proxy>, client: TcpStream, peer: SocketAddr, inspection: bool) {
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
            run_session(proxy, client, peer, start)
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

fn run_session(proxy: Arc<Proxy>, client: ClientStream, peer: SocketAddr, start: Start) {
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
    relay_session(proxy, client, start, info, &span);
}

/// The session proper, inside its tracing span.
fn relay_session(
    proxy: Arc<Proxy>,
    client: ClientStream,
    start: Start,
    info: SessionInfo,
    span: &tracing::Span,
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
    let keys = Mutex::new(Vec::new());

    let up = {
        let (proxy, handle, span) = (Arc::clone(&proxy), Arc::clone(&handle), span.clone());
        let (early, deadline) = (start.early, start.deadline);
        std::thread::Builder::new()
            .name("rg-client".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let _entered = span.enter();
                client_to_server(&proxy, &handle, early, deadline)
            })
    };
    let up = match up {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the session's client thread");
            let msg = format!("resumeguard: out of resources for a new session: {e}");
            let err = error_response(Severity::Fatal, sqlstate::TOO_MANY_CONNECTIONS, &msg, None);
            let _ = (&*client).write_all(&err);
            server.shutdown(Shutdown::Both);
            return;
        }
    };
    let down = server_to_client(&proxy, &handle, &keys);
    // Whichever direction ended first, the other must end too.
    handle.stop(StopReason::Quiet);
    handle.release_client_reader();
    let up = up
        .join()
        .unwrap_or_else(|_| End::Error("client thread panicked".into()));
    drop(registered);
    let end = match down {
        End::Quiet => up,
        other => other,
    };
    if let End::ClientProtocol(msg) = &end {
        // The server loop is done, so the client is free to hear why.
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
    // Both relay loops are done: nothing else writes to the client now.
    client.close_notify();
    for (pid, key) in keys.into_inner().unwrap_or_default() {
        proxy.cancel_keys.remove(&(pid, key));
    }
    if let Ok(mut st) = state.lock() {
        if st.started() && matches!(end, End::ServerClosed) {
            metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "kind" => "lost").increment(1);
        }
        st.closed();
        st.flush();
    }
    let age_ms = opened.elapsed().as_millis() as u64;
    match end {
        End::Error(e) | End::ClientProtocol(e) => {
            tracing::info!(error = %e, age_ms, "session closed")
        }
        End::ClientRefused(_) => tracing::info!(age_ms, "session closed: channel binding refused"),
        End::ClientClosed | End::ServerClosed | End::Shutdown | End::Quiet => {
            tracing::info!(reason = ?end, age_ms, "session closed")
        }
    }
}

#[cfg(test)]
mod tests;
