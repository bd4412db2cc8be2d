//! resumeguard: a transparent PostgreSQL wire-protocol proxy that recognizes
//! LangGraph checkpoint traffic and holds it to the Resume Contract.
//!
//! Layers, top first; a module uses only those below it (`tests/imports.rs`
//! holds the code to this picture):
//! - [`config`]: the configuration, from defaults, file, environment and flags.
//! - [`admin`]: the HTTP admin API, `/metrics` and the approvals console.
//! - [`enforce`]: the session's hooks; turns decoded traffic into actions.
//! - [`policy`]: the verdicts (fork filter, channel rules, claims, fences).
//! - [`claims`] and [`audit`]: the stores, side by side.
//! - [`audit_event`]: what an audit record says, shared by both stores.
//! - [`pg`] and [`managed_pg`]: PostgreSQL as a client, and the embedded server.
//! - [`saver`]: recognizes checkpoint statements and decodes their values.
//! - [`wire`]: frames, relays and tracks protocol state; knows nothing of
//!   LangGraph.
//! - Leaves: [`metrics`], [`timestamp`], [`error_chain`], [`log_text`],
//!   [`log_scope`], [`fd_limit`].

pub mod admin;
pub mod audit;
pub mod audit_event;
pub mod claims;
pub mod config;
pub mod enforce;
pub mod error_chain;
pub mod fd_limit;
pub mod log_scope;
pub mod log_text;
pub mod managed_pg;
pub mod metrics;
pub mod pg;
pub mod policy;
pub mod saver;
mod sql_tokens;
#[cfg(test)]
mod test_log;
#[cfg(test)]
mod test_metrics;
#[cfg(test)]
mod test_pg_front;
#[cfg(test)]
mod test_pg_server;
pub mod timestamp;
pub mod wire;
