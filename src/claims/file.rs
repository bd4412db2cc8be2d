//! The claim store's file: opening it (retried with backoff on use while
//! it cannot be opened), the identity row created with it, and the check,
//! on every operation, that the path still holds the file this process
//! opened.
//!
//! Replicas agree on claims only while they share one file. A file removed
//! or replaced under a running proxy is a split brain: the running proxy
//! keeps its unlinked copy while a restarted replica creates a new, empty
//! store, and both grant the same interrupt. So each operation compares
//! the path's device and inode with the open handle's (one `stat`) and
//! reads the identity row inside its transaction (one indexed select); on
//! a mismatch the operation fails (the proxy fails closed, 58000), with one
//! ERROR log per transition, until the original file is back.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use super::clock::local_ms;
use super::error::StoreError;

/// How long an operation waits for another process's transaction before
/// the store counts as unavailable (and the read is refused).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// First wait before opening an unopenable store again; doubled on each
/// failure up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS store_identity (
    only INTEGER PRIMARY KEY CHECK (only = 1),
    id TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS claims (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('held', 'consumed', 'released')),
    proxy_id TEXT NOT NULL,
    session_id INTEGER NOT NULL,
    client_addr TEXT NOT NULL,
    application_name TEXT NOT NULL,
    claimed_at_ms INTEGER NOT NULL,
    lapse_at_ms INTEGER NOT NULL,
    consumed_at_ms INTEGER,
    evidence TEXT,
    refusals INTEGER NOT NULL DEFAULT 0,
    takeovers INTEGER NOT NULL DEFAULT 0,
    superseded_at_ms INTEGER,
    abandon_at_ms INTEGER,
    epoch INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, fingerprint)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS claims_consumed_at ON claims(consumed_at_ms);
CREATE INDEX IF NOT EXISTS claims_lapse_at ON claims(lapse_at_ms);
CREATE INDEX IF NOT EXISTS claims_superseded_at ON claims(superseded_at_ms);
CREATE INDEX IF NOT EXISTS claims_holder ON claims(proxy_id, session_id);
CREATE TABLE IF NOT EXISTS run_leases (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    answered_checkpoint_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    proxy_id TEXT NOT NULL,
    session_id INTEGER NOT NULL,
    client_addr TEXT NOT NULL,
    application_name TEXT NOT NULL,
    answered_at_ms INTEGER NOT NULL,
    last_write_ms INTEGER NOT NULL,
    until_ms INTEGER NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS run_leases_until ON run_leases(until_ms);
"#;

/// Whether opening may create the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpenMode {
    /// Create the file (and its identity) if it does not exist: the proxy.
    Create,
    /// The file must exist: operator commands, which must not start a new
    /// store beside the one the replicas use.
    Existing,
}

/// The path of the store and, once opened, the connection to it.
pub(super) struct StoreFile {
    path: PathBuf,
    shown: String,
    slot: Mutex<Slot>,
}

enum Slot {
    /// Not open: the last attempt failed with `error`; no new attempt is
    /// made before `retry_at`.
    Closed {
        error: StoreError,
        retry_at: Instant,
        backoff: Duration,
    },
    Open(Opened),
}

struct Opened {
    conn: Connection,
    /// The identity row of the file this process opened.
    identity: String,
    /// Device and inode of that file (`None` where the platform has none).
    file: Option<FileId>,
    /// Why the path no longer holds that file, while it does not.
    lost: Option<String>,
}

impl StoreFile {
    /// Opens the file now; an error is returned as is (nothing is retried).
    pub(super) fn open(path: &Path, mode: OpenMode) -> Result<StoreFile, StoreError> {
        let shown = path.display().to_string();
        let opened = open_file(path, &shown, mode)?;
        Ok(StoreFile {
            path: path.to_path_buf(),
            shown,
            slot: Mutex::new(Slot::Open(opened)),
        })
    }

