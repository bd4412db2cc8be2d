//! The PostgreSQL store's connections: a few for decisions (one short
//! transaction each, prepared statements cached) and one that only holds
//! this process's liveness lock. While either is down every operation
//! fails (the proxy fails closed, 58000), with one ERROR log per
//! transition, and reconnecting is retried on use with backoff.
//!
//! Liveness: the lock connection holds a session-level advisory lock keyed
//! by this process's instance id (from the `holder_instances` sequence),
//! and every claim and run lease records that id. Another proxy that finds
//! the lock gone (pg_locks) treats the holder as gone. The server ends the
//! lock when the connection dies: at once when the process is killed (the
//! kernel closes the socket), within the liveness bound when the network
//! is cut (server-side TCP keepalives and TCP user timeout set on it).
//! The proxy's end of every connection has the same (set where the
//! target's config is built), so a statement sent to a database that went
//! silent fails within the bound and the decision fails closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::schema;
use super::target::{DeadPeer, PgTarget};
use crate::claims::clock;
use crate::claims::error::StoreError;

/// How long a statement or a row lock may wait before the store counts as
/// unavailable (as the SQLite store's busy timeout).
const STATEMENT_TIMEOUT_MS: u64 = 2_000;

/// How long a decision waits for a row lock before it says so
/// (`RowLocked`, asked again while the reader may wait): below the
/// statement timeout, so a lock wait is told apart from a stuck server.
const LOCK_TIMEOUT_MS: u64 = 1_000;

const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// Whether connecting may create or upgrade the schema and must hold a
/// liveness lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The proxy: migrates, holds the liveness lock.
    Proxy,
    /// Operator commands: the schema must exist; no lock (they never
    /// take claims).
    Operator,
}

pub(super) struct PgConn {
    pub(super) target: PgTarget,
    role: Role,
    /// Decision connections: a session's read does not wait behind the
    /// evidence worker's write, nor one session behind another.
    slots: Vec<Mutex<Option<Decision>>>,
    next: AtomicUsize,
    liveness: Mutex<Option<Liveness>>,
    /// The instance id of the lock last confirmed held, and when (ms
    /// since `born`, monotonic; 0: never), so a decision needs neither
    /// the liveness mutex nor a round trip while the heartbeat keeps
    /// confirming it.
    confirmed_instance: AtomicI64,
    confirmed_at: AtomicU64,
    born: Instant,
    /// Why the store is down, while it is.
    down: Mutex<Option<Down>>,
}

/// Decision connections per proxy process.
const POOL: usize = 3;

struct Down {
    error: StoreError,
    retry_at: Instant,
    backoff: Duration,
}

struct Decision {
    client: Client,
    cache: HashMap<String, Statement>,
}

struct Liveness {
    client: Client,
    instance: i64,
}

/// How long a confirmation that this process's liveness lock is held
/// stands: a decision after that asks the lock connection itself (a
/// round trip on its path), which only happens when the heartbeat could
/// not confirm it.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

/// How often the heartbeat confirms the lock and reads the database's
/// clock, off the request path.
const HEARTBEAT: Duration = Duration::from_millis(400);

/// The database's clock, in ms since the Unix epoch.
const CLOCK_SQL: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// Why an operation failed: the server's message with its SQLSTATE, or a
/// row that does not map to a claim.
#[derive(Debug)]
pub(super) struct Fail(pub(super) String);

/// Why a decision failed: it waited out its lock timeout on a row, or
/// anything else.
enum Failed {
    RowLocked,
    Other(Fail),
}

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Fail {
        Fail(describe(&e))
    }
}

/// Where a decision's statements run.
enum Link<'a> {
    /// One transaction, committed when the decision returns.
    Tx(Transaction<'a>),
    /// Each statement on its own (autocommit): a decision of one
    /// statement, without the round trips of BEGIN and COMMIT.
    Single(&'a mut Client),
}

/// One decision's transaction, with the statement cache and this
/// process's instance id.
pub(super) struct Tx<'a> {
    link: Link<'a>,
    cache: &'a mut HashMap<String, Statement>,
    pub(super) instance: i64,
    pub(super) schema: &'a str,
    /// A statement of this decision waited out its lock timeout.
    row_locked: bool,
}

