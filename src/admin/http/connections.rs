//! The admin listener's connections, bounded so that no peer can take the
//! file descriptors client sessions need: at most `max_connections` at
//! once (one more is answered 503 and closed at once), a deadline for each
//! request's head (which also closes a kept-alive connection left idle),
//! one for each request's body and answer, and a lifetime for each
//! connection.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::admin::auth::PeerAddr;
use crate::admin::json_error::json_error;

/// Admin connections served at once unless `[admin] max_connections`
/// says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// The admin API's share of the process's file descriptors, at most.
const FD_SHARE_DIVISOR: u64 = 4;

/// How long the accept loop waits after a failed accept (out of
/// descriptors, say) before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What one admin connection may hold, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// A request's head must be in within this of the connection's start,
    /// or of the previous answer: an idle kept-alive connection is closed
    /// after it too.
    pub header_timeout: Duration,
    /// A request's body and its answer take at most this (503 after).
    pub request_timeout: Duration,
    /// A connection is closed after this, once its request in flight (if
    /// any) is answered, or `request_timeout` later at the latest.
    pub lifetime: Duration,
}

impl AdminLimits {
    /// The limits with `max_connections` (at least 1), but never more
    /// than a quarter of the soft descriptor limit `nofile`, when known.
    pub fn new(max_connections: usize, nofile: Option<u64>) -> Self {
        let share = nofile.map_or(usize::MAX, |n| {
            usize::try_from(n / FD_SHARE_DIVISOR).unwrap_or(usize::MAX)
        });
        AdminLimits {
            max_connections: max_connections.min(share).max(1),
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Serves `app` on `listener` within `limits`, until the runtime stops.
pub async fn serve(listener: TcpListener, app: Router, limits: AdminLimits) {
    let app = app.layer(middleware::from_fn_with_state(
        limits.request_timeout,
        request_deadline,
    ));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut full = false;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if !full {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "admin connections at their limit: further ones are refused (503)"
                );
                full = true;
            }
            refuse(&stream);
            continue;
        };
        full = false;
        // Each request knows its peer (the console's login limit).
        let app = app.clone().layer(Extension(PeerAddr(peer)));
        let limits = limits.clone();
        tokio::spawn(async move {
            serve_connection(stream, app, &limits).await;
            drop(slot);
        });
    }
}

/// Answers a connection past the cap 503 without reading it, as far as
/// one write without waiting goes, and closes it.
fn refuse(stream: &TcpStream) {
    let body = r#"{"error":"too many admin connections"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

async fn serve_connection(stream: TcpStream, app: Router, limits: &AdminLimits) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = tokio::time::sleep(limits.lifetime) => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(limits.request_timeout, conn.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "admin connection ended");
    }
}

/// Bounds a request's body and answer.
async fn request_deadline(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(answer) => answer,
        Err(_) => {
            let msg = format!("no answer within {} s", limit.as_secs_f64());
            json_error(StatusCode::SERVICE_UNAVAILABLE, &msg)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant;

    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn limits(max_connections: usize, header_ms: u64) -> AdminLimits {
        AdminLimits {
            max_connections,
            header_timeout: Duration::from_millis(header_ms),
            request_timeout: Duration::from_millis(300),
            lifetime: Duration::from_secs(30),
        }
    }

    /// An admin listener with two routes, served within `limits`.
    async fn listening(limits: AdminLimits) -> SocketAddr {
        let app = Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route("/echo", post(|body: String| async move { body }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, app, limits));
        addr
    }

    const GET_OK: &[u8] = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";

    /// Reads until the server closes (or `within` passes): what came, and
    /// whether the server closed.
    async fn read_until_closed(sock: &mut TcpStream, within: Duration) -> (String, bool) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, sock.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => return (String::from_utf8_lossy(&got).into(), false),
            }
        }
    }

    #[test]
    fn the_cap_is_at_most_a_quarter_of_the_descriptor_limit() {
        assert_eq!(AdminLimits::new(64, Some(1 << 20)).max_connections, 64);
        assert_eq!(AdminLimits::new(64, Some(256)).max_connections, 64);
        assert_eq!(AdminLimits::new(64, Some(100)).max_connections, 25);
        assert_eq!(AdminLimits::new(500, None).max_connections, 500);
        assert_eq!(AdminLimits::new(0, Some(2)).max_connections, 1);
    }

    #[tokio::test]
    async fn a_half_sent_request_is_closed_at_the_header_deadline() {
        let addr = listening(limits(4, 200)).await;
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let start = Instant::now();
        let (_, closed) = read_until_closed(&mut sock, Duration::from_secs(5)).await;
        assert!(closed, "still open after 5 s");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed() {
        let addr = listening(limits(4, 200)).await;
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(GET_OK).await.unwrap();
        let (answer, closed) = read_until_closed(&mut sock, Duration::from_secs(5)).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
            "{answer}"
        );
        assert!(closed, "an idle kept-alive connection stayed open for 5 s");
    }

    #[tokio::test]
    async fn a_body_that_does_not_come_is_given_up() {
        let addr = listening(limits(4, 5000)).await;
        let mut sock = TcpStream::connect(addr).await.unwrap();
        let head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly some";
        sock.write_all(head).await.unwrap();
        let (answer, _) = read_until_closed(&mut sock, Duration::from_secs(3)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    }

    #[tokio::test]
    async fn a_connection_past_the_cap_is_refused_until_one_closes() {
        let addr = listening(limits(2, 10_000)).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut sock = TcpStream::connect(addr).await.unwrap();
            sock.write_all(b"GET /ok HTTP/1.1\r\n").await.unwrap();
            held.push(sock);
        }
        let mut third = TcpStream::connect(addr).await.unwrap();
        let (answer, closed) = read_until_closed(&mut third, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer.ends_with(r#"{"error":"too many admin connections"}"#),
            "{answer}"
        );
        assert!(closed);
        drop(held.pop());
        // The closed one's slot is given back once the server sees the end.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut next = TcpStream::connect(addr).await.unwrap();
            next.write_all(GET_OK).await.unwrap();
            let (answer, _) = read_until_closed(&mut next, Duration::from_secs(1)).await;
            if answer.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "still refused: {answer}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
