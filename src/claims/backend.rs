//! The claim store a proxy uses: PostgreSQL (the database the replicas
//! front: shared across hosts; the default) or a SQLite file (one host
//! only: `[claims] backend = "sqlite"` or a `[claims] store` file). One
//! facade, the same operations and semantics on both.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::clock::{Now, WrittenAt};
use super::error::StoreError;
use super::model::{ClaimKey, ClaimRecord, Holder, RunLease};
use super::outcome::ClaimOutcome;
use super::postgres::{PgClaims, PgTarget};
use super::store::SqliteClaims;
use crate::config::live::LiveClaimsTimings;

/// Where a proxy's claims live.
#[derive(Debug, Clone)]
pub enum StoreLocation {
    Sqlite(PathBuf),
    Postgres(Box<PgTarget>),
}

impl StoreLocation {
    /// The file or database, as shown in errors and logs.
    pub fn shown(&self) -> String {
        match self {
            StoreLocation::Sqlite(p) => p.display().to_string(),
            StoreLocation::Postgres(t) => t.shown().to_owned(),
        }
    }
}

/// Handle on the shared claims, one per proxy process (`Send + Sync`,
/// shared in an `Arc` by session threads and the evidence worker).
// One per process, shared in an `Arc`: boxing the larger variant would
// buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ClaimStore {
    Sqlite(SqliteClaims),
    Postgres(PgClaims),
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            ClaimStore::Sqlite($s) => $e,
            ClaimStore::Postgres($s) => $e,
        }
    };
}

impl ClaimStore {
    /// The proxy's store at `at`: opened now if it can be, else every
    /// operation fails (fail closed) and opening is retried on use.
    pub fn connect_to(at: &StoreLocation) -> ClaimStore {
        match at {
            StoreLocation::Sqlite(p) => ClaimStore::Sqlite(SqliteClaims::connect(p)),
            StoreLocation::Postgres(t) => ClaimStore::Postgres(PgClaims::connect((**t).clone())),
        }
    }

    /// Why the PostgreSQL store's first connect failed, if it did (a
    /// SQLite file that does not open is retried on use and never stops
    /// `serve`).
    pub fn start_fault(&self) -> Option<super::postgres::StartFault> {
        match self {
            ClaimStore::Sqlite(_) => None,
            ClaimStore::Postgres(p) => p.start_fault(),
        }
    }

    /// Operator commands: the store must exist already (a mistyped path or
    /// database must not start a new store beside the replicas' one).
    pub fn open_existing_at(at: &StoreLocation) -> Result<ClaimStore, StoreError> {
        match at {
            StoreLocation::Sqlite(p) => SqliteClaims::open_existing(p).map(ClaimStore::Sqlite),
            StoreLocation::Postgres(t) => {
                PgClaims::open_existing((**t).clone()).map(ClaimStore::Postgres)
            }
        }
    }

    /// A SQLite file, opened (created) now.
    pub fn open(path: &Path) -> Result<ClaimStore, StoreError> {
        SqliteClaims::open(path).map(ClaimStore::Sqlite)
    }

    /// An existing SQLite file.
    pub fn open_existing(path: &Path) -> Result<ClaimStore, StoreError> {
        SqliteClaims::open_existing(path).map(ClaimStore::Sqlite)
    }

    /// A SQLite file, opened now or on use.
    pub fn connect(path: &Path) -> ClaimStore {
        ClaimStore::Sqlite(SqliteClaims::connect(path))
    }

    #[cfg(test)]
    pub fn with_retention(self, retain_ms: i64) -> ClaimStore {
        match self {
            ClaimStore::Sqlite(s) => ClaimStore::Sqlite(s.with_retention(retain_ms)),
            ClaimStore::Postgres(s) => ClaimStore::Postgres(s.with_retention(retain_ms)),
        }
    }

    pub fn with_superseded_grace(self, grace_ms: i64) -> ClaimStore {
        match self {
            ClaimStore::Sqlite(s) => ClaimStore::Sqlite(s.with_superseded_grace(grace_ms)),
            ClaimStore::Postgres(s) => ClaimStore::Postgres(s.with_superseded_grace(grace_ms)),
        }
    }

    /// Reads the run lease and the grace given to holders whose proxy
    /// process is gone (PostgreSQL: its liveness lock went; SQLite knows no
    /// other processes' liveness) from `timings` at each decision.
    pub fn with_timings(self, timings: Arc<LiveClaimsTimings>) -> ClaimStore {
        match self {
            ClaimStore::Sqlite(s) => ClaimStore::Sqlite(s.with_timings(timings)),
            ClaimStore::Postgres(s) => ClaimStore::Postgres(s.with_timings(timings)),
        }
    }

    #[cfg(test)]
    pub fn with_run_lease(self, lease_ms: i64) -> ClaimStore {
        match self {
            ClaimStore::Sqlite(s) => ClaimStore::Sqlite(s.with_run_lease(lease_ms)),
            ClaimStore::Postgres(s) => ClaimStore::Postgres(s.with_run_lease(lease_ms)),
        }
    }

    /// The file or database, as shown in errors.
    pub fn path(&self) -> &str {
        match self {
            ClaimStore::Sqlite(s) => s.path(),
            ClaimStore::Postgres(s) => s.shown(),
        }
    }

