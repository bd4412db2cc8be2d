//! Consume-once claims: a reader of a parked head takes a claim
//! on its interrupt in a store shared by every proxy replica; evidence of
//! the run consumes it; a claim with no evidence lapses, so an inspection
//! read or a dead holder never strands the thread.
//!
//! - `model`: keys, holders, records, the interrupt fingerprint.
//! - `clock`: the claims database's clock, the time base of every claim.
//! - `file`: the shared SQLite file: opening (retried), identity, the
//!   check that it is still the file this process opened.
//! - `backend`: the [`ClaimStore`] facade over the two backends.
//! - `postgres`: claims in the fronted PostgreSQL (shared across hosts).
//! - `store`: claims in SQLite, one transaction per operation; `rows`
//!   maps them.
//! - `leases`: run leases of answered threads.
//! - `render`: the table behind `resumeguard claims list`.
//!
//! The decision for a read (serve, wait, refuse) is pure and lives in
//! [`crate::policy::claims`].

mod backend;
pub mod clock;
mod error;
pub mod evidence;
mod evidence_retry;
mod file;
mod leases;
pub mod location;
mod model;
mod outcome;
pub mod postgres;
mod render;
mod rows;
mod store;

#[cfg(test)]
mod tests;

pub use backend::{ClaimStore, StoreLocation};
pub use clock::{local_ms, Now, WrittenAt};
pub use error::{StoreError, StoreKind};
pub use file::BUSY_TIMEOUT;
pub use model::{
    format_ms, interrupt_fingerprint, ClaimKey, ClaimRecord, ClaimState, Holder, RunLease,
};
pub use outcome::{decide_existing, ClaimOutcome};
pub use render::render_claims;
pub use store::{
    SqliteClaims, DEFAULT_RETAIN_MS, DEFAULT_RUN_LEASE_MS, DEFAULT_SUPERSEDED_GRACE_MS,
    NEXT_CHECKPOINT,
};
