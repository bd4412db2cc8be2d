//! Releasing a thread's claims by hand, from the admin API or the
//! console: the release, its log line and its audit event.

use std::sync::Arc;

use serde_json::json;

use super::blocking::{blocking, with_store};
use super::request_error::RequestError;
use super::AdminState;
use crate::audit::{AuditEvent, Operation, SessionContext};
use crate::log_text::shown;

/// Releases the thread's claims (one checkpoint's, when named), logs it
/// and records it in the audit trail (`claim_released`, `via` the route
/// that asked); how many were released.
pub(super) async fn release_claims(
    s: Arc<AdminState>,
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
