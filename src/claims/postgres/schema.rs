//! The shared schema in PostgreSQL (claims, run leases, the audit trail
//! of every replica, and the fence writes are checked by in their own
//! transaction), created on first use and upgraded by
//! versioned migrations recorded in `<schema>.schema_version`.
//!
//! Each migration runs in one transaction holding a transaction-level
//! advisory lock, so proxies starting together apply it once. A store that
//! is already current runs no DDL, so a role with only USAGE and DML on the
//! schema can use it (docs/architecture.md, "Least privileges").

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
        // The fence checked inside the writer's own transaction (see
        // `enforce::fencing`): the rule of `policy::claims::decide_write`
        // and the commit cover of `keep_until`, on the database's clock.
        // The claim row stays locked until the write's transaction ends,
        // so a takeover waits for its commit. SECURITY DEFINER: the
        // clients' roles need EXECUTE on it and USAGE on the schema, not
        // the tables.
        format!(
            r#"
CREATE FUNCTION {s}.fence_write(
    p_thread text, p_ns text, p_checkpoint text,
    p_proxy text, p_session bigint, p_addr text, p_app text,
    p_took text, p_cover_ms bigint
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
    c {s}.claims%ROWTYPE;
    until_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint + p_cover_ms;
    took_epoch bigint;
    reason text;
    why text;
BEGIN
    SELECT * INTO c FROM {s}.claims
     WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_checkpoint
       AND state IN ('held', 'consumed')
     ORDER BY claimed_at_ms DESC, epoch DESC LIMIT 1
     FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF c.proxy_id = p_proxy AND (c.session_id = p_session OR (
        regexp_replace(c.client_addr, ':[0-9]+$', '') = regexp_replace(p_addr, ':[0-9]+$', '')
        AND c.application_name = p_app)) THEN
        IF (c.state = 'held' AND c.lapse_at_ms < until_ms) OR c.abandon_at_ms < until_ms THEN
            UPDATE {s}.claims SET
                lapse_at_ms = CASE WHEN state = 'held'
                    THEN greatest(lapse_at_ms, until_ms) ELSE lapse_at_ms END,
                abandon_at_ms = CASE WHEN abandon_at_ms IS NULL
                    THEN NULL ELSE greatest(abandon_at_ms, until_ms) END
             WHERE thread_id = c.thread_id AND checkpoint_ns = c.checkpoint_ns
               AND checkpoint_id = c.checkpoint_id AND fingerprint = c.fingerprint;
        END IF;
        RETURN;
    END IF;
    -- p_took: the writer's generations of claims on this checkpoint, as
    -- 'fingerprint:epoch' entries separated by commas.
    SELECT max(split_part(t, ':', 2)::bigint) INTO took_epoch
      FROM unnest(string_to_array(p_took, ',')) AS t
     WHERE split_part(t, ':', 1) = c.fingerprint
       AND split_part(t, ':', 2)::bigint < c.epoch;
    IF took_epoch IS NOT NULL THEN
        reason := 'superseded_holder';
        why := format('this session (proxy %s, session %s) held epoch %s, which was taken over',
            p_proxy, p_session, took_epoch);
    ELSIF c.proxy_id <> p_proxy THEN
        reason := 'other_proxy';
        why := format('this session is on proxy %s, not the holder''s', p_proxy);
    ELSE
        reason := 'other_client';
        why := format('this session is another client (%s, application_name "%s")', p_addr, p_app);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'RGF01',
        MESSAGE = format('resumeguard: write fenced: thread "%s", checkpoint_ns "%s", '
            'checkpoint "%s" is held by client %s (application_name "%s", proxy %s, '
            'session %s) at epoch %s (interrupt %s); %s; nothing of this write was committed',
            p_thread, p_ns, p_checkpoint, c.client_addr, c.application_name, c.proxy_id,
            c.session_id, c.epoch, left(c.fingerprint, 12), why),
        DETAIL = format('the claim''s holder: proxy %s, session %s, epoch %s',
            c.proxy_id, c.session_id, c.epoch),
        HINT = reason;
END
$f$;
GRANT USAGE ON SCHEMA {s} TO PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.fence_write(text, text, text, text, bigint, text, text, text, bigint)
    TO PUBLIC;
"#
        ),
        // Each audit record carries the hash of its replica's record before
        // it (`audit::chain`); rows written before stay unhashed.
        format!(
            r#"
ALTER TABLE {s}.audit_events ADD COLUMN prev_hash text, ADD COLUMN hash text;
CREATE INDEX audit_events_chain ON {s}.audit_events (proxy_id, id);
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
        // A migration waits for another proxy's (the advisory lock) and
        // runs DDL: not bound by the decisions' short timeouts.
        tx.batch_execute("SET LOCAL lock_timeout = '60s'; SET LOCAL statement_timeout = '60s'")?;
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
