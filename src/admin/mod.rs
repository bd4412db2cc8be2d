//! The admin listener: Prometheus `/metrics`, `/healthz` and `/readyz`,
//! and a run ledger of the proxy's decisions (`/threads/{id}`, `/claims`,
//! `/sessions`, `POST /claims/release`), the configuration in effect
//! (`/config`, `POST /reload`), served over HTTP on the tokio
//! runtime that accepts client connections, never on a relay thread.
//!
//! - `metrics`: the recorder, help texts, decision counters, scrape-time values.
//! - `auth`: the token every route but the probes needs (bearer or a
//!   console session), CSRF tokens, the failed-login limit.
//! - `login_page`: the console's login form, which the token check shows too.
//! - `html_escape`: escaping of client- and trail-derived text in HTML.
//! - `alert`: the alert an HTML page shows for what failed.
//! - `console`: the approvals console (`/ui`), server-rendered HTML.
//! - `blocking`: handlers' blocking work, the claims store among it.
//! - `claims_release`: a release by hand, logged and audited.
//! - `json_error`: the API's `{"error": …}` answer.
//! - `http`: the routes, readiness, and the listener's connection limits
//!   and deadlines.
//! - `ledger`: a thread's approvals as a state machine, from its audit trail.
//! - `request_error`: why a request has no answer (the answer's error text).
//! - `views`: claims and sessions as JSON.

mod alert;
mod auth;
mod blocking;
mod claims_release;
mod console;
mod html_escape;
mod http;
mod json_error;
mod ledger;
mod login_page;
pub mod metrics;
mod request_error;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::audit::AuditSink;
use crate::claims::ClaimStore;
use crate::wire::proxy::Proxy;

pub use auth::AdminAuth;
pub use console::ChainCheck;
pub use http::{metrics_router, router, AdminLimits, DEFAULT_MAX_CONNECTIONS};
pub use ledger::{thread_ledger, ApprovalState, ThreadLedger};

/// Why the admin listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "admin listener on {addr} (give admin_listen another address, \"auto\" for a free \
         port, or \"off\": --admin-listen, RESUMEGUARD_ADMIN_LISTEN)"
    )]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "metrics listener on {addr} (give [admin] metrics_listen another address, or leave \
         it out)"
    )]
    MetricsListen {
        addr: String,
        source: std::io::Error,
    },
    #[error("the admin listener's local address")]
    LocalAddr(#[source] std::io::Error),
    #[error("the latency buckets of {}", crate::metrics::STATEMENT_SECONDS)]
    Buckets(#[source] metrics_exporter_prometheus::BuildError),
    #[error("installing the metrics recorder")]
    Recorder(
        #[source] ::metrics::SetRecorderError<metrics_exporter_prometheus::PrometheusRecorder>,
    ),
}

/// Where the admin listener goes when nothing says otherwise.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:6433";

/// How often histogram samples are folded in when nobody scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// `[admin]` in the configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The token every admin route but `/healthz` and `/readyz` needs
    /// (bearer, or the console's login); absent: those routes answer 403,
    /// all but `/metrics`.
    pub token: Option<String>,
    /// A file holding the token (its trailing newline dropped), read at
    /// start and at every reload; instead of `token`.
    pub token_file: Option<std::path::PathBuf>,
    /// Admin connections served at once (never more than a quarter of the
    /// process's file-descriptor limit); the next wait to be accepted.
    pub max_connections: usize,
    /// An address where `/metrics` alone answers, without the token (for
    /// Prometheus); absent: `/metrics` is on the admin listener only.
    pub metrics_listen: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            token: None,
            token_file: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            metrics_listen: None,
        }
    }
}

/// Where `auto` listens: a free port of the loopback interface.
const AUTO_ADMIN_LISTEN: &str = "127.0.0.1:0";

/// The admin listener's address as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminListen {
    /// `off`.
    Off,
    /// `auto`: a port the system picks on 127.0.0.1 (logged, and printed
    /// as `ADMIN_URL=`).
    Auto,
    /// An address ([`DEFAULT_ADMIN_LISTEN`] when nothing is configured):
    /// one that is taken (another proxy on the host) stops the proxy at
    /// start, naming it.
    Addr(String),
}

