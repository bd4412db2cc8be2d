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
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{self, PeerAddr};
use super::blocking::{blocking, with_store};
use super::claims_release::{release_claims, Requester};
use super::console;
use super::json_error::json_error;
use super::ledger::thread_ledger;
use super::metrics::scrape_time;
use super::request_error::RequestError;
use super::views::{ClaimView, SessionView};
use super::AdminState;
use crate::claims::Now;
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
/// anyone; the rest need the token (`admin::auth`).
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
        Err(e) => json_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
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

async fn release(
    State(s): State<Shared>,
    peer: Option<Extension<PeerAddr>>,
    body: Bytes,
) -> Response {
    let req: ReleaseRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("expected {{\"thread\": …, \"checkpoint\": …}}: {e}");
            return json_error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let requester = Requester {
        addr: peer.map(|Extension(p)| p.0),
        via: "admin_api",
    };
    match release_claims(s, req.thread, req.checkpoint, requester).await {
        Ok(n) => Json(json!({"released": n})).into_response(),
        Err(e) => json_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

async fn thread(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(trail) = s.audit_trail.clone() else {
        return json_error(StatusCode::NOT_FOUND, &RequestError::NoTrail.to_string());
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
        Ok(_) => json_error(StatusCode::NOT_FOUND, "no audit events for this thread"),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `GET /config`: the configuration in effect as TOML, each value with its
/// source, secrets redacted.
async fn config(State(s): State<Shared>) -> Response {
    let Some(control) = s.control.clone() else {
        return json_error(StatusCode::NOT_FOUND, "no configuration to show");
    };
    match blocking(move || Ok(control.config())).await {
        Ok(text) => ([(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response(),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `POST /reload`: what SIGHUP does (the configuration file, the rules,
/// the certificates, the JSONL file), answered with each part's outcome.
async fn reload(State(s): State<Shared>) -> Response {
    let Some(control) = s.control.clone() else {
        return json_error(StatusCode::NOT_FOUND, "nothing to reload");
    };
    tracing::info!("reload requested through the admin API");
    match blocking(move || Ok(control.reload())).await {
        Ok(outcome) => Json(outcome).into_response(),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[cfg(test)]
mod tests;
