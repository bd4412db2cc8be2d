//! The admin API's routes. Everything that blocks (SQLite, a connect to
//! the upstream) runs on tokio's blocking pool, so the runtime that
//! accepts client connections never waits for it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth;
use super::console;
use super::ledger::thread_ledger;
use super::metrics::scrape_time;
use super::request_error::RequestError;
use super::views::{ClaimView, SessionView};
use super::AdminState;
use crate::audit::{AuditEvent, Operation, SessionContext};
use crate::claims::{ClaimStore, Now, StoreError};
use crate::log_text::shown;
use crate::wire::upstream_probe::probe_upstream;

/// Longest connect, TLS handshake step or wait for the startup's answer
/// `/readyz` allows the upstream.
const READY_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest `/readyz` takes in all (a claim store locked by another
/// process counts as not ready).
const READY_DEADLINE: Duration = Duration::from_secs(3);

type Shared = Arc<AdminState>;

mod connections;
pub use connections::{serve, AdminLimits, DEFAULT_MAX_CONNECTIONS};

/// Every admin endpoint: the probes and the console's login answer
/// anyone; the rest need the token ([`auth`](super::auth)).
pub fn router(state: Shared) -> Router {
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/sessions", get(sessions))
        .route("/claims", get(claims))
        .route("/claims/release", post(release))
        .route("/threads/{id}", get(thread))
        .route("/config", get(config))
        .route("/reload", post(reload))
        .merge(console::guarded_routes())
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require_token,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(console::open_routes())
        .merge(guarded)
        .with_state(state)
}

/// `/metrics` alone, answering without the token: the router of
/// `[admin] metrics_listen`.
pub fn metrics_router(state: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn metrics(State(s): State<Shared>) -> Response {
    let mut body = s.metrics.render();
    body.push_str(&scrape_time(&s.proxy, &s.audit));
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The process is up and its runtime answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready to serve: not shutting down, the upstream answers a startup
/// (over TLS when its sslmode asks for it), and (with consume-once on) the claim store answers.
async fn readyz(State(s): State<Shared>) -> Response {
    let draining = s.proxy.sessions.draining();
    let proxy = Arc::clone(&s.proxy);
    let timeout = READY_CONNECT_TIMEOUT.min(s.proxy.config.connect_timeout);
    let shown = s.proxy.config.upstream.to_string();
    let upstream = blocking(move || {
        let user = std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into());
        Ok(probe_upstream(&proxy.config, &user, timeout)?)
    });
    let store = s.claims.clone();
    let claims = async move {
        match store {
            Some(st) => {
                Some(blocking(move || Ok(st.run_lease("", "", Now::STORE).map(drop)?)).await)
            }
            None => None,
        }
    };
    let checks = async { tokio::join!(upstream, claims) };
    let (upstream, claims) = match tokio::time::timeout(READY_DEADLINE, checks).await {
        Ok(done) => done,
        Err(_) => (
            Err(RequestError::Timeout),
            s.claims.as_ref().map(|_| Err(RequestError::Timeout)),
        ),
    };
    let ready = !draining && upstream.is_ok() && claims.as_ref().is_none_or(|c| c.is_ok());
    let body = json!({
        "ready": ready,
        "draining": draining,
        "upstream": check_json(&upstream, Some(&shown)),
        "claims_store": claims.as_ref().map(|c| check_json(c, None)),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

fn check_json(r: &Result<(), RequestError>, address: Option<&str>) -> serde_json::Value {
    let mut v = match r {
        Ok(()) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    if let Some(a) = address {
        v["address"] = json!(a);
    }
    v
}

async fn sessions(State(s): State<Shared>) -> Response {
    let list: Vec<SessionView> = s
        .proxy
        .sessions
        .snapshot()
        .iter()
        .map(SessionView::from)
        .collect();
    Json(list).into_response()
}

#[derive(Deserialize)]
struct ClaimsQuery {
    thread: Option<String>,
}

async fn claims(State(s): State<Shared>, Query(q): Query<ClaimsQuery>) -> Response {
    let listed = blocking(move || with_store(&s, |st| st.list(q.thread.as_deref()))).await;
    match listed {
        Ok(records) => {
            Json(records.iter().map(ClaimView::from).collect::<Vec<_>>()).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// `POST /claims/release` with `{"thread": T, "checkpoint": C?}`: as
/// `resumeguard claims release`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    thread: String,
    checkpoint: Option<String>,
}

async fn release(State(s): State<Shared>, body: Bytes) -> Response {
    let req: ReleaseRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("expected {{\"thread\": …, \"checkpoint\": …}}: {e}");
            return error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    match release_claims(s, req.thread, req.checkpoint, "admin_api").await {
        Ok(n) => Json(json!({"released": n})).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// Releases the thread's claims (one checkpoint's, when named), logs it
/// and records it in the audit trail (`claim_released`, `via` the route
/// that asked); how many were released.
pub(super) async fn release_claims(
    s: Shared,
    thread: String,
    checkpoint: Option<String>,
    via: &'static str,
) -> Result<usize, RequestError> {
    let (t, c) = (thread.clone(), checkpoint.clone());
    let audit = s.audit.clone();
    let n = blocking(move || with_store(&s, |st| st.release(&t, c.as_deref()))).await?;
    tracing::info!(thread = %shown(&thread), released = n, via, "claims released through the admin API");
    let mut ev = AuditEvent::new(&SessionContext::internal(), Operation::ClaimReleased)
        .with_thread(thread)
        .with_detail(json!({"released": n, "via": via}));
    ev.checkpoint_id = checkpoint;
    audit.record(ev);
    Ok(n)
}

async fn thread(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(trail) = s.audit_trail.clone() else {
        return error(StatusCode::NOT_FOUND, "no audit trail is configured");
    };
    let source = trail.describe();
    let thread_id = id.clone();
    let events =
        blocking(move || trail.thread_events(&thread_id).map_err(RequestError::Trail)).await;
    match events {
        Ok(events) if events.iter().any(|e| e.thread_id.as_deref() == Some(&id)) => {
            let mut ledger = thread_ledger(&id, events);
            ledger.source = source;
            Json(ledger).into_response()
        }
        Ok(_) => error(StatusCode::NOT_FOUND, "no audit events for this thread"),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `GET /config`: the configuration in effect as TOML, each value with its
/// source, secrets redacted.
async fn config(State(s): State<Shared>) -> Response {
    let Some(control) = s.control.clone() else {
        return error(StatusCode::NOT_FOUND, "no configuration to show");
    };
    match blocking(move || Ok(control.config())).await {
        Ok(text) => ([(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `POST /reload`: what SIGHUP does (the configuration file, the rules,
/// the certificates, the JSONL file), answered with each part's outcome.
async fn reload(State(s): State<Shared>) -> Response {
    let Some(control) = s.control.clone() else {
        return error(StatusCode::NOT_FOUND, "nothing to reload");
    };
    tracing::info!("reload requested through the admin API");
    match blocking(move || Ok(control.reload())).await {
        Ok(outcome) => Json(outcome).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// The consume-once leg's store, or the configured file opened for this
/// request (the leg is off, as for `resumeguard claims`).
pub(super) fn with_store<T>(
    s: &AdminState,
    f: impl FnOnce(&ClaimStore) -> Result<T, StoreError>,
) -> Result<T, RequestError> {
    match &s.claims {
        Some(store) => Ok(f(store)?),
        None => {
            let at = s
                .claims_at
                .as_ref()
                .map_err(|why| RequestError::NoStore(Arc::clone(why)))?;
            let store = ClaimStore::open_existing(at.clone())?;
            Ok(f(&store)?)
        }
    }
}

/// Runs `f` on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RequestError> + Send + 'static,
) -> Result<T, RequestError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(RequestError::Task(e)))
}

pub(super) fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

#[cfg(test)]
mod tests;
