//! The claim store: claims kept in the database every proxy replica
//! already fronts (schema `resumeguard`), or the one `[claims] dsn` names,
//! so replicas on different hosts agree on consume-once.
//!
//! Where the database is and how it is reached (address, TLS, password,
//! liveness bound) is [`crate::pg`]'s.
//! - `schema`: the claims' steps of the shared schema's migrations
//!   (claims, leases, the decision functions the store and the fence call).
//! - `conn`: the decision and liveness connections, fail closed;
//!   `reaped`: a connection the server ended while it stays up, replaced
//!   within a time budget.
//! - `store`: the operations, a decision one statement each; `rows`, `leases`.
//! - `held_consumption`: the consumption of held claims, for both versions
//!   of the server's function.
//! - `liveness`: holders whose proxy process is gone.
//! - `fault`: which connect failures stop `serve` at start, and their fixes.
//! - `db_clock`: every decision on the database's clock; `claim_first`: a
//!   claim's first step, askable before the head is known.
//! - `key_digest`: keys of any length, by digest.
//! - `answer_in_write`: an answer consumes its claim in its own transaction.
//! - `thread_lock`: one writer of a thread's claims and leases at a time.
//! - `unclaimed_evidence`: evidence on a checkpoint nothing claims skipped,
//!   or reduced to its thread's lease renewal.
//! - `pooler`: a claims target that is a transaction pooler, refused at start.

mod answer_in_write;
mod claim_first;
mod conn;
mod db_clock;
mod evidence_batch;
mod fault;
mod fence;
mod held_consumption;
mod key_digest;
mod leases;
mod liveness;
pub mod pooler;
mod reaped;
mod rows;
mod schema;
mod store;
#[cfg(test)]
pub(crate) mod tests;
mod thread_lock;
mod unclaimed_evidence;

pub use conn::check_once;
pub use evidence_batch::{EvidenceItem, WriteEvidence};
pub use fault::StartFault;
pub use schema::CLAIMS_MIGRATIONS;
pub use store::{ClaimStore, DEFAULT_RETAIN_MS, DEFAULT_SUPERSEDED_GRACE_MS, NEXT_CHECKPOINT};
