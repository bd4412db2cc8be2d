//! One client connection: the startup handshake, then two relay loops,
//! client→server and server→client, each on a thread of its own, sharing
//! the session's protocol state.
//!
//! Blocking threads rather than an event loop: the relay is bound by
//! system calls and wake-ups, and a thread blocked in `recv` is woken by
//! the kernel straight onto whichever core is free, where one event loop
//! serializes every session on one core (measured: README, performance).
//! The state lock is never held across a read or a write.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;

use super::backend::{error_response, sqlstate, Severity};
use super::frame::peek_frame;
use super::guard::{ClientStep, Guard, HeldTicket, SessionInfo};
use super::proxy::Proxy;
use super::read_buffer::ReadBuffer;
use super::registry::{SessionHandle, StopReason};
use super::response_queue::Route;
use super::startup::{self, FirstPacket, StartupMessage};

/// A write buffer grown past this is replaced once sent.
const SHRINK_ABOVE: usize = 1024 * 1024;

/// Stack of each relay thread: the deepest paths are sqlparser's recursive
/// descent (its own depth limit applies) and SQLite; only touched pages
/// count as resident.
pub const THREAD_STACK: usize = 1024 * 1024;

/// Why a session ended, for the log.
#[derive(Debug)]
enum End {
    ClientClosed,
    ServerClosed,
    Shutdown,
    /// The other direction ended first.
    Quiet,
    /// The client broke the protocol; it is told why before the close.
    ClientProtocol(String),
    Error(String),
}

/// Serves one accepted client connection to completion, on the calling
/// thread (plus one more for the client→server direction).
pub fn serve_client(proxy: Arc<Proxy>, mut client: TcpStream, peer: SocketAddr, inspection: bool) {
    let _ = client.set_nodelay(true);
    let deadline = Instant::now() + proxy.config.startup_timeout;
    let first = match read_first_packet(&mut client, deadline) {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(msg) => {
            tracing::info!(%peer, error = %msg, "refused connection start");
            let err = error_response(Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, &msg, None);
            let _ = client.write_all(&err);
            return;
        }
    };
    let (first, early) = first;
    match first {
        FirstPacket::Cancel { pid, key } => proxy.forward_cancel(pid, key),
        FirstPacket::Startup(_) if proxy.sessions.live() > proxy.config.max_client_conn => {
            // PgBouncer's max_client_conn: threads and the server's connection
            // slots are finite; say so at the start instead of failing later.
            // (This thread counts itself; cancel requests still pass.)
            let limit = proxy.config.max_client_conn;
            tracing::warn!(%peer, limit, "max_client_conn reached: connection refused");
            let msg =
                format!("resumeguard: too many client connections (max_client_conn = {limit})");
            let err = error_response(Severity::Fatal, sqlstate::TOO_MANY_CONNECTIONS, &msg, None);
            let _ = client.write_all(&err);
        }
        FirstPacket::Startup(startup) => {
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

/// Reads the connection's first packet, answering SSL and GSSAPI
/// encryption requests with 'N' (no TLS yet) until a real one arrives.
/// The whole exchange must finish within the startup timeout, however
/// slowly the bytes come. Bytes after the packet are the client's first
/// messages: they come back with it.
fn read_first_packet(
    client: &mut TcpStream,
    deadline: Instant,
) -> Result<Option<(FirstPacket, BytesMut)>, String> {
    let mut rb = ReadBuffer::default();
    let first = loop {
        let len = loop {
            match startup::peek_len(&rb.bytes).map_err(|e| e.to_string())? {
                Some(len) => break len,
                None => match fill_before(&mut rb, client, deadline) {
                    Ok(0) => return Ok(None),
                    Ok(_) => {}
                    Err(e) if is_timeout(&e) => {
                        return Err("timed out waiting for the startup packet".into())
                    }
                    Err(_) => return Ok(None),
                },
            }
        };
        let packet = rb.bytes.split_to(len);
        match startup::parse(&packet).map_err(|e| e.to_string())? {
            FirstPacket::SslRequest | FirstPacket::GssEncRequest => {
                if !rb.bytes.is_empty() {
                    // Bytes after an encryption request, before our answer:
                    // a client must wait for it (PgBouncer refuses this too).
                    return Err("received unencrypted data after an encryption request".into());
                }
                client.write_all(b"N").map_err(|e| e.to_string())?;
            }
            other => break other,
        }
    };
    Ok(Some((first, rb.bytes)))
}

/// One read, given up at `deadline`.
fn fill_before(
    rb: &mut ReadBuffer,
    client: &TcpStream,
    deadline: Instant,
) -> std::io::Result<usize> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    client.set_read_timeout(Some(left))?;
    rb.fill(client)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// What a session starts from: the client's StartupMessage, the bytes it
/// sent right after it, and when authentication must be over.
struct Start {
    startup: StartupMessage,
    early: BytesMut,
    deadline: Instant,
    inspection: bool,
}

fn run_session(proxy: Arc<Proxy>, client: TcpStream, peer: SocketAddr, start: Start) {
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
    let span = tracing::info_span!("session", id = session_id, %peer, user = %info.user, db = %info.database);
    let _entered = span.enter();
    relay_session(proxy, client, start, info, &span);
}

/// The session proper, inside its tracing span.
fn relay_session(
    proxy: Arc<Proxy>,
    client: TcpStream,
    start: Start,
    info: SessionInfo,
    span: &tracing::Span,
) {
    let session_id = info.session_id;
    let client = Arc::new(client);
    let server = match proxy.connect_upstream() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::warn!(error = %e, "upstream unreachable");
            let msg = format!("resumeguard: cannot reach the upstream server: {e}");
            let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
            let _ = (&*client).write_all(&err);
            return;
        }
    };
    if let Err(e) = server.write_all(&start.startup.raw) {
        let msg = format!("resumeguard: upstream failed during startup: {e}");
        let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
        let _ = (&*client).write_all(&err);
        return;
    }

    let state = Arc::new(Mutex::new(proxy.guards.guard(info)));
    let handle = Arc::new(SessionHandle::new(
        Arc::clone(&client),
        Arc::clone(&server),
        Arc::clone(&state),
    ));
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
        tracing::warn!(error = %msg, "closing session");
        let err = error_response(Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, msg, None);
        let _ = (&*client).write_all(&err);
    }
    for (pid, key) in keys.into_inner().unwrap_or_default() {
        proxy.cancel_keys.remove(&(pid, key));
    }
    if let Ok(mut st) = state.lock() {
        st.closed();
        st.flush();
    }
    match end {
        End::Error(e) | End::ClientProtocol(e) => tracing::info!(error = %e, "session ended"),
        End::ClientClosed | End::ServerClosed | End::Shutdown | End::Quiet => {
            tracing::debug!(?end, "session ended")
        }
    }
}