    /// Which backend: `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            ClaimStore::Sqlite(_) => "sqlite",
            ClaimStore::Postgres(_) => "postgres",
        }
    }

    /// Whether a claim this process's session holds may be answered from
    /// memory (`enforce::held_claims`): PostgreSQL while this process's
    /// liveness lock is confirmed and the store reachable. Never SQLite:
    /// there a read costs no round trip, and each checks the file is
    /// still the one opened.
    pub fn answers_held_claims(&self) -> bool {
        match self {
            ClaimStore::Sqlite(_) => false,
            ClaimStore::Postgres(s) => s.live(),
        }
    }

    /// A reader of a parked head asks for the interrupt `key`; a claim it
    /// takes lapses `lapse_ms` after `now` on the store's clock.
    pub fn try_claim(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now: impl Into<Now>,
        lapse_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.try_claim_timed(key, holder, now, lapse_ms)
            .map(|(outcome, _)| outcome)
    }

    /// [`ClaimStore::try_claim`], with the store's clock when it decided
    /// (ms since the Unix epoch): what the caller's local waits measure
    /// the record's times against.
    pub fn try_claim_timed(
        &self,
        key: &ClaimKey,
        holder: &Holder,
        now: impl Into<Now>,
        lapse_ms: i64,
    ) -> Result<(ClaimOutcome, i64), StoreError> {
        let now = now.into();
        match self {
            ClaimStore::Sqlite(s) => s.try_claim(key, holder, now, lapse_ms),
            ClaimStore::Postgres(s) => s.try_claim_timed(key, holder, now, lapse_ms),
        }
    }

    pub fn consume(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        evidence: &str,
        written_at: impl Into<WrittenAt>,
        now: impl Into<Now>,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let (written_at, now) = (written_at.into(), now.into());
        each!(self, s => s.consume(thread_id, checkpoint_ns, checkpoint_id, evidence, written_at, now))
    }

    pub fn note_refusal(&self, key: &ClaimKey) -> Result<(), StoreError> {
        each!(self, s => s.note_refusal(key))
    }

    pub fn note_progress(
        &self,
        at: (&str, &str, &str),
        evidence: &str,
        written_at: impl Into<WrittenAt>,
        now: impl Into<Now>,
        hold_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let (written_at, now) = (written_at.into(), now.into());
        each!(self, s => s.note_progress(at, evidence, written_at, now, hold_ms))
    }

    pub fn holder_gone(
        &self,
        proxy_id: &str,
        session_id: u64,
        now: impl Into<Now>,
        grace_ms: i64,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let now = now.into();
        each!(self, s => s.holder_gone(proxy_id, session_id, now, grace_ms))
    }

    pub fn move_on(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        parent_checkpoint_id: &str,
        now: impl Into<Now>,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let now = now.into();
        each!(self, s => s.move_on(thread_id, checkpoint_ns, parent_checkpoint_id, now))
    }

    pub fn purge(&self, older_than_ms: i64) -> Result<usize, StoreError> {
        each!(self, s => s.purge(older_than_ms))
    }

    pub fn forget_thread(&self, thread_id: &str) -> Result<usize, StoreError> {
        each!(self, s => s.forget_thread(thread_id))
    }

    pub fn list(&self, thread_id: Option<&str>) -> Result<Vec<ClaimRecord>, StoreError> {
        each!(self, s => s.list(thread_id))
    }

    pub fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        each!(self, s => s.get(key))
    }

    /// The latest-generation held or consumed claim on a checkpoint.
    pub fn current_holder(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
    ) -> Result<Option<ClaimRecord>, StoreError> {
        self.current_holder_timed(thread_id, checkpoint_ns, checkpoint_id, Now::STORE)
            .map(|(current, _)| current)
    }

    /// [`ClaimStore::current_holder`], with the store's clock when it was
    /// read (ms since the Unix epoch).
    pub fn current_holder_timed(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        now: impl Into<Now>,
    ) -> Result<(Option<ClaimRecord>, i64), StoreError> {
        let now = now.into();
        match self {
            ClaimStore::Sqlite(s) => s.current_holder(thread_id, checkpoint_ns, checkpoint_id, now),
            ClaimStore::Postgres(s) => {
                s.current_holder_timed(thread_id, checkpoint_ns, checkpoint_id, now)
            }
        }
    }

    /// Keeps a generation of a claim from lapsing or counting as abandoned
    /// for `cover_ms` after `now` on the store's clock (see
    /// [`SqliteClaims::keep_for`]).
    pub fn keep_for(
        &self,
        key: &ClaimKey,
        epoch: i64,
        now: impl Into<Now>,
        cover_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = now.into();
        each!(self, s => s.keep_for(key, epoch, now, cover_ms))
    }

    pub fn release(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<usize, StoreError> {
        each!(self, s => s.release(thread_id, checkpoint_id))
    }

    pub fn run_lease(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        now: impl Into<Now>,
    ) -> Result<Option<RunLease>, StoreError> {
        let now = now.into();
        each!(self, s => s.run_lease(thread_id, checkpoint_ns, now))
    }

    /// The run lease row of a namespace of a thread, live or ended (kept
    /// until the retention purge): its latest answered interrupt.
    pub fn last_answer(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
    ) -> Result<Option<RunLease>, StoreError> {
        each!(self, s => s.last_answer(thread_id, checkpoint_ns))
    }
}