    /// Opens the file now if it can; otherwise says so (ERROR) and tries
    /// again on use, with backoff, until it opens.
    pub(super) fn connect(path: &Path) -> StoreFile {
        let shown = path.display().to_string();
        let slot = match open_file(path, &shown, OpenMode::Create) {
            Ok(opened) => Slot::Open(opened),
            Err(error) => {
                tracing::error!(%error, "claim store cannot be opened: reads of parked heads are \
                    refused (58000) until it opens; opening is retried on use");
                Slot::Closed {
                    error,
                    retry_at: Instant::now() + FIRST_RETRY,
                    backoff: FIRST_RETRY,
                }
            }
        };
        StoreFile {
            path: path.to_path_buf(),
            shown,
            slot: Mutex::new(slot),
        }
    }

    /// The file as shown in errors.
    pub(super) fn shown(&self) -> &str {
        &self.shown
    }

    /// Runs `f` in one transaction of `behavior` on the file this process
    /// opened, committed on success; opens the file first if it is not
    /// open and its retry time has come.
    pub(super) fn with_tx<T>(
        &self,
        op: &'static str,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        // A panic elsewhere cannot leave a half-done transaction behind:
        // dropping a `Transaction` rolls it back, so the connection is sound.
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Slot::Closed {
            error,
            retry_at,
            backoff,
        } = &*slot
        {
            if Instant::now() < *retry_at {
                return Err(error.clone());
            }
            match open_file(&self.path, &self.shown, OpenMode::Create) {
                Ok(opened) => {
                    tracing::warn!(path = %self.shown, "claim store opened: reads of parked heads \
                        are claimed again");
                    *slot = Slot::Open(opened);
                }
                Err(error) => {
                    let backoff = (*backoff * 2).min(MAX_RETRY);
                    tracing::debug!(%error, "claim store still cannot be opened");
                    *slot = Slot::Closed {
                        error: error.clone(),
                        retry_at: Instant::now() + backoff,
                        backoff,
                    };
                    return Err(error);
                }
            }
        }
        match &mut *slot {
            Slot::Open(opened) => opened.run(&self.path, &self.shown, op, behavior, f),
            Slot::Closed { error, .. } => Err(error.clone()),
        }
    }
}

impl Opened {
    fn run<T>(
        &mut self,
        path: &Path,
        shown: &str,
        op: &'static str,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let err = |e: rusqlite::Error| StoreError::Sqlite {
            path: shown.to_owned(),
            op,
            reason: describe(&e),
        };
        if let Some(reason) = self.file.and_then(|ours| ours.replaced_at(path)) {
            return Err(lose(&mut self.lost, shown, reason));
        }
        let tx = self.conn.transaction_with_behavior(behavior).map_err(err)?;
        let identity = match read_identity(&tx) {
            Ok(Some(id)) if id == self.identity => None,
            Ok(Some(id)) => Some(format!(
                "its identity is {id}, not {} (the file was overwritten)",
                self.identity
            )),
            Ok(None) => Some("its identity row is gone (the file was overwritten)".to_owned()),
            Err(e) if is_missing_table(&e) => {
                Some("it has no identity table (the file was overwritten)".to_owned())
            }
            Err(e) => return Err(err(e)),
        };
        if let Some(reason) = identity {
            drop(tx);
            return Err(lose(&mut self.lost, shown, reason));
        }
        let out = f(&tx).map_err(err)?;
        tx.commit().map_err(err)?;
        if let Some(was) = self.lost.take() {
            tracing::warn!(path = %shown, %was, "claim store is back: the path holds the file \
                this proxy opened again; reads of parked heads are claimed again");
        }
        Ok(out)
    }
}

/// The store is not the one this process opened: logs the transition once
/// (ERROR) and returns the error every operation gets meanwhile.
fn lose(lost: &mut Option<String>, shown: &str, reason: String) -> StoreError {
    if lost.is_none() {
        tracing::error!(path = %shown, %reason, "claim store removed or replaced under this \
            proxy: reads of parked heads are refused (58000, fail closed) until the file it \
            opened is back; to adopt a new store, restart every proxy that shares it");
        *lost = Some(reason.clone());
    }
    StoreError::Replaced {
        path: shown.to_owned(),
        reason,
    }
}

fn read_identity(tx: &Transaction<'_>) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    tx.prepare_cached("SELECT id FROM store_identity WHERE only = 1")?
        .query_row([], |r| r.get(0))
        .optional()
}

