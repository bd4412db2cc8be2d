//! The trail in PostgreSQL (`[audit] postgres = true`): every replica
//! appends to `<schema>.audit_events` of the schema the claims live in,
//! so one thread's events from all replicas read back as one timeline.
//!
//! The writer's connection is made on first use and again after it
//! breaks, with backoff (the sink starts before the managed server is up;
//! a database restart must not end auditing); it brings the schema up to
//! date. A batch is one statement (one transaction): the events travel as
//! parameter arrays, never as SQL text. Readers require the schema and run
//! no DDL.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, Statement};

use super::chain::{link, ChainedRow, Heads, Verdict, Verifier, CHAIN_STARTS};
use super::error::AuditError;
use super::pg_schema::{AUDIT_CHAIN_VERSION, AUDIT_DB_CLOCK_VERSION};
use super::query::{EventFilter, ThreadSummary};
use super::sqlite_store::column;
use crate::audit_event::{AuditEvent, Operation, SessionContext};
use crate::pg::connect::error_text;
use crate::pg::{connect_schema, Backoff, PgTarget, SchemaAccess, SchemaError, SchemaMigrations};

/// How long a batch, a prune chunk or a reader's query may take.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
const READER_TIMEOUT: Duration = Duration::from_secs(30);

/// First wait before reconnecting after a failed connect, doubled per
/// failure up to [`MAX_RETRY`]: a dead database costs the writer at most
/// one connect timeout (2 s) per [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Rows one retention step deletes.
pub const PRUNE_CHUNK: i64 = 10_000;

/// The writer's database and the migrations of the schema it shares with
/// the claims, which the writer brings up to date.
#[derive(Debug)]
pub struct TrailDatabase {
    pub target: PgTarget,
    pub migrations: SchemaMigrations,
}

/// Where the writer's database is: known once the proxy knows its
/// upstream (perhaps the managed server, started after the sink).
pub type TargetSlot = Arc<OnceLock<TrailDatabase>>;

/// The writer's handle on the table.
pub struct PgTrail {
    target: TargetSlot,
    link: Option<Link>,
    retry_at: Option<Instant>,
    backoff: Backoff,
}

struct Link {
    client: Client,
    insert: Statement,
    /// Each chain's head as this writer last committed it; read from the
    /// table when the connection is made (and so after any failure).
    heads: Heads,
}

impl PgTrail {
    pub fn new(target: TargetSlot) -> PgTrail {
        PgTrail {
            target,
            link: None,
            retry_at: None,
            backoff: Backoff::new(FIRST_RETRY, MAX_RETRY),
        }
    }

    /// Whether the database is known yet.
    pub fn is_known(&self) -> bool {
        self.target.get().is_some()
    }

    /// Append `events` in one statement: all of them or none.
    pub fn append(&mut self, events: &[&AuditEvent]) -> Result<(), AuditError> {
        if events.is_empty() {
            return Ok(());
        }
        let schema = self.schema()?;
        self.with_link(|link| {
            let mut heads = std::mem::take(&mut link.heads);
            let columns = Columns::of(events, &mut heads, &mut |proxy| {
                head_of(&mut link.client, &schema, proxy)
            })?;
            link.client.execute(&link.insert, &columns.params())?;
            link.heads = heads;
            Ok(())
        })
    }

