//! One client connection: the startup handshake, then two relay loops
//! (client→server, server→client) polled by one task, sharing the
//! session's protocol state.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tracing::Instrument;

use super::backend::{error_response, sqlstate, Severity};
use super::claims_gate::ClaimRequest;
use super::frame::peek_frame;
use super::proxy::Proxy;
use super::response_queue::{Expect, Route};
use super::session_state::SessionState;
use super::startup::{self, FirstPacket, StartupMessage};
use super::upstream::{UpRead, UpWrite};
use crate::audit::SessionContext;
use crate::claims::evidence::Evidence;

/// Read buffers start small (idle connections stay cheap) and grow with
/// the traffic; a buffer grown past this is replaced once drained.
const INITIAL_BUFFER: usize = 8 * 1024;
const SHRINK_ABOVE: usize = 1024 * 1024;

/// Why a session ended, for the log.
#[derive(Debug)]
enum End {
    ClientClosed,
    ServerClosed,
    Shutdown,
    /// The client broke the protocol; it is told why before the close.
    ClientProtocol(String),
    Error(String),
}

/// Serves one accepted client connection to completion.
pub async fn serve_client(
    proxy: Arc<Proxy>,
    mut client: TcpStream,
    peer: SocketAddr,
    inspection: bool,
) {
    let _ = client.set_nodelay(true);
    let first = match read_first_packet(&proxy, &mut client).await {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(msg) => {
            tracing::info!(%peer, error = %msg, "refused connection start");
            let err = error_response(Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, &msg, None);
            let _ = client.write_all(&err).await;
            return;
        }
    };
    match first {
        FirstPacket::Cancel { pid, key } => proxy.forward_cancel(pid, key).await,
        FirstPacket::Startup(startup) => {
            run_session(proxy, client, peer, startup, inspection).await
        }
        // read_first_packet answers negotiation requests itself.
        FirstPacket::SslRequest | FirstPacket::GssEncRequest => {}
    }
}

/// Reads the connection's first packet, answering SSL and GSSAPI
/// encryption requests with 'N' (no TLS yet) until a real one arrives.
async fn read_first_packet(
    proxy: &Proxy,
    client: &mut TcpStream,
) -> Result<Option<FirstPacket>, String> {
    let mut buf = BytesMut::with_capacity(512);
    loop {
        let len = loop {
            match startup::peek_len(&buf).map_err(|e| e.to_string())? {
                Some(len) => break len,
                None => {
                    let read = tokio::time::timeout(
                        proxy.config.startup_timeout,
                        client.read_buf(&mut buf),
                    )
                    .await;
                    match read {
                        Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                        Ok(Ok(_)) => {}
                        Err(_) => return Err("timed out waiting for the startup packet".into()),
                    }
                }
            }
        };
        let packet = buf.split_to(len);
        match startup::parse(&packet).map_err(|e| e.to_string())? {
            FirstPacket::SslRequest | FirstPacket::GssEncRequest => {
                if !buf.is_empty() {
                    // Bytes after an encryption request, before our answer:
                    // a client must wait for it (PgBouncer refuses this too).
                    return Err("received unencrypted data after an encryption request".into());
                }
                client.write_all(b"N").await.map_err(|e| e.to_string())?;
            }
            other => return Ok(Some(other)),
        }
    }
}

async fn run_session(
    proxy: Arc<Proxy>,
    client: TcpStream,
    peer: SocketAddr,
    startup: StartupMessage,
    inspection: bool,
) {
    let session_id = proxy.next_session_id.fetch_add(1, Ordering::Relaxed);
    let ctx = SessionContext {
        session_id,
        client_addr: peer.to_string(),
        user: startup.user().to_owned(),
        database: startup.database().to_owned(),
        application_name: startup.param("application_name").unwrap_or("").to_owned(),
    };
    let span = tracing::info_span!("session", id = session_id, %peer, user = %ctx.user, db = %ctx.database);
    relay_session(proxy, client, startup, inspection, ctx)
        .instrument(span)
        .await;
}

