//! The PostgreSQL claims backend: claims kept in the database every proxy
//! replica already fronts (schema `resumeguard`), so replicas on different
//! hosts agree on consume-once.
//!
//! - `target`: connection parameters (upstream URL or `[claims] dsn`,
//!   password file), the liveness bound.
//! - `schema`: versioned migrations (claims, leases, the audit trail, the
//!   decision functions the store and the fence call).
//! - `client`: connections to the schema for the audit trail.
//! - `conn`: the decision and liveness connections, fail closed.
//! - `store`: the operations, a decision one statement each; `rows`, `leases`.
//! - `liveness`: holders whose proxy process is gone.
//! - `pooler`: a claims target that is a transaction pooler, refused at start.

mod client;
mod conn;
mod leases;
mod liveness;
pub mod pooler;
mod rows;
mod schema;
mod store;
mod target;
#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;

pub use client::{connect_schema, error_text, schema_name, SchemaAccess};
pub use schema::{AUDIT_CHAIN_VERSION, AUDIT_VERSION};
pub use store::PgClaims;
pub use target::{PgTarget, TargetError, DEFAULT_LIVENESS_BOUND, DEFAULT_SCHEMA};