    /// Delete up to [`PRUNE_CHUNK`] rows of the prefix before the first
    /// row at or after `cutoff` (RFC 3339) and, when any went, record an
    /// `audit_pruned` event by `proxy_id` in the same transaction, with
    /// each shortened chain's new start. Returns how many rows went.
    /// Replicas may all prune: what one deleted, the others find gone.
    pub fn prune_step(&mut self, cutoff: &str, proxy_id: &str) -> Result<u64, AuditError> {
        let schema = self.schema()?;
        // A prefix by id, so each replica's chain loses only its oldest
        // records even where replicas' clocks (the times) disagree.
        let delete = format!(
            "WITH boundary AS (SELECT coalesce((SELECT id FROM {schema}.audit_events \
                 WHERE time >= $1::text::timestamptz ORDER BY time, id LIMIT 1), \
                 (SELECT max(id) + 1 FROM {schema}.audit_events)) AS id), \
             gone AS (DELETE FROM {schema}.audit_events WHERE id IN \
                 (SELECT id FROM {schema}.audit_events WHERE id < (SELECT id FROM boundary) \
                  ORDER BY id LIMIT $2) RETURNING id, proxy_id, hash) \
             SELECT (SELECT count(*) FROM gone), \
                 (SELECT coalesce(json_object_agg(proxy_id, hash), '{{}}')::text FROM \
                     (SELECT DISTINCT ON (proxy_id) proxy_id, hash FROM gone \
                      WHERE hash IS NOT NULL ORDER BY proxy_id, id DESC) last)"
        );
        let mut record = AuditEvent::new(&SessionContext::internal(), Operation::AuditPruned);
        record.proxy_id = proxy_id.to_owned();
        self.with_link(|link| {
            let mut heads = std::mem::take(&mut link.heads);
            let mut tx = link.client.transaction()?;
            let gone = tx.query_one(&delete, &[&cutoff, &PRUNE_CHUNK])?;
            let rows: i64 = gone.try_get(0)?;
            if rows > 0 {
                let starts: String = gone.try_get(1)?;
                let starts: serde_json::Value =
                    serde_json::from_str(&starts).map_err(|e| AuditError::Column {
                        column: CHAIN_STARTS,
                        source: e,
                    })?;
                record.detail = serde_json::json!({
                    "rows": rows,
                    "cutoff": cutoff,
                    "by": "retention",
                    "table": "postgres",
                    CHAIN_STARTS: starts,
                });
                let columns = Columns::of(&[&record], &mut heads, &mut |proxy| {
                    head_of(&mut tx, &schema, proxy)
                })?;
                tx.execute(&link.insert, &columns.params())?;
            }
            tx.commit()?;
            link.heads = heads;
            Ok(rows as u64)
        })
    }

    fn schema(&self) -> Result<String, AuditError> {
        let database = self.target.get().ok_or(AuditError::PostgresUnknown)?;
        Ok(database.target.schema().to_owned())
    }