impl Tx<'_> {
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.cache.get(sql) {
            return Ok(s.clone());
        }
        let s = match &mut self.link {
            Link::Tx(tx) => tx.prepare(sql)?,
            Link::Single(c) => c.prepare(sql)?,
        };
        self.cache.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    pub(super) fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let s = self.statement(sql)?;
        let out = match &mut self.link {
            Link::Tx(tx) => tx.query(&s, params),
            Link::Single(c) => c.query(&s, params),
        };
        self.note(out)
    }

    fn note<T>(&mut self, out: Result<T, postgres::Error>) -> Result<T, postgres::Error> {
        if out.as_ref().err().is_some_and(is_row_locked) {
            self.row_locked = true;
        }
        out
    }

    pub(super) fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let s = self.statement(sql)?;
        let out = match &mut self.link {
            Link::Tx(tx) => tx.execute(&s, params),
            Link::Single(c) => c.execute(&s, params),
        };
        self.note(out)
    }
}

impl PgConn {
    fn new(target: PgTarget, role: Role) -> PgConn {
        PgConn {
            target,
            role,
            slots: (0..POOL).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            liveness: Mutex::new(None),
            confirmed_instance: AtomicI64::new(0),
            confirmed_at: AtomicU64::new(0),
            born: Instant::now(),
            down: Mutex::new(None),
        }
    }

    /// Records that the lock of `instance` is held, now.
    fn confirm(&self, instance: i64) {
        let at = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.confirmed_instance.store(instance, Ordering::Relaxed);
        self.confirmed_at.store(at.max(1), Ordering::Release);
    }

    /// The instance whose lock was confirmed held within [`LIVENESS_CHECK`].
    fn confirmed(&self) -> Option<i64> {
        let at = self.confirmed_at.load(Ordering::Acquire);
        if at == 0 {
            return None;
        }
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let fresh = now.saturating_sub(at) < LIVENESS_CHECK.as_millis() as u64;
        fresh.then(|| self.confirmed_instance.load(Ordering::Relaxed))
    }

    /// Whether this process holds its liveness lock (confirmed within
    /// [`LIVENESS_CHECK`]) and the store is not down: what it remembers of
    /// its own claims still stands for other proxies.
    pub(super) fn live(&self) -> bool {
        self.confirmed().is_some()
            && self
                .down
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none()
    }

    fn unconfirm(&self) {
        self.confirmed_at.store(0, Ordering::Release);
    }

    /// One heartbeat: the lock connection answers (the lock is held) and
    /// tells the database's time ([`clock`]). A failure only withdraws
    /// the confirmation: the next decision finds out and takes a new lock.
    fn beat(&self) {
        let mut liveness = self.liveness.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(l) = liveness.as_mut() else {
            return;
        };
        match read_clock(&mut l.client) {
            Ok(()) => self.confirm(l.instance),
            Err(e) => {
                self.unconfirm();
                tracing::debug!(error = %describe(&e), "claims heartbeat failed");
            }
        }
    }