fn is_missing_table(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(msg)) if msg.starts_with("no such table"))
}

/// Opens the file, creates or upgrades the schema and its identity row.
fn open_file(path: &Path, shown: &str, mode: OpenMode) -> Result<Opened, StoreError> {
    let open_err = |reason: String| StoreError::Open {
        path: shown.to_owned(),
        reason,
    };
    if path.is_dir() {
        return Err(open_err("it is a directory, not a database file".into()));
    }
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(open_err(format!(
                "directory {} does not exist",
                parent.display()
            )));
        }
    }
    if mode == OpenMode::Existing && !path.exists() {
        return Err(open_err("no such file".into()));
    }
    let flags = match mode {
        OpenMode::Create => OpenFlags::default(),
        OpenMode::Existing => OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE,
    };
    let mut conn = Connection::open_with_flags(path, flags).map_err(|e| open_err(describe(&e)))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| open_err(describe(&e)))?;
    let journal: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| open_err(describe(&e)))?;
    if !journal.eq_ignore_ascii_case("wal") {
        tracing::warn!(path = %shown, mode = %journal, "claim store is not in WAL mode");
    }
    // NORMAL is durable across process crashes in WAL mode; an OS crash
    // may lose the last commits, but it also ends every racer.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| open_err(describe(&e)))?;
    // Which file the path names, right after opening it: should the path
    // change in between, the first operation fails closed (it compares
    // this with the path again) rather than trusting the wrong file.
    let file = FileId::of(path).map_err(|e| open_err(e.to_string()))?;
    let identity = prepare(&mut conn)
        .map_err(|e| open_err(format!("creating the claims schema: {}", describe(&e))))?;
    Ok(Opened {
        conn,
        identity,
        file,
        lost: None,
    })
}

/// Creates the schema, adds columns newer than the file, and creates the
/// identity row if the file has none; returns the identity. One
/// `BEGIN IMMEDIATE` transaction, so replicas starting together agree.
fn prepare(conn: &mut Connection) -> rusqlite::Result<String> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    let has_abandon = tx
        .prepare("SELECT 1 FROM pragma_table_info('claims') WHERE name = 'abandon_at_ms'")?
        .exists([])?;
    if !has_abandon {
        tx.execute_batch("ALTER TABLE claims ADD COLUMN abandon_at_ms INTEGER")?;
    }
    // Files from before generations were counted: their claims are each
    // key's first generation.
    let has_epoch = tx
        .prepare("SELECT 1 FROM pragma_table_info('claims') WHERE name = 'epoch'")?
        .exists([])?;
    if !has_epoch {
        tx.execute_batch("ALTER TABLE claims ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1")?;
    }
    tx.execute(
        "INSERT OR IGNORE INTO store_identity (only, id, created_at_ms) \
         VALUES (1, lower(hex(randomblob(16))), ?1)",
        [local_ms()],
    )?;
    let id: String = tx.query_row("SELECT id FROM store_identity WHERE only = 1", [], |r| {
        r.get(0)
    })?;
    tx.commit()?;
    Ok(id)
}

/// SQLite's text, with the busy case spelled out.
fn describe(e: &rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => format!(
            "{e} (still locked by another process after {} ms)",
            BUSY_TIMEOUT.as_millis()
        ),
        _ => e.to_string(),
    }
}

/// Which file a path names: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    #[cfg(unix)]
    fn of(path: &Path) -> std::io::Result<Option<FileId>> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
        }))
    }

    #[cfg(not(unix))]
    fn of(_path: &Path) -> std::io::Result<Option<FileId>> {
        Ok(None)
    }

    /// Why `path` no longer names this file, if it does not.
    fn replaced_at(self, path: &Path) -> Option<String> {
        match FileId::of(path) {
            Ok(Some(now)) if now == self => None,
            Ok(Some(_)) => Some("the path now holds another file (replaced)".to_owned()),
            Ok(None) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Some("the file was removed".to_owned())
            }
            Err(e) => Some(format!("cannot stat the file: {e}")),
        }
    }
}
