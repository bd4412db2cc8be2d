//! Classification of every statement the LangGraph savers send (verbatim
//! from the wire notes), plus the JS saver's shapes.

use super::*;

#[path = "saver_sql.rs"]
mod saver_sql;
use saver_sql::*;

fn classifier() -> Classifier {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    Classifier::new(crate::saver::profile::load_profiles(&dir).unwrap())
}

fn kind(sql: &str) -> StatementKind {
    classifier().classify(sql).kind.clone()
}

fn read(tail: &str) -> ReadShape {
    match kind(&format!("{SELECT_SQL}{tail}")) {
        StatementKind::Read(r) => r,
        other => panic!("not a read: {other:?}"),
    }
}

#[test]
fn read_latest() {
    let r = read("WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1");
    assert_eq!(r.mode, ReadMode::Latest);
    assert_eq!(
        (r.thread_param, r.ns_param, r.id_param),
        (Some(0), Some(1), None)
    );
    assert_eq!(
        r.output,
        [
            "thread_id",
            "checkpoint",
            "checkpoint_ns",
            "checkpoint_id",
            "parent_checkpoint_id",
            "metadata",
            "channel_values",
            "pending_writes"
        ]
    );
    assert_eq!(r.column("pending_writes"), Some(7));
}

#[test]
fn read_by_id() {
    let r = read("WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3");
    assert_eq!(r.mode, ReadMode::ById);
    assert_eq!(
        (r.thread_param, r.ns_param, r.id_param),
        (Some(0), Some(1), Some(2))
    );
}

#[test]
fn read_lists() {
    for tail in [
        "WHERE thread_id = $1  AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC",
        "WHERE thread_id = $1  ORDER BY checkpoint_id DESC",
        "WHERE thread_id = $1  AND metadata @> $2  AND checkpoint_id < $3  ORDER BY checkpoint_id DESC LIMIT $4",
        " ORDER BY checkpoint_id DESC",
    ] {
        assert_eq!(read(tail).mode, ReadMode::List, "{tail}");
    }
    let r = read("WHERE thread_id = $1  AND metadata @> $2  AND checkpoint_id < $3  ORDER BY checkpoint_id DESC LIMIT $4");
    assert_eq!((r.thread_param, r.id_param), (Some(0), None));
}

#[test]
fn writes() {
    let StatementKind::BlobUpsert(s) = kind(UPSERT_BLOBS) else {
        panic!()
    };
    assert_eq!(s.param_of("blob"), Some(5));
    assert_eq!(s.param_of("channel"), Some(2));
    let StatementKind::CheckpointUpsert(s) = kind(UPSERT_CHECKPOINT) else {
        panic!()
    };
    assert_eq!(s.param_of("parent_checkpoint_id"), Some(3));
    assert_eq!(s.param_of("checkpoint"), Some(4));
    let StatementKind::WritesUpsert(s) = kind(UPSERT_WRITES) else {
        panic!()
    };
    assert_eq!(s.param_of("idx"), Some(5));
    let StatementKind::WritesInsertIgnore(s) = kind(INSERT_WRITES) else {
        panic!()
    };
    assert_eq!(s.param_of("task_id"), Some(3));
}

#[test]
fn deletes_and_auxiliary_reads() {
    for (sql, table) in [
        (
            "DELETE FROM checkpoints WHERE thread_id = $1",
            TableRole::Checkpoints,
        ),
        (
            "DELETE FROM checkpoint_blobs WHERE thread_id = $1",
            TableRole::Blobs,
        ),
        (
            "DELETE FROM checkpoint_writes WHERE thread_id = $1",
            TableRole::Writes,
        ),
    ] {
        assert_eq!(
            kind(sql),
            StatementKind::DeleteThread {
                table,
                thread_param: Some(0)
            }
        );
    }
    assert_eq!(kind(PENDING_SENDS), StatementKind::WritesRead);
    assert_eq!(
        kind("DELETE FROM checkpoints WHERE checkpoint_id = $1"),
        StatementKind::Unrecognized
    );
}