    /// Runs `f` on the connection, connecting first if there is none and
    /// the backoff allows; after a failure the next call connects again.
    /// A connect that fails or waits out the backoff is
    /// [`AuditError::PostgresUnreachable`]: `f` was not run.
    fn with_link<T>(
        &mut self,
        f: impl FnOnce(&mut Link) -> Result<T, LinkError>,
    ) -> Result<T, AuditError> {
        let database = self.target.get().ok_or(AuditError::PostgresUnknown)?;
        let at = || database.target.shown().to_owned();
        if self.link.as_ref().is_some_and(|l| l.client.is_closed()) {
            self.link = None;
        }
        if self.link.is_none() {
            if let Some(retry_at) = self.retry_at {
                if Instant::now() < retry_at {
                    return Err(AuditError::PostgresUnreachable {
                        at: at(),
                        reason: "not connected; reconnecting after a backoff".into(),
                    });
                }
            }
            match connect(database) {
                Ok(link) => {
                    self.link = Some(link);
                    self.retry_at = None;
                    self.backoff.reset();
                }
                Err(e) => {
                    self.retry_at = Some(Instant::now() + self.backoff.wait());
                    self.backoff.grow();
                    return Err(AuditError::PostgresUnreachable {
                        at: at(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        let Some(link) = self.link.as_mut() else {
            return Err(AuditError::PostgresUnknown);
        };
        // Any failure drops the connection: a server that ended it says so
        // first (57P01) and closes it after, and one that failed a batch is
        // worth a new session at the cost of one connect.
        // An event that cannot be encoded drops it too: the chain heads
        // taken for the batch are not put back.
        f(link).map_err(|e| {
            self.link = None;
            match e {
                LinkError::Postgres(e) => AuditError::Postgres {
                    at: at(),
                    reason: error_text(&e),
                },
                LinkError::Audit(e) => e,
            }
        })
    }
}

/// Why a step on the writer's connection failed.
enum LinkError {
    Postgres(postgres::Error),
    Audit(AuditError),
}

impl From<postgres::Error> for LinkError {
    fn from(e: postgres::Error) -> LinkError {
        LinkError::Postgres(e)
    }
}

impl From<AuditError> for LinkError {
    fn from(e: AuditError) -> LinkError {
        LinkError::Audit(e)
    }
}

/// The newest hash of `proxy`'s chain in the table.
fn head_of(
    client: &mut impl GenericClient,
    schema: &str,
    proxy: &str,
) -> Result<Option<String>, postgres::Error> {
    client
        .query_opt(
            &format!(
                "SELECT hash FROM {schema}.audit_events WHERE proxy_id = $1 \
                 AND hash IS NOT NULL ORDER BY id DESC LIMIT 1"
            ),
            &[&proxy],
        )?
        .map(|r| r.try_get(0))
        .transpose()
}

/// The writer's connection, the schema brought up to date, the insert
/// prepared.
fn connect(database: &TrailDatabase) -> Result<Link, SchemaError> {
    let mut client = connect_schema(
        &database.target,
        SchemaAccess::Migrate(database.migrations),
        "resumeguard-audit",
        STATEMENT_TIMEOUT,
    )?;
    let insert = client.prepare(&insert_sql(database.target.schema()))?;
    Ok(Link {
        client,
        insert,
        heads: Heads::default(),
    })
}

/// One statement appending a batch: the parameters are one array per
/// column, unnested in event order (so ids follow it), and the writer's
/// clock as the batch leaves, in µs since the epoch: each record's
/// `db_time` is its time moved by how far the writer's clock is behind
/// the server's (the wire's one-way trip counts as skew, well under the
/// clocks' disagreement it corrects).
fn insert_sql(s: &str) -> String {
    format!(
        r#"INSERT INTO {s}.audit_events (time, db_time, proxy_id, session_id, client_addr,
    "user", "database", application_name, operation, thread_id, checkpoint_ns, checkpoint_id,
    parent_checkpoint_id, task_id, channels, blob_sha256, detail, prev_hash, hash)
SELECT e.t::timestamptz,
    e.t::timestamptz + (clock_timestamp() - to_timestamp($19::int8 / 1000000.0)),
    e.p, e.s, e.ca, e.u, e.d, e.an, e.op, e.th, e.ns, e.ck, e.pa, e.ta,
    e.ch::json, e.bl::json, e.de::json, e.ph, e.h
FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[],
    $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
    $14::text[], $15::text[], $16::text[], $17::text[], $18::text[])
    WITH ORDINALITY AS e(t, p, s, ca, u, d, an, op, th, ns, ck, pa, ta, ch, bl, de, ph, h, n)
ORDER BY e.n"#
    )
}

/// A batch as one array per column.
#[derive(Default)]
struct Columns<'a> {
    time: Vec<&'a str>,
    proxy_id: Vec<&'a str>,
    session_id: Vec<i64>,
    client_addr: Vec<&'a str>,
    user: Vec<&'a str>,
    database: Vec<&'a str>,
    application_name: Vec<&'a str>,
    operation: Vec<&'static str>,
    thread_id: Vec<Option<&'a str>>,
    checkpoint_ns: Vec<Option<&'a str>>,
    checkpoint_id: Vec<Option<&'a str>>,
    parent_checkpoint_id: Vec<Option<&'a str>>,
    task_id: Vec<Option<&'a str>>,
    channels: Vec<String>,
    blob_sha256: Vec<String>,
    detail: Vec<String>,
    prev_hash: Vec<String>,
    hash: Vec<String>,
    /// The writer's clock as the batch leaves (µs since the epoch).
    sent_micros: i64,
}

impl<'a> Columns<'a> {
    /// The batch, each event chained after its replica's head in `heads`
    /// (read by `load` where not known), which it advances.
    fn of(
        events: &[&'a AuditEvent],
        heads: &mut Heads,
        load: &mut dyn FnMut(&str) -> Result<Option<String>, postgres::Error>,
    ) -> Result<Columns<'a>, LinkError> {
        let mut c = Columns::default();
        for ev in events {
            let prev = heads.get(&ev.proxy_id, || load(&ev.proxy_id))?;
            let hash = link(&prev, ev).map_err(AuditError::Encode)?;
            heads.advance(&ev.proxy_id, hash.clone());
            c.prev_hash.push(prev);
            c.hash.push(hash);
            c.time.push(&ev.time);
            c.proxy_id.push(&ev.proxy_id);
            // bigint is i64; ids beyond it wrap visibly, as in SQLite.
            c.session_id.push(ev.session_id as i64);
            c.client_addr.push(&ev.client_addr);
            c.user.push(&ev.user);
            c.database.push(&ev.database);
            c.application_name.push(&ev.application_name);
            c.operation.push(ev.operation.as_str());
            c.thread_id.push(ev.thread_id.as_deref());
            c.checkpoint_ns.push(ev.checkpoint_ns.as_deref());
            c.checkpoint_id.push(ev.checkpoint_id.as_deref());
            c.parent_checkpoint_id
                .push(ev.parent_checkpoint_id.as_deref());
            c.task_id.push(ev.task_id.as_deref());
            let encoded = |r: Result<String, serde_json::Error>| r.map_err(AuditError::Encode);
            c.channels
                .push(encoded(serde_json::to_string(&ev.channels))?);
            c.blob_sha256
                .push(encoded(serde_json::to_string(&ev.blob_sha256))?);
            c.detail.push(encoded(serde_json::to_string(&ev.detail))?);
        }
        c.sent_micros = sent_micros(SystemTime::now());
        Ok(c)
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 19] {
        [
            &self.time,
            &self.proxy_id,
            &self.session_id,
            &self.client_addr,
            &self.user,
            &self.database,
            &self.application_name,
            &self.operation,
            &self.thread_id,
            &self.checkpoint_ns,
            &self.checkpoint_id,
            &self.parent_checkpoint_id,
            &self.task_id,
            &self.channels,
            &self.blob_sha256,
            &self.detail,
            &self.prev_hash,
            &self.hash,
            &self.sent_micros,
        ]
    }
}

/// `at` in µs since the Unix epoch (before it: negative; beyond `i64`:
/// saturated, as a clock that far off is wrong whatever it says).
fn sent_micros(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, |m| -m),
    }
}

/// A record's time on the database's clock, where it has one (see
/// `pg_schema::db_clock_column`), else its replica's.
pub(super) const DB_CLOCK_TIME: &str = "coalesce(db_time, time)";

/// The columns read back, in [`row_to_event`]'s order; times as the trail
/// writes them (RFC 3339 UTC, milliseconds).
pub(super) fn select(s: &str) -> String {
    format!(
        r#"SELECT to_char(time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    proxy_id, session_id, client_addr, "user", "database", application_name, operation,
    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, task_id,
    channels::text, blob_sha256::text, detail::text
FROM {s}.audit_events"#
    )
}

/// An operator's connection to a schema whose records have their time on
/// the database's clock ([`DB_CLOCK_TIME`]): the table must exist; nothing
/// is created.
pub(super) fn clock_reader(target: &PgTarget) -> Result<Client, AuditError> {
    reader_at(target, AUDIT_DB_CLOCK_VERSION)
}

/// An operator's connection to a schema at `version` or later.
fn reader_at(target: &PgTarget, version: i32) -> Result<Client, AuditError> {
    connect_schema(
        target,
        SchemaAccess::AtLeast(version),
        "resumeguard-audit-reader",
        READER_TIMEOUT,
    )
    .map_err(|e| AuditError::Postgres {
        at: target.shown().to_owned(),
        reason: e.to_string(),
    })
}

pub(super) fn read_error(target: &PgTarget) -> impl Fn(postgres::Error) -> AuditError + '_ {
    move |e| AuditError::Postgres {
        at: target.shown().to_owned(),
        reason: error_text(&e),
    }
}

