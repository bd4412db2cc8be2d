//! Why the claim store could not answer.
//!
//! The proxy fails closed on any of these: a read of a parked head is
//! refused and the client sees this text, so each message says that the
//! claim store is unavailable, which database, and what it said.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The PostgreSQL store could not connect, or prepare its
    /// connection (credential, schema, liveness lock).
    #[error("claim store unavailable: cannot open {at}: {reason}")]
    PgOpen { at: String, reason: String },
    /// A decision waited its lock timeout for a claim row that a write
    /// still being committed holds (the server's fence in that write's
    /// transaction): not a failure of the store; the reader asks again.
    #[error(
        "claim store busy: {op} on {at} waited for a claim row held by a write that has not \
         committed yet"
    )]
    RowLocked { at: String, op: &'static str },
    /// An operation failed on the PostgreSQL store (connection lost,
    /// lock or statement timeout, permission, ...).
    #[error("claim store unavailable: {op} failed on {at}: {reason}")]
    Postgres {
        at: String,
        op: &'static str,
        reason: String,
    },
}
