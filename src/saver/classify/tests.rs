//! Classification of every statement the LangGraph savers send: Python
//! 3.x (verbatim from the wire notes), Python 2.0.x and JS 1.0.x.

use super::*;
use crate::saver::layout::{ChannelValuesLayout, PendingWritesLayout};

use super::saver_sql::*;
use other_savers_sql::*;

mod housekeeping;
pub(crate) mod housekeeping_sql;
pub(crate) mod other_savers_sql;

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
    assert_eq!(
        r.layout,
        crate::saver::checkpoint_row::RowLayout::SAVER_SELECT
    );
    assert_eq!(r.saver, "3.x");
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
        "SELECT * FROM checkpoint_blobs",
        "DELETE FROM checkpoints",
        "DELETE FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3)",
        "UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = $1",
        "WITH d AS (DELETE FROM checkpoint_writes WHERE thread_id = $1 RETURNING blob) SELECT blob FROM d",
        "SELECT channel, blob FROM checkpoint_writes WHERE thread_id = $1 UNION SELECT channel, blob FROM checkpoint_blobs",
        "SELECT c.checkpoint FROM checkpoints c JOIN checkpoint_writes w ON w.thread_id = c.thread_id",
        "select * from checkpoints; select 1",
        "SELEKT garbage FROM checkpoints",
        "TRUNCATE checkpoint_writes",
    ] {
        assert_eq!(kind(sql), StatementKind::Unrecognized, "{sql}");
    }
}

