//! The accept loop and graceful shutdown: stop accepting, let sessions
//! finish what they have in flight (bounded), then return.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::proxy::Proxy;
use super::session::serve_client;

/// Accepts connections until `stop` resolves, then waits up to `grace`
/// for sessions to drain (each closes at its next idle point) and aborts
/// the rest. Sessions of an `inspection` listener never claim.
pub async fn run(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    inspection: bool,
    stop: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let mut sessions = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    sessions.spawn(serve_client(Arc::clone(&proxy), stream, peer, inspection));
                }
                Err(e) => {
                    // Out of descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
        }
    }
    drop(listener);
    let open = sessions.len();
    if open > 0 {
        tracing::info!(open, ?grace, "draining sessions");
    }
    let drained = tokio::time::timeout(grace, async {
        while sessions.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = sessions.len(),
            "sessions still busy after the grace period: closing them"
        );
        sessions.shutdown().await;
    }
}
