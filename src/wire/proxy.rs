//! What every session of one proxy process shares: configuration, the
//! guard factory, the cancel-key registry, the live sessions.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use crate::wire::client_stream::ClientTls;
use crate::wire::draining::Draining;
use crate::wire::guard::GuardFactory;
use crate::wire::keepalive::Keepalive;
use crate::wire::messages::startup::write_cancel_request;
use crate::wire::registry::Registry;
use crate::wire::upstream::{Upstream, UpstreamAddr};
use crate::wire::upstream_tls::UpstreamTls;

/// Settings of the relay itself.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The PostgreSQL server behind the proxy.
    pub upstream: UpstreamAddr,
    /// TLS towards the upstream (sslmode and friends).
    pub upstream_tls: UpstreamTls,
    /// TLS towards clients; absent: SSLRequest is answered 'N'.
    pub client_tls: Option<ClientTls>,
    pub connect_timeout: Duration,
    pub startup_timeout: Duration,
    /// TCP keepalives and user timeout of client and upstream sockets.
    pub keepalive: Keepalive,
    /// Largest client message accepted (PostgreSQL's own cap is 1 GiB).
    pub max_message_bytes: usize,
    /// Largest server message accepted.
    pub max_backend_message_bytes: usize,
    /// Client connections served at once (each an upstream connection);
    /// more are answered 53300 and closed.
    pub max_client_conn: usize,
    /// Event loops relaying sessions without TLS (see `event_loop.rs`);
    /// 0: every session relays on two threads of its own.
    pub event_loops: usize,
    /// How the loops wait for their sockets and write to them.
    pub event_loop_io: LoopIo,
}

/// How an event loop waits for its sockets and writes to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopIo {
    /// Readiness and writes as requests on an io_uring, submitted with
    /// the loop's one wait per turn; epoll where the kernel refuses a
    /// ring (said in the log).
    #[default]
    IoUring,
    /// epoll readiness, then a system call per read and per write.
    Epoll,
}

/// One event loop per two cores (at least one): a proxy shares its host
/// with the database or its clients, and on two cores one loop served
/// more sessions per wake-up and spent less CPU per transaction than two
/// (docs/performance.md, "Where the CPU goes").
pub fn default_event_loops() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(2))
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            upstream: UpstreamAddr::Tcp("127.0.0.1:5432".into()),
            upstream_tls: UpstreamTls::disabled(),
            client_tls: None,
            connect_timeout: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(30),
            keepalive: Keepalive::default(),
            max_message_bytes: (1 << 30) - 1,
            max_backend_message_bytes: i32::MAX as usize,
            max_client_conn: 2_000,
            event_loops: default_event_loops(),
            event_loop_io: LoopIo::default(),
        }
    }
}

pub struct Proxy {
    pub config: RelayConfig,
    /// Makes each session's guard.
    pub guards: Arc<dyn GuardFactory>,
    /// BackendKeyData of live sessions: a CancelRequest is forwarded only
    /// for a key the proxy handed out, so the proxy cannot be used to
    /// probe or cancel arbitrary backends; and it is told to the session
    /// (see [`super::backend_keys`]).
    pub cancel_keys: DashMap<(i32, Vec<u8>), Arc<AtomicBool>>,
    pub next_session_id: AtomicU64,
    /// Live sessions, for draining at shutdown.
    pub sessions: Registry,
}

impl Proxy {
    pub fn new(config: RelayConfig, guards: Arc<dyn GuardFactory>) -> Self {
        Proxy {
            config,
            guards,
            cancel_keys: DashMap::new(),
            next_session_id: AtomicU64::new(1),
            sessions: Registry::default(),
        }
    }

    /// The same proxy, with a shutdown flag shared with what grants its
    /// sessions work.
    pub fn with_draining(mut self, draining: Draining) -> Self {
        self.sessions = Registry::with_draining(draining);
        self
    }

    /// Connects to the upstream server and negotiates TLS as configured
    /// (blocking, bounded by the connect timeout).
    pub fn connect_upstream(&self) -> std::io::Result<Upstream> {
        let timeout = self.config.connect_timeout;
        self.config
            .upstream
            .connect(timeout)
            .inspect(|s| {
                if let Upstream::Tcp(sock) = s {
                    self.config.keepalive.apply(sock, "upstream");
                }
            })
            .and_then(|s| self.config.upstream_tls.negotiate(s, timeout))
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("connecting to {}: {e}", self.config.upstream),
                )
            })
    }

    /// A CancelRequest arrives on its own connection carrying the backend
    /// key the client saw; the proxy passed the server's key through, so
    /// the request goes to the upstream verbatim.
    pub fn forward_cancel(&self, pid: i32, key: Vec<u8>) {
        match self.cancel_keys.get(&(pid, key.clone())) {
            Some(session) => session.store(true, Ordering::SeqCst),
            None => {
                tracing::info!(pid, "cancel request for an unknown backend key ignored");
                return;
            }
        }
        let mut packet = BytesMut::with_capacity(12 + key.len());
        if let Err(e) = write_cancel_request(&mut packet, pid, &key) {
            tracing::warn!(pid, error = %e, "cancel request cannot be forwarded");
            return;
        }
        match self.connect_upstream() {
            Ok(s) => {
                if let Err(e) = s.write_all(&packet) {
                    tracing::warn!(pid, error = %e, "forwarding cancel request failed");
                }
                s.close_notify();
                tracing::info!(pid, "cancel request forwarded");
            }
            Err(e) => tracing::warn!(pid, error = %e, "cancel request: upstream unreachable"),
        }
    }
}
