//! Versioned migrations of a schema shared by several parts of the proxy:
//! each part owns its steps, each step names the version it brings the
//! schema to, and the runner applies them in version order, recording
//! each in `<schema>.schema_version`.
//!
//! Each migration runs in one transaction holding a transaction-level
//! advisory lock, so proxies starting together apply it once. A schema
//! that is already current runs no DDL, so a role with only USAGE and DML
//! on it can use it (docs/architecture.md, "Least privileges").

use postgres::Client;

/// One step: the version it brings the schema to and its SQL for a
/// schema name.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub sql: fn(&str) -> String,
}

/// A schema's migrations: the steps of every part that owns some of it.
/// Their versions together are 1, 2, … with none missing or repeated.
#[derive(Debug, Clone, Copy)]
pub struct SchemaMigrations {
    parts: &'static [&'static [Migration]],
}

impl SchemaMigrations {
    pub const fn new(parts: &'static [&'static [Migration]]) -> SchemaMigrations {
        SchemaMigrations { parts }
    }

    /// Every step, by version.
    pub fn in_order(&self) -> Vec<Migration> {
        let mut steps: Vec<Migration> = self.parts.iter().flat_map(|p| p.iter().copied()).collect();
        steps.sort_by_key(|m| m.version);
        steps
    }

    /// The schema version this build needs.
    pub fn current_version(&self) -> i32 {
        self.parts
            .iter()
            .flat_map(|p| p.iter())
            .map(|m| m.version)
            .max()
            .unwrap_or(0)
    }
}

/// The version the database is at (0: no schema yet).
pub fn version(client: &mut Client, schema: &str) -> Result<i32, postgres::Error> {
    let table = format!("{schema}.schema_version");
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])?
        .try_get(0)?;
    if !exists {
        return Ok(0);
    }
    client
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {schema}.schema_version"),
            &[],
        )
        .and_then(|r| r.try_get(0))
}

/// Brings the schema to the current version of `migrations`, one
/// transaction per migration under an advisory lock; nothing runs when it
/// is current.
pub fn migrate(
    client: &mut Client,
    schema: &str,
    migrations: SchemaMigrations,
) -> Result<(), postgres::Error> {
    migrate_to(client, schema, migrations, migrations.current_version())
}

/// Brings the schema to version `last` (tests: a schema as an older build
/// left it).
pub fn migrate_to(
    client: &mut Client,
    schema: &str,
    migrations: SchemaMigrations,
    last: i32,
) -> Result<(), postgres::Error> {
    if version(client, schema)? >= last {
        return Ok(());
    }
    for step in migrations.in_order().iter().filter(|m| m.version <= last) {
        let v = step.version;
        let mut tx = client.transaction()?;
        // A migration waits for another proxy's (the advisory lock) and
        // runs DDL: not bound by the decisions' short timeouts.
        tx.batch_execute("SET LOCAL lock_timeout = '60s'; SET LOCAL statement_timeout = '60s'")?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('resumeguard migrations'), hashtext($1))",
            &[&schema],
        )?;
        // A schema an administrator made for the proxy's role is used as
        // it is: CREATE SCHEMA asks for CREATE on the database even when
        // the schema exists, which that role need not have.
        let made: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[&schema],
            )?
            .try_get(0)?;
        if !made {
            tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))?;
        }
        // Quiet: every migration after the first finds it made.
        tx.batch_execute(&format!(
            "SET LOCAL client_min_messages = warning; \
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
            tx.batch_execute(&(step.sql)(schema))?;
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
