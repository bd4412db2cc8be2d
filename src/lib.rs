//! resumeguard: a transparent PostgreSQL wire-protocol proxy that recognizes
//! LangGraph checkpoint traffic and holds it to the Resume Contract.
//!
//! Layers: [`wire`] frames, relays and tracks protocol state; [`saver`]
//! recognizes checkpoint statements and decodes their parameters and rows;
//! [`audit`] records what the proxy saw and decided.

pub mod admin;
pub mod audit;
pub mod audit_event;
pub mod claims;
pub mod config;
pub mod enforce;
pub mod error_chain;
pub mod fd_limit;
pub mod log_text;
pub mod managed_pg;
pub mod metrics;
pub mod pg;
pub mod policy;
pub mod saver;
#[cfg(test)]
mod test_pg_server;
pub mod timestamp;
pub mod wire;