/// The session proper, inside its tracing span.
async fn relay_session(
    proxy: Arc<Proxy>,
    mut client: TcpStream,
    startup: StartupMessage,
    inspection: bool,
    ctx: SessionContext,
) {
    let session_id = ctx.session_id;

    let (server_rd, mut server_wr) = match proxy.connect_upstream().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "upstream unreachable");
            let msg = format!("resumeguard: cannot reach the upstream server: {e}");
            let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
            let _ = client.write_all(&err).await;
            return;
        }
    };
    if let Err(e) = server_wr.write_all(&startup.raw).await {
        let msg = format!("resumeguard: upstream failed during startup: {e}");
        let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
        let _ = client.write_all(&err).await;
        return;
    }

    let mut state = SessionState::new(Arc::clone(&proxy.classifier), proxy.legs.clone(), ctx);
    state.queue.push(Expect::Startup, Route::Forward, None);
    state.inspection_listener = inspection;
    let state = Mutex::new(state);
    let keys = Mutex::new(Vec::new());

    let (client_rd, mut client_wr) = client.into_split();
    let mut shutdown = proxy.shutdown.clone();
    let end = {
        let up = client_to_server(&proxy, &state, client_rd, server_wr);
        let down = server_to_client(
            &proxy,
            &state,
            &keys,
            server_rd,
            &mut client_wr,
            &mut shutdown,
        );
        tokio::select! {
            e = up => e,
            e = down => e,
        }
    };
    if let End::ClientProtocol(msg) = &end {
        // The down loop is gone, so the client's write half is free to
        // carry the reason before the connection closes.
        tracing::warn!(error = %msg, "closing session");
        let err = error_response(Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, msg, None);
        let _ = client_wr.write_all(&err).await;
    }
    for (pid, key) in keys.into_inner().unwrap_or_default() {
        proxy.cancel_keys.remove(&(pid, key));
    }
    // A holder that goes away mid-gate must not strand its thread.
    if let Some(sender) = proxy.legs.claims.as_ref().and_then(|l| l.evidence.as_ref()) {
        if let Ok(st) = state.lock() {
            sender.send(&st.ctx, Evidence::HolderGone { session_id });
        }
    }
    match end {
        End::Error(e) | End::ClientProtocol(e) => tracing::info!(error = %e, "session ended"),
        End::ClientClosed | End::ServerClosed | End::Shutdown => {
            tracing::debug!(?end, "session ended")
        }
    }
}

/// Client → server: frame, track, forward.
async fn client_to_server(
    proxy: &Proxy,
    state: &Mutex<SessionState>,
    mut client: OwnedReadHalf,
    mut server: UpWrite,
) -> End {
    let mut buf = BytesMut::with_capacity(INITIAL_BUFFER);
    let mut out = BytesMut::new();
    loop {
        match client.read_buf(&mut buf).await {
            Ok(0) => {
                let _ = server.shutdown().await;
                return End::ClientClosed;
            }
            Ok(_) => {}
            Err(e) => return End::Error(format!("client read: {e}")),
        }
        // Frame and track under the lock; no await while it is held.
        let (ready, refused) = match state.lock() {
            Ok(mut st) => track_client(&mut st, &buf, &mut out, proxy.config.max_message_bytes),
            Err(_) => return End::Error("session state poisoned".into()),
        };
        let sent = if out.is_empty() {
            // Nothing rewritten: forward the received bytes as they are.
            server.write_all(&buf[..ready]).await
        } else {
            let sent = server.write_all(&out).await;
            out.clear();
            sent
        };
        if let Err(e) = sent {
            return End::Error(format!("upstream write: {e}"));
        }
        let _ = buf.split_to(ready);
        if let Some(reason) = refused {
            return End::ClientProtocol(format!("resumeguard: invalid client message: {reason}"));
        }
        if buf.is_empty() && buf.capacity() > SHRINK_ABOVE {
            buf = BytesMut::with_capacity(INITIAL_BUFFER);
        }
    }
}