#[test]
fn a_checkpoint_table_named_through_unicode_escapes_is_unrecognized() {
    let c = classifier();
    for sql in [
        r#"UPDATE U&"checkpo\0069nts" SET metadata = metadata WHERE thread_id = $1"#,
        r#"insert into u&"checkpoint\005fblobs" values ($1, $2, $3, $4, $5, $6)"#,
        r#"DELETE FROM public.U&"checkpoint!005fwrites" UESCAPE '!'"#,
        r#"SELECT * FROM U&"\+000063heckpoints""#,
        // An escape the server refuses: what it names cannot be known.
        r#"DELETE FROM U&"checkpo\zzzznts""#,
    ] {
        let class = c.classify(sql);
        assert_eq!(class.kind, StatementKind::Unrecognized, "{sql}");
        let what = class.unenforced.as_ref().expect("says why");
        assert!(what.reason.contains("U&"), "{sql}: {}", what.reason);
    }
    for sql in [
        r#"SELECT U&"d\0061ta" FROM t"#,
        r#"SELECT U&'checkpo\0069nts'"#,
    ] {
        assert!(Arc::ptr_eq(&c.classify(sql), &c.other()), "{sql}");
    }
    assert!(
        c.names_saver_tables(r#"SELECT U&"d\0061ta" FROM t"#),
        "a maybe"
    );
}

#[test]
fn a_checkpoint_table_named_through_unicode_escapes_is_refused_when_unknowns_are() {
    let c = classifier().with_unknown_policy(UnknownSaverPolicy::Refuse);
    let class = c.classify(r#"UPDATE U&"checkpo\0069nts" SET metadata = '{}'"#);
    assert!(class.refusal.is_some(), "{class:?}");
}

#[test]
fn a_checkpoint_table_a_backslash_may_take_out_of_a_string_is_unrecognized() {
    // With standard_conforming_strings off the string ends at `\'`, and
    // the DELETE runs.
    let class = classifier().classify(r"SELECT 'a\'' ; DELETE FROM checkpoints ; --'");
    assert_eq!(class.kind, StatementKind::Unrecognized);
    let what = class.unenforced.as_ref().expect("says why");
    assert!(
        what.reason.contains("standard_conforming_strings"),
        "{}",
        what.reason
    );
    // Read alike both ways: the parse decides (a mention in a string).
    assert_eq!(kind(r"SELECT 'checkpoints\d'"), StatementKind::Other);
}

#[test]
fn a_checkpoint_table_a_multibyte_character_may_take_out_of_a_string_is_unrecognized() {
    // SJIS 表 is 0x95 0x5C: the server reads E'表', and the DELETE runs.
    let sql = crate::wire::client_text::decode(b"SELECT E'\x95\\' ; DELETE FROM checkpoints ; --'");
    let class = classifier().classify(&sql);
    assert_eq!(class.kind, StatementKind::Unrecognized);
    let what = class.unenforced.as_ref().expect("says why");
    assert!(what.reason.contains("SJIS"), "{}", what.reason);
    // A character whose bytes hold no backslash in any such encoding
    // (é is 0xC3 0xA9): the parse decides.
    assert_eq!(kind("SELECT E'checkpoints é\\\\'"), StatementKind::Other);
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
    // Unqualified names are the Python saver's way; qualified, the JS one's.
    assert_eq!(a.profile.as_deref(), Some("langgraph-python"));
    assert_eq!(
        c.classify(JS_UPSERT_BLOBS).profile.as_deref(),
        Some("langgraph-js")
    );
}

/// The classification of `sql` by the shipped profiles, as a read.
fn read_of(sql: &str) -> (ReadShape, Arc<Classified>) {
    let class = classifier().classify(sql);
    match &class.kind {
        StatementKind::Read(r) => (r.clone(), Arc::clone(&class)),
        other => panic!("not a read: {other:?} ({:?})", class.unenforced),
    }
}

#[test]
fn python_2_reads_pick_the_four_element_layout() {
    for (tail, mode) in [
        (
            "WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1",
            ReadMode::Latest,
        ),
        (
            "WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3",
            ReadMode::ById,
        ),
        (
            "WHERE thread_id = $1  AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC",
            ReadMode::List,
        ),
    ] {
        let (r, class) = read_of(&format!("{PY2_SELECT_SQL}{tail}"));
        assert_eq!(r.mode, mode, "{tail}");
        assert_eq!(class.profile.as_deref(), Some("langgraph-python"));
        assert_eq!(r.saver, "2.0.x");
        assert_eq!(r.layout.write_rows, PendingWritesLayout::FOUR);
        assert_eq!(r.layout.value_rows, ChannelValuesLayout::STANDARD);
        assert_eq!((r.layout.channel_values, r.layout.pending_writes), (6, 7));
        assert_eq!(class.fork_sql.is_some(), mode == ReadMode::ById);
    }
    // The same table names, six elements: the 3.x layout.
    let (r, _) = read_of(&format!(
        "{SELECT_SQL}WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3"
    ));
    assert_eq!(
        (r.saver.as_str(), r.layout.write_rows),
        ("3.x", PendingWritesLayout::PYTHON_3)
    );
}

#[test]
fn js_reads_are_recognized_with_their_layout_and_fork_rewrite() {
    let (r, class) = read_of(&format!("{JS_SELECT_SQL}{JS_LATEST_TAIL}"));
    assert_eq!(r.mode, ReadMode::Latest);
    assert_eq!(class.profile.as_deref(), Some("langgraph-js"));
    assert_eq!(r.saver, "1.0.x");
    assert_eq!(r.layout.write_rows, PendingWritesLayout::FOUR);
    assert_eq!(
        (r.thread_param, r.ns_param, r.id_param),
        (Some(0), Some(1), None)
    );

    let (r, class) = read_of(&format!("{JS_SELECT_SQL}{JS_BY_ID_TAIL}"));
    assert_eq!((r.mode, r.id_param), (ReadMode::ById, Some(2)));
    let fork_sql = class
        .fork_sql
        .as_deref()
        .expect("a JS read by id has a fork rewrite");
    assert!(
        fork_sql.contains("rg_h.thread_id = cp.thread_id"),
        "{fork_sql}"
    );
    // The rewrite is still the same read, the head column last.
    let (rewritten, _) = read_of(fork_sql);
    assert_eq!(rewritten.layout, r.layout);
    assert_eq!(
        rewritten.output.last().map(String::as_str),
        Some(crate::saver::fork_rewrite::HEAD_COLUMN)
    );
}

#[test]
fn js_in_a_custom_schema_is_the_js_profile() {
    let sql = format!("{JS_SELECT_SQL}{JS_LATEST_TAIL}").replace("\"public\"", "\"custom_schema\"");
    let (r, class) = read_of(&sql);
    assert_eq!(class.profile.as_deref(), Some("langgraph-js"));
    assert_eq!(r.layout.write_rows, PendingWritesLayout::FOUR);
    let write = classifier().classify(&JS_INSERT_WRITES.replace("\"public\"", "\"custom_schema\""));
    assert!(matches!(write.kind, StatementKind::WritesInsertIgnore(_)));
    assert_eq!(write.profile.as_deref(), Some("langgraph-js"));
}

#[test]
fn js_writes_deletes_sends_and_setup() {
    let c = classifier();
    let kind = |sql: &str| {
        let class = c.classify(sql);
        assert_eq!(class.unenforced, None, "{sql}");
        class.kind.clone()
    };
    let StatementKind::BlobUpsert(s) = kind(JS_UPSERT_BLOBS) else {
        panic!()
    };
    assert_eq!(s.param_of("blob"), Some(5));
    let StatementKind::CheckpointUpsert(s) = kind(JS_UPSERT_CHECKPOINT) else {
        panic!()
    };
    assert_eq!(s.param_of("metadata"), Some(5));
    for sql in [JS_UPSERT_WRITES, JS_INSERT_WRITES] {
        let (StatementKind::WritesUpsert(s) | StatementKind::WritesInsertIgnore(s)) = kind(sql)
        else {
            panic!("{sql}")
        };
        assert_eq!(
            (
                s.param_of("idx"),
                s.param_of("blob"),
                s.param_of("task_path")
            ),
            (Some(4), Some(7), None)
        );
    }
    assert_eq!(kind(JS_PENDING_SENDS), StatementKind::WritesRead);
    assert_eq!(
        kind(r#"DELETE FROM "public".checkpoint_writes WHERE thread_id = $1"#),
        StatementKind::DeleteThread {
            table: TableRole::Writes,
            thread_param: Some(0)
        }
    );
    assert_eq!(kind(JS_SETUP[0]), StatementKind::Other);
    for sql in &JS_SETUP[1..] {
        assert_eq!(kind(sql), StatementKind::Migration, "{sql}");
    }
}

#[test]
fn an_undeclared_pending_writes_layout_is_unrecognized_and_says_why() {
    // Five elements: no profile declares that row.
    let sql = format!(
        "{}WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1",
        SELECT_SQL.replace(", cw.idx::text::bytea]", "]")
    );
    let class = classifier().classify(&sql);
    assert_eq!(class.kind, StatementKind::Unrecognized);
    assert_eq!(class.profile.as_deref(), Some("langgraph-python"));
    let what = class.unenforced.as_ref().unwrap();
    assert_eq!(what.statement, "read_latest");
    assert_eq!(what.legs_off, crate::saver::unknown::READ_LEGS);
    assert!(
        what.reason.starts_with(
            "pending_writes rows are [task_id, channel, type, blob, task_path]; the profile knows \
             [task_id, channel, type, blob, task_path, idx] (3.x), [task_id, channel, type, blob] (2.0.x)"
        ),
        "{}",
        what.reason
    );
    assert_eq!(class.refusal, None, "warn forwards it");
}

#[test]
fn a_read_without_the_decoded_columns_is_unrecognized() {
    let class = classifier().classify(
        "SELECT cp.thread_id, cp.checkpoint FROM \"public\".checkpoints cp \
         WHERE cp.thread_id = $1 ORDER BY cp.checkpoint_id DESC LIMIT 1",
    );
    assert_eq!(class.kind, StatementKind::Unrecognized);
    let what = class.unenforced.as_ref().unwrap();
    assert_eq!(what.statement, "read_latest");
    assert_eq!(what.reason, "the read does not return checkpoint_ns");
}

#[test]
fn element_order_is_read_off_the_sql() {
    // A profile declaring writes as [channel, task_id, blob, type]: the
    // positions come from the declaration the SQL matched.
    let text = include_str!("../../../rules/langgraph-python.toml").replace(
        "{ saver = \"2.0.x\", elements = [\"task_id\", \"channel\", \"type\", \"blob\"] }",
        "{ saver = \"swapped\", elements = [\"channel\", \"task_id\", \"blob\", \"type\"] }",
    );
    let profile = SaverProfile::from_toml(&text).unwrap();
    let c = Classifier::new(vec![profile]);
    let swapped = PY2_SELECT_SQL.replace(
        "array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob]",
        "array[cw.channel::bytea, cw.task_id::text::bytea, cw.blob, cw.type::bytea]",
    );
    let StatementKind::Read(r) = &c.classify(&format!("{swapped}WHERE thread_id = $1")).kind else {
        panic!()
    };
    assert_eq!(r.saver, "swapped");
    let w = r.layout.write_rows;
    assert_eq!(
        (w.width, w.channel, w.task_id, w.blob, w.type_tag),
        (4, 0, 1, 2, 3)
    );
    // The 2.0.x order is no longer declared there.
    let class = c.classify(&format!("{PY2_SELECT_SQL}WHERE thread_id = $1"));
    assert_eq!(class.kind, StatementKind::Unrecognized);
}

#[test]
fn refuse_policy_puts_the_refusal_in_the_classification() {
    let c =
        Classifier::new(SaverProfile::built_in()).with_unknown_policy(UnknownSaverPolicy::Refuse);
    let class = c.classify("UPDATE checkpoints SET metadata = '{}'");
    assert_eq!(class.kind, StatementKind::Unrecognized);
    let refusal = class.refusal.as_deref().expect("refused");
    assert!(
        refusal.contains("update") && refusal.contains("profile langgraph-python"),
        "{refusal}"
    );
    // Recognized and ordinary traffic is never refused.
    assert_eq!(c.classify(UPSERT_BLOBS).refusal, None);
    assert_eq!(c.classify("SELECT 1").refusal, None);
}

#[test]
fn unrecognized_statements_and_rows_are_counted_every_time() {
    let c = classifier();
    let sql = "TRUNCATE checkpoint_blobs";
    let before = crate::saver::unknown::unknown_total();
    let class = c.classify(sql);
    c.classify(sql); // cached, counted again
    c.classify(UPSERT_BLOBS); // recognized: not counted
    let (_, read) = read_of(&format!("{SELECT_SQL}WHERE thread_id = $1"));
    read.report_undecodable_row(&crate::saver::decode_error::DecodeError::UnexpectedNull {
        what: "thread_id",
    });
    // Other tests count concurrently: these three are in it.
    assert!(crate::saver::unknown::unknown_total() >= before + 3);
    assert_eq!(class.unenforced.as_ref().unwrap().statement, "truncate");
}

#[test]
fn the_cache_holds_a_bounded_number_of_bytes() {
    let c = classifier();
    // Distinct 1 MB texts on a checkpoint table: classified, never cached.
    for i in 0..20 {
        let sql = format!(
            "select * from checkpoints /* {i} {} */",
            "x".repeat(1 << 20)
        );
        c.classify(&sql);
    }
    assert_eq!(c.cached_bytes(), 0);
    // Small texts are cached up to the byte budget.
    let mut texts = 0;
    for i in 0..400 {
        let sql = format!(
            "select * from checkpoints /* {i} {} */",
            "y".repeat(60 << 10)
        );
        c.classify(&sql);
        texts += 1;
    }
    assert!(texts * (60 << 10) > super::CACHE_BYTES);
    assert!(
        c.cached_bytes() <= super::CACHE_BYTES,
        "{}",
        c.cached_bytes()
    );
    assert!(c.cached_bytes() > super::CACHE_BYTES / 2);
}