/// Every replica's events for `thread_id`, by time on the database's
/// clock (then as written), and every gap record written since the
/// thread's first event (the thread's own events may be among those lost,
/// on any replica). Each event keeps its replica's time.
pub fn thread_events(target: &PgTarget, thread_id: &str) -> Result<Vec<AuditEvent>, AuditError> {
    let mut client = clock_reader(target)?;
    let s = target.schema();
    let at = DB_CLOCK_TIME;
    let sql = format!(
        "{} WHERE id IN (SELECT id FROM {s}.audit_events WHERE thread_id = $1 \
         UNION ALL SELECT id FROM {s}.audit_events WHERE operation = 'events_dropped' \
         AND {at} >= (SELECT min({at}) FROM {s}.audit_events WHERE thread_id = $1)) \
         ORDER BY {at}, id",
        select(s)
    );
    let rows = client
        .query(&sql, &[&thread_id])
        .map_err(read_error(target))?;
    rows.iter().map(row_to_event).collect()
}

/// Walk every replica's chain in the table, in id order (streamed).
pub fn verify(target: &PgTarget) -> Result<Verdict, AuditError> {
    let mut client = reader_at(target, AUDIT_CHAIN_VERSION)?;
    let s = target.schema();
    let pruned = client
        .query(
            &format!("{} WHERE operation = 'audit_pruned' ORDER BY id", select(s)),
            &[],
        )
        .map_err(read_error(target))?;
    let pruned = pruned
        .iter()
        .map(|r| row_to_event_at(r, 0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut verifier = Verifier::new(&pruned);
    let chained = select(s).replacen("SELECT ", "SELECT id, prev_hash, hash, ", 1);
    let mut tx = client.transaction().map_err(read_error(target))?;
    let portal = tx
        .bind(&format!("{chained} ORDER BY id"), &[])
        .map_err(read_error(target))?;
    loop {
        let rows = tx
            .query_portal(&portal, 10_000)
            .map_err(read_error(target))?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            verifier.record(ChainedRow {
                id: column_of(r, 0)?,
                prev_hash: column_of(r, 1)?,
                hash: column_of(r, 2)?,
                event: row_to_event_at(r, 3)?,
            })?;
        }
    }
    Ok(verifier.finish())
}

/// The threads with events in the filter's window (and of its
/// operations), over every replica, the most recently active first: times,
/// windows and order on the database's clock.
pub fn threads(target: &PgTarget, filter: &EventFilter) -> Result<Vec<ThreadSummary>, AuditError> {
    let mut client = clock_reader(target)?;
    let s = target.schema();
    let ops: Vec<&str> = filter.ops.iter().map(|o| o.as_str()).collect();
    let at = DB_CLOCK_TIME;
    let utc = format!(r#"to_char(max({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')"#);
    let sql = format!(
        "SELECT thread_id, count(*), {first}, {utc}, \
         (array_agg(operation ORDER BY {at} DESC, id DESC))[1] \
         FROM {s}.audit_events WHERE thread_id IS NOT NULL \
         AND ($1::text IS NULL OR {at} >= $1::text::timestamptz) \
         AND ($2::text IS NULL OR {at} <= $2::text::timestamptz) \
         AND (cardinality($3::text[]) = 0 OR operation = ANY($3::text[])) \
         GROUP BY thread_id ORDER BY max({at}) DESC, thread_id",
        first = utc.replace("max(", "min(")
    );
    let rows = client
        .query(&sql, &[&filter.since, &filter.until, &ops])
        .map_err(read_error(target))?;
    rows.iter()
        .map(|r| {
            Ok(ThreadSummary {
                thread_id: column_of(r, 0)?,
                events: column_of::<i64>(r, 1)?.max(0) as u64,
                first: column_of(r, 2)?,
                last: column_of(r, 3)?,
                last_operation: column_of(r, 4)?,
            })
        })
        .collect()
}

/// Decode one row; a malformed JSON column or an unknown operation is
/// reported, not skipped.
fn row_to_event(r: &Row) -> Result<AuditEvent, AuditError> {
    row_to_event_at(r, 0)
}

/// [`row_to_event`] of a row whose [`select`] columns start at `at`.
pub(super) fn row_to_event_at(r: &Row, at: usize) -> Result<AuditEvent, AuditError> {
    let op: String = column_of(r, at + 7)?;
    let session_id: i64 = column_of(r, at + 2)?;
    Ok(AuditEvent {
        time: column_of(r, at)?,
        proxy_id: column_of(r, at + 1)?,
        session_id: session_id as u64,
        client_addr: column_of(r, at + 3)?,
        user: column_of(r, at + 4)?,
        database: column_of(r, at + 5)?,
        application_name: column_of(r, at + 6)?,
        operation: Operation::parse(&op).ok_or(AuditError::UnknownOperation(op))?,
        thread_id: column_of(r, at + 8)?,
        checkpoint_ns: column_of(r, at + 9)?,
        checkpoint_id: column_of(r, at + 10)?,
        parent_checkpoint_id: column_of(r, at + 11)?,
        task_id: column_of(r, at + 12)?,
        channels: column("channels", column_of(r, at + 13)?)?,
        blob_sha256: column("blob_sha256", column_of(r, at + 14)?)?,
        detail: column("detail", column_of(r, at + 15)?)?,
        run_metadata: None,
        answer: None,
    })
}

/// Column `index` of a row the trail read: one of another type (or NULL
/// where a value is expected) is the trail's error, not a panic.
pub(super) fn column_of<'a, T: postgres::types::FromSql<'a>>(
    r: &'a Row,
    index: usize,
) -> Result<T, AuditError> {
    r.try_get(index).map_err(AuditError::PostgresRow)
}

#[cfg(test)]
mod tests;
