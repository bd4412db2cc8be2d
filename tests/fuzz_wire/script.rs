//! Generated client scripts for the tracker property: the extended and
//! simple protocol over a few statement and portal names, with the saver's
//! reads and writes (and their real Bind parameters), SQL PREPARE /
//! EXECUTE / DEALLOCATE / DISCARD, transactions and unknown checkpoint SQL.

use proptest::prelude::*;

use super::common::{self, saver_sql};
use super::server_model::msg;
use super::session::query;

/// One client message of a generated script.
#[derive(Debug, Clone)]
pub enum Op {
    Parse {
        name: u8,
        sql: u8,
    },
    Bind {
        portal: u8,
        statement: u8,
        params: u8,
    },
    DescribeStatement(u8),
    DescribePortal(u8),
    Execute(u8),
    CloseStatement(u8),
    ClosePortal(u8),
    Sync,
    Flush,
    Query(u8),
}

const STATEMENTS: [&str; 4] = ["", "s1", "_pg3_1", "q1"];
const PORTALS: [&str; 2] = ["", "p1"];

pub fn sql_pool() -> Vec<String> {
    let by_id = format!(
        "{}WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3",
        saver_sql::SELECT_SQL
    );
    vec![
        "select 1".into(),
        "select $1::int".into(),
        common::PGBENCH_SELECT_PREPARED.into(),
        common::read_latest_sql(),
        by_id.clone(),
        saver_sql::UPSERT_BLOBS.into(),
        saver_sql::UPSERT_CHECKPOINT.into(),
        saver_sql::UPSERT_WRITES.into(),
        saver_sql::INSERT_WRITES.into(),
        "begin".into(),
        "commit".into(),
        "rollback".into(),
        "select * from checkpoints".into(),
        "delete from checkpoint_writes where thread_id = $1".into(),
        "prepare q1 as select 1".into(),
        format!(
            "prepare q1 as {}",
            common::read_latest_sql()
                .replace("$1", "'t'")
                .replace("$2", "''")
        ),
        "execute q1".into(),
        "deallocate q1".into(),
        "deallocate all".into(),
        "discard all".into(),
        "declare c cursor for select 1".into(),
        "select 1; select 2".into(),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    let n = any::<u8>();
    prop_oneof![
        3 => (n, n).prop_map(|(name, sql)| Op::Parse { name, sql }),
        3 => (n, n, n).prop_map(|(portal, statement, params)| Op::Bind { portal, statement, params }),
        1 => n.prop_map(Op::DescribeStatement),
        2 => n.prop_map(Op::DescribePortal),
        3 => n.prop_map(Op::Execute),
        1 => n.prop_map(Op::CloseStatement),
        1 => n.prop_map(Op::ClosePortal),
        3 => Just(Op::Sync),
        1 => Just(Op::Flush),
        2 => n.prop_map(Op::Query),
    ]
}

fn pick<'a>(list: &[&'a str], i: u8) -> &'a str {
    list[usize::from(i) % list.len()]
}

pub fn frame_of(op: &Op, pool: &[String]) -> Vec<u8> {
    let cstr = |s: &str| {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    };
    match op {
        Op::Parse { name, sql } => common::parse(
            pick(&STATEMENTS, *name),
            &pool[usize::from(*sql) % pool.len()],
            &[],
        ),
        Op::Bind {
            portal,
            statement,
            params,
        } => {
            let (portal, statement) = (pick(&PORTALS, *portal), pick(&STATEMENTS, *statement));
            match params % 7 {
                // The saver's `__interrupt__` write, as psycopg binds it.
                0 => {
                    let frame = common::interrupt_write_bind(statement);
                    let mut bound =
                        common::kept_bind(&frame).expect("the benchmark's Bind decodes");
                    bound.portal = portal.into();
                    bound.encode().expect("a decoded Bind encodes")
                }
                1 => common::bind(portal, statement, &[], &[Some(b"t1"), Some(b"")], &[1]),
                2 => common::bind(
                    portal,
                    statement,
                    &[],
                    &[Some(b"t1"), Some(b""), Some(b"ck1")],
                    &[1],
                ),
                // A blob of channel `items`: ["a"] (valid) or [null] (invalid).
                3 | 4 => {
                    let blob: &[u8] = if params % 7 == 3 { &[0x91, 0xa1, b'a'] } else { &[0x91, 0xc0] };
                    common::bind(
                        portal,
                        statement,
                        &[0, 0, 0, 0, 0, 1],
                        &[
                            Some(b"t1"),
                            Some(b""),
                            Some(b"items"),
                            Some(b"00002.0.1"),
                            Some(b"msgpack"),
                            Some(blob),
                        ],
                        &[],
                    )
                }
                // The checkpoint that names that blob version.
                5 => common::bind(
                    portal,
                    statement,
                    &[],
                    &[
                        Some(b"t1"),
                        Some(b""),
                        Some(b"ck-42"),
                        None,
                        Some(br#"{"v": 4, "channel_values": {}, "channel_versions": {"items": "00002.0.1"}}"#),
                        Some(b"{}"),
                    ],
                    &[],
                ),
                _ => common::bind(portal, statement, &[1], &[Some(&[*params; 3])], &[]),
            }
        }
        Op::DescribeStatement(i) => {
            msg(b'D', &[b"S".to_vec(), cstr(pick(&STATEMENTS, *i))].concat())
        }
        Op::DescribePortal(i) => msg(b'D', &[b"P".to_vec(), cstr(pick(&PORTALS, *i))].concat()),
        Op::Execute(i) => msg(b'E', &[cstr(pick(&PORTALS, *i)), vec![0, 0, 0, 0]].concat()),
        Op::CloseStatement(i) => msg(b'C', &[b"S".to_vec(), cstr(pick(&STATEMENTS, *i))].concat()),
        Op::ClosePortal(i) => msg(b'C', &[b"P".to_vec(), cstr(pick(&PORTALS, *i))].concat()),
        Op::Sync => msg(b'S', b""),
        Op::Flush => msg(b'H', b""),
        Op::Query(i) => query(&pool[usize::from(*i) % pool.len()]),
    }
}
