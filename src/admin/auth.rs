//! Who may use the admin listener: every route but `/healthz`,
//! `/readyz`, the console's login form and its static files needs the
//! `[admin] token`, as `Authorization: Bearer <token>` or as a console
//! session cookie opened by the login form. Both are compared in constant
//! time. A request carried by the cookie that changes anything must also
//! carry the session's CSRF token (a form field on the console's forms, an
//! `X-CSRF-Token` header elsewhere). With no token configured, nothing
//! but `/metrics` (and the two probes) answers: the data routes, the
//! console and the mutating routes say to set `[admin] token`.
//!
//! - `console_sessions`: login sessions and their CSRF tokens.
//! - `login_limit`: failed logins per client address.

mod console_sessions;
mod login_limit;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE, LOCATION, SET_COOKIE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use console_sessions::{ConsoleSession, ConsoleSessions, SESSION_COOKIE, SESSION_LIFETIME};
pub use login_limit::{LoginLimit, WINDOW};

use super::json_error::json_error;
use super::login_page::{login_page, safe_next};
use super::AdminState;
use crate::log_text::shown;

type Shared = Arc<AdminState>;

/// The header a cookie-carried request outside the console's forms names
/// its session's CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The admin listener's logins: sessions open, failures counted.
#[derive(Default)]
pub struct AdminAuth {
    pub sessions: ConsoleSessions,
    pub logins: LoginLimit,
}

/// The address of the peer of an admin connection, set on each request
/// by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Lets a request on to its route only with the token (see the module
/// doc); with a console session, the request carries it as an extension.
pub async fn require_token(State(s): State<Shared>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let Some(token) = s.token.current() else {
        if path == "/metrics" {
            return next.run(req).await;
        }
        return no_token(&path);
    };
    if bearer_matches(req.headers(), &token) {
        return next.run(req).await;
    }
    if let Some(session) = cookie_session(&s, req.headers(), &token) {
        let reads = matches!(*req.method(), Method::GET | Method::HEAD);
        // The console's forms carry the token in their body, checked by
        // their handlers; anything else names it in a header.
        if !reads && !path.starts_with("/ui/") {
            let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
            if !given.is_some_and(|g| session.csrf_matches(g)) {
                return json_error(
                    StatusCode::FORBIDDEN,
                    "a console session's request that changes anything needs its CSRF token (X-CSRF-Token)",
                );
            }
        }
        req.extensions_mut().insert(session);
        return next.run(req).await;
    }
    unauthorized(&path)
}

/// The answer of every guarded route while no token is configured.
fn no_token(path: &str) -> Response {
    let msg = "the admin API's data routes, its mutating routes and the console are off: \
               set [admin] token (or token_file) to use them";
    if path == "/ui" || path.starts_with("/ui/") {
        let page = login_page(None, msg);
        return (StatusCode::FORBIDDEN, page).into_response();
    }
    json_error(StatusCode::FORBIDDEN, msg)
}

/// 401: the console's login form for its pages, JSON elsewhere.
fn unauthorized(path: &str) -> Response {
    let mut r = if path == "/ui" || path.starts_with("/ui/") {
        let next = Some(path).filter(|p| *p != "/ui/logout");
        (StatusCode::UNAUTHORIZED, login_page(next, "")).into_response()
    } else {
        json_error(StatusCode::UNAUTHORIZED, "a valid bearer token is required")
    };
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same_secret(given, token))
}

/// Compared as digests, in constant time: neither the time taken nor the
/// lengths say anything about the token.
fn same_secret(given: &str, token: &str) -> bool {
    bool::from(Sha256::digest(given.as_bytes()).ct_eq(&Sha256::digest(token.as_bytes())))
}

fn cookie_session(s: &AdminState, headers: &HeaderMap, token: &str) -> Option<ConsoleSession> {
    let id = session_cookie(headers)?;
    s.auth.sessions.find(id, token)
}

/// The session cookie's value among the request's cookies.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
    /// The console page to go to after the login.
    #[serde(default)]
    next: String,
}

/// `POST /ui/login`: the token typed into the console's login form.
pub async fn login(
    State(s): State<Shared>,
    peer: Option<Extension<PeerAddr>>,
    Form(form): Form<LoginForm>,
) -> Response {
    let addr = peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |Extension(p)| p.0.ip());
    let next = safe_next(&form.next);
    let Some(token) = s.token.current() else {
        return no_token("/ui");
    };
    if s.auth.logins.blocked(addr) {
        tracing::warn!(client = %shown(&addr.to_string()), "console login refused: too many failed logins from this address");
        let msg = format!(
            "too many failed logins from this address: wait up to {} s",
            WINDOW.as_secs()
        );
        let page = login_page(Some(next), &msg);
        return (StatusCode::TOO_MANY_REQUESTS, page).into_response();
    }
    if !same_secret(&form.token, &token) {
        let failures = s.auth.logins.failed(addr);
        tracing::warn!(client = %shown(&addr.to_string()), failures, "console login refused: wrong token");
        let page = login_page(Some(next), "that is not the admin token");
        return (StatusCode::UNAUTHORIZED, page).into_response();
    }
    match s.auth.sessions.open(&token) {
        Ok((id, _)) => {
            tracing::info!(client = %shown(&addr.to_string()), "console login");
            let cookie = format!(
                "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                SESSION_LIFETIME.as_secs()
            );
            let mut r = StatusCode::SEE_OTHER.into_response();
            if let (Ok(c), Ok(l)) = (HeaderValue::from_str(&cookie), HeaderValue::from_str(next)) {
                r.headers_mut().insert(SET_COOKIE, c);
                r.headers_mut().insert(LOCATION, l);
            }
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "console login failed");
            json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
        }
    }
}

#[derive(Deserialize)]
pub struct LogoutForm {
    csrf: String,
}

/// `POST /ui/logout`: ends the console session.
pub async fn logout(
    State(s): State<Shared>,
    session: Option<Extension<ConsoleSession>>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    let Some(Extension(session)) = session else {
        return json_error(StatusCode::BAD_REQUEST, "no console session to end");
    };
    if !session.csrf_matches(&form.csrf) {
        return json_error(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is not this session's",
        );
    }
    if let Some(id) = session_cookie(&headers) {
        s.auth.sessions.close(id);
    }
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(LOCATION, HeaderValue::from_static("/ui/login"));
    r.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static("rg_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    r
}
