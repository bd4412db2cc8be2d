//! Shared inputs of the micro-benchmarks: the saver's statements verbatim
//! (shared reference langgraph-wire.md, section 3), pgbench's statements,
//! and wire frames built the way psycopg / libpq / PostgreSQL send them.
#![allow(dead_code)]

use std::sync::Arc;

use resumeguard::audit::{AuditSink, SessionContext};
use resumeguard::enforce::{Enforcement, Legs, SessionGuard};
use resumeguard::saver::bind::BoundParams;
use resumeguard::saver::classify::Classifier;
use resumeguard::saver::decode_error::DecodeError;
use resumeguard::saver::profile::SaverProfile;
use resumeguard::wire::guard::Guard;
use resumeguard::wire::messages::bind::Bind;
use resumeguard::wire::messages::read::HEADER_LEN;

pub mod saver_sql;

pub const LATEST_TAIL: &str =
    "WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1";

pub fn read_latest_sql() -> String {
    format!("{}{LATEST_TAIL}", saver_sql::SELECT_SQL)
}

/// pgbench's statements (select-only, and the longest TPC-B one).
pub const PGBENCH_SELECT_PREPARED: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;";
pub const PGBENCH_SELECT_SIMPLE: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = 412337;";
pub const PGBENCH_INSERT_SIMPLE: &str = "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (7, 1, 412337, -2718, CURRENT_TIMESTAMP);";

pub fn classifier() -> Arc<Classifier> {
    Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()]))
}

pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + 5);
    v.push(tag);
    v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

pub fn parse(name: &str, sql: &str, oids: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    for s in [name, sql] {
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    }
    b.extend_from_slice(&(oids.len() as i16).to_be_bytes());
    for o in oids {
        b.extend_from_slice(&o.to_be_bytes());
    }
    msg(b'P', &b)
}

pub fn bind(
    portal: &str,
    stmt: &str,
    formats: &[i16],
    params: &[Option<&[u8]>],
    results: &[i16],
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(portal.as_bytes());
    b.push(0);
    b.extend_from_slice(stmt.as_bytes());
    b.push(0);
    b.extend_from_slice(&(formats.len() as i16).to_be_bytes());
    for f in formats {
        b.extend_from_slice(&f.to_be_bytes());
    }
    b.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        match p {
            Some(v) => {
                b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                b.extend_from_slice(v);
            }
            None => b.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    b.extend_from_slice(&(results.len() as i16).to_be_bytes());
    for r in results {
        b.extend_from_slice(&r.to_be_bytes());
    }
    msg(b'B', &b)
}

pub fn describe_portal() -> Vec<u8> {
    msg(b'D', b"P\0")
}

pub fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}

pub fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

pub fn ready(status: u8) -> Vec<u8> {
    msg(b'Z', &[status])
}

pub fn command_complete(tag: &str) -> Vec<u8> {
    let mut b = tag.as_bytes().to_vec();
    b.push(0);
    msg(b'C', &b)
}

/// RowDescription with (name, type oid, format) columns.
pub fn row_description(cols: &[(&str, u32, i16)]) -> Vec<u8> {
    let mut b = (cols.len() as i16).to_be_bytes().to_vec();
    for (name, oid, fmt) in cols {
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(&0u32.to_be_bytes()); // table oid
        b.extend_from_slice(&0i16.to_be_bytes()); // attnum
        b.extend_from_slice(&oid.to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes()); // typlen
        b.extend_from_slice(&(-1i32).to_be_bytes()); // typmod
        b.extend_from_slice(&fmt.to_be_bytes());
    }
    msg(b'T', &b)
}

/// A DataRow body (after the 5-byte header), by the proxy's own encoder.
pub fn data_row_body(fields: &[Option<&[u8]>]) -> Vec<u8> {
    resumeguard::wire::messages::data_row::data_row(fields)[5..].to_vec()
}

/// A binary `bytea[]` (element OID 17, lower bounds 1), by the proxy's own
/// encoder.
pub fn bytea_array(dims: &[i32], elements: &[Option<&[u8]>]) -> Vec<u8> {
    resumeguard::saver::pg_array::ByteaArray {
        dims: dims.iter().map(|d| *d as usize).collect(),
        elements: elements
            .iter()
            .map(|e| e.map(bytes::Bytes::copy_from_slice))
            .collect(),
    }
    .encode_binary()
}

