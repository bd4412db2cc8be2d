//! Statements of the other saver generations, as they reach the wire:
//! LangGraph Python `langgraph-checkpoint-postgres` 2.0.x (2.0.25) and
//! LangGraph JS `@langchain/langgraph-checkpoint-postgres` 1.0.x (1.0.5,
//! schema "public"). Python's `%s` placeholders are `$n` by the time
//! psycopg sends them. The SELECTs, the pending-sends read and the writes
//! are byte for byte the strings of the installed packages
//! (`langgraph.checkpoint.postgres.base.SELECT_SQL`, JS
//! `getSQLStatements("public")`).

/// Python 2.0.x: the 3.x read with four elements per pending write,
/// ordered by task and idx.
pub const PY2_SELECT_SQL: &str = "
select
    thread_id,
    checkpoint,
    checkpoint_ns,
    checkpoint_id,
    parent_checkpoint_id,
    metadata,
    (
        select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
        from jsonb_each_text(checkpoint -> 'channel_versions')
        inner join checkpoint_blobs bl
            on bl.thread_id = checkpoints.thread_id
            and bl.checkpoint_ns = checkpoints.checkpoint_ns
            and bl.channel = jsonb_each_text.key
            and bl.version = jsonb_each_text.value
    ) as channel_values,
    (
        select
        array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob] order by cw.task_id, cw.idx)
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.checkpoint_id = checkpoints.checkpoint_id
    ) as pending_writes
from checkpoints ";

/// JS 1.0.x: schema-qualified tables and a `cp` alias; the SELECT ends
/// with a space for the WHERE clause appended to it.
pub const JS_SELECT_SQL: &str = r#"select
    thread_id,
    checkpoint,
    checkpoint_ns,
    checkpoint_id,
    parent_checkpoint_id,
    metadata,
    (
      select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
      from jsonb_each_text(checkpoint -> 'channel_versions')
      inner join "public".checkpoint_blobs bl
        on bl.thread_id = cp.thread_id
        and bl.checkpoint_ns = cp.checkpoint_ns
        and bl.channel = jsonb_each_text.key
        and bl.version = jsonb_each_text.value
    ) as channel_values,
    (
      select
      array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob] order by cw.task_id, cw.idx)
      from "public".checkpoint_writes cw
      where cw.thread_id = cp.thread_id
        and cw.checkpoint_ns = cp.checkpoint_ns
        and cw.checkpoint_id = cp.checkpoint_id
    ) as pending_writes
  from "public".checkpoints cp "#;

/// The WHERE clauses JS `getTuple` appends.
pub const JS_LATEST_TAIL: &str =
    "WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1";
pub const JS_BY_ID_TAIL: &str =
    "WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3";

pub const JS_PENDING_SENDS: &str = r#"select
      checkpoint_id,
      array_agg(array[cw.type::bytea, cw.blob] order by cw.task_id, cw.idx) as pending_sends
    from "public".checkpoint_writes cw
    where cw.thread_id = $1
      and cw.checkpoint_id = any($2)
      and cw.channel = '__pregel_tasks'
    group by cw.checkpoint_id
  "#;

pub const JS_UPSERT_BLOBS: &str = r#"INSERT INTO "public".checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
  VALUES ($1, $2, $3, $4, $5, $6)
  ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
  "#;

pub const JS_UPSERT_CHECKPOINT: &str = r#"INSERT INTO "public".checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
  VALUES ($1, $2, $3, $4, $5, $6)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
  DO UPDATE SET
    checkpoint = EXCLUDED.checkpoint,
    metadata = EXCLUDED.metadata;
  "#;

pub const JS_UPSERT_WRITES: &str = r#"INSERT INTO "public".checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel,
    type = EXCLUDED.type,
    blob = EXCLUDED.blob;
  "#;

pub const JS_INSERT_WRITES: &str = r#"INSERT INTO "public".checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
  "#;

/// JS `setup()`: the schema, the version query, the migrations, each
/// migration's version row.
pub const JS_SETUP: [&str; 8] = [
    r#"CREATE SCHEMA IF NOT EXISTS "public""#,
    r#"SELECT v FROM "public".checkpoint_migrations ORDER BY v DESC LIMIT 1"#,
    r#"CREATE TABLE IF NOT EXISTS "public".checkpoint_migrations (
    v INTEGER PRIMARY KEY
  );"#,
    r#"CREATE TABLE IF NOT EXISTS "public".checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
  );"#,
    r#"CREATE TABLE IF NOT EXISTS "public".checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
  );"#,
    r#"CREATE TABLE IF NOT EXISTS "public".checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT,
    blob BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
  );"#,
    r#"ALTER TABLE "public".checkpoint_blobs ALTER COLUMN blob DROP not null;"#,
    r#"INSERT INTO "public".checkpoint_migrations (v) VALUES ($1)"#,
];
