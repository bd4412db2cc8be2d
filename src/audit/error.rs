//! Why the audit trail could not be written or read (which database or
//! file, which step, and the cause beneath), and why the audit command's
//! time and operation filters are refused.

use std::io;
use std::path::PathBuf;

use crate::audit_event::Operation;

/// A failure of an audit output or of reading the trail back.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("creating audit database {}", .path.display())]
    CreateDatabase { path: PathBuf, source: io::Error },
    #[error("opening audit database {}", .path.display())]
    OpenDatabase {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("creating audit_events schema")]
    Schema(#[source] rusqlite::Error),
    /// A transaction of the trail (`what`: the batch, a prune's record or
    /// step) that did not commit.
    #[error("committing {what}")]
    Commit {
        what: &'static str,
        source: rusqlite::Error,
    },
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// An event's JSON column that could not be encoded.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// A row of the PostgreSQL trail whose column is not of the type the
    /// proxy reads it as (or NULL where it expects a value).
    #[error("reading a row of the PostgreSQL audit table")]
    PostgresRow(#[source] postgres::Error),
    #[error("unknown audit operation {0:?}")]
    UnknownOperation(String),
    #[error("audit {column} column")]
    Column {
        column: &'static str,
        source: serde_json::Error,
    },
    #[error("opening audit jsonl file {target}")]
    OpenJsonl { target: String, source: io::Error },
    #[error("encoding audit event")]
    EncodeEvent(#[source] serde_json::Error),
    #[error("writing audit jsonl")]
    WriteJsonl(#[source] io::Error),
    #[error("flushing audit jsonl")]
    FlushJsonl(#[source] io::Error),
    #[error("opening {}", .path.display())]
    OpenJsonlToRead { path: PathBuf, source: io::Error },
    #[error("reading {}", .path.display())]
    ReadJsonl { path: PathBuf, source: io::Error },
    #[error("{}:{line}: bad audit event", .path.display())]
    BadJsonlLine {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    /// The PostgreSQL table (`[audit] postgres`): where, and the server's
    /// or the client's message.
    #[error("audit trail in {at}: {reason}")]
    Postgres { at: String, reason: String },
    /// The PostgreSQL table's database could not be reached: the connect
    /// failed, or the output waits out the backoff after one that did.
    /// Nothing of the batch reached the server.
    #[error("audit trail in {at}: {reason}")]
    PostgresUnreachable { at: String, reason: String },
    /// The PostgreSQL output before its database is known (the managed
    /// server not started yet, or no database configured).
    #[error("the PostgreSQL audit output has no database (yet)")]
    PostgresUnknown,
    #[error("spawning audit writer thread")]
    SpawnWriter(#[source] io::Error),
}

impl AuditError {
    /// Whether the output could not be reached at all, so the write was
    /// not tried: a database restarting, failing over or not known yet (the
    /// managed server still starting), not a batch the output refused.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            AuditError::PostgresUnreachable { .. } | AuditError::PostgresUnknown
        )
    }
}

/// A `--before`, `--since`, `--until` or `--op` value the audit command
/// refuses; each names its flag and value.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("{flag} needs a time (2026-11-01T00:00:00Z) or an age (7d)")]
    NoTime { flag: String },
    #[error(
        "{flag} {spec:?} is neither an RFC 3339 UTC time (2026-11-01T00:00:00Z) \
         nor an age (7d, 12h)"
    )]
    NotATime {
        flag: String,
        spec: String,
        source: humantime::DurationError,
    },
    #[error("{flag} {spec:?} reaches before the clock's range")]
    BeforeClock { flag: String, spec: String },
    #[error("--op {name:?} is not an operation; one of: {}", operation_names())]
    UnknownOperation { name: String },
    #[error("--since {since} is after --until {until}")]
    EmptyWindow { since: String, until: String },
}

fn operation_names() -> String {
    let names: Vec<&str> = Operation::ALL.iter().map(|o| o.as_str()).collect();
    names.join(", ")
}
