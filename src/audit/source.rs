//! Where the trail is read back (`resumeguard audit`, `GET /threads/{id}`):
//! this replica's SQLite file, or the PostgreSQL table every replica
//! writes (`[audit] postgres = true`), which answers for all of them.

use std::path::PathBuf;

use super::chain::Verdict;
use super::console_query::{self, ConsoleFilter, ConsoleList, ListedEvent};
use super::error::AuditError;
use super::postgres_store;
use super::query::{self, EventFilter, ThreadSummary};
use super::sqlite_store;
use crate::audit_event::AuditEvent;
use crate::pg::PgTarget;

/// The trail a reader asks.
#[derive(Debug, Clone)]
pub enum TrailSource {
    /// One replica's SQLite file.
    Sqlite(PathBuf),
    /// `<schema>.audit_events`: every replica's events.
    Postgres(Box<PgTarget>),
}

impl TrailSource {
    /// One thread's events in order, with the gap records since it began.
    pub fn thread_events(&self, thread_id: &str) -> Result<Vec<AuditEvent>, AuditError> {
        match self {
            TrailSource::Sqlite(path) => sqlite_store::thread_events(path, thread_id),
            TrailSource::Postgres(target) => postgres_store::thread_events(target, thread_id),
        }
    }

    /// The threads on record, the most recently active first.
    pub fn threads(&self, filter: &EventFilter) -> Result<Vec<ThreadSummary>, AuditError> {
        match self {
            TrailSource::Sqlite(path) => query::threads(path, filter),
            TrailSource::Postgres(target) => postgres_store::threads(target, filter),
        }
    }

    /// One page of one of the console's lists, newest first.
    pub fn console_list(
        &self,
        list: ConsoleList,
        filter: &ConsoleFilter,
    ) -> Result<Vec<ListedEvent>, AuditError> {
        match self {
            TrailSource::Sqlite(path) => console_query::console_list(path, list, filter),
            TrailSource::Postgres(target) => {
                console_query::console_list_postgres(target, list, filter)
            }
        }
    }

    /// Every chain of the trail walked (`audit::chain`).
    pub fn verify(&self) -> Result<Verdict, AuditError> {
        match self {
            TrailSource::Sqlite(path) => sqlite_store::verify(path),
            TrailSource::Postgres(target) => postgres_store::verify(target),
        }
    }

    /// `sqlite <path> (this replica)` or `postgres <user@host:port/db>
    /// schema <s> (every replica)`: which trail answered.
    pub fn describe(&self) -> String {
        match self {
            TrailSource::Sqlite(path) => format!("sqlite {} (this replica)", path.display()),
            TrailSource::Postgres(target) => format!(
                "{} schema {} (every replica)",
                target.shown(),
                target.schema()
            ),
        }
    }
}
