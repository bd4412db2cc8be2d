//! Audit trail of checkpoint operations.
//!
//! Producers build an [`AuditEvent`] from a per-connection [`SessionContext`]
//! and hand it to an [`AuditSink`], which never blocks: each output (SQLite,
//! JSON Lines, the PostgreSQL table every replica shares) has a bounded
//! queue and a writer thread of its own that appends batches to it,
//! records every loss there as a gap record, and prunes it to its
//! retention limits. The trail is read back from a [`TrailSource`] (or
//! [`thread_events`] of a SQLite file) and rendered with [`render_timeline`].

pub mod approver;
mod before;
mod chain;
mod config;
mod console_query;
mod error;
mod jsonl;
mod lane;
mod losses;
mod outputs;
mod pg_retention;
mod pg_schema;
mod postgres_store;
mod private_file;
mod prune;
mod query;
mod question;
mod sink;
mod source;
mod sqlite_retention;
mod sqlite_store;
mod stats;
#[cfg(test)]
mod test_util;
mod timeline;
mod writer;

pub use crate::audit_event::{digest, AuditEvent, BlobDigest, Operation, SessionContext};
pub use crate::timestamp::format_rfc3339_millis;
pub use before::parse_before;
pub use chain::{Break, ChainSummary, Verdict};
pub use config::{AuditConfig, DEFAULT_MAX_ROWS, DEFAULT_QUEUE_CAPACITY};
pub use console_query::{ConsoleFilter, ConsoleList, ListedEvent};
pub use error::{AuditError, FilterError};
pub use jsonl::{read_jsonl, verify_jsonl, JsonlWriter};
pub use pg_schema::AUDIT_MIGRATIONS;
pub use prune::{prune, Declared, PruneRule};
pub use query::{render_threads, threads, EventFilter, ThreadSummary};
pub use sink::{AuditSink, DEFAULT_FLUSH_TIMEOUT};
pub use source::TrailSource;
pub use sqlite_store::{all_events, thread_events, Store};
pub use stats::AuditStats;
pub use timeline::{render_json, render_timeline};
