//! The PostgreSQL client foundation beneath the claims store and the audit
//! trail: what both need to reach their database and keep at it.
//!
//! - `backoff`: the wait between retries after failures.

pub mod backoff;

pub use backoff::Backoff;