    /// Starts the heartbeat thread of a proxy's store; it ends with the
    /// store.
    fn start_heartbeat(conn: &Arc<PgConn>) {
        if conn.role != Role::Proxy {
            return;
        }
        let weak: Weak<PgConn> = Arc::downgrade(conn);
        let spawned = std::thread::Builder::new()
            .name("claims-heartbeat".into())
            .spawn(move || loop {
                std::thread::sleep(HEARTBEAT);
                match weak.upgrade() {
                    Some(conn) => conn.beat(),
                    None => return,
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "claims heartbeat thread could not start: every \
                decision checks the liveness lock itself");
        }
    }

    /// Connects every decision connection now if it can (a proxy holds
    /// from its start what it holds under traffic); otherwise logs the
    /// error (ERROR) and connects on use, with backoff.
    pub(super) fn connect(target: PgTarget, role: Role) -> Arc<PgConn> {
        let conn = Arc::new(PgConn::new(target, role));
        for slot in &conn.slots {
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(error) = conn.ensure(&mut slot) {
                conn.mark_down(error);
                break;
            }
        }
        PgConn::start_heartbeat(&conn);
        conn
    }

    /// Connects now; an error is returned as is.
    pub(super) fn open_now(target: PgTarget, role: Role) -> Result<Arc<PgConn>, StoreError> {
        let conn = Arc::new(PgConn::new(target, role));
        let mut slot = conn.slot();
        conn.ensure(&mut slot)?;
        drop(slot);
        PgConn::start_heartbeat(&conn);
        Ok(conn)
    }

    /// This process's instance id, while it holds its liveness lock.
    pub(super) fn instance(&self) -> Option<i64> {
        let liveness = self.liveness.lock().unwrap_or_else(PoisonError::into_inner);
        liveness.as_ref().map(|l| l.instance)
    }

    /// Runs `f` in one transaction, committed on success; (re)connects
    /// first what is not connected, once the retry time has come.
    pub(super) fn with_tx<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        self.decide(op, false, f)
    }

