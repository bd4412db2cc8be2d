//! Statements of the other saver generations, as they reach the wire:
//! LangGraph Python `langgraph-checkpoint-postgres` 2.0.x (2.0.25) and
//! LangGraph JS `@langchain/langgraph-checkpoint-postgres` 1.0.x (1.0.5,
//! schema "public"), per shared reference saver-generations.md. Python's
//! `%s` placeholders are `$n` by the time psycopg sends them.

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

/// JS `setup()`: the schema, then the migrations table in it.
pub const JS_SETUP: [&str; 4] = [
    r#"CREATE SCHEMA IF NOT EXISTS "public""#,
    "CREATE TABLE IF NOT EXISTS \"public\".checkpoint_migrations (\n    v INTEGER PRIMARY KEY\n  );",
    r#"SELECT v FROM "public".checkpoint_migrations ORDER BY v DESC LIMIT 1"#,
    r#"INSERT INTO "public".checkpoint_migrations (v) VALUES ($1)"#,
];
