//! What an admin handler must not do on the runtime that accepts client
//! connections: it runs on tokio's blocking pool, and reaches the claims
//! store (SQLite or PostgreSQL, both blocking) from there.

use std::sync::Arc;

use super::request_error::RequestError;
use super::AdminState;
use crate::claims::{ClaimStore, StoreError};

/// Runs `f` on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RequestError> + Send + 'static,
) -> Result<T, RequestError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(RequestError::Task(e)))
}

/// The consume-once leg's store, or the configured file opened for this
/// request (the leg is off, as for `resumeguard claims`).
pub(super) fn with_store<T>(
    s: &AdminState,
    f: impl FnOnce(&ClaimStore) -> Result<T, StoreError>,
) -> Result<T, RequestError> {
    match &s.claims {
        Some(store) => Ok(f(store)?),
        None => {
            let at = s
                .claims_at
                .as_ref()
                .map_err(|why| RequestError::NoStore(Arc::clone(why)))?;
            let store = ClaimStore::open_existing(at.clone())?;
            Ok(f(&store)?)
        }
    }
}
