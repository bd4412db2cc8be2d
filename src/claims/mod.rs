//! Consume-once claims: a reader of a parked head takes a claim
//! on its interrupt in a store shared by every proxy replica; evidence of
//! the run consumes it; a claim with no evidence lapses, so an inspection
//! read or a dead holder never strands the thread.
//!
//! - `model`: keys, holders, records, the interrupt fingerprint.
//! - `outcome`: what a reader's claim came to.
//! - `clock`: the claims database's clock, the time base of every claim.
//! - `postgres`: the store, [`ClaimStore`]: claims in PostgreSQL (the
//!   fronted database, or `[claims] dsn`), every rule of claim, wait,
//!   lapse, takeover, holder-gone, abandoned run, run lease and fence
//!   written once, in its SQL functions.
//! - `render`: the table behind `resumeguard claims list`.
//! - `timings`: the claims timings a reload may change, shared.
//! - `failure_streak`: a run of the store's failures, as the log tells it.
//!
//! The decision for a read (serve, wait, refuse) is pure and lives in
//! [`crate::policy::claims`].

pub mod clock;
mod error;
pub mod evidence;
mod evidence_gather;
mod evidence_retry;
pub mod failure_streak;
mod model;
mod outcome;
pub mod postgres;
mod render;
pub mod timings;

#[cfg(test)]
mod tests;

pub use clock::{Now, WrittenAt};
pub use error::StoreError;
pub use model::{
    format_ms, interrupt_fingerprint, ClaimKey, ClaimRecord, ClaimState, Holder, RunLease,
};
pub use outcome::ClaimOutcome;
pub use postgres::{ClaimStore, DEFAULT_RETAIN_MS, DEFAULT_SUPERSEDED_GRACE_MS, NEXT_CHECKPOINT};
pub use render::render_claims;
pub use timings::DEFAULT_RUN_LEASE_MS;