impl AdminListen {
    pub fn parse(setting: Option<&str>) -> AdminListen {
        match setting {
            None => AdminListen::Addr(DEFAULT_ADMIN_LISTEN.to_owned()),
            Some("off") => AdminListen::Off,
            Some("auto") => AdminListen::Auto,
            Some(addr) => AdminListen::Addr(addr.to_owned()),
        }
    }
}

/// What the admin endpoints read and act on.
pub struct AdminState {
    pub proxy: Arc<Proxy>,
    /// Renders the recorder the counters go to.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub audit: AuditSink,
    /// The trail `/threads/{id}` reads: this replica's SQLite file, or the
    /// PostgreSQL table of every replica.
    pub audit_trail: Option<crate::audit::TrailSource>,
    /// The consume-once leg's store; `None` with the leg off (then
    /// `claims_at` is opened per request, as `resumeguard claims` does).
    pub claims: Option<Arc<ClaimStore>>,
    /// Where the claims are, or why no store is configured.
    pub claims_at: Result<crate::pg::PgTarget, Arc<dyn std::error::Error + Send + Sync>>,
    /// The token of every guarded route (a reload may change it).
    pub token: AdminToken,
    /// Console sessions and failed logins.
    pub auth: AdminAuth,
    /// The console's last walk of the audit chain.
    pub chain_check: ChainCheck,
    /// The configuration in effect and its reload (`GET /config`, `POST
    /// /reload`); `None`: those endpoints answer 404.
    pub control: Option<Arc<dyn AdminControl>>,
}

/// The bearer token of the mutating endpoints, replaceable while the
/// proxy runs (a reload that read a new `[admin] token` or `token_file`).
#[derive(Debug, Clone, Default)]
pub struct AdminToken(Arc<arc_swap::ArcSwapOption<String>>);

impl AdminToken {
    pub fn new(token: Option<String>) -> AdminToken {
        AdminToken(Arc::new(arc_swap::ArcSwapOption::new(token.map(Arc::new))))
    }

    /// The token in effect; `None`: the mutating endpoints are off.
    pub fn current(&self) -> Option<Arc<String>> {
        self.0.load_full()
    }

    pub fn replace(&self, token: Option<String>) {
        self.0.store(token.map(Arc::new));
    }
}

/// What the admin API asks of the running proxy's configuration. Both
/// block (files are read): they run on the blocking pool.
pub trait AdminControl: Send + Sync {
    /// The configuration in effect, as `resumeguard config show` prints it.
    fn config(&self) -> String;
    /// Reads the configuration and the files it names again, as SIGHUP
    /// does; what each part did.
    fn reload(&self) -> serde_json::Value;
}

/// Binds the admin listener (and `metrics_listen`, `/metrics` alone, when
/// given), installs the process's metrics recorder and
/// serves the endpoints on the current runtime until it stops, within
/// `limits`. Returns the address served, or `None` when the admin
/// listener is off; the counters are then no-ops. An address that cannot
/// be listened on (taken) is an error.
pub async fn start(
    listen: &AdminListen,
    metrics_listen: Option<&str>,
    limits: AdminLimits,
    state: impl FnOnce(metrics_exporter_prometheus::PrometheusHandle) -> AdminState,
) -> Result<Option<SocketAddr>, AdminError> {
    let addr = match listen {
        AdminListen::Off => return Ok(None),
        AdminListen::Auto => AUTO_ADMIN_LISTEN,
        AdminListen::Addr(addr) => addr.as_str(),
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Listen {
            addr: addr.to_owned(),
            source,
        })?;
    let local = listener.local_addr().map_err(AdminError::LocalAddr)?;
    let metrics_listener = match metrics_listen {
        Some(addr) => {
            Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| AdminError::MetricsListen {
                        addr: addr.to_owned(),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let recorder = self::metrics::recorder()?;
    let handle = recorder.handle();
    ::metrics::set_global_recorder(recorder).map_err(AdminError::Recorder)?;
    self::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let state = Arc::new(state(handle));
    if let Some(l) = metrics_listener {
        let at = l.local_addr().map_err(AdminError::LocalAddr)?;
        tracing::info!(listen = %at, "metrics listener (/metrics alone, no token)");
        let app = metrics_router(Arc::clone(&state));
        tokio::spawn(http::serve(l, app, limits.clone()));
    }
    let app = router(state);
    tokio::spawn(http::serve(listener, app, limits));
    Ok(Some(local))
}
