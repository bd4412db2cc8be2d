//! The audit trail's part of the shared schema in PostgreSQL
//! (`<schema>.audit_events`, `[audit] postgres = true`): its steps of the
//! schema's versioned migrations (`pg::migration`), each at its version
//! in the one order of the whole schema, which the claims' steps share.

use crate::pg::Migration;

/// The first version with `<schema>.audit_events`.
pub const AUDIT_VERSION: i32 = 2;

/// The first version whose audit records carry their chain's hashes.
pub const AUDIT_CHAIN_VERSION: i32 = 4;

/// The first version whose audit records carry their time on the
/// database's clock.
pub const AUDIT_DB_CLOCK_VERSION: i32 = 17;

/// The audit trail's steps, each at its version of the shared schema.
pub const AUDIT_MIGRATIONS: [Migration; 3] = [
    Migration {
        version: AUDIT_VERSION,
        sql: events_table,
    },
    Migration {
        version: AUDIT_CHAIN_VERSION,
        sql: chain_columns,
    },
    Migration {
        version: AUDIT_DB_CLOCK_VERSION,
        sql: db_clock_column,
    },
];

/// The audit trail of every replica; JSON columns keep the text as
/// written.
fn events_table(s: &str) -> String {
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
    )
}

/// Each audit record carries the hash of its replica's record before it
/// (`audit::chain`); rows written before stay unhashed.
fn chain_columns(s: &str) -> String {
    format!(
        r#"
ALTER TABLE {s}.audit_events ADD COLUMN prev_hash text, ADD COLUMN hash text;
CREATE INDEX audit_events_chain ON {s}.audit_events (proxy_id, id);
"#
    )
}

/// Each audit record's time on the database's clock (`db_time`): its
/// replica's time moved by how far that replica's clock was from the
/// database's when the record was written, so the records of replicas
/// whose clocks disagree read back in the order they happened. Rows
/// written before, or by an older replica, have none: their own time
/// stands in (`coalesce(db_time, time)`). No index: a thread's records
/// are found by the thread's index and sorted. A column with no default
/// is added without rewriting the table, so the replicas' writes wait a
/// moment, not for an index build over a large trail.
fn db_clock_column(s: &str) -> String {
    format!(
        r#"
ALTER TABLE {s}.audit_events ADD COLUMN db_time timestamptz;
"#
    )
}
