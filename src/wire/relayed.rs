//! A session past its startup packet, wherever it relays (an event loop,
//! or two threads of its own): what keeps it counted and reachable, where
//! its relay stands, the relay on threads, and how it ends.

use std::io::Write;
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use super::backend_keys::{BackendKeys, WaitEnds};
use super::client_relay::client_to_server;
use super::client_stream::ClientStream;
use super::connection::Connection;
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::proxy::Proxy;
use super::registry::{LiveGuard, Registered, SessionHandle, StopReason};
use super::sasl_plus;
use super::server_relay::server_to_client;
use super::session_end::End;
use super::upstream::Upstream;
use crate::log_text::shown;

/// Stack of each thread that runs a session's guard (relay threads, event
/// loops, decisions): the deepest paths are sqlparser's recursive descent
/// (its own depth limit applies) and SQLite; only touched pages count as
/// resident.
pub const THREAD_STACK: usize = 1024 * 1024;

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
    pub keys: BackendKeys,
    /// Keeps the session reachable (shutdown, the admin API) until it ends.
    pub _registered: Registered,
    /// Counts the session as live until it ends.
    pub _live: LiveGuard,
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
    /// What ends a wait for a decision the session starts now.
    pub fn wait_ends(&self) -> WaitEnds {
        self.keys.wait_ends(Arc::clone(&self.handle.server))
    }

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
        self.keys.forget(&self.proxy);
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
