//! The shared schema in PostgreSQL (claims, run leases, and the audit
//! trail of every replica), created on first use and upgraded by
//! versioned migrations recorded in `<schema>.schema_version`.
//!
//! Each migration runs in one transaction holding a transaction-level
//! advisory lock, so proxies starting together apply it once. A store that
//! is already current runs no DDL, so a role with only USAGE and DML on the
//! schema can use it (README, "Consume-once").

use postgres::Client;

/// The migrations, in order; version = index + 1.
fn migrations(s: &str) -> Vec<String> {
    vec![
        format!(
            r#"
CREATE TABLE {s}.claims (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL,
    checkpoint_id text NOT NULL,
    fingerprint text NOT NULL,
    state text NOT NULL CHECK (state IN ('held', 'consumed', 'released')),
    proxy_id text NOT NULL,
    session_id bigint NOT NULL,
    client_addr text NOT NULL,
    application_name text NOT NULL,
    claimed_at_ms bigint NOT NULL,
    lapse_at_ms bigint NOT NULL,
    consumed_at_ms bigint,
    evidence text,
    refusals bigint NOT NULL DEFAULT 0,
    takeovers bigint NOT NULL DEFAULT 0,
    superseded_at_ms bigint,
    abandon_at_ms bigint,
    epoch bigint NOT NULL DEFAULT 1,
    holder_instance bigint NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, fingerprint)
);
CREATE INDEX claims_consumed_at ON {s}.claims (consumed_at_ms);
CREATE INDEX claims_lapse_at ON {s}.claims (lapse_at_ms);
CREATE INDEX claims_superseded_at ON {s}.claims (superseded_at_ms);
CREATE INDEX claims_holder ON {s}.claims (proxy_id, session_id);
CREATE TABLE {s}.run_leases (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL,
    answered_checkpoint_id text NOT NULL,
    fingerprint text NOT NULL,
    proxy_id text NOT NULL,
    session_id bigint NOT NULL,
    client_addr text NOT NULL,
    application_name text NOT NULL,
    answered_at_ms bigint NOT NULL,
    last_write_ms bigint NOT NULL,
    until_ms bigint NOT NULL,
    holder_instance bigint NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns)
);
CREATE INDEX run_leases_until ON {s}.run_leases (until_ms);
CREATE SEQUENCE {s}.holder_instances;
"#
        ),
        // The audit trail of every replica (`[audit] postgres = true`);
        // JSON columns keep the text as written.
        format!(
            r#"
CREATE TABLE {s}.audit_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time timestamptz NOT NULL,
    proxy_id text NOT NULL,
    session_id bigint NOT NULL,
    client_addr text NOT NULL,
    "user" text NOT NULL,
    "database" text NOT NULL,
    application_name text NOT NULL,
    operation text NOT NULL,
    thread_id text,
    checkpoint_ns text,
    checkpoint_id text,
    parent_checkpoint_id text,
    task_id text,
    channels json NOT NULL,
    blob_sha256 json NOT NULL,
    detail json NOT NULL
);
CREATE INDEX audit_events_thread ON {s}.audit_events (thread_id, time, id);
CREATE INDEX audit_events_time ON {s}.audit_events (time);
CREATE INDEX audit_events_gaps ON {s}.audit_events (time) WHERE operation = 'events_dropped';
CREATE FUNCTION {s}.audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only (old rows leave only by retention)';
END
$f$;
CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON {s}.audit_events
    FOR EACH ROW EXECUTE FUNCTION {s}.audit_events_append_only();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON {s}.audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.audit_events_append_only();
"#
        ),
    ]
}

/// The first version with `<schema>.audit_events`.
pub const AUDIT_VERSION: i32 = 2;

/// The schema version this build needs.
pub(super) fn current_version() -> i32 {
    migrations("s").len() as i32
}

/// The version the database is at (0: no schema yet).
pub(super) fn version(client: &mut Client, schema: &str) -> Result<i32, postgres::Error> {
    let table = format!("{schema}.schema_version");
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    client
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {schema}.schema_version"),
            &[],
        )
        .map(|r| r.get(0))
}

/// Brings the schema to [`current_version`], one transaction per
/// migration under an advisory lock; nothing runs when it is current.
pub(super) fn migrate(client: &mut Client, schema: &str) -> Result<(), postgres::Error> {
    if version(client, schema)? >= current_version() {
        return Ok(());
    }
    for (i, sql) in migrations(schema).iter().enumerate() {
        let v = i as i32 + 1;
        let mut tx = client.transaction()?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('resumeguard migrations'), hashtext($1))",
            &[&schema],
        )?;
        // Quiet: every migration after the first finds these made.
        tx.batch_execute(&format!(
            "SET LOCAL client_min_messages = warning; \
             CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {schema}.schema_version (\
                 version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        ))?;
        let applied = tx
            .query_opt(
                &format!("SELECT 1 FROM {schema}.schema_version WHERE version = $1"),
                &[&v],
            )?
            .is_some();
        if !applied {
            tx.batch_execute(sql)?;
            tx.execute(
                &format!("INSERT INTO {schema}.schema_version (version) VALUES ($1)"),
                &[&v],
            )?;
            tracing::info!(schema, version = v, "resumeguard schema migrated");
        }
        tx.commit()?;
    }
    Ok(())
}