    /// Runs `f`, whose statements each commit on their own: for a
    /// decision that one statement makes.
    pub(super) fn with_single<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        self.decide(op, true, f)
    }

    fn decide<T>(
        &self,
        op: &'static str,
        single: bool,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        if let Some(error) = self.down_until_retry() {
            return Err(error);
        }
        let mut slot = self.slot();
        let instance = match self.ensure(&mut slot) {
            Ok(i) => i,
            Err(error) => {
                self.mark_down(error.clone());
                return Err(error);
            }
        };
        if self
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some()
        {
            tracing::warn!(at = %self.target.shown, "claim store reachable: reads of parked \
                heads are claimed again");
        }
        let Some(decision) = slot.as_mut() else {
            return Err(StoreError::Postgres {
                at: self.target.shown.clone(),
                op,
                reason: "not connected".into(),
            });
        };
        match run(decision, instance, &self.target.schema, single, f) {
            Ok(v) => Ok(v),
            Err(Failed::RowLocked) => Err(StoreError::RowLocked {
                at: self.target.shown.clone(),
                op,
            }),
            Err(Failed::Other(Fail(reason))) => {
                let error = StoreError::Postgres {
                    at: self.target.shown.clone(),
                    op,
                    reason,
                };
                if decision.client.is_closed() {
                    *slot = None;
                    self.mark_down(error.clone());
                }
                Err(error)
            }
        }
    }

    /// A free decision connection's slot, else the next one's (waited for).
    fn slot(&self) -> MutexGuard<'_, Option<Decision>> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for i in 0..n {
            match self.slots[(start + i) % n].try_lock() {
                Ok(g) => return g,
                Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        self.slots[start]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the store is down, while its retry time has not come.
    fn down_until_retry(&self) -> Option<StoreError> {
        let down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        down.as_ref()
            .filter(|d| Instant::now() < d.retry_at)
            .map(|d| d.error.clone())
    }

    /// The store is down: every operation fails until the retry time
    /// (first 100 ms, doubled per failed retry up to 2 s); logged (ERROR)
    /// on the transition. A failure before the retry time came (another
    /// decision's, in flight when the store was marked down) is already
    /// counted.
    fn mark_down(&self, error: StoreError) {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if down.as_ref().is_some_and(|d| Instant::now() < d.retry_at) {
            return;
        }
        let backoff = match &*down {
            Some(d) => {
                tracing::debug!(%error, "claim store still cannot be reached");
                (d.backoff * 2).min(MAX_RETRY)
            }
            None => {
                tracing::error!(%error, "claim store unavailable: reads of parked heads are \
                    refused (58000, fail closed) until it is back; reconnecting is retried \
                    on use");
                FIRST_RETRY
            }
        };
        *down = Some(Down {
            error,
            retry_at: Instant::now() + backoff,
            backoff,
        });
    }

    /// Connects the slot's decision connection if it is not (migrating the
    /// schema for the proxy, checking it exists for operators) and, for the
    /// proxy, takes a liveness lock if it holds none or its connection
    /// died; returns this process's instance id (0 for operators).
    ///
    /// A decision that waited for its slot or the liveness lock while
    /// another failed to connect does not try again before the retry time:
    /// against a silent database each try costs the connect timeout, and
    /// the reads waiting behind it would wait for every one. (So a failure
    /// to take the lock marks the store down before the lock is let go.)
    fn ensure(&self, slot: &mut Option<Decision>) -> Result<i64, StoreError> {
        let target = &self.target;
        if slot.as_ref().is_none_or(|d| d.client.is_closed()) {
            *slot = None;
            if let Some(error) = self.down_until_retry() {
                return Err(error);
            }
            *slot = Some(connect_decision(target, self.role)?);
        }
        if self.role == Role::Operator {
            return Ok(0);
        }
        if let Some(instance) = self.confirmed() {
            return Ok(instance);
        }
        let mut liveness = self.liveness.lock().unwrap_or_else(PoisonError::into_inner);
        let mut lost = None;
        if let Some(l) = &mut *liveness {
            let alive = !l.client.is_closed() && l.client.is_valid(LIVENESS_CHECK).is_ok();
            if alive {
                self.confirm(l.instance);
                return Ok(l.instance);
            }
            self.unconfirm();
            tracing::error!(
                instance = l.instance,
                "claims liveness lock lost: other proxies count this one's holders as gone \
                 meanwhile; taking a new one"
            );
            lost = Some(l.instance);
            *liveness = None;
        }
        if let Some(error) = self.down_until_retry() {
            return Err(error);
        }
        let open_err = |e: postgres::Error| {
            let error = StoreError::Open {
                path: target.shown.clone(),
                reason: format!("taking the liveness lock: {}", describe(&e)),
            };
            self.mark_down(error.clone());
            error
        };
        let (client, instance) = lock_instance(target).map_err(open_err)?;
        if let (Some(old), Some(d)) = (lost, slot.as_mut()) {
            // This process's claims not yet counted as gone are its
            // holders' still: they follow it to its new lock.
            let s = &target.schema;
            d.client
                .batch_execute(&format!(
                    "UPDATE {s}.claims SET holder_instance = {instance} \
                     WHERE holder_instance = {old} AND abandon_at_ms IS NULL; \
                     UPDATE {s}.run_leases SET holder_instance = {instance} \
                     WHERE holder_instance = {old}"
                ))
                .map_err(open_err)?;
        }
        *liveness = Some(Liveness { client, instance });
        self.confirm(instance);
        Ok(instance)
    }
}

