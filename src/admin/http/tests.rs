//! The admin routes called as a client would (`Router::oneshot`), against
//! real stores (audit SQLite files in the temp dir, claims in the test
//! PostgreSQL) and real sockets.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::body::{to_bytes, Body};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, Request};
use serde_json::Value;
use tower::ServiceExt;

use super::*;
use crate::admin::{AdminControl, AdminToken};
use crate::audit::{AuditEvent, AuditSink, Operation, SessionContext};
use crate::claims::{ClaimKey, ClaimStore, Holder};
use crate::config::claims_location::LocationError;
use crate::enforce::{Enforcement, Legs};
use crate::saver::classify::Classifier;
use crate::saver::profile::profiles_for;
use crate::wire::client_stream::ClientStream;
use crate::wire::guard::SessionInfo;
use crate::wire::proxy::{Proxy, RelayConfig};
use crate::wire::registry::{SessionHandle, SessionSummary};
use crate::wire::upstream::{Upstream, UpstreamAddr};

fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "resumeguard-admin-{name}-{}-{n}.sqlite",
        std::process::id()
    ))
}

fn proxy(upstream: SocketAddr) -> Arc<Proxy> {
    let enforcement = Arc::new(Enforcement::new(
        Arc::new(Classifier::new(profiles_for(None).unwrap())),
        Legs::default(),
        AuditSink::disabled(),
    ));
    let relay = RelayConfig {
        upstream: UpstreamAddr::Tcp(upstream.to_string()),
        ..RelayConfig::default()
    };
    Arc::new(Proxy::new(relay, Arc::new(enforcement)))
}

struct Setup {
    upstream: SocketAddr,
    token: Option<String>,
    audit_db: Option<PathBuf>,
    claims: Option<Arc<ClaimStore>>,
}

impl Setup {
    fn new(upstream: SocketAddr) -> Self {
        Setup {
            upstream,
            token: Some("s3cret".into()),
            audit_db: None,
            claims: None,
        }
    }

    fn state(self) -> Shared {
        Arc::new(AdminState {
            proxy: proxy(self.upstream),
            metrics: super::super::metrics::recorder().unwrap().handle(),
            audit: AuditSink::disabled(),
            audit_trail: self.audit_db.map(crate::audit::TrailSource::Sqlite),
            claims: self.claims,
            claims_at: Err(Arc::new(LocationError::NoDatabase)),
            token: super::super::AdminToken::new(self.token),
            auth: Default::default(),
            chain_check: Default::default(),
            control: None,
        })
    }
}

/// An address nothing listens on.
fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn call(state: &Shared, req: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let res = router(Arc::clone(state)).oneshot(req).await.unwrap();
    let (status, headers) = (res.status(), res.headers().clone());
    let body = to_bytes(res.into_body(), 1 << 24).await.unwrap();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// A GET with the token in effect, if any.
async fn get(state: &Shared, uri: &str) -> (StatusCode, String) {
    let mut req = Request::get(uri);
    if let Some(t) = state.token.current() {
        req = req.header(AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Body::empty()).unwrap();
    let (status, _, body) = call(state, req).await;
    (status, body)
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A socket that answers every startup as PostgreSQL does for a password
/// login (AuthenticationCleartextPassword); the real server's answers are
/// the integration tests' (`integration/test_tls_verify.py`).
fn answering_upstream() -> SocketAddr {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in l.incoming().flatten() {
            let mut len = [0u8; 4];
            if conn.read_exact(&mut len).is_err() {
                continue;
            }
            let mut rest = vec![0u8; (i32::from_be_bytes(len) as usize).saturating_sub(4)];
            if conn.read_exact(&mut rest).is_ok() {
                let _ = conn.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]);
            }
        }
    });
    addr
}

#[tokio::test]
async fn readyz_follows_the_upstream_and_the_drain() {
    let state = Setup::new(answering_upstream()).state();
    let (status, body) = get(&state, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["upstream"]["ok"], true);

    // A port that accepts but never answers the startup is not an upstream.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let (status, body) = get(&Setup::new(mute.local_addr().unwrap()).state(), "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let error = json_of(&body)["upstream"]["error"].to_string();
    assert!(error.contains("no answer to the startup"), "{body}");

    state.proxy.sessions.begin_drain();
    let (status, body) = get(&state, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(json_of(&body)["draining"], true);

    let down = Setup::new(closed_port()).state();
    let (status, body) = get(&down, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let v = json_of(&body);
    assert_eq!(v["ready"], false);
    assert_eq!(v["upstream"]["ok"], false);
    assert!(
        v["upstream"]["error"].as_str().unwrap().contains("refused"),
        "{body}"
    );
    // The process itself is up.
    assert_eq!(get(&down, "/healthz").await.0, StatusCode::OK);
}

/// Runs `test` on a runtime of its own: a claim store is made and dropped
/// outside it (its blocking client runs a runtime of its own, as `serve`
/// makes the legs outside the proxy's).
fn on_a_runtime<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test)
}

