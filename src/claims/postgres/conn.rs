//! The PostgreSQL store's connections: one for decisions (one short
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

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement, Transaction};

use super::schema;
use super::target::PgTarget;
use crate::claims::error::StoreError;

/// How long a statement or a row lock may wait before the store counts as
/// unavailable (as the SQLite store's busy timeout).
const STATEMENT_TIMEOUT_MS: u64 = 2_000;

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
    slot: Mutex<Slot>,
}

enum Slot {
    Closed {
        error: StoreError,
        retry_at: Instant,
        backoff: Duration,
    },
    Open(Box<Opened>),
}

struct Opened {
    client: Client,
    lock: Option<Client>,
    instance: i64,
    cache: HashMap<String, Statement>,
}

/// Why an operation failed: the server's message with its SQLSTATE, or a
/// row that does not map to a claim.
#[derive(Debug)]
pub(super) struct Fail(pub(super) String);

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Fail {
        Fail(describe(&e))
    }
}

/// One decision's transaction, with the statement cache and this
/// process's instance id.
pub(super) struct Tx<'a> {
    tx: Transaction<'a>,
    cache: &'a mut HashMap<String, Statement>,
    pub(super) instance: i64,
    pub(super) schema: &'a str,
}

impl Tx<'_> {
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.cache.get(sql) {
            return Ok(s.clone());
        }
        let s = self.tx.prepare(sql)?;
        self.cache.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    pub(super) fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let s = self.statement(sql)?;
        self.tx.query(&s, params)
    }

    pub(super) fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let s = self.statement(sql)?;
        self.tx.execute(&s, params)
    }
}

impl PgConn {
    /// Connects now if it can; otherwise logs the error (ERROR) and
    /// connects on use, with backoff.
    pub(super) fn connect(target: PgTarget, role: Role) -> PgConn {
        let slot = match open(&target, role) {
            Ok(o) => Slot::Open(Box::new(o)),
            Err(error) => {
                tracing::error!(%error, "claim store cannot be reached: reads of parked heads \
                    are refused (58000) until it can; connecting is retried on use");
                Slot::Closed {
                    error,
                    retry_at: Instant::now() + FIRST_RETRY,
                    backoff: FIRST_RETRY,
                }
            }
        };
        PgConn {
            target,
            role,
            slot: Mutex::new(slot),
        }
    }

    /// Connects now; an error is returned as is.
    pub(super) fn open_now(target: PgTarget, role: Role) -> Result<PgConn, StoreError> {
        let opened = open(&target, role)?;
        Ok(PgConn {
            target,
            role,
            slot: Mutex::new(Slot::Open(Box::new(opened))),
        })
    }

    /// This process's instance id, once connected.
    pub(super) fn instance(&self) -> Option<i64> {
        match &*self.slot.lock().unwrap_or_else(PoisonError::into_inner) {
            Slot::Open(o) => Some(o.instance),
            Slot::Closed { .. } => None,
        }
    }

    /// Runs `f` in one transaction, committed on success.
    pub(super) fn with_tx<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
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
            match open(&self.target, self.role) {
                Ok(o) => {
                    tracing::warn!(at = %self.target.shown, "claim store reachable: reads of \
                        parked heads are claimed again");
                    *slot = Slot::Open(Box::new(o));
                }
                Err(error) => {
                    let backoff = (*backoff * 2).min(MAX_RETRY);
                    tracing::debug!(%error, "claim store still cannot be reached");
                    *slot = Slot::Closed {
                        error: error.clone(),
                        retry_at: Instant::now() + backoff,
                        backoff,
                    };
                    return Err(error);
                }
            }
        }
        let Slot::Open(opened) = &mut *slot else {
            return Err(StoreError::Postgres {
                at: self.target.shown.clone(),
                op,
                reason: "not connected".into(),
            });
        };
        let lost = if opened.client.is_closed() {
            Some("the connection was lost")
        } else if opened.lock.as_ref().is_some_and(Client::is_closed) {
            Some("the liveness lock's connection was lost (other proxies count this one's holders as gone)")
        } else {
            None
        };
        let result = match lost {
            Some(why) => Err(why.to_owned()),
            None => run(opened, &self.target.schema, f).map_err(|Fail(why)| why),
        };
        match result {
            Ok(v) => Ok(v),
            Err(reason) => {
                let error = StoreError::Postgres {
                    at: self.target.shown.clone(),
                    op,
                    reason,
                };
                let broken = opened.client.is_closed()
                    || opened.lock.as_ref().is_some_and(Client::is_closed);
                if broken {
                    tracing::error!(%error, "claim store connection lost: reads of parked heads \
                        are refused (58000, fail closed) until it is back; reconnecting is \
                        retried on use");
                    *slot = Slot::Closed {
                        error: error.clone(),
                        retry_at: Instant::now() + FIRST_RETRY,
                        backoff: FIRST_RETRY,
                    };
                }
                Err(error)
            }
        }
    }
}

