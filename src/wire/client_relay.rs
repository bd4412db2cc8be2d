//! Client → server: frame each message, let the session's guard track
//! it, forward it (or what the guard puts in its place). Before
//! authentication is over, reads have a deadline and messages are small.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use super::client_stream::ClientStream;
use super::connection::{peek_header, Connection, Passing, STREAM_ABOVE};
use super::first_packet::is_timeout;
use super::guard::{ClientStep, Guard};
use super::proxy::Proxy;
use super::registry::{closable, SessionHandle, StopReason};
use super::sasl_plus;
use super::session_end::End;
use super::upstream::Upstream;

/// Client → server: frame, track, forward. Runs on its own thread,
/// reading `conn` (after what it already holds, unless `read_first`). The
/// client's end-of-file (a half-close, or a TLS close_notify) is passed
/// on to the server, whose answers to everything sent before it are still
/// relayed until the server closes, as a client of PostgreSQL's own would
/// get them; any other way out stops the session ([`StopReason::Quiet`]
/// unless shutdown).
pub(super) fn client_to_server(
    proxy: &Proxy,
    handle: &SessionHandle,
    conn: Connection<Arc<ClientStream>>,
    read_first: bool,
    deadline: Instant,
) -> End {
    let end = relay_client(proxy, handle, conn, read_first, deadline);
    match end {
        End::ClientClosed => handle.client_finished(),
        End::Shutdown => {
            handle.stop(StopReason::Shutdown);
        }
        _ => {
            handle.stop(StopReason::Quiet);
        }
    }
    end
}

/// Messages before authentication is over are small (passwords, SASL
/// tokens): a larger one is refused before it is buffered.
pub const MAX_PRE_AUTH_MESSAGE: usize = 65_536;

fn relay_client(
    proxy: &Proxy,
    handle: &SessionHandle,
    mut conn: Connection<Arc<ClientStream>>,
    read_first: bool,
    deadline: Instant,
) -> End {
    let server = &*handle.server;
    let upstream_tls = matches!(server, Upstream::Tls(_));
    let mut out = BytesMut::new();
    let mut read_more = read_first;
    let mut started = false;
    loop {
        if !started {
            started = handle.state.lock().map(|st| st.started()).unwrap_or(false);
            if started {
                let _ = conn.socket().set_read_timeout(None);
            }
        }
        if read_more {
            let read = if started {
                conn.read()
            } else {
                // Startup and authentication have one deadline, however
                // slowly the bytes come.
                conn.read_before(deadline)
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
        match conn.pass_streaming(|chunk| server.write_all(chunk)) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => return End::Error(format!("upstream write: {e}")),
        }
        // Frame and track under the lock; no I/O while it is held.
        let tracked = match handle.state.lock() {
            // Shutting down and nothing in flight: close instead of
            // starting new work (checked under the lock the drain uses).
            Ok(st) if proxy.sessions.draining() && closable(st.as_ref()) => return End::Shutdown,
            Ok(mut st) => {
                // Authentication may have ended while this read waited: the
                // first message after it has the full limit.
                let max = if started || st.started() {
                    proxy.config.max_message_bytes
                } else {
                    MAX_PRE_AUTH_MESSAGE
                };
                let limits = Limits {
                    max,
                    upstream_tls,
                    on_loop: false,
                };
                track_client(st.as_mut(), conn.buffered(), &mut out, limits)
            }
            Err(_) => return End::Error("session state poisoned".into()),
        };
        if tracked.terminated {
            // Before the server sees it, so its close is never news.
            handle.client_terminated.store(true, Ordering::Release);
        }
        let sent = if out.is_empty() {
            // Nothing rewritten: forward the received bytes as they are.
            server.write_all(&conn.buffered()[..tracked.ready])
        } else {
            let sent = server.write_all(&out);
            out.clear();
            sent
        };
        if let Err(e) = sent {
            return End::Error(format!("upstream write: {e}"));
        }
        conn.consume(tracked.ready);
        match tracked.refused {
            Some(Refused::Invalid(reason)) => {
                return End::ClientProtocol(format!(
                    "resumeguard: invalid client message: {reason}"
                ))
            }
            Some(Refused::ChannelBinding(refusal)) => return End::ClientRefused(refusal),
            None => {}
        }
        conn.stream_on(tracked.passing);
        read_more = !tracked.awaiting;
        if tracked.awaiting && !await_answers(handle) {
            return End::Quiet;
        }
        conn.shrink_if_drained();
    }
}

/// Waits until the server has answered everything sent before the
/// client's latest Sync. False when the session stops meanwhile.
fn await_answers(handle: &SessionHandle) -> bool {
    let Ok(mut st) = handle.state.lock() else {
        return false;
    };
    // Set and read under the state lock, so no answer's wake-up is missed.
    handle.awaiting.store(true, Ordering::Relaxed);
    let settled = loop {
        if st.settled() {
            break true;
        }
        if handle.stopping().is_some() {
            break false;
        }
        st = match handle
            .answered
            .wait_timeout(st, std::time::Duration::from_millis(100))
        {
            Ok((st, _)) => st,
            Err(_) => return false,
        };
    };
    handle.awaiting.store(false, Ordering::Relaxed);
    settled
}

/// Why a client message is not forwarded, and the session ends.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// It breaks the protocol.
    Invalid(String),
    /// It asks for channel binding the proxy cannot carry.
    ChannelBinding(sasl_plus::BindingRefusal),
}

