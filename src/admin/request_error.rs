//! Why an admin request (API or console) has no answer: its text is the
//! JSON answer's `error`, or the console's alert.

use std::sync::Arc;

use crate::audit::{AuditError, FilterError};
use crate::claims::StoreError;
use crate::error_chain::chain;
use crate::wire::upstream_probe::ProbeError;

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No claim store is configured: why, as the proxy found at start
    /// (the text carries its causes).
    #[error("{}", chain(.0.as_ref()))]
    NoStore(Arc<dyn std::error::Error + Send + Sync>),
    /// The audit trail could not be read; the text carries its causes.
    #[error("{}", chain(.0))]
    Trail(AuditError),
    /// A page or API answer from the audit trail asked of a proxy that
    /// keeps none: 404 wherever it is asked, as is every admin answer of a
    /// feature configured off (a 503 would tell clients and monitors to
    /// retry what no retry brings).
    #[error("no audit trail is configured ([audit] sqlite or postgres)")]
    NoTrail,
    /// A list page's time window that is not a time; the text carries
    /// its causes.
    #[error("{}", chain(.0))]
    Window(FilterError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// A readiness check that did not answer within its deadline.
    #[error("no answer in time")]
    Timeout,
    #[error("admin task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
