//! The accept loop and graceful shutdown: stop accepting, let sessions
//! finish what they have in flight (bounded), then return.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use super::event_loop::EventLoops;
use super::messages::error_response::{error_response, Severity};
use super::messages::sqlstate;
use super::proxy::Proxy;
use super::relayed::THREAD_STACK;
use super::session::serve_client;

/// How often the drain looks at the count of live sessions.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// How long closed sessions get to notice before the listener returns.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Accepts connections until `stop` resolves. Each session starts on a
/// thread of its own, and relays on one of the `loops` when it can (see
/// `session.rs`). Sessions of an `inspection` listener never claim.
pub async fn run(
    proxy: Arc<Proxy>,
    loops: Option<Arc<EventLoops>>,
    listener: TcpListener,
    inspection: bool,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    spawn_session(&proxy, loops.as_ref(), stream, peer, inspection)
                }
                Err(e) => {
                    // Out of descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

fn spawn_session(
    proxy: &Arc<Proxy>,
    loops: Option<&Arc<EventLoops>>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    inspection: bool,
) {
    metrics::counter!(crate::metrics::CLIENT_CONNECTIONS).increment(1);
    let stream = match stream.into_std().and_then(|s| {
        s.set_nonblocking(false)?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "accepted connection unusable");
            return;
        }
    };
    let mut refuse = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "accepted connection unusable");
            return;
        }
    };
    proxy.sessions.spawning();
    let for_thread = Arc::clone(proxy);
    let loops = loops.cloned();
    let spawned = std::thread::Builder::new()
        .name("rg-session".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            let live = for_thread.sessions.adopt();
            serve_client(
                Arc::clone(&for_thread),
                loops,
                stream,
                peer,
                inspection,
                live,
            );
        });
    if let Err(e) = spawned {
        // The closure never ran: undo the count it would have dropped.
        drop(proxy.sessions.adopt());
        tracing::warn!(%peer, error = %e, "cannot start a session thread");
        let msg = format!("resumeguard: out of resources for a new session: {e}");
        let err = error_response(Severity::Fatal, sqlstate::TOO_MANY_CONNECTIONS, &msg, None);
        let _ = refuse.write_all(&err);
    }
}

/// After every listener stopped: idle sessions close now, busy ones at
/// their next idle point, for at most `grace`; then the rest are closed.
pub async fn drain(proxy: &Proxy, grace: Duration) {
    proxy.sessions.begin_drain();
    let open = proxy.sessions.live();
    if open > 0 {
        tracing::info!(open, ?grace, "draining sessions");
    }
    if !wait_for_sessions(proxy, grace).await {
        tracing::warn!(
            left = proxy.sessions.live(),
            "sessions still busy after the grace period: closing them"
        );
        proxy.sessions.close_all();
        if !wait_for_sessions(proxy, CLOSE_WAIT).await {
            tracing::warn!(
                left = proxy.sessions.live(),
                "sessions left running at exit"
            );
        }
    }
}

async fn wait_for_sessions(proxy: &Proxy, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while proxy.sessions.live() > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    true
}