/// What one pass over the client's buffered bytes left to do.
pub(super) struct TrackedClient {
    /// Bytes consumed (forwarded as they are, or as `out`).
    pub ready: usize,
    /// Why the next message is refused.
    pub refused: Option<Refused>,
    /// The next message waits for the server's answers.
    pub awaiting: bool,
    /// The next message may block the tracking thread: a relay serving
    /// many sessions on one thread moves this one to its own threads
    /// before it offers the message again (see [`ClientStep::Blocks`]).
    pub may_block: bool,
    /// The client sent Terminate: the server closing next is expected.
    pub terminated: bool,
    /// The last message consumed streams on: the rest of its body.
    pub passing: Option<Passing>,
}

/// How a pass over the client's bytes reads them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The largest message accepted.
    pub max: usize,
    /// The upstream connection has TLS (see `sasl_plus.rs`).
    pub upstream_tls: bool,
    /// The relay serves many sessions on this thread: a message that
    /// may block stops the pass (see [`ClientStep::Blocks`]).
    pub on_loop: bool,
}

/// Frames and tracks the complete client messages at the front of `buf`,
/// and a large incomplete one the guard lets stream (see
/// [`Guard::client_streams`]). When the guard rewrites a message or puts
/// bytes of its own before one, `out` receives everything consumed (as
/// the guard changed it); otherwise it stays empty and the consumed bytes
/// are forwarded unchanged. Over an
/// upstream TLS connection, a SASL start asking for channel binding is
/// refused (see `sasl_plus.rs`).
pub(super) fn track_client(
    guard: &mut dyn Guard,
    buf: &[u8],
    out: &mut BytesMut,
    limits: Limits,
) -> TrackedClient {
    let Limits {
        max,
        upstream_tls,
        on_loop,
    } = limits;
    let mut ready = 0;
    let mut copied = 0;
    let mut awaiting = false;
    let mut may_block = false;
    let mut terminated = false;
    let mut passing = None;
    let refused = loop {
        let h = match peek_header(&buf[ready..], max) {
            Ok(Some(h)) => h,
            Ok(None) => break None,
            Err(e) => break Some(Refused::Invalid(e.to_string())),
        };
        let whole = buf.len() - ready >= h.total_len;
        if !whole && (h.total_len <= STREAM_ABOVE || !guard.client_streams(&buf[ready..])) {
            break None;
        }
        let end = if whole {
            ready + h.total_len
        } else {
            buf.len()
        };
        terminated |= h.tag == b'X';
        if whole && h.tag == b'p' && !guard.started() {
            if let Some(refusal) = sasl_plus::binding_refused(&buf[ready..end], upstream_tls) {
                break Some(Refused::ChannelBinding(refusal));
            }
        }
        let mut forward = true;
        match guard.on_client(&buf[ready..end], on_loop) {
            Ok(ClientStep::Forward) => {}
            Ok(ClientStep::Replace(replacement)) => {
                out.extend_from_slice(&buf[copied..ready]);
                out.extend_from_slice(&replacement);
                copied = end;
                forward = false;
            }
            Ok(ClientStep::Inject(first)) => {
                out.extend_from_slice(&buf[copied..ready]);
                out.extend_from_slice(&first);
                copied = ready;
                continue;
            }
            Ok(ClientStep::AwaitServer) => {
                awaiting = true;
                break None;
            }
            Ok(ClientStep::Blocks) => {
                may_block = true;
                break None;
            }
            Err(e) => break Some(Refused::Invalid(e.to_string())),
        }
        if !whole {
            passing = Some(Passing {
                left: ready + h.total_len - end,
                forward,
            });
            ready = end;
            break None;
        }
        ready = end;
    };
    if !out.is_empty() {
        out.extend_from_slice(&buf[copied..ready]);
    }
    TrackedClient {
        ready,
        refused,
        awaiting,
        may_block,
        terminated,
        passing,
    }
}

#[cfg(test)]
pub(super) mod tests;
