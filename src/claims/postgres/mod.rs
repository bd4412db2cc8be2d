//! The PostgreSQL claims backend: claims kept in the database every proxy
//! replica already fronts (schema `resumeguard`), so replicas on different
//! hosts agree on consume-once.
//!
//! - `target`: connection parameters (upstream URL or `[claims] dsn`,
//!   password file), the liveness bound.
//! - `schema`: versioned migrations.
//! - `conn`: the decision and liveness connections, fail closed.
//! - `store`: the operations, one short transaction each; `rows`, `leases`.
//! - `liveness`: holders whose proxy process is gone.

mod conn;
mod leases;
mod liveness;
mod rows;
mod schema;
mod store;
mod target;
#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;

pub use store::PgClaims;
pub use target::{PgTarget, TargetError, DEFAULT_LIVENESS_BOUND, DEFAULT_SCHEMA};
