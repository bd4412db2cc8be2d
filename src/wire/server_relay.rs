//! Server → client: frame each message, let the session's guard track
//! it, route it (forward, replace, swallow), and hold a row while its
//! ticket (a claim) is decided.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};

use super::backend_keys::BackendKeys;
use super::client_stream::ClientStream;
use super::connection::{peek_header, Connection, FrameError, Passing, STREAM_ABOVE};
use super::guard::{Guard, HeldTicket, RareStep};
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::proxy::Proxy;
use super::registry::{closable, SessionHandle, StopReason};
use super::response_queue::{Desync, Route};
use super::sasl_plus;
use super::session_end::End;
use super::upstream::Upstream;
use crate::log_text::shown;

/// A write buffer grown past this is replaced once sent.
pub(super) const SHRINK_ABOVE: usize = 1024 * 1024;

/// Server → client: frame, match against the response queue, route. Runs
/// on the session's own thread, reading `conn` (what it holds is the start
/// of a message still arriving); `server_said_fatal`: the server already
/// sent a FATAL error.
pub(super) fn server_to_client(
    proxy: &Proxy,
    handle: &SessionHandle,
    keys: &BackendKeys,
    mut conn: Connection<Arc<Upstream>>,
    mut server_said_fatal: bool,
) -> End {
    let mut client = &*handle.client;
    let state = &*handle.state;
    let mut out = BytesMut::new();
    // A client's stream is settled before its relay starts.
    let plaintext_client = !handle.client.is_tls();
    loop {
        let read = conn.read();
        match (read, handle.stopping()) {
            (Ok(n), None) if n > 0 => {}
            (Err(e), None) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            (_, Some(StopReason::Shutdown)) => return close_for_shutdown(client),
            (_, Some(StopReason::Quiet)) => return End::Quiet,
            (Ok(_), None) if handle.client_left() => {
                // The client said goodbye (or sent its last byte); the
                // server's close answers it.
                return End::ClientClosed;
            }
            (Ok(_), None) => {
                if !server_said_fatal {
                    tell_fatal(
                        client,
                        sqlstate::CONNECTION_FAILURE,
                        "resumeguard: the upstream server closed the connection unexpectedly",
                    );
                }
                return End::ServerClosed;
            }
            (Err(e), None) => {
                metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "kind" => "lost").increment(1);
                let msg = format!("resumeguard: lost the upstream connection: {e}");
                tell_fatal(client, sqlstate::CONNECTION_FAILURE, &msg);
                return End::Error(msg);
            }
        }
        // A client that does not read blocks this write, and with it the
        // reads from the server: nothing more is buffered.
        match conn.pass_streaming(|chunk| client.write_all(chunk)) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => return End::Error(format!("client write: {e}")),
        }
        // Route every complete message; a read of a parked head stops the
        // batch until its claim is decided, then routing goes on.
        loop {
            let outcome = match state.lock() {
                Ok(mut st) => {
                    let tracked = track_server(
                        proxy,
                        st.as_mut(),
                        keys,
                        (conn.buffered_mut(), &mut out),
                        plaintext_client,
                    );
                    st.flush();
                    // Only a waiting client thread is woken: a notify is a
                    // system call, and almost no batch has a waiter.
                    if handle.awaiting.load(Ordering::Relaxed) {
                        handle.answered.notify_all();
                    }
                    tracked
                }
                Err(_) => return End::Error("session state poisoned".into()),
            };
            let held = match outcome {
                Ok(tracked) => {
                    server_said_fatal |= tracked.fatal;
                    conn.stream_on(tracked.passing);
                    tracked.held
                }
                Err(lost) => {
                    tracing::error!(error = %shown(&lost.to_string()), "closing session");
                    return fail_session(client, &lost.to_string());
                }
            };
            let Some(Held {
                frame,
                replace,
                ticket: HeldTicket(ticket),
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
            let ends = keys.wait_ends(Arc::clone(&handle.server));
            ticket.decide(&|| ends.now());
            let refusal = match state.lock() {
                Ok(mut st) => {
                    let refusal = st.release();
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
        conn.shrink_if_drained();
        if out.capacity() > SHRINK_ABOVE {
            out = BytesMut::new();
        }
        if proxy.sessions.draining() && idle(state) {
            return close_for_shutdown(client);
        }
    }
}

/// What one batch of server messages left for the relay to do.
pub(super) struct Tracked {
    pub fatal: bool,
    /// A message held until its ticket is decided.
    pub held: Option<Held>,
    /// The last message routed streams on: the rest of its body.
    pub passing: Option<Passing>,
}

/// A message held back from the client while its ticket is decided.
pub(super) struct Held {
    pub frame: BytesMut,
    pub replace: Option<bytes::Bytes>,
    pub ticket: HeldTicket,
}

/// Why the server's side of a session can no longer be followed.
#[derive(Debug, thiserror::Error)]
pub(super) enum LostTrack {
    #[error("upstream protocol violation: {0}")]
    Framing(FrameError),
    #[error(transparent)]
    Desync(#[from] Desync),
}

/// Frames, tracks and routes the complete server messages in `buf` into
/// `out`, and a large incomplete one the guard lets stream (see
/// [`Guard::unwatched_row`]). An error means the session can no longer
/// be followed. A `plaintext_client` is never offered SCRAM-SHA-256-PLUS
/// (see `sasl_plus.rs`).
///
/// Consecutive messages that go on unchanged are copied to `out` in one
/// piece.
pub(super) fn track_server(
    proxy: &Proxy,
    guard: &mut dyn Guard,
    keys: &BackendKeys,
    (buf, out): (&mut BytesMut, &mut BytesMut),
    plaintext_client: bool,
) -> Result<Tracked, LostTrack> {
    let mut fatal = false;
    let mut held = None;
    let mut passing = None;
    // `buf[run..at]` goes on unchanged; `buf[..at]` is routed.
    let mut run = 0;
    let mut at = 0;
    while let Some(h) = peek_header(&buf[at..], proxy.config.max_backend_message_bytes)
        .map_err(LostTrack::Framing)?
    {
        let end = at + h.total_len;
        if let Some(route) = guard.unwatched_row(h.tag) {
            if buf.len() < end {
                if h.total_len > STREAM_ABOVE {
                    out.extend_from_slice(&buf[run..at]);
                    buf.advance(at);
                    (run, at) = (0, 0);
                    passing = Some(stream_row(buf, out, route, h.total_len));
                }
                break;
            }
            if route != Route::Forward {
                out.extend_from_slice(&buf[run..at]);
                run = end;
            }
            at = end;
            continue;
        }
        if buf.len() < end {
            break;
        }
        // Read in place; only a held message is split off the buffer.
        let frame = &buf[at..end];
        let mut step = guard.on_server(frame)?;
        if plaintext_client && h.tag == b'R' && !guard.started() {
            step.set_replace(sasl_plus::without_plus(frame));
        }
        fatal |= step.fatal;
        let mut replace = None;
        if let Some(rare) = step.rare {
            // An error that answers the whole statement: the guard routes
            // the rest of its answer.
            let RareStep {
                replace: replacement,
                backend_key,
                hold,
                answers: _,
            } = *rare;
            if let Some((pid, key)) = backend_key {
                keys.record(proxy, pid, key);
            }
            if let Some(ticket) = hold {
                out.extend_from_slice(&buf[run..at]);
                buf.advance(at);
                (run, at) = (0, 0);
                held = Some(Held {
                    frame: buf.split_to(h.total_len),
                    replace: replacement,
                    ticket,
                });
                break;
            }
            replace = replacement;
        }
        if step.route != Route::Forward || replace.is_some() {
            out.extend_from_slice(&buf[run..at]);
            if step.route == Route::Forward {
                out.extend_from_slice(replace.as_deref().unwrap_or_default());
            }
            run = end;
        }
        at = end;
    }
    if run == 0 && at == buf.len() && out.is_empty() {
        // The whole read goes on unchanged: the buffers trade places
        // rather than copy it.
        std::mem::swap(buf, out);
    } else {
        out.extend_from_slice(&buf[run..at]);
        buf.advance(at);
    }
    Ok(Tracked {
        fatal,
        held,
        passing,
    })
}

/// Routes the front of a row that streams (`buf` holds what of it has
/// arrived): it goes to `out` unless its route drops it, and the rest
/// passes as it arrives.
fn stream_row(buf: &mut BytesMut, out: &mut BytesMut, route: Route, total_len: usize) -> Passing {
    let forward = route == Route::Forward;
    if forward {
        out.extend_from_slice(buf);
    }
    let left = total_len - buf.len();
    buf.clear();
    Passing { left, forward }
}

/// Whether a draining proxy closes the session now (a poisoned state
/// closes it).
pub(super) fn idle(state: &Mutex<Box<dyn Guard>>) -> bool {
    state.lock().map(|s| closable(s.as_ref())).unwrap_or(true)
}

/// A FATAL ErrorResponse to the client, best effort: the session ends
/// whether it arrives or not.
fn tell_fatal(mut client: &ClientStream, code: &str, message: &str) {
    let _ = client.write_all(&error_response(Severity::Fatal, code, message, None));
}

/// What a client is told when the proxy shuts its session down.
pub(super) const SHUTTING_DOWN: &str = "terminating connection: resumeguard is shutting down";

fn close_for_shutdown(client: &ClientStream) -> End {
    tell_fatal(client, sqlstate::ADMIN_SHUTDOWN, SHUTTING_DOWN);
    End::Shutdown
}

fn fail_session(client: &ClientStream, msg: &str) -> End {
    tell_fatal(
        client,
        sqlstate::INTERNAL_ERROR,
        &format!("resumeguard: {msg}"),
    );
    End::Error(msg.to_owned())
}

#[cfg(test)]
mod tests;
