//! Releasing a thread's claims by hand, from the admin API or the
//! console: the release, its log line and its audit event.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::json;

use super::blocking::{blocking, with_store};
use super::request_error::RequestError;
use super::AdminState;
use crate::audit::{AuditEvent, Operation, SessionContext};
use crate::log_text::shown;

/// Who asked for a release and through which route.
pub(super) struct Requester {
    /// The admin connection's peer, when the listener knows it.
    pub addr: Option<SocketAddr>,
    /// `admin_api` or `console`.
    pub via: &'static str,
}

/// Releases the thread's claims (one checkpoint's, when named), logs it
/// and records it in the audit trail (`claim_released`, with the
/// requester's address and `via` the route that asked); how many were
/// released.
pub(super) async fn release_claims(
    s: Arc<AdminState>,
    thread: String,
    checkpoint: Option<String>,
    requester: Requester,
) -> Result<usize, RequestError> {
    let (t, c) = (thread.clone(), checkpoint.clone());
    let audit = s.audit.clone();
    let n = blocking(move || with_store(&s, |st| st.release(&t, c.as_deref()))).await?;
    let via = requester.via;
    tracing::info!(thread = %shown(&thread), released = n, via, "claims released through the admin API");
    audit.record(released_event(&requester, thread, checkpoint, n));
    Ok(n)
}

/// The `claim_released` record: the requester's address as its client
/// address, so the trail says who released the claim.
fn released_event(
    requester: &Requester,
    thread: String,
    checkpoint: Option<String>,
    released: usize,
) -> AuditEvent {
    let ctx = SessionContext {
        client_addr: requester.addr.map(|a| a.to_string()).unwrap_or_default(),
        ..SessionContext::internal()
    };
    let mut ev = AuditEvent::new(&ctx, Operation::ClaimReleased)
        .with_thread(thread)
        .with_detail(json!({"released": released, "via": requester.via}));
    ev.checkpoint_id = checkpoint;
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_records_who_asked_for_it() {
        let requester = Requester {
            addr: Some("192.0.2.7:5000".parse().expect("an address")),
            via: "console",
        };
        let ev = released_event(&requester, "t1".into(), Some("c1".into()), 2);
        assert_eq!(ev.operation, Operation::ClaimReleased);
        assert_eq!(ev.client_addr, "192.0.2.7:5000");
        assert_eq!(ev.application_name, "resumeguard");
        assert_eq!(ev.thread_id.as_deref(), Some("t1"));
        assert_eq!(ev.checkpoint_id.as_deref(), Some("c1"));
        assert_eq!(ev.detail, json!({"released": 2, "via": "console"}));
    }
}