fn run<T>(
    decision: &mut Decision,
    instance: i64,
    schema: &str,
    single: bool,
    f: impl FnOnce(&mut Tx<'_>) -> Result<T, Fail>,
) -> Result<T, Failed> {
    let link = if single {
        Link::Single(&mut decision.client)
    } else {
        Link::Tx(decision.client.transaction().map_err(failed)?)
    };
    let mut t = Tx {
        link,
        cache: &mut decision.cache,
        instance,
        schema,
        row_locked: false,
    };
    let out = f(&mut t);
    let row_locked = t.row_locked;
    let out = match out {
        Ok(v) => v,
        Err(_) if row_locked => return Err(Failed::RowLocked),
        Err(e) => return Err(Failed::Other(e)),
    };
    if let Link::Tx(tx) = t.link {
        tx.commit().map_err(failed)?;
    }
    Ok(out)
}

fn failed(e: postgres::Error) -> Failed {
    if is_row_locked(&e) {
        Failed::RowLocked
    } else {
        Failed::Other(Fail::from(e))
    }
}

/// The statement waited out `lock_timeout` (55P03).
fn is_row_locked(e: &postgres::Error) -> bool {
    e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// A connection with `config`, over TLS where `target` has it (its
/// `sslmode` says whether TLS is required or only preferred).
pub(super) fn connect(
    config: &postgres::Config,
    target: &PgTarget,
) -> Result<Client, postgres::Error> {
    match &target.tls {
        Some(tls) => config.connect(MakeRustlsConnect::new((**tls).clone())),
        None => config.connect(NoTls),
    }
}

/// The decision connection, its schema migrated (proxy) or checked to
/// exist (operators).
fn connect_decision(target: &PgTarget, role: Role) -> Result<Decision, StoreError> {
    let err = |e: postgres::Error| StoreError::Open {
        path: target.shown.clone(),
        reason: describe(&e),
    };
    let mut client = connect(&target.config, target).map_err(err)?;
    client
        .batch_execute(&format!(
            "SET statement_timeout = {STATEMENT_TIMEOUT_MS}; \
             SET lock_timeout = {LOCK_TIMEOUT_MS}; \
             SET idle_in_transaction_session_timeout = {}",
            STATEMENT_TIMEOUT_MS * 5
        ))
        .map_err(err)?;
    let schema = &target.schema;
    match role {
        Role::Proxy => schema::migrate(&mut client, schema).map_err(|e| StoreError::Open {
            path: target.shown.clone(),
            reason: format!("creating the claims schema {schema}: {}", describe(&e)),
        })?,
        Role::Operator => {
            if schema::version(&mut client, schema).map_err(err)? == 0 {
                return Err(StoreError::Open {
                    path: target.shown.clone(),
                    reason: format!("no claims schema {schema} (no proxy has used this database)"),
                });
            }
        }
    }
    Ok(Decision {
        client,
        cache: HashMap::new(),
    })
}

/// The liveness connection, with the server's end given the same
/// keepalives and TCP user timeout as the proxy's (so the server drops the
/// lock of a partitioned proxy within the bound), holding a fresh instance
/// id's session-level advisory lock.
fn lock_instance(target: &PgTarget) -> Result<(Client, i64), postgres::Error> {
    let mut config = target.config.clone();
    config.application_name("resumeguard-claims-liveness");
    let mut lock = connect(&config, target)?;
    let p = DeadPeer::within(target.liveness_bound);
    lock.batch_execute(&format!(
        "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = {}; \
         SET tcp_keepalives_count = {}; SET tcp_user_timeout = {}",
        p.idle.as_secs(),
        p.interval.as_secs(),
        p.retries,
        p.user_timeout.as_millis()
    ))?;
    let mut id = next_instance(&mut lock, &target.schema)?;
    loop {
        let locked: bool = lock
            .query_one("SELECT pg_try_advisory_lock($1)", &[&id])?
            .get(0);
        if locked {
            read_clock(&mut lock)?;
            return Ok((lock, id));
        }
        // A dead predecessor's backend still holds it: take a new id.
        id = next_instance(&mut lock, &target.schema)?;
    }
}

/// Reads the database's clock into [`clock`] (one round trip).
fn read_clock(client: &mut Client) -> Result<(), postgres::Error> {
    let sent = clock::local_ms();
    let server: i64 = client.query_one(CLOCK_SQL, &[])?.get(0);
    clock::observe(sent, server, clock::local_ms());
    Ok(())
}

fn next_instance(client: &mut Client, schema: &str) -> Result<i64, postgres::Error> {
    client
        .query_one(&format!("SELECT nextval('{schema}.holder_instances')"), &[])
        .map(|r| r.get(0))
}

/// The server's message, with its SQLSTATE, or the client's.
pub(super) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}
