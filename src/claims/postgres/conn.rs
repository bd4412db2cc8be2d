//! The PostgreSQL store's connections: a few for decisions (one short
//! transaction each, prepared statements cached) and one that only holds
//! this process's liveness lock. While either is down every operation
//! fails (the proxy fails closed, 58000), with one ERROR log per
//! transition, and reconnecting is retried on use with backoff.
//!
//! A connection the server ended while the database stays up (an
//! idle-session reaper's `pg_terminate_backend`, `idle_session_timeout`:
//! 57P01, 57P05, or its stream closed or reset) is not an outage: the
//! decision that finds it reconnects and runs again at once (for as long
//! as `reaped::REAPED_BUDGET` allows, see `reaped`; the statement did not
//! commit on the ended backend), and the heartbeat re-takes a reaped lock
//! connection's lock (the same instance id) at its next beat. Each replacement is counted
//! (`resumeguard_claims_reconnects_total`).
//!
//! Liveness: the lock connection holds a session-level advisory lock keyed
//! by this process's instance id (the schema's OID and a number from its
//! `holder_instances` sequence, see `next_instance`),
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
use postgres::{Client, Row, Statement, Transaction};

use super::fault::{credential_fix, fix_for, StartFault};
use super::reaped::{reaped, Replacing};
use crate::claims::error::StoreError;
use crate::metrics;
use crate::pg::connect::{connect, error_text};
use crate::pg::credential::CredentialError;
use crate::pg::dead_peer::DeadPeer;
use crate::pg::migration::{self, SchemaMigrations};
use crate::pg::Backoff;
use crate::pg::PgTarget;

/// How long a statement or a row lock may wait before the store counts as
/// unavailable.
const STATEMENT_TIMEOUT_MS: u64 = 2_000;

/// How long a decision waits for a row lock before it says so
/// (`RowLocked`, asked again while the reader may wait): below the
/// statement timeout, so a lock wait is told apart from a stuck server.
const LOCK_TIMEOUT_MS: u64 = 1_000;

const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// How long re-taking this process's liveness lock waits for the ended
/// backend that held it to exit (the server sends the client the
/// termination before it releases the backend's locks); a lock still
/// held after it (the old connection is alive somewhere, cut off) is
/// given up for a new instance's.
const RELOCK_WAIT_MS: u64 = 500;

/// Whether connecting may create or upgrade the schema and must hold a
/// liveness lock.
#[derive(Debug, Clone, Copy)]
pub(super) enum Role {
    /// The proxy: migrates the shared schema with these, holds the
    /// liveness lock.
    Proxy(SchemaMigrations),
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
    /// Why the first connect failed, if it did.
    start_fault: Mutex<Option<StartFault>>,
}

/// Decision connections per proxy process.
const POOL: usize = 3;

struct Down {
    error: StoreError,
    retry_at: Instant,
    backoff: Backoff,
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

/// How often the heartbeat confirms the lock, off the request path.
const HEARTBEAT: Duration = Duration::from_millis(400);

/// Why an operation failed: the server's message with its SQLSTATE, or a
/// row that does not map to a claim.
#[derive(Debug)]
pub(super) struct Fail(pub(super) String);

/// Why a decision failed: it waited out its lock timeout on a row, its
/// connection was ended under it (see [`reaped`]), or anything else.
enum Failed {
    RowLocked,
    Reaped(Fail),
    Other(Fail),
}

/// Why a connection could not be made ready: the error, and whether the
/// server ended the connection under it (another attempt may succeed at
/// once) rather than refusing or failing to answer.
pub(super) struct Unready {
    error: StoreError,
    reaped: bool,
    /// What an operator sets, when no retry mends it ([`fix_for`]).
    fix: Option<String>,
}

impl Unready {
    fn down(error: StoreError) -> Unready {
        Unready {
            error,
            reaped: false,
            fix: None,
        }
    }