/// Client → server: frame, track, forward. Runs on its own thread; any
/// way out stops the session ([`StopReason::Quiet`] unless shutdown).
fn client_to_server(
    proxy: &Proxy,
    handle: &SessionHandle,
    early: BytesMut,
    deadline: Instant,
) -> End {
    let end = relay_client(proxy, handle, early, deadline);
    let reason = match end {
        End::Shutdown => StopReason::Shutdown,
        _ => StopReason::Quiet,
    };
    handle.stop(reason);
    end
}

/// Messages before authentication is over are small (passwords, SASL
/// tokens): a larger one is refused before it is buffered.
pub const MAX_PRE_AUTH_MESSAGE: usize = 65_536;

fn relay_client(proxy: &Proxy, handle: &SessionHandle, early: BytesMut, deadline: Instant) -> End {
    let (client, server) = (&*handle.client, &*handle.server);
    let mut rb = ReadBuffer::default();
    rb.bytes.extend_from_slice(&early);
    let mut out = BytesMut::new();
    let mut read_more = early.is_empty();
    let mut started = false;
    loop {
        if !started {
            started = handle.state.lock().map(|st| st.started()).unwrap_or(false);
            if started {
                let _ = client.set_read_timeout(None);
            }
        }
        if read_more {
            let read = if started {
                rb.fill(client)
            } else {
                // Startup and authentication have one deadline, however
                // slowly the bytes come.
                fill_before(&mut rb, client, deadline)
            };
            match read {
                Ok(0) => return End::ClientClosed,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if !started && is_timeout(&e) => {
                    return End::ClientProtocol("resumeguard: authentication timed out".into())
                }
                Err(e) => return End::Error(format!("client read: {e}")),
            }
        }
        if handle.stopping().is_some() {
            return End::Quiet;
        }
        // Frame and track under the lock; no I/O while it is held.
        let tracked = match handle.state.lock() {
            // Shutting down and nothing in flight: close instead of
            // starting new work (checked under the lock the drain uses).
            Ok(st) if proxy.sessions.draining() && st.is_idle() => return End::Shutdown,
            Ok(mut st) => {
                let max = if started {
                    proxy.config.max_message_bytes
                } else {
                    MAX_PRE_AUTH_MESSAGE
                };
                track_client(st.as_mut(), &rb.bytes, &mut out, max)
            }
            Err(_) => return End::Error("session state poisoned".into()),
        };
        if tracked.terminated {
            // Before the server sees it, so its close is never news.
            handle.client_terminated.store(true, Ordering::Release);
        }
        let sent = if out.is_empty() {
            // Nothing rewritten: forward the received bytes as they are.
            server.write_all(&rb.bytes[..tracked.ready])
        } else {
            let sent = server.write_all(&out);
            out.clear();
            sent
        };
        if let Err(e) = sent {
            return End::Error(format!("upstream write: {e}"));
        }
        let _ = rb.bytes.split_to(tracked.ready);
        if let Some(reason) = tracked.refused {
            return End::ClientProtocol(format!("resumeguard: invalid client message: {reason}"));
        }
        read_more = !tracked.awaiting;
        if tracked.awaiting && !await_answers(handle) {
            return End::Quiet;
        }
        rb.shrink_if_drained();
    }
}

