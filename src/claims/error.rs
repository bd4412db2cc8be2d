//! Why the claim store could not answer.
//!
//! The proxy fails closed on any of these: a read of a parked head is
//! refused and the client sees this text, so each message says that the
//! claim store is unavailable, which file or database, and what it said.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The database file could not be opened or prepared.
    #[error("claim store unavailable: cannot open {path}: {reason}")]
    Open { path: String, reason: String },
    /// The PostgreSQL store could not connect, or prepare its
    /// connection (credential, schema, liveness lock).
    #[error("claim store unavailable: cannot open {at}: {reason}")]
    PgOpen { at: String, reason: String },
    /// The path no longer holds the file this process opened (removed,
    /// replaced, or overwritten with another store): replicas no longer
    /// share claims, so nothing is decided until that file is back.
    #[error(
        "claim store unavailable: {path} is not the store this proxy opened: {reason}; \
         restore that file, or restart every proxy sharing the store to adopt a new one"
    )]
    Replaced { path: String, reason: String },
    /// An operation failed on an open store (locked past the busy
    /// timeout, disk full, file removed, unreadable row, ...).
    #[error("claim store unavailable: {op} failed on {path}: {reason}")]
    Sqlite {
        path: String,
        op: &'static str,
        reason: String,
    },
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

/// Which backend a store error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

impl StoreError {
    /// The backend that failed.
    pub fn kind(&self) -> StoreKind {
        match self {
            StoreError::Open { .. } | StoreError::Replaced { .. } | StoreError::Sqlite { .. } => {
                StoreKind::Sqlite
            }
            StoreError::PgOpen { .. }
            | StoreError::RowLocked { .. }
            | StoreError::Postgres { .. } => StoreKind::Postgres,
        }
    }
}