    /// The password for `target` could not be read.
    fn credential(target: &PgTarget, e: &CredentialError) -> Unready {
        Unready {
            error: StoreError::PgOpen {
                at: target.shown().to_owned(),
                reason: format!("reading its password: {}", crate::error_chain::chain(e)),
            },
            reaped: false,
            fix: credential_fix(e),
        }
    }
}

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Fail {
        Fail(error_text(&e))
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
    /// A statement of this decision found its connection ended
    /// ([`reaped`]).
    reaped: bool,
}

impl Tx<'_> {
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.cache.get(sql) {
            return Ok(s.clone());
        }
        let s = match &mut self.link {
            Link::Tx(tx) => tx.prepare(sql),
            Link::Single(c) => c.prepare(sql),
        };
        let s = self.note(s)?;
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
        if let Err(e) = &out {
            self.row_locked |= is_row_locked(e);
            self.reaped |= reaped(e);
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
            start_fault: Mutex::new(None),
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

    /// One heartbeat: the lock connection answers (the lock is held). On a failure the lock is
    /// taken again at once (its connection was most likely ended by the
    /// server: the same reaper ended the idle decision connections too,
    /// which are then checked and replaced before a decision needs them).
    /// A store marked down is left to the decisions' retry time.
    fn beat(&self) {
        let mut liveness = self.liveness.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(l) = liveness.as_mut() else {
            return;
        };
        let e = match ping(&mut l.client) {
            Ok(()) => return self.confirm(l.instance),
            Err(e) => e,
        };
        self.unconfirm();
        tracing::debug!(error = %error_text(&e), "claims heartbeat failed");
        if self.down_until_retry().is_some() {
            return;
        }
        if let Err(u) = self.hold_lock(&mut liveness) {
            tracing::debug!(error = %u.error, "claims heartbeat could not take the lock again");
            return;
        }
        drop(liveness);
        self.replace_dead_decisions();
    }

    /// Checks each idle decision connection (one round trip each) and
    /// replaces those the server ended.
    fn replace_dead_decisions(&self) {
        for slot in &self.slots {
            let Ok(mut slot) = slot.try_lock() else {
                continue;
            };
            let dead = match slot.as_mut() {
                Some(d) => d.client.is_closed() || d.client.is_valid(LIVENESS_CHECK).is_err(),
                None => false,
            };
            if dead && self.down_until_retry().is_none() {
                *slot = None;
                match connect_decision(&self.target, self.role) {
                    Ok(d) => {
                        *slot = Some(d);
                        metrics::claims_reconnected("decision");
                    }
                    Err(u) => tracing::debug!(error = %u.error, "claims decision connection \
                        not replaced yet: the next decision connects it"),
                }
            }
        }
    }

    /// Starts the heartbeat thread of a proxy's store; it ends with the
    /// store.
    fn start_heartbeat(conn: &Arc<PgConn>) {
        if !matches!(conn.role, Role::Proxy(_)) {
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
            if let Err(u) = conn.ensure(&mut slot) {
                *conn
                    .start_fault
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(StartFault {
                    error: u.error.clone(),
                    fix: u.fix,
                });
                conn.mark_down(u.error);
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
        conn.ensure(&mut slot).map_err(|u| u.error)?;
        drop(slot);
        PgConn::start_heartbeat(&conn);
        Ok(conn)
    }

    /// Why the first connect failed, if it did (the fix of a permanent
    /// fault with it).
    pub(super) fn start_fault(&self) -> Option<StartFault> {
        self.start_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
        f: impl FnMut(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        self.decide(op, false, f)
    }

    /// Runs `f`, whose statements each commit on their own: for a
    /// decision that one statement makes.
    pub(super) fn with_single<T>(
        &self,
        op: &'static str,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        self.decide(op, true, f)
    }

    /// Runs the decision `f`; when its connection was ended under it
    /// (reaped) it runs again at once on a new one, for as long as
    /// `reaped::REAPED_BUDGET` allows: what ran on the ended backend did not
    /// commit. Anything else fails the decision, and a connection that is
    /// gone marks the store down.
    fn decide<T>(
        &self,
        op: &'static str,
        single: bool,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        if let Some(error) = self.down_until_retry() {
            return Err(error);
        }
        let mut slot = self.slot();
        let mut replacing = Replacing::start();
        loop {
            let error = match self.attempt(&mut slot, op, single, &mut f) {
                Ok(v) => return Ok(v),
                Err((error, false)) => return Err(error),
                Err((error, true)) => error,
            };
            if !replacing.again() {
                // The server answers (it ended the connections): not an
                // outage to back off from, so other decisions keep trying
                // on their own; this one fails closed.
                tracing::error!(%error, attempts = replacing.attempts(),
                    elapsed_ms = replacing.elapsed().as_millis() as u64,
                    "claims connection ended under every attempt of a decision: failing it \
                    closed");
                return Err(error);
            }
            tracing::warn!(%error, "claims connection ended by the server (an idle-session \
                reaper?): reconnecting and deciding again at once");
            // The same reaper most likely ended the lock connection too:
            // this decision asks it rather than trust the last beat.
            self.unconfirm();
        }
    }

    /// One attempt of a decision; an error says whether another attempt
    /// may succeed at once (the connection was ended under it).
    fn attempt<T>(
        &self,
        slot: &mut Option<Decision>,
        op: &'static str,
        single: bool,
        f: &mut impl FnMut(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, (StoreError, bool)> {
        let instance = match self.ensure(slot) {
            Ok(i) => i,
            Err(u) => {
                if !u.reaped {
                    self.mark_down(u.error.clone());
                }
                return Err((u.error, u.reaped));
            }
        };
        if self
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some()
        {
            tracing::warn!(at = %self.target.shown(), "claim store reachable: reads of parked \
                heads are claimed again");
        }
        let at = || self.target.shown().to_owned();
        let Some(decision) = slot.as_mut() else {
            let reason = "not connected".into();
            return Err((
                StoreError::Postgres {
                    at: at(),
                    op,
                    reason,
                },
                false,
            ));
        };
        match run(decision, instance, self.target.schema(), single, f) {
            Ok(v) => Ok(v),
            Err(Failed::RowLocked) => Err((StoreError::RowLocked { at: at(), op }, false)),
            Err(Failed::Reaped(Fail(reason))) => {
                // The connection is gone (the server said so, or its
                // stream ended): counted here, the next attempt connects
                // its replacement.
                *slot = None;
                metrics::claims_reconnected("decision");
                Err((
                    StoreError::Postgres {
                        at: at(),
                        op,
                        reason,
                    },
                    true,
                ))
            }
            Err(Failed::Other(Fail(reason))) => {
                let error = StoreError::Postgres {
                    at: at(),
                    op,
                    reason,
                };
                if decision.client.is_closed() {
                    *slot = None;
                    self.mark_down(error.clone());
                }
                Err((error, false))
            }
        }
    }

    /// The first free decision connection's slot, else the next one's in
    /// turn (waited for). The first free one, not the next in turn: a
    /// backend used a moment ago answers faster than one idle since the
    /// decision before last (its caches are warm), so the decisions of a
    /// quiet proxy go to one connection.
    fn slot(&self) -> MutexGuard<'_, Option<Decision>> {
        for slot in &self.slots {
            match slot.try_lock() {
                Ok(g) => return g,
                Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
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
        let backoff = match down.take() {
            Some(mut d) => {
                tracing::debug!(%error, "claim store still cannot be reached");
                d.backoff.grow();
                d.backoff
            }
            None => {
                tracing::error!(%error, "claim store unavailable: reads of parked heads are \
                    refused (58000, fail closed) until it is back; reconnecting is retried \
                    on use");
                Backoff::new(FIRST_RETRY, MAX_RETRY)
            }
        };
        *down = Some(Down {
            error,
            retry_at: Instant::now() + backoff.wait(),
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
    /// to take the lock marks the store down before the lock is let go,
    /// unless the connection was ended under it: then the next attempt
    /// follows at once.)
    fn ensure(&self, slot: &mut Option<Decision>) -> Result<i64, Unready> {
        let target = &self.target;
        if slot.as_ref().is_none_or(|d| d.client.is_closed()) {
            let replacing = slot.is_some();
            *slot = None;
            if let Some(error) = self.down_until_retry() {
                return Err(Unready::down(error));
            }
            *slot = Some(connect_decision(target, self.role)?);
            if replacing {
                metrics::claims_reconnected("decision");
            }
        }
        if matches!(self.role, Role::Operator) {
            return Ok(0);
        }
        if let Some(instance) = self.confirmed() {
            return Ok(instance);
        }
        let mut liveness = self.liveness.lock().unwrap_or_else(PoisonError::into_inner);
        self.hold_lock(&mut liveness)
    }

    /// This process's instance id, its lock held: the lock connection is
    /// asked whether it lives (one round trip), and a lock whose
    /// connection died is taken again (see [`lock_instance`]), the lock
    /// connection ended under it tried again at once while
    /// `reaped::REAPED_BUDGET` allows.
    fn hold_lock(&self, liveness: &mut Option<Liveness>) -> Result<i64, Unready> {
        let target = &self.target;
        let mut lost = None;
        if let Some(l) = liveness.as_mut() {
            let alive = !l.client.is_closed() && l.client.is_valid(LIVENESS_CHECK).is_ok();
            if alive {
                self.confirm(l.instance);
                return Ok(l.instance);
            }
            self.unconfirm();
            tracing::warn!(
                instance = l.instance,
                "claims liveness lock connection lost: taking the lock again (other proxies \
                 count this one's holders as gone meanwhile; a lock back within \
                 holder_gone_grace_ms hands none of its claims over)"
            );
            lost = Some(l.instance);
            *liveness = None;
        }
        if let Some(error) = self.down_until_retry() {
            return Err(Unready::down(error));
        }
        let mut replacing = Replacing::start();
        let (client, instance) = loop {
            let config = match target.config_now() {
                Ok(c) => c,
                Err(e) => {
                    let u = Unready::credential(target, &e);
                    self.mark_down(u.error.clone());
                    return Err(u);
                }
            };
            match lock_instance(target, &config, lost) {
                Ok(got) => break got,
                Err(e) => {
                    let u = Unready {
                        error: StoreError::PgOpen {
                            at: target.shown().to_owned(),
                            reason: format!("taking the liveness lock: {}", error_text(&e)),
                        },
                        reaped: reaped(&e),
                        fix: fix_for(&e, target.schema()),
                    };
                    if u.reaped && replacing.again() {
                        continue;
                    }
                    if !u.reaped {
                        self.mark_down(u.error.clone());
                    }
                    return Err(u);
                }
            }
        };
        if let Some(old) = lost {
            metrics::claims_reconnected("liveness");
            if old == instance {
                tracing::warn!(instance, "claims liveness lock taken again (same instance)");
            } else {
                tracing::error!(
                    old,
                    instance,
                    "claims liveness lock of this instance still held by its old connection: \
                     took a new instance's, which this process's claims follow"
                );
            }
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
    f: &mut impl FnMut(&mut Tx<'_>) -> Result<T, Fail>,
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
        reaped: false,
    };
    let out = f(&mut t);
    let (row_locked, was_reaped) = (t.row_locked, t.reaped);
    let out = match out {
        Ok(v) => v,
        Err(_) if row_locked => return Err(Failed::RowLocked),
        Err(e) if was_reaped => return Err(Failed::Reaped(e)),
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
    } else if reaped(&e) {
        Failed::Reaped(Fail::from(e))
    } else {
        Failed::Other(Fail::from(e))
    }
}

/// The statement waited out `lock_timeout` (55P03).
fn is_row_locked(e: &postgres::Error) -> bool {
    e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// The decision connection, its schema migrated (proxy) or checked to
/// exist (operators).
fn connect_decision(target: &PgTarget, role: Role) -> Result<Decision, Unready> {
    let err = |reason: String, e: &postgres::Error| Unready {
        error: StoreError::PgOpen {
            at: target.shown().to_owned(),
            reason,
        },
        reaped: reaped(e),
        fix: fix_for(e, target.schema()),
    };
    let plain = |e: postgres::Error| err(error_text(&e), &e);
    let config = target
        .config_now()
        .map_err(|e| Unready::credential(target, &e))?;
    let mut client = connect(&config, target).map_err(plain)?;
    client
        .batch_execute(&format!(
            "SET statement_timeout = {STATEMENT_TIMEOUT_MS}; \
             SET lock_timeout = {LOCK_TIMEOUT_MS}; \
             SET idle_in_transaction_session_timeout = {}",
            STATEMENT_TIMEOUT_MS * 5
        ))
        .map_err(plain)?;
    let schema = target.schema();
    match role {
        Role::Proxy(migrations) => {
            migration::migrate(&mut client, schema, migrations).map_err(|e| {
                err(
                    format!("creating the claims schema {schema}: {}", error_text(&e)),
                    &e,
                )
            })?
        }
        Role::Operator => {
            if migration::version(&mut client, schema).map_err(plain)? == 0 {
                return Err(Unready::down(StoreError::PgOpen {
                    at: target.shown().to_owned(),
                    reason: format!("no claims schema {schema} (no proxy has used this database)"),
                }));
            }
        }
    }
    Ok(Decision {
        client,
        cache: HashMap::new(),
    })
}

/// Connects once as a decision connection does (password read, schema
/// made or brought up to date) and lets the connection go: the start
/// check of the audit table's database where no claims store checks it.
pub fn check_once(target: &PgTarget, migrations: SchemaMigrations) -> Result<(), StartFault> {
    connect_decision(target, Role::Proxy(migrations))
        .map(drop)
        .map_err(|u| StartFault {
            error: u.error,
            fix: u.fix,
        })
}

/// The liveness connection, with the server's end given the same
/// keepalives and TCP user timeout as the proxy's (so the server drops the
/// lock of a partitioned proxy within the bound), holding a session-level
/// advisory lock: `again`'s when this process held it before (its
/// connection was lost) and the backend that held it lets it go within
/// [`RELOCK_WAIT_MS`], else a fresh instance id's. Taken again, the lock
/// takes back what sweeps did to `again`'s claims meanwhile (see
/// `liveness`).
fn lock_instance(
    target: &PgTarget,
    config: &postgres::Config,
    again: Option<i64>,
) -> Result<(Client, i64), postgres::Error> {
    let mut config = config.clone();
    config.application_name("resumeguard-claims-liveness");
    let mut lock = connect(&config, target)?;
    let p = DeadPeer::within(target.liveness_bound());
    lock.batch_execute(&format!(
        "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = {}; \
         SET tcp_keepalives_count = {}; SET tcp_user_timeout = {}; \
         SET statement_timeout = {STATEMENT_TIMEOUT_MS}",
        p.idle.as_secs(),
        p.interval.as_secs(),
        p.retries,
        p.user_timeout.as_millis()
    ))?;
    let s = target.schema();
    let mut id = match again {
        Some(old) => {
            lock.batch_execute(&format!("SET lock_timeout = {RELOCK_WAIT_MS}"))?;
            let same = lock.execute("SELECT pg_advisory_lock($1)", &[&old]);
            lock.batch_execute(&format!("SET lock_timeout = {LOCK_TIMEOUT_MS}"))?;
            match same {
                Ok(_) => {
                    lock.execute(&format!("SELECT {s}.revive($1, $1)"), &[&old])?;
                    return Ok((lock, old));
                }
                Err(e) if is_row_locked(&e) => next_instance(&mut lock, s)?,
                Err(e) => return Err(e),
            }
        }
        None => next_instance(&mut lock, s)?,
    };
    loop {
        let locked: bool = lock
            .query_one("SELECT pg_try_advisory_lock($1)", &[&id])?
            .try_get(0)?;
        if locked {
            if let Some(old) = again {
                // This process's claims not counted as gone by a closed
                // session are its holders' still: they follow it to its
                // new lock.
                lock.execute(&format!("SELECT {s}.revive($1, $2)"), &[&old, &id])?;
            }
            return Ok((lock, id));
        }
        // A dead predecessor's backend still holds it: take a new id.
        id = next_instance(&mut lock, s)?;
    }
}

/// Asks the lock connection to answer (one round trip).
fn ping(client: &mut Client) -> Result<(), postgres::Error> {
    client.batch_execute("SELECT 1")
}

/// A fresh instance id: the schema's OID in the high half and the next
/// number of its `holder_instances` in the low. Advisory locks are keyed
/// per database, not per schema: another schema's proxies (another
/// deployment's, or a test's) draw the same numbers from their own
/// sequence, and a bare number held by one of them would keep this
/// schema's gone holder of that number alive. The schema's half also
/// keeps the keys clear of the small integers applications lock.
fn next_instance(client: &mut Client, schema: &str) -> Result<i64, postgres::Error> {
    client
        .query_one(
            &format!(
                "SELECT ('{schema}'::regnamespace::oid::bigint << 32) \
                 | (nextval('{schema}.holder_instances') & 4294967295)"
            ),
            &[],
        )?
        .try_get(0)
}