/// Waits until the server has answered everything sent before the
/// client's latest Sync. False when the session stops meanwhile.
fn await_answers(handle: &SessionHandle) -> bool {
    let Ok(mut st) = handle.state.lock() else {
        return false;
    };
    while !st.settled() {
        if handle.stopping().is_some() {
            return false;
        }
        st = match handle
            .answered
            .wait_timeout(st, std::time::Duration::from_millis(100))
        {
            Ok((st, _)) => st,
            Err(_) => return false,
        };
    }
    true
}

/// What one pass over the client's buffered bytes left to do.
struct TrackedClient {
    /// Bytes consumed (forwarded as they are, or as `out`).
    ready: usize,
    /// Why the next message is refused.
    refused: Option<String>,
    /// The next message waits for the server's answers.
    awaiting: bool,
    /// The client sent Terminate: the server closing next is expected.
    terminated: bool,
}

/// Frames and tracks the complete client messages at the front of `buf`.
/// When the guard rewrites a message, `out` receives everything consumed
/// (rewritten where needed); otherwise it stays empty and the consumed
/// bytes are forwarded unchanged.
fn track_client(
    guard: &mut dyn Guard,
    buf: &[u8],
    out: &mut BytesMut,
    max: usize,
) -> TrackedClient {
    let mut ready = 0;
    let mut copied = 0;
    let mut awaiting = false;
    let mut terminated = false;
    let refused = loop {
        match peek_frame(&buf[ready..], max) {
            Ok(Some(h)) => {
                let end = ready + h.total_len;
                terminated |= h.tag == b'X';
                match guard.on_client(&buf[ready..end]) {
                    Ok(ClientStep::Forward) => {}
                    Ok(ClientStep::Replace(replacement)) => {
                        out.extend_from_slice(&buf[copied..ready]);
                        out.extend_from_slice(&replacement);
                        copied = end;
                    }
                    Ok(ClientStep::AwaitServer) => {
                        awaiting = true;
                        break None;
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
    TrackedClient {
        ready,
        refused,
        awaiting,
        terminated,
    }
}

/// Server → client: frame, match against the response queue, route. Runs
/// on the session's own thread.
fn server_to_client(
    proxy: &Proxy,
    handle: &SessionHandle,
    keys: &Mutex<Vec<(i32, Vec<u8>)>>,
) -> End {
    let (server, mut client) = (&*handle.server, &*handle.client);
    let state = &*handle.state;
    let mut rb = ReadBuffer::default();
    let mut out = BytesMut::new();
    let mut server_said_fatal = false;
    loop {
        let read = rb.fill(server);
        match (read, handle.stopping()) {
            (Ok(n), None) if n > 0 => {}
            (Err(e), None) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            (_, Some(StopReason::Shutdown)) => return close_for_shutdown(client),
            (_, Some(StopReason::Quiet)) => return End::Quiet,
            (Ok(_), None) if handle.client_terminated.load(Ordering::Acquire) => {
                // The client said goodbye; the server's close answers it.
                return End::ClientClosed;
            }
            (Ok(_), None) => {
                if !server_said_fatal {
                    let err = error_response(
                        Severity::Fatal,
                        sqlstate::CONNECTION_FAILURE,
                        "resumeguard: the upstream server closed the connection unexpectedly",
                        None,
                    );
                    let _ = client.write_all(&err);
                }
                return End::ServerClosed;
            }
            (Err(e), None) => {
                let msg = format!("resumeguard: lost the upstream connection: {e}");
                let err = error_response(Severity::Fatal, sqlstate::CONNECTION_FAILURE, &msg, None);
                let _ = client.write_all(&err);
                return End::Error(msg);
            }
        }
        // Route every complete message; a read of a parked head stops the
        // batch until its claim is decided, then routing goes on.
        loop {
            let outcome = match state.lock() {
                Ok(mut st) => {
                    let tracked = track_server(proxy, st.as_mut(), keys, &mut rb.bytes, &mut out);
                    st.flush();
                    handle.answered.notify_all();
                    tracked
                }
                Err(_) => return End::Error("session state poisoned".into()),
            };
            let held = match outcome {
                Ok(tracked) => {
                    server_said_fatal |= tracked.fatal;
                    tracked.held
                }
                Err(msg) => {
                    tracing::error!(error = %msg, "closing session");
                    return fail_session(client, &msg);
                }
            };
            let Some(Held {
                frame,
                replace,
                ticket: HeldTicket(mut ticket),
            }) = held
            else {
                break;
            };
            // What came before the held row may go out while it waits.
            if !out.is_empty() {
                if let Err(e) = client.write_all(&out) {
                    return End::Error(format!("client write: {e}"));
                }
                out.clear();
            }
            ticket.decide();
            let refusal = match state.lock() {
                Ok(mut st) => {
                    let refusal = st.release(ticket);
                    st.flush();
                    refusal
                }
                Err(_) => return End::Error("session state poisoned".into()),
            };
            match refusal {
                Some(error) => out.extend_from_slice(&error),
                None => out.extend_from_slice(replace.as_deref().unwrap_or(&frame)),
            }
        }
        if !out.is_empty() {
            if let Err(e) = client.write_all(&out) {
                return End::Error(format!("client write: {e}"));
            }
            out.clear();
        }
        rb.shrink_if_drained();
        if out.capacity() > SHRINK_ABOVE {
            out = BytesMut::new();
        }
        if proxy.sessions.draining() && idle(state) {
            return close_for_shutdown(client);
        }
    }
}

/// What one batch of server messages left for the relay to do.
struct Tracked {
    fatal: bool,
    /// A message held until its ticket is decided.
    held: Option<Held>,
}

/// A message held back from the client while its ticket is decided.
struct Held {
    frame: BytesMut,
    replace: Option<bytes::Bytes>,
    ticket: HeldTicket,
}

/// Frames, tracks and routes the complete server messages in `buf` into
/// `out`. An error means the session can no longer be followed.
fn track_server(
    proxy: &Proxy,
    guard: &mut dyn Guard,
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
        let mut step = guard.on_server(&frame).map_err(|d| d.to_string())?;
        if let Some(ticket) = step.hold.take() {
            held = Some(Held {
                frame,
                replace: step.replace,
                ticket,
            });
            break;
        }
        if step.route == Route::Forward {
            out.extend_from_slice(step.replace.as_deref().unwrap_or(&frame));
        }
        fatal |= step.fatal;
        if let Some((pid, key)) = step.backend_key {
            proxy.cancel_keys.insert((pid, key.clone()), ());
            if let Ok(mut k) = keys.lock() {
                k.push((pid, key));
            }
        }
    }
    Ok(Tracked { fatal, held })
}

fn idle(state: &Mutex<Box<dyn Guard>>) -> bool {
    state.lock().map(|s| s.is_idle()).unwrap_or(true)
}

fn close_for_shutdown(mut client: &TcpStream) -> End {
    let err = error_response(
        Severity::Fatal,
        sqlstate::ADMIN_SHUTDOWN,
        "terminating connection: resumeguard is shutting down",
        None,
    );
    let _ = client.write_all(&err);
    End::Shutdown
}

fn fail_session(mut client: &TcpStream, msg: &str) -> End {
    let err = error_response(
        Severity::Fatal,
        sqlstate::INTERNAL_ERROR,
        &format!("resumeguard: {msg}"),
        None,
    );
    let _ = client.write_all(&err);
    End::Error(msg.to_owned())
}