#[test]
fn setup_statements_are_migrations() {
    for sql in [
        "CREATE TABLE IF NOT EXISTS checkpoint_migrations (\n    v INTEGER PRIMARY KEY\n);",
        "SELECT v FROM checkpoint_migrations ORDER BY v DESC LIMIT 1",
        "INSERT INTO checkpoint_migrations (v) VALUES ($1)",
        "CREATE TABLE IF NOT EXISTS checkpoints (\n    thread_id TEXT NOT NULL,\n    checkpoint_ns TEXT NOT NULL DEFAULT '',\n    checkpoint_id TEXT NOT NULL,\n    parent_checkpoint_id TEXT,\n    type TEXT,\n    checkpoint JSONB NOT NULL,\n    metadata JSONB NOT NULL DEFAULT '{}',\n    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)\n);",
        "ALTER TABLE checkpoint_blobs ALTER COLUMN blob DROP not null;",
        "\n    CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoints_thread_id_idx ON checkpoints(thread_id);\n    ",
        "ALTER TABLE checkpoint_writes ADD COLUMN IF NOT EXISTS task_path TEXT NOT NULL DEFAULT '';",
    ] {
        assert_eq!(kind(sql), StatementKind::Migration, "{sql}");
    }
}

#[test]
fn ordinary_traffic_is_other_without_parsing() {
    let c = classifier();
    for sql in [
        "SELECT abalance FROM pgbench_accounts WHERE aid = $1;",
        "SELECT 1;",
        "BEGIN",
        "not even sql",
    ] {
        assert!(Arc::ptr_eq(&c.classify(sql), &c.other()), "{sql}");
    }
    assert!(c.cache.is_empty(), "ordinary traffic is never cached");
}

#[test]
fn unknown_shapes_on_checkpoint_tables_are_unrecognized() {
    for sql in [
        "UPDATE checkpoints SET metadata = '{}'",
        "SELECT count(*) FROM checkpoint_blobs",
        "select * from checkpoints; select 1",
        "SELEKT garbage FROM checkpoints",
        "TRUNCATE checkpoint_writes",
    ] {
        assert_eq!(kind(sql), StatementKind::Unrecognized, "{sql}");
    }
}

#[test]
fn a_mention_in_a_literal_is_not_checkpoint_traffic() {
    assert_eq!(kind("SELECT 'checkpoints are nice'"), StatementKind::Other);
}

#[test]
fn results_are_cached_by_text() {
    let c = classifier();
    let a = c.classify(UPSERT_BLOBS);
    let b = c.classify(UPSERT_BLOBS);
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.profile.as_deref(), Some("langgraph-js"));
}

#[test]
fn js_saver_shapes_are_the_same_code_path() {
    // Schema-qualified, quoted names and a `cp` alias on the read; an
    // 8-parameter write without task_path.
    let r = match kind(
        "SELECT cp.thread_id, cp.checkpoint, cp.checkpoint_ns, cp.checkpoint_id, \
         cp.parent_checkpoint_id, cp.metadata FROM \"public\".\"checkpoints\" cp \
         WHERE cp.thread_id = $1 AND cp.checkpoint_ns = $2 ORDER BY cp.checkpoint_id DESC LIMIT 1",
    ) {
        StatementKind::Read(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.mode, ReadMode::Latest);
    assert_eq!(r.column("parent_checkpoint_id"), Some(4));
    let StatementKind::WritesInsertIgnore(s) = kind(
        "INSERT INTO \"public\".\"checkpoint_writes\" (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING",
    ) else {
        panic!()
    };
    assert_eq!(s.param_of("blob"), Some(7));
    assert_eq!(s.param_of("task_path"), None);
    // Another schema is not this saver's table.
    assert_eq!(
        kind("DELETE FROM other.checkpoints WHERE thread_id = $1"),
        StatementKind::DeleteThread {
            table: TableRole::Checkpoints,
            thread_param: Some(0)
        },
        "the python profile has no schema, so any schema matches it"
    );
}
