//! Classification of LangGraph Python 3.2.0's `prune()`, delta-channel
//! history and shallow-saver statements (and 2.0.25's shallow read).

use crate::saver::checkpoint_row::RowLayout;
use crate::saver::classify::tests::housekeeping_sql::*;
use crate::saver::classify::*;
use crate::saver::layout::PendingWritesLayout;

fn classifier() -> Classifier {
    Classifier::new(SaverProfile::built_in())
}

fn kind(sql: &str) -> StatementKind {
    let class = classifier().classify(sql);
    assert_eq!(class.unenforced, None, "{sql}");
    assert_eq!(class.profile.as_deref(), Some("langgraph-python"), "{sql}");
    class.kind.clone()
}

fn rows(table: TableRole, rows: RowsDeleted) -> StatementKind {
    StatementKind::DeleteRows { table, rows }
}

#[test]
fn prune_statements_are_recognized() {
    let tables = [TableRole::Checkpoints, TableRole::Blobs, TableRole::Writes];
    for (sql, table) in PRUNE_DELETE_THREADS.iter().zip(tables) {
        let threads = RowsDeleted::Threads { threads_param: 0 };
        assert_eq!(kind(sql), rows(table, threads), "{sql}");
    }
    let tables = [TableRole::Checkpoints, TableRole::Writes, TableRole::Blobs];
    for (sql, table) in PRUNE_SUBGRAPH_CALLS.iter().zip(tables) {
        assert_eq!(kind(sql), rows(table, RowsDeleted::Namespaces), "{sql}");
    }
    for sql in [
        PRUNE_DELTA_THREADS,
        PRUNE_HEADS,
        PRUNE_UNKEPT,
        PRUNE_REFERENCED_BLOBS,
    ] {
        assert_eq!(kind(sql), StatementKind::ReadWithoutWrites, "{sql}");
    }
    assert_eq!(
        kind(PRUNE_WRITES),
        rows(TableRole::Writes, RowsDeleted::Listed)
    );
    assert_eq!(
        kind(PRUNE_CHECKPOINTS),
        rows(
            TableRole::Checkpoints,
            RowsDeleted::AllBut {
                thread_param: 0,
                ns_param: 1,
                kept_params: vec![2]
            }
        )
    );
    assert_eq!(kind(PRUNE_PARENTS), StatementKind::Unparent);
    assert_eq!(
        kind(PRUNE_BLOBS),
        rows(TableRole::Blobs, RowsDeleted::BlobVersions)
    );
    // `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ` names no table.
    let set = classifier().classify("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    assert!(!set.kind.is_checkpoint_traffic());
}

#[test]
fn delta_history_reads_are_recognized_with_their_channel_parameters() {
    assert_eq!(kind(DELTA_STAGE1), StatementKind::ReadWithoutWrites);
    assert_eq!(
        kind(DELTA_STAGE2),
        StatementKind::ChannelHistoryRead {
            channel_params: vec![2, 6]
        }
    );
    // A writes branch that does not name its channel by a parameter is
    // not the saver's: it could return `__resume__` writes.
    let unfiltered = DELTA_STAGE2.replacen("AND channel = $3 ", "", 1);
    assert_eq!(
        classifier().classify(&unfiltered).kind,
        StatementKind::Unrecognized
    );
    let literal = DELTA_STAGE2.replacen("channel = $3", "channel = '__resume__'", 1);
    assert_eq!(
        classifier().classify(&literal).kind,
        StatementKind::Unrecognized
    );
}

#[test]
fn shallow_saver_statements_are_recognized() {
    let read = |tail: &str, sql: &str| match kind(&format!("{sql}{tail}")) {
        StatementKind::Read(r) => r,
        other => panic!("not a read: {other:?}"),
    };
    let get = read(
        "WHERE thread_id = $1 AND checkpoint_ns = $2",
        SHALLOW_SELECT_SQL,
    );
    // One row per namespace: a read of one namespace is of its head.
    assert_eq!(get.mode, ReadMode::Latest);
    assert_eq!((get.thread_param, get.ns_param), (Some(0), Some(1)));
    assert_eq!(
        (get.layout.checkpoint_id, get.layout.parent_checkpoint_id),
        (None, None)
    );
    assert_eq!(get.layout.write_rows, PendingWritesLayout::PYTHON_3);
    assert_eq!(get.saver, "3.x");
    let class = classifier().classify(&format!(
        "{SHALLOW_SELECT_SQL}WHERE thread_id = $1 AND checkpoint_ns = $2"
    ));
    assert_eq!(class.fork_sql, None, "nothing superseded to fork from");
    let list = read("WHERE thread_id = $1 LIMIT $2", SHALLOW_SELECT_SQL);
    assert_eq!(list.mode, ReadMode::List);
    let by_id = read(
        "WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3",
        SHALLOW_SELECT_SQL,
    );
    assert_eq!((by_id.mode, by_id.id_param), (ReadMode::Latest, None));
    let py2 = SHALLOW_SELECT_SQL.replace(
        "array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob, convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])",
        SHALLOW_2_0_PENDING_WRITES,
    );
    let old = read("WHERE thread_id = $1 AND checkpoint_ns = $2", &py2);
    assert_eq!((old.saver.as_str(), old.mode), ("2.0.x", ReadMode::Latest));
    assert_eq!(
        kind(SHALLOW_DELETE_WRITES),
        rows(
            TableRole::Writes,
            RowsDeleted::AllBut {
                thread_param: 0,
                ns_param: 1,
                kept_params: vec![2, 3]
            }
        )
    );
    assert!(matches!(
        kind(SHALLOW_UPSERT_BLOBS),
        StatementKind::BlobUpsert(_)
    ));
    assert!(matches!(
        kind(SHALLOW_UPSERT_CHECKPOINT),
        StatementKind::CheckpointUpsert(_)
    ));
}

#[test]
fn a_read_without_ids_that_is_not_the_shallow_one_stays_unrecognized() {
    // The shallow read is known by its writes joined on the document's id;
    // without that, a read missing checkpoint_id is not decodable.
    let sql = SHALLOW_SELECT_SQL.replace("(checkpoint->>'id')", "checkpoints.checkpoint_ns");
    let class = classifier().classify(&format!("{sql}WHERE thread_id = $1 AND checkpoint_ns = $2"));
    assert_eq!(class.kind, StatementKind::Unrecognized);
    assert_eq!(
        class.unenforced.as_ref().map(|u| u.reason.as_str()),
        Some("the read does not return checkpoint_id")
    );
}

#[test]
fn the_suites_row_listings_are_reads_without_writes() {
    let [checkpoints, writes, blobs] = SUITE_ROW_LISTINGS;
    assert_eq!(kind(checkpoints), StatementKind::ReadWithoutWrites);
    assert_eq!(kind(writes), StatementKind::WritesRead);
    assert_eq!(kind(blobs), StatementKind::ReadWithoutWrites);
}

#[test]
fn a_shallow_row_takes_its_id_from_the_document() {
    use crate::saver::checkpoint_row::decode_checkpoint_row;
    let StatementKind::Read(shape) = kind(&format!(
        "{SHALLOW_SELECT_SQL}WHERE thread_id = $1 AND checkpoint_ns = $2"
    )) else {
        panic!("not a read")
    };
    let layout: RowLayout = shape.layout;
    let doc = br#"{"v": 4, "id": "1f0-shallow", "channel_versions": {}}"#;
    let fields: Vec<Option<&[u8]>> = vec![
        Some(b"t1"),
        Some(doc),
        Some(b""),
        Some(b"{}"),
        None,
        None,
        None,
    ];
    let row = decode_checkpoint_row(&fields, &[], &layout).unwrap();
    assert_eq!(row.at.checkpoint_id, "1f0-shallow");
    assert_eq!(row.parent_checkpoint_id, None);
    let no_id: Vec<Option<&[u8]>> = vec![
        Some(b"t1"),
        Some(b"{}"),
        Some(b""),
        Some(b"{}"),
        None,
        None,
        None,
    ];
    assert!(decode_checkpoint_row(&no_id, &[], &layout).is_err());
}