fn run<T>(
    opened: &mut Opened,
    schema: &str,
    f: impl FnOnce(&mut Tx<'_>) -> Result<T, Fail>,
) -> Result<T, Fail> {
    let tx = opened.client.transaction()?;
    let mut t = Tx {
        tx,
        cache: &mut opened.cache,
        instance: opened.instance,
        schema,
    };
    let out = f(&mut t)?;
    t.tx.commit()?;
    Ok(out)
}

/// Connects the decision connection (migrating the schema for the proxy,
/// checking it exists for operators) and, for the proxy, the lock
/// connection holding the instance's advisory lock.
fn open(target: &PgTarget, role: Role) -> Result<Opened, StoreError> {
    let err = |e: postgres::Error| StoreError::Open {
        path: target.shown.clone(),
        reason: describe(&e),
    };
    let mut client = target.config.connect(NoTls).map_err(err)?;
    client
        .batch_execute(&format!(
            "SET statement_timeout = {STATEMENT_TIMEOUT_MS}; \
             SET lock_timeout = {STATEMENT_TIMEOUT_MS}; \
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
            let v = schema::version(&mut client, schema).map_err(err)?;
            if v == 0 {
                return Err(StoreError::Open {
                    path: target.shown.clone(),
                    reason: format!("no claims schema {schema} (no proxy has used this database)"),
                });
            }
        }
    }
    if role == Role::Operator {
        return Ok(Opened {
            client,
            lock: None,
            instance: 0,
            cache: HashMap::new(),
        });
    }
    let (lock, instance) = lock_instance(target, &mut client).map_err(err)?;
    Ok(Opened {
        client,
        lock: Some(lock),
        instance,
        cache: HashMap::new(),
    })
}

/// The liveness connection, with its server-side keepalives and TCP user
/// timeout, holding a fresh instance id's session-level advisory lock.
fn lock_instance(target: &PgTarget, client: &mut Client) -> Result<(Client, i64), postgres::Error> {
    let bound = target.liveness_bound;
    let mut config = target.config.clone();
    config.application_name("resumeguard-claims-liveness");
    let mut lock = config.connect(NoTls)?;
    // idle + count * interval ≈ the bound; the user timeout bounds data
    // the server sent and the peer never acknowledged.
    let secs = bound.as_secs().max(2);
    let idle = (secs / 2).max(1);
    let interval = ((secs - idle) / 3).max(1);
    lock.batch_execute(&format!(
        "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; \
         SET tcp_keepalives_count = 3; SET tcp_user_timeout = {}",
        bound.as_millis()
    ))?;
    let mut id = next_instance(client, &target.schema)?;
    loop {
        let locked: bool = lock
            .query_one("SELECT pg_try_advisory_lock($1)", &[&id])?
            .get(0);
        if locked {
            return Ok((lock, id));
        }
        // A dead predecessor's backend still holds it: take a new id.
        id = next_instance(client, &target.schema)?;
    }
}

fn next_instance(client: &mut Client, schema: &str) -> Result<i64, postgres::Error> {
    client
        .query_one(&format!("SELECT nextval('{schema}.holder_instances')"), &[])
        .map(|r| r.get(0))
}

/// The server's message, with its SQLSTATE, or the client's.
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}
