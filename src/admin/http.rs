//! The admin API's routes. Everything that blocks (SQLite, a connect to
//! the upstream) runs on tokio's blocking pool, so the runtime that
//! accepts client connections never waits for it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::ledger::thread_ledger;
use super::metrics::scrape_time;
use super::views::{ClaimView, SessionView};
use super::AdminState;
use crate::claims::{ClaimStore, Now, StoreError};
use crate::error_chain::chain;
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

/// Every admin endpoint.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/sessions", get(sessions))
        .route("/claims", get(claims))
        .route("/claims/release", post(release))
        .route("/threads/{id}", get(thread))
        .route("/config", get(config))
        .route("/reload", post(reload))
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
        probe_upstream(&proxy.config, &user, timeout)
    });
    let store = s.claims.clone();
    let claims = async move {
        match store {
            Some(st) => Some(
                blocking(move || {
                    st.run_lease("", "", Now::STORE)
                        .map(drop)
                        .map_err(|e| e.to_string())
                })
                .await,
            ),
            None => None,
        }
    };
    let checks = async { tokio::join!(upstream, claims) };
    let (upstream, claims) = match tokio::time::timeout(READY_DEADLINE, checks).await {
        Ok(done) => done,
        Err(_) => (
            Err("no answer in time".to_owned()),
            s.claims
                .as_ref()
                .map(|_| Err("no answer in time".to_owned())),
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

fn check_json(r: &Result<(), String>, address: Option<&str>) -> serde_json::Value {
    let mut v = match r {
        Ok(()) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "error": e}),
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
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e),
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

async fn release(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refusal(&s, &headers) {
        return refused;
    }
    let req: ReleaseRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("expected {{\"thread\": …, \"checkpoint\": …}}: {e}");
            return error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let thread = req.thread.clone();
    let released =
        blocking(move || with_store(&s, |st| st.release(&req.thread, req.checkpoint.as_deref())))
            .await;
    match released {
        Ok(n) => {
            tracing::info!(thread = %shown(&thread), released = n, "claims released through the admin API");
            Json(json!({"released": n})).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e),
    }
}

async fn thread(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(trail) = s.audit_trail.clone() else {
        return error(StatusCode::NOT_FOUND, "no audit trail is configured");
    };
    let source = trail.describe();
    let thread_id = id.clone();
    let events = blocking(move || {
        trail
            .thread_events(&thread_id)
            .map_err(|e| chain(&e).to_string())
    })
    .await;
    match events {
        Ok(events) if events.iter().any(|e| e.thread_id.as_deref() == Some(&id)) => {
            let mut ledger = thread_ledger(&id, events);
            ledger.source = source;
            Json(ledger).into_response()
        }
        Ok(_) => error(StatusCode::NOT_FOUND, "no audit events for this thread"),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e),
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
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}

/// `POST /reload`: what SIGHUP does (the configuration file, the rules,
/// the certificates, the JSONL file), answered with each part's outcome.
async fn reload(State(s): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(refused) = refusal(&s, &headers) {
        return refused;
    }
    let Some(control) = s.control.clone() else {
        return error(StatusCode::NOT_FOUND, "nothing to reload");
    };
    tracing::info!("reload requested through the admin API");
    match blocking(move || Ok(control.reload())).await {
        Ok(outcome) => Json(outcome).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}

/// Mutating endpoints need `Authorization: Bearer <[admin] token>`; with
/// no token configured they are off (403). The answer to a request that
/// may not go on, if this is one.
fn refusal(s: &AdminState, headers: &HeaderMap) -> Option<Response> {
    let Some(token) = s.token.current() else {
        return Some(error(
            StatusCode::FORBIDDEN,
            "mutating endpoints are disabled: no [admin] token is configured",
        ));
    };
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compared as digests: the time taken says nothing about the token.
    match given {
        Some(g) if Sha256::digest(g.as_bytes()) == Sha256::digest(token.as_bytes()) => None,
        _ => {
            let mut r = error(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
            r.headers_mut().insert(
                WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            Some(r)
        }
    }
}

/// The consume-once leg's store, or the configured file opened for this
/// request (the leg is off, as for `resumeguard claims`).
fn with_store<T>(
    s: &AdminState,
    f: impl FnOnce(&ClaimStore) -> Result<T, StoreError>,
) -> Result<T, String> {
    match &s.claims {
        Some(store) => f(store).map_err(|e| e.to_string()),
        None => {
            let at = s.claims_at.as_ref().map_err(String::clone)?;
            let store = ClaimStore::open_existing_at(at).map_err(|e| e.to_string())?;
            f(&store).map_err(|e| e.to_string())
        }
    }
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(format!("admin task failed: {e}")))
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

#[cfg(test)]
mod tests;