/// msgpack-ish payload of `n` bytes (content is irrelevant to the decoders).
pub fn blob(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The parked thread's checkpoint row as PostgreSQL sends it to the saver
/// (all columns binary): a v4 checkpoint, two blob channels, and the
/// gate's `__interrupt__` plus a few task writes pending.
pub fn checkpoint_row_body() -> Vec<u8> {
    let checkpoint = br#"{"v": 4, "ts": "2026-11-29T23:41:30.123456+00:00", "id": "1f0cd3a1-7e2b-6c4e-8002-5d2b9a41c0fe", "channel_versions": {"__start__": "00000000000000000000000000000002.0.2437960846411713", "items": "00000000000000000000000000000003.0.5541276530119327", "branch:to:prep": "00000000000000000000000000000003.0.8132412077611832", "branch:to:gate": "00000000000000000000000000000004.0.1204591822349171", "messages": "00000000000000000000000000000004.0.0961236645231111"}, "versions_seen": {"__input__": {}, "__start__": {"__start__": "00000000000000000000000000000001.0.7346120948113301"}, "prep": {"branch:to:prep": "00000000000000000000000000000002.0.1136622719051234"}, "gate": {"branch:to:gate": "00000000000000000000000000000003.0.9911273640012345"}}, "updated_channels": ["branch:to:gate", "items", "messages"], "channel_values": {"branch:to:gate": null}}"#;
    let mut ck = vec![1u8];
    ck.extend_from_slice(checkpoint);
    let metadata = br#"{"source": "loop", "step": 1, "parents": {}, "run_id": "1f0cd3a1-7d00-6b3a-bf2e-3e1fb27c1a22", "thread_id": "bench-thread-7f3a9c"}"#;
    let mut md = vec![1u8];
    md.extend_from_slice(metadata);
    let items = blob(180, 1);
    let messages = blob(900, 2);
    let cv = bytea_array(
        &[2, 3],
        &[
            Some(b"items"),
            Some(b"msgpack"),
            Some(&items),
            Some(b"messages"),
            Some(b"msgpack"),
            Some(&messages),
        ],
    );
    let interrupt = blob(140, 3);
    let w1 = blob(60, 4);
    let w2 = blob(40, 5);
    let pw = bytea_array(
        &[3, 6],
        &[
            Some(b"5b0e2d7c-1a2b-4c3d-9e8f-0a1b2c3d4e5f"),
            Some(b"__interrupt__"),
            Some(b"msgpack"),
            Some(&interrupt),
            Some(b"~__pregel_pull, gate"),
            Some(b"-3"),
            Some(b"0a4f3c2d-9b8a-4e7d-8c6b-5a4b3c2d1e0f"),
            Some(b"items"),
            Some(b"msgpack"),
            Some(&w1),
            Some(b"~__pregel_pull, prep"),
            Some(b"0"),
            Some(b"0a4f3c2d-9b8a-4e7d-8c6b-5a4b3c2d1e0f"),
            Some(b"branch:to:gate"),
            Some(b"null"),
            Some(&w2[..0]),
            Some(b"~__pregel_pull, prep"),
            Some(b"1"),
        ],
    );
    data_row_body(&[
        Some(b"bench-thread-7f3a9c"),
        Some(&ck),
        Some(b""),
        Some(b"1f0cd3a1-7e2b-6c4e-8002-5d2b9a41c0fe"),
        Some(b"1f0cd3a1-7a11-6f02-8001-0c9e1d2f3a4b"),
        Some(&md),
        Some(&cv),
        Some(&pw),
    ])
}

/// The RowDescription of the checkpoint SELECT (section 4).
pub fn checkpoint_row_description() -> Vec<u8> {
    row_description(&[
        ("thread_id", 25, 1),
        ("checkpoint", 3802, 1),
        ("checkpoint_ns", 25, 1),
        ("checkpoint_id", 25, 1),
        ("parent_checkpoint_id", 25, 1),
        ("metadata", 3802, 1),
        ("channel_values", 1001, 1),
        ("pending_writes", 1001, 1),
    ])
}

/// A 9-parameter `__interrupt__` upsert Bind, as psycopg sends it.
/// A whole Bind frame read by the codec and kept, as the enforcer keeps
/// a checkpoint statement's Bind.
pub fn kept_bind(frame: &[u8]) -> Result<BoundParams, DecodeError> {
    let body = frame.get(HEADER_LEN..).unwrap_or_default();
    BoundParams::keep(&Bind::read_body(body)?)
}

pub fn interrupt_write_bind(stmt: &str) -> Vec<u8> {
    let payload = blob(140, 9);
    bind(
        "",
        stmt,
        &[0, 0, 0, 0, 0, 1, 0, 0, 1],
        &[
            Some(b"bench-thread-7f3a9c"),
            Some(b""),
            Some(b"1f0cd3a1-7e2b-6c4e-8002-5d2b9a41c0fe"),
            Some(b"5b0e2d7c-1a2b-4c3d-9e8f-0a1b2c3d4e5f"),
            Some(b"~__pregel_pull, gate"),
            Some(&[0xff, 0xfd]),
            Some(b"__interrupt__"),
            Some(b"msgpack"),
            Some(&payload),
        ],
        &[1],
    )
}

/// A fresh session with the proxy's default enforcement legs (what
/// `resumeguard serve` runs with).
pub fn session() -> SessionGuard {
    let shared = Arc::new(Enforcement::new(
        classifier(),
        Legs::default(),
        AuditSink::disabled(),
    ));
    let mut st = shared.session(SessionContext::default(), false);
    st.on_server(&msg(b'Z', b"I")).unwrap();
    st
}

/// A session that has prepared `stmt` = `sql` (Parse + Sync answered).
pub fn prepared_session(stmt: &str, sql: &str, oids: &[u32]) -> SessionGuard {
    let mut st = session();
    st.on_client(&parse(stmt, sql, oids), false).unwrap();
    st.on_client(&sync(), false).unwrap();
    st.on_server(&msg(b'1', b"")).unwrap();
    st.on_server(&ready(b'I')).unwrap();
    st
}

/// One pgbench `-M prepared` select-only transaction on the wire (libpq's
/// PQexecPrepared): client Bind/Describe/Execute/Sync; server
/// BindComplete/RowDescription/DataRow/CommandComplete/ReadyForQuery.
pub struct PgbenchRound {
    pub client: Vec<Vec<u8>>,
    pub server: Vec<Vec<u8>>,
}

pub fn pgbench_prepared_round() -> PgbenchRound {
    PgbenchRound {
        client: vec![
            bind("", "P0_1", &[], &[Some(b"412337")], &[]),
            describe_portal(),
            execute(),
            sync(),
        ],
        server: vec![
            msg(b'2', b""),
            row_description(&[("abalance", 23, 0)]),
            msg(b'D', &data_row_body(&[Some(b"-2718")])),
            command_complete("SELECT 1"),
            ready(b'I'),
        ],
    }
}

/// A checkpoint read round on a prepared `_pg3_1` (the saver's READ(latest)).
pub fn checkpoint_read_round() -> PgbenchRound {
    PgbenchRound {
        client: vec![
            bind(
                "",
                "_pg3_1",
                &[],
                &[Some(b"bench-thread-7f3a9c"), Some(b"")],
                &[1],
            ),
            describe_portal(),
            execute(),
            sync(),
        ],
        server: vec![
            msg(b'2', b""),
            checkpoint_row_description(),
            msg(b'D', &checkpoint_row_body()),
            command_complete("SELECT 1"),
            ready(b'I'),
        ],
    }
}

/// A pending-write round on a prepared `_pg3_2` (`put_writes` of `__interrupt__`).
pub fn interrupt_write_round() -> PgbenchRound {
    PgbenchRound {
        client: vec![
            interrupt_write_bind("_pg3_2"),
            describe_portal(),
            execute(),
            sync(),
            msg(b'H', b""),
        ],
        server: vec![
            msg(b'2', b""),
            msg(b'n', b""),
            command_complete("INSERT 0 1"),
            ready(b'I'),
        ],
    }
}