/// Frames and tracks the complete client messages at the front of `buf`:
/// how many bytes were consumed, and why the next message is refused.
/// When the state rewrites a message, `out` receives everything consumed
/// (rewritten where needed); otherwise it stays empty and the consumed
/// bytes are forwarded unchanged.
fn track_client(
    st: &mut SessionState,
    buf: &[u8],
    out: &mut BytesMut,
    max: usize,
) -> (usize, Option<String>) {
    let mut ready = 0;
    let mut copied = 0;
    let refused = loop {
        match peek_frame(&buf[ready..], max) {
            Ok(Some(h)) => {
                let end = ready + h.total_len;
                match st.on_client(&buf[ready..end]) {
                    Ok(None) => {}
                    Ok(Some(replacement)) => {
                        out.extend_from_slice(&buf[copied..ready]);
                        out.extend_from_slice(&replacement);
                        copied = end;
                    }
                    Err(e) => break Some(e.to_string()),
                }
                ready = end;
            }
            Ok(None) => break None,
            Err(e) => break Some(e.to_string()),
        }
    };
    if !out.is_empty() {
        out.extend_from_slice(&buf[copied..ready]);
    }
    (ready, refused)
}

/// Server → client: frame, match against the response queue, route.
async fn server_to_client(
    proxy: &Proxy,
    state: &Mutex<SessionState>,
    keys: &Mutex<Vec<(i32, Vec<u8>)>>,
    mut server: UpRead,
    client: &mut OwnedWriteHalf,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> End {
    let mut buf = BytesMut::with_capacity(INITIAL_BUFFER);
    let mut out = BytesMut::with_capacity(INITIAL_BUFFER);
    let mut server_said_fatal = false;
    let mut draining = *shutdown.borrow();
    loop {
        let read = tokio::select! {
            r = server.read_buf(&mut buf) => r,
            _ = shutdown.changed(), if !draining => {
                draining = true;
                if idle(state) {
                    return close_for_shutdown(client).await;
                }
                continue;
            }
        };
        match read {
            Ok(0) => {
                if !server_said_fatal {
                    let err = error_response(
                        Severity::Fatal,
                        sqlstate::CONNECTION_FAILURE,
                        "resumeguard: the upstream server closed the connection unexpectedly",
                        None,
                    );
                    let _ = client.write_all(&err).await;
                }
                return End::ServerClosed;
            }
            Ok(_) => {}
            Err(e) => {
                let msg = format!("resumeguard: lost the upstream connection: {e}");
                let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
                let _ = client.write_all(&err).await;
                return End::Error(msg);
            }
        }
        // Route every complete message; a read of a parked head stops the
        // batch until its claim is decided, then routing goes on.
        loop {
            let outcome = match state.lock() {
                Ok(mut st) => track_server(proxy, &mut st, keys, &mut buf, &mut out),
                Err(_) => return End::Error("session state poisoned".into()),
            };
            let held = match outcome {
                Ok(tracked) => {
                    server_said_fatal |= tracked.fatal;
                    dispatch(proxy, state, tracked.events, tracked.evidence);
                    tracked.held
                }
                Err(msg) => {
                    tracing::error!(error = %msg, "closing session");
                    return fail_session(client, &msg).await;
                }
            };
            let Some(held) = held else { break };
            let Some(leg) = proxy.legs.claims.as_ref() else {
                // Claims are only requested with the leg on; never drop a row.
                out.extend_from_slice(held.replace.as_deref().unwrap_or(&held.frame));
                continue;
            };
            // What came before the held row may go out while it waits.
            if !out.is_empty() {
                if let Err(e) = client.write_all(&out).await {
                    return End::Error(format!("client write: {e}"));
                }
                out.clear();
            }
            let resolution = leg.resolve(&held.request).await;
            let (refusal, events) = match state.lock() {
                Ok(mut st) => (
                    st.apply_claim(&held.request, &resolution),
                    std::mem::take(&mut st.ready_events),
                ),
                Err(_) => return End::Error("session state poisoned".into()),
            };
            dispatch(proxy, state, events, Vec::new());
            match refusal {
                Some(error) => out.extend_from_slice(&error),
                None => out.extend_from_slice(held.replace.as_deref().unwrap_or(&held.frame)),
            }
        }
        if !out.is_empty() {
            if let Err(e) = client.write_all(&out).await {
                return End::Error(format!("client write: {e}"));
            }
            out.clear();
        }
        if buf.is_empty() && buf.capacity() > SHRINK_ABOVE {
            buf = BytesMut::with_capacity(INITIAL_BUFFER);
        }
        if out.capacity() > SHRINK_ABOVE {
            out = BytesMut::with_capacity(INITIAL_BUFFER);
        }
        if draining && idle(state) {
            return close_for_shutdown(client).await;
        }
    }
}

/// What one batch of server messages left for the relay to do.
struct Tracked {
    fatal: bool,
    events: Vec<crate::audit::AuditEvent>,
    evidence: Vec<Evidence>,
    /// A parked head's row, held until its claim is decided.
    held: Option<Held>,
}

/// A message held back from the client while a claim is decided.
struct Held {
    frame: BytesMut,
    replace: Option<bytes::Bytes>,
    request: ClaimRequest,
}

/// Hands audit events to the sink and claim evidence to the claims worker;
/// neither blocks.
fn dispatch(
    proxy: &Proxy,
    state: &Mutex<SessionState>,
    events: Vec<crate::audit::AuditEvent>,
    evidence: Vec<Evidence>,
) {
    for ev in events {
        proxy.audit.record(ev);
    }
    if evidence.is_empty() {
        return;
    }
    let sender = proxy.legs.claims.as_ref().and_then(|l| l.evidence.as_ref());
    if let (Some(sender), Ok(st)) = (sender, state.lock()) {
        for ev in evidence {
            sender.send(&st.ctx, ev);
        }
    }
}

/// Frames, tracks and routes the complete server messages in `buf` into
/// `out`. An error means the session can no longer be followed.
fn track_server(
    proxy: &Proxy,
    st: &mut SessionState,
    keys: &Mutex<Vec<(i32, Vec<u8>)>>,
    buf: &mut BytesMut,
    out: &mut BytesMut,
) -> Result<Tracked, String> {
    let mut fatal = false;
    let mut held = None;
    while let Some(h) = peek_frame(buf, proxy.config.max_backend_message_bytes)
        .map_err(|e| format!("upstream protocol violation: {e}"))?
    {
        let frame = buf.split_to(h.total_len);
        let mut verdict = st.on_server(&frame).map_err(|d| d.to_string())?;
        if let Some(request) = verdict.claim.take() {
            for synthesized in &verdict.before {
                out.extend_from_slice(synthesized);
            }
            held = Some(Held {
                frame,
                replace: verdict.replace,
                request,
            });
            break;
        }
        for synthesized in &verdict.before {
            out.extend_from_slice(synthesized);
        }
        if verdict.route == Route::Forward {
            out.extend_from_slice(verdict.replace.as_deref().unwrap_or(&frame));
        }
        fatal |= verdict.fatal;
        if let Some((pid, key)) = verdict.backend_key {
            proxy.cancel_keys.insert((pid, key.clone()), ());
            if let Ok(mut k) = keys.lock() {
                k.push((pid, key));
            }
        }
    }
    Ok(Tracked {
        fatal,
        events: std::mem::take(&mut st.ready_events),
        evidence: std::mem::take(&mut st.ready_evidence),
        held,
    })
}

fn idle(state: &Mutex<SessionState>) -> bool {
    state.lock().map(|s| s.is_idle()).unwrap_or(true)
}

async fn close_for_shutdown(client: &mut OwnedWriteHalf) -> End {
    let err = error_response(
        Severity::Fatal,
        sqlstate::ADMIN_SHUTDOWN,
        "terminating connection: resumeguard is shutting down",
        None,
    );
    let _ = client.write_all(&err).await;
    End::Shutdown
}

async fn fail_session(client: &mut OwnedWriteHalf, msg: &str) -> End {
    let err = error_response(
        Severity::Fatal,
        sqlstate::INTERNAL_ERROR,
        &format!("resumeguard: {msg}"),
        None,
    );
    let _ = client.write_all(&err).await;
    End::Error(msg.to_owned())
}