#[test]
fn readyz_checks_the_claim_store() {
    let store = Arc::new(crate::test_pg_server::unreachable());
    on_a_runtime(async {
        let mut setup = Setup::new(answering_upstream());
        setup.claims = Some(Arc::clone(&store));
        let (status, body) = get(&setup.state(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let v = json_of(&body);
        assert_eq!(
            (v["upstream"]["ok"].clone(), v["claims_store"]["ok"].clone()),
            (true.into(), false.into())
        );
    });
}

#[tokio::test]
async fn metrics_renders_counters_and_scrape_time_values() {
    let state = Setup::new(closed_port()).state();
    let (status, body) = get(&state, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for line in [
        "resumeguard_client_connections_open 0",
        "resumeguard_audit_queue_depth 0",
        "resumeguard_audit_events_dropped_total 0",
        "# TYPE resumeguard_unknown_saver_statements_total counter",
        concat!(
            "resumeguard_build_info{version=\"",
            env!("CARGO_PKG_VERSION"),
            "\"} 1"
        ),
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_open_fds gauge",
    ] {
        assert!(body.lines().any(|l| l == line), "{line} missing:\n{body}");
    }
}

#[tokio::test]
async fn sessions_lists_who_is_connected() {
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let state = Setup::new(upstream.local_addr().unwrap()).state();
    let client = TcpStream::connect(upstream.local_addr().unwrap()).unwrap();
    let server = TcpStream::connect(upstream.local_addr().unwrap()).unwrap();
    let info = SessionInfo {
        session_id: 7,
        client_addr: "127.0.0.1:50007".into(),
        user: "alice".into(),
        database: "app".into(),
        application_name: "worker-1".into(),
        inspection_listener: false,
    };
    let guard = state.proxy.guards.guard(info.clone());
    let handle = Arc::new(SessionHandle::new(
        Arc::new(ClientStream::Plain(client)),
        Arc::new(Upstream::Tcp(server)),
        Arc::new(Mutex::new(guard)),
    ));
    let _ = handle.summary.set(SessionSummary::of(&info));
    let registered = state.proxy.sessions.register(7, handle);
    let (status, body) = get(&state, "/sessions").await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&body);
    let s = &v[0];
    assert_eq!(
        (s["id"].clone(), s["user"].clone()),
        (7.into(), "alice".into())
    );
    assert_eq!(s["database"], "app");
    assert_eq!(s["application_name"], "worker-1");
    assert_eq!(s["peer"], "127.0.0.1:50007");
    assert!(s["started_at"].as_str().unwrap().ends_with('Z'));
    drop(registered);
    assert_eq!(get(&state, "/sessions").await.1, "[]");
}

fn held_claim(store: &ClaimStore, thread: &str) {
    let key = ClaimKey {
        at: crate::saver::checkpoint_ref::CheckpointRef {
            thread_id: thread.into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "1f0-c1".into(),
        },
        fingerprint: "ab".repeat(32),
    };
    let holder = Holder {
        proxy_id: "px".into(),
        session_id: 3,
        client_addr: "127.0.0.1:50003".into(),
        application_name: "ui".into(),
    };
    store
        .try_claim(&key, &holder, crate::claims::Now::STORE, 60_000)
        .unwrap();
}

fn release_request(token: Option<&str>) -> Request<Body> {
    let mut req = Request::post("/claims/release").header(CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(AUTHORIZATION, format!("Bearer {t}"));
    }
    req.body(Body::from(r#"{"thread": "t-rel"}"#)).unwrap()
}

#[test]
fn claims_are_listed_and_released_only_with_the_token() {
    let db = crate::test_pg_server::PgSchema::new("admin-claims");
    let store = Arc::new(db.open());
    held_claim(&store, "t-rel");
    on_a_runtime(async {
        let mut setup = Setup::new(closed_port());
        setup.claims = Some(Arc::clone(&store));
        setup.token = None;
        let no_token = setup.state();
        let (status, _, body) = call(&no_token, release_request(Some("anything"))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

        let mut setup = Setup::new(closed_port());
        setup.claims = Some(Arc::clone(&store));
        setup.token = Some("s3cret".into());
        let state = setup.state();
        let (status, body) = get(&state, "/claims?thread=t-rel").await;
        assert_eq!(status, StatusCode::OK);
        let v = json_of(&body);
        assert_eq!(v.as_array().unwrap().len(), 1, "{body}");
        assert_eq!(v[0]["state"], "held");
        assert_eq!(v[0]["holder"]["application_name"], "ui");
        assert_eq!(get(&state, "/claims?thread=other").await.1, "[]");

        let (status, headers, _) = call(&state, release_request(None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(headers[WWW_AUTHENTICATE], "Bearer");
        let (status, _, _) = call(&state, release_request(Some("s3cre"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(json_of(&get(&state, "/claims").await.1)[0]["state"], "held");

        let (status, _, body) = call(&state, release_request(Some("s3cret"))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(json_of(&body)["released"], 1);
        assert_eq!(
            json_of(&get(&state, "/claims").await.1)[0]["state"],
            "released"
        );

        let bad = Request::post("/claims/release")
            .header(AUTHORIZATION, "Bearer s3cret")
            .body(Body::from(r#"{"thread_id": "t-rel"}"#))
            .unwrap();
        assert_eq!(call(&state, bad).await.0, StatusCode::BAD_REQUEST);
        drop(state);
        drop(no_token);
    });
}

#[tokio::test]
async fn threads_shows_the_ledger_from_the_audit_db() {
    let db = scratch("audit");
    let mut store = crate::audit::Store::open(&db).unwrap();
    let runner = SessionContext {
        session_id: 1,
        application_name: "runner".into(),
        ..SessionContext::default()
    };
    let mut parked = AuditEvent::new(&runner, Operation::InterruptParked)
        .with_thread("t-led")
        .with_checkpoint("", "1f0-c1");
    parked.task_id = Some("task-gate".into());
    let other = AuditEvent::new(&runner, Operation::ReadLatest).with_thread("t-other");
    store.append([&parked, &other]).unwrap();

    let mut setup = Setup::new(closed_port());
    setup.audit_db = Some(db.clone());
    let state = setup.state();
    let (status, body) = get(&state, "/threads/t-led").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = json_of(&body);
    assert_eq!(v["state"], "parked");
    assert_eq!(v["approvals"][0]["parked"]["application_name"], "runner");
    assert_eq!(v["approvals"][0]["tasks"][0], "task-gate");
    assert_eq!(v["timeline"].as_array().unwrap().len(), 1);
    let source = v["source"].as_str().unwrap();
    assert!(
        source.starts_with("sqlite ") && source.ends_with("(this replica)"),
        "{source}"
    );
    assert_eq!(
        get(&state, "/threads/t-none").await.0,
        StatusCode::NOT_FOUND
    );
    let none = Setup::new(closed_port()).state();
    assert_eq!(get(&none, "/threads/t-led").await.0, StatusCode::NOT_FOUND);
    // The console's pages of the trail answer as the API does.
    for path in ["/ui/waiting", "/ui/threads/t-led"] {
        let (status, body) = get(&none, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(
            body.contains("no audit trail is configured"),
            "{path}: {body}"
        );
    }
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// A proxy's configuration that counts its reloads and changes the token
/// at the first, as a reload that read a new token file does.
struct Control {
    reloads: AtomicU64,
    token: AdminToken,
}

impl AdminControl for Control {
    fn config(&self) -> String {
        format!(
            "listen = \"x\"  # default\n# reloads {}\n",
            self.reloads.load(Ordering::SeqCst)
        )
    }

    fn reload(&self) -> Value {
        let n = self.reloads.fetch_add(1, Ordering::SeqCst) + 1;
        self.token.replace(Some("rotated".into()));
        serde_json::json!({"reloads": n})
    }
}

#[tokio::test]
async fn reload_needs_the_token_in_effect_and_config_shows_the_result() {
    let mut setup = Setup::new(closed_port());
    setup.token = Some("s3cret".into());
    let state = setup.state();
    let token = state.token.clone();
    let control = Arc::new(Control {
        reloads: AtomicU64::new(0),
        token: token.clone(),
    });
    let state = Arc::new(AdminState {
        control: Some(control),
        token,
        ..Arc::into_inner(state).unwrap()
    });
    let post = |t: &str| {
        Request::post("/reload")
            .header(AUTHORIZATION, format!("Bearer {t}"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        call(&state, post("wrong")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, body) = get(&state, "/config").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("# reloads 0"), "{body}");
    let (status, _, body) = call(&state, post("s3cret")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["reloads"], 1);
    assert!(get(&state, "/config").await.1.contains("# reloads 1"));
    // The reload replaced the token: the old one no longer passes.
    assert_eq!(
        call(&state, post("s3cret")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(call(&state, post("rotated")).await.0, StatusCode::OK);
    let no_control = Setup::new(closed_port()).state();
    assert_eq!(get(&no_control, "/config").await.0, StatusCode::NOT_FOUND);
}

fn form(uri: &str) -> axum::http::request::Builder {
    Request::post(uri).header(CONTENT_TYPE, "application/x-www-form-urlencoded")
}

/// The `rg_session=…` pair a login's answer sets.
fn session_cookie(headers: &HeaderMap) -> String {
    let set = headers[axum::http::header::SET_COOKIE].to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap().to_owned()
}

#[tokio::test]
async fn without_a_token_only_the_probes_and_metrics_answer() {
    let mut setup = Setup::new(closed_port());
    setup.token = None;
    let state = setup.state();
    for path in [
        "/sessions",
        "/claims",
        "/threads/t",
        "/config",
        "/ui/waiting",
    ] {
        let (status, body) = get(&state, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(body.contains("[admin] token"), "{path}: {body}");
    }
    assert_eq!(get(&state, "/metrics").await.0, StatusCode::OK);
    assert_eq!(get(&state, "/healthz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn every_data_route_needs_the_token_and_metrics_listen_does_not() {
    let state = Setup::new(closed_port()).state();
    for path in ["/sessions", "/claims", "/threads/t", "/metrics", "/config"] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        let (status, headers, _) = call(&state, req).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(headers[WWW_AUTHENTICATE], "Bearer");
    }
    let req = Request::get("/ui/waiting").body(Body::empty()).unwrap();
    let (status, _, body) = call(&state, req).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("action=\"/ui/login\""), "{body}");
    assert_eq!(get(&state, "/sessions").await.0, StatusCode::OK);
    let req = Request::get("/metrics").body(Body::empty()).unwrap();
    let res = metrics_router(Arc::clone(&state))
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_console_login_sets_a_strict_cookie_and_forms_need_its_csrf_token() {
    let state = Setup::new(closed_port()).state();
    let login = |token: &str| {
        form("/ui/login")
            .body(Body::from(format!("token={token}&next=%2Fui%2Fclaims")))
            .unwrap()
    };
    let (status, _, body) = call(&state, login("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, headers, _) = call(&state, login("s3cret")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[axum::http::header::LOCATION], "/ui/claims");
    let cookie = session_cookie(&headers);
    let with_cookie = |req: axum::http::request::Builder| req.header("cookie", cookie.as_str());
    let req = with_cookie(Request::get("/sessions"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&state, req).await.0, StatusCode::OK);
    let req = with_cookie(Request::get("/ui/claims"))
        .body(Body::empty())
        .unwrap();
    let (status, _, page) = call(&state, req).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_owned();
    assert_eq!(csrf.len(), 64);
    // A cookie-carried change without the session's CSRF token: refused.
    let req = with_cookie(form("/ui/claims/release"))
        .body(Body::from("thread=t&csrf=forged"))
        .unwrap();
    assert_eq!(call(&state, req).await.0, StatusCode::FORBIDDEN);
    let req = with_cookie(Request::post("/reload"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&state, req).await.0, StatusCode::FORBIDDEN);
    // Logged out, the cookie no longer opens anything.
    let req = with_cookie(form("/ui/logout"))
        .body(Body::from(format!("csrf={csrf}")))
        .unwrap();
    assert_eq!(call(&state, req).await.0, StatusCode::SEE_OTHER);
    let req = with_cookie(Request::get("/sessions"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&state, req).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn failed_logins_past_the_limit_answer_429() {
    let state = Setup::new(closed_port()).state();
    let login = |token: &str| {
        form("/ui/login")
            .extension(crate::admin::auth::PeerAddr(
                "192.0.2.7:5000".parse().unwrap(),
            ))
            .body(Body::from(format!("token={token}")))
            .unwrap()
    };
    for _ in 0..5 {
        assert_eq!(
            call(&state, login("guess")).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        call(&state, login("guess")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Even the right token waits out the window.
    assert_eq!(
        call(&state, login("s3cret")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}
