//! Fuzz harness (stable Rust, proptest): framing, first packets, the saver
//! decoders and the session guard (the protocol tracker with the real
//! enforcer as hooks), seeded from real captured sessions (fuzz/corpus/).
//!
//! Properties: nothing panics; framing consumes exactly the declared
//! lengths and never more; the guard stays in step with a model of
//! PostgreSQL's answers to whatever the proxy sends it, never keeps a
//! ReadyForQuery from the client, and after any sequence a `select 1`
//! round still routes correctly. Each property runs for a share of
//! `RG_FUZZ_SECONDS` (default 60 in all): `RG_FUZZ_SECONDS=3600 cargo test
//! --release --test fuzz_wire` fuzzes for an hour.

#[path = "fuzz_wire/budget.rs"]
mod budget;
#[path = "../benches/common/mod.rs"]
mod common;
#[path = "fuzz_wire/corpus.rs"]
mod corpus;
#[path = "fuzz_wire/script.rs"]
mod script;
#[path = "fuzz_wire/server_model.rs"]
mod server_model;
#[path = "fuzz_wire/session.rs"]
mod session;

use std::io::Read;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use resumeguard::saver::checkpoint_row::{decode_checkpoint_row, RowLayout};
use resumeguard::saver::pg_array::ByteaArray;
use resumeguard::saver::unknown::UnknownSaverPolicy;
use resumeguard::saver::write_record::WriteRecord;
use resumeguard::saver::{json_blob, msgpack, typed_blob};
use resumeguard::wire::connection::{peek_frame, ReadBuffer};
use resumeguard::wire::guard::Guard;
use resumeguard::wire::messages::data_row::split_data_row;
use resumeguard::wire::messages::frontend::Frontend;
use resumeguard::wire::messages::read::HEADER_LEN;
use resumeguard::wire::messages::startup::{self, FirstPacket, MAX_STARTUP_LEN};

use budget::run_for;
use common::saver_sql;
use corpus::{corpus, first_packets_len, server_typed_start, split_frames};
use script::{frame_of, op, sql_pool};
use server_model::msg;
use session::{enforcement, Session};

fn fail(what: String) -> TestCaseError {
    TestCaseError::fail(what)
}

/// A reader that hands out its bytes in the given chunk sizes.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: &'a [usize],
    at: usize,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self
            .sizes
            .get(self.at % self.sizes.len().max(1))
            .copied()
            .unwrap_or(1);
        self.at += 1;
        let n = size.max(1).min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn frames_strategy() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
    proptest::collection::vec(
        (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..400)),
        0..12,
    )
}

/// A slice borrowed from inside `frame`'s body.
fn within(frame: &[u8], part: &[u8]) -> bool {
    let body = frame.get(HEADER_LEN..).unwrap_or_default();
    let (start, end) = (body.as_ptr() as usize, body.as_ptr() as usize + body.len());
    let p = part.as_ptr() as usize;
    part.is_empty() || (p >= start && p + part.len() <= end)
}

fn frontend_within(frame: &[u8]) -> bool {
    match Frontend::read(frame) {
        Frontend::Parse {
            name,
            sql,
            param_types,
        } => within(frame, name) && within(frame, sql) && within(frame, param_types),
        Frontend::Bind(bind) => within(frame, bind.portal) && within(frame, bind.statement),
        Frontend::Execute { portal } => within(frame, portal),
        Frontend::Describe { name, .. } | Frontend::Close { name, .. } => within(frame, name),
        Frontend::Query { sql } => within(frame, sql),
        _ => true,
    }
}

/// Frames of well-formed messages arrive through the relay's read buffer
/// in arbitrary read sizes: each comes out whole and alone, the bytes after
/// the last one stay unconsumed, and every message the frontend reader
/// types borrows only from inside its own body.
#[test]
fn framing_reads_only_declared_lengths() {
    let strategy = (
        frames_strategy(),
        proptest::collection::vec(1usize..600, 1..8),
        proptest::collection::vec(any::<u8>(), 0..5),
        1usize..1000,
    );
    run_for("framing", strategy, |(frames, sizes, tail, max)| {
        let frames: Vec<Vec<u8>> = frames.iter().map(|(t, b)| msg(*t, b)).collect();
        let mut stream = frames.concat();
        stream.extend_from_slice(&tail);
        let mut reader = Chunked {
            data: &stream,
            sizes: &sizes,
            at: 0,
        };
        let mut buf = ReadBuffer::default();
        let mut out = Vec::new();
        let mut refused = false;
        loop {
            match peek_frame(&buf.bytes, max) {
                Ok(Some(h)) => {
                    if h.total_len > buf.bytes.len() || h.total_len < HEADER_LEN {
                        return Err(fail(format!(
                            "frame of {} in {}",
                            h.total_len,
                            buf.bytes.len()
                        )));
                    }
                    let declared = i32::from_be_bytes([
                        buf.bytes[1],
                        buf.bytes[2],
                        buf.bytes[3],
                        buf.bytes[4],
                    ]);
                    if h.total_len != declared as usize + 1 || declared as usize > max {
                        return Err(fail(format!(
                            "frame of {} for declared {declared}",
                            h.total_len
                        )));
                    }
                    let frame = buf.bytes.split_to(h.total_len);
                    if !frontend_within(&frame) {
                        return Err(fail("frontend reader borrowed outside its frame".into()));
                    }
                    out.push(frame.to_vec());
                }
                Ok(None) => {
                    if buf.fill(&mut reader).map_err(|e| fail(e.to_string()))? == 0 {
                        break;
                    }
                }
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        // Everything framed is exactly the sent messages, in order.
        let expected: Vec<&Vec<u8>> = frames.iter().take(out.len()).collect();
        if out.iter().collect::<Vec<_>>() != expected {
            return Err(fail("framed messages differ from the sent ones".into()));
        }
        let all_fit = frames.iter().all(|f| f.len() - 1 <= max);
        if all_fit && out.len() != frames.len() {
            return Err(fail(format!(
                "{} of {} messages framed",
                out.len(),
                frames.len()
            )));
        }
        if !all_fit && !refused {
            return Err(fail("a message above the limit was not refused".into()));
        }
        Ok(())
    });
}

fn first_packet_seeds() -> Vec<Vec<u8>> {
    corpus()
        .iter()
        .map(|c| c.client[..first_packets_len(&c.client)].to_vec())
        .filter(|p| !p.is_empty())
        .collect()
}

/// First packets (captured ones mutated, and random bytes): the length is
/// checked against 8..=10,000 before the packet is decoded, decoding
/// never panics, and a startup keeps exactly its own bytes.
#[test]
fn startup_packets_are_bounded() {
    let seeds = first_packet_seeds();
    let strategy = prop_oneof![
        (
            0..seeds.len(),
            proptest::collection::vec(corpus::mutation(), 0..5)
        )
            .prop_map(move |(i, edits)| corpus::apply(&seeds[i], &edits)),
        proptest::collection::vec(any::<u8>(), 0..64),
    ];
    run_for("startup", strategy, |bytes| {
        let mut rest = &bytes[..];
        // SSL/GSSENC requests come first, then the real first packet.
        for _ in 0..3 {
            let len = match startup::peek_len(rest) {
                Ok(Some(len)) => len,
                Ok(None) | Err(_) => return Ok(()),
            };
            if !(8..=MAX_STARTUP_LEN).contains(&len) || len > rest.len() {
                return Err(fail(format!("first packet of {len} bytes accepted")));
            }
            match startup::parse(&rest[..len]) {
                Ok(FirstPacket::Startup(s)) if s.raw.len() != len => {
                    return Err(fail("startup kept bytes not its own".into()))
                }
                Ok(FirstPacket::SslRequest | FirstPacket::GssEncRequest) => rest = &rest[len..],
                _ => return Ok(()),
            }
        }
        Ok(())
    });
}

/// Bind frames and DataRows seen in the captured sessions, the
/// benchmarks' saver messages, and the parameters inside the Binds.
struct DecoderSeeds {
    binds: Vec<Vec<u8>>,
    rows: Vec<Vec<u8>>,
    blobs: Vec<Vec<u8>>,
}

fn decoder_seeds() -> DecoderSeeds {
    let mut binds = vec![common::interrupt_write_bind("_pg3_2")];
    let mut rows = vec![common::checkpoint_row_body()];
    for c in corpus() {
        let client = &c.client[first_packets_len(&c.client)..];
        binds.extend(
            split_frames(client)
                .into_iter()
                .filter(|f| f.first() == Some(&b'B')),
        );
        let server = &c.server[server_typed_start(&c.server)..];
        rows.extend(
            split_frames(server)
                .into_iter()
                .filter(|f| f.first() == Some(&b'D') && f.len() > 64)
                .map(|f| f[HEADER_LEN..].to_vec()),
        );
    }
    let mut blobs: Vec<Vec<u8>> = binds
        .iter()
        .filter_map(|b| common::kept_bind(b).ok())
        .flat_map(|b| b.params.into_iter().flatten().map(|p| p.to_vec()))
        .filter(|p| p.len() > 2)
        .collect();
    blobs.extend(rows.iter().filter_map(|r| {
        let fields = split_data_row(r).ok()?;
        fields.get(6).copied().flatten().map(<[u8]>::to_vec)
    }));
    blobs.sort();
    blobs.dedup();
    DecoderSeeds { binds, rows, blobs }
}

fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let seeds = std::sync::Arc::new(seeds);
    prop_oneof![
        4 => (0..seeds.len(), proptest::collection::vec(byte_edit(), 0..6)).prop_map(
            move |(i, edits)| edit_bytes(seeds[i].clone(), &edits)
        ),
        1 => proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

/// A plain byte edit (for payloads that have no message framing): flip a
/// bit, store a byte, truncate, insert a run, or store a 4-byte integer
/// (lengths, counts, dimensions) near a limit.
fn byte_edit() -> impl Strategy<Value = (u8, usize, u8)> {
    (0u8..6, any::<usize>(), any::<u8>())
}

const INTERESTING_I32: [i32; 8] = [-1, 0, 1, 4, 0xffff, 0x7fff_ffff, i32::MIN, 0x4000_0000];

fn edit_bytes(mut b: Vec<u8>, edits: &[(u8, usize, u8)]) -> Vec<u8> {
    for &(op, at, v) in edits {
        let len = b.len();
        match op {
            0 if len > 0 => b[at % len] ^= 1 << (v % 8),
            1 if len > 0 => b[at % len] = v,
            2 => b.truncate(at % (len + 1)),
            3 | 4 if len >= 4 => {
                let at = at % (len - 3);
                let value = INTERESTING_I32[usize::from(v) % INTERESTING_I32.len()];
                b[at..at + 4].copy_from_slice(&value.to_be_bytes());
            }
            _ => {
                let at = at % (len + 1);
                b.splice(at..at, std::iter::repeat_n(v, usize::from(v % 5)));
            }
        }
    }
    b
}

/// Every saver decoder on mutated real inputs: Bind decode (and its
/// re-encoding), the write record of each saver INSERT shape, DataRow
/// split and checkpoint row decode in text and binary formats, bytea[]
/// (binary and text, with an encode round trip), msgpack and JSON blobs,
/// and classification of mutated saver SQL. None may panic.
#[test]
fn saver_decoders_never_panic() {
    let seeds = decoder_seeds();
    let classifier = common::classifier();
    let sql_seeds: Vec<Vec<u8>> = [
        common::read_latest_sql(),
        format!(
            "{}WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3",
            saver_sql::SELECT_SQL
        ),
        saver_sql::UPSERT_BLOBS.into(),
        saver_sql::UPSERT_CHECKPOINT.into(),
        saver_sql::UPSERT_WRITES.into(),
        saver_sql::INSERT_WRITES.into(),
        saver_sql::PENDING_SENDS.into(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    let shapes: Vec<_> = [
        saver_sql::UPSERT_BLOBS,
        saver_sql::UPSERT_CHECKPOINT,
        saver_sql::UPSERT_WRITES,
    ]
    .iter()
    .map(|sql| {
        classifier
            .classify(sql)
            .kind
            .insert_shape()
            .cloned()
            .expect("a saver INSERT has a shape")
    })
    .collect();
    let strategy = (
        mutated(seeds.binds),
        mutated(seeds.rows),
        mutated(seeds.blobs),
        mutated(sql_seeds),
    );
    run_for("saver decoders", strategy, |(bind, row, blob, sql)| {
        if let Ok(bound) = common::kept_bind(&bind) {
            let encoded = bound.encode().map_err(|e| fail(e.to_string()))?;
            let again = common::kept_bind(&encoded).map_err(|e| fail(e.to_string()))?;
            if again != bound {
                return Err(fail("Bind encode/decode round trip differs".into()));
            }
            for shape in &shapes {
                let _ = WriteRecord::decode(shape, &bound);
            }
        }
        if let Ok(fields) = split_data_row(&row) {
            for formats in [&[][..], &[1][..], &[0][..]] {
                let _ = decode_checkpoint_row(&fields, formats, &RowLayout::SAVER_SELECT);
            }
        }
        if let Ok(array) = ByteaArray::decode_binary(&blob) {
            let again = ByteaArray::decode_binary(&array.encode_binary())
                .map_err(|e| fail(e.to_string()))?;
            if again.elements != array.elements {
                return Err(fail("bytea[] round trip differs".into()));
            }
        }
        let _ = ByteaArray::decode_text(&String::from_utf8_lossy(&blob));
        let _ = msgpack::to_json(&blob);
        let _ = typed_blob::blob_to_json("msgpack", Some(&blob));
        let _ = json_blob::to_json(&blob);
        let _ = classifier.classify(&String::from_utf8_lossy(&sql));
        Ok(())
    });
}

/// Generated client scripts (statements, portals, the saver's reads and
/// writes, SQL PREPARE / EXECUTE / DEALLOCATE, transactions, errors) with
/// `unknown_saver` = warn and refuse: the guard never desyncs from the
/// modelled server's answers to what the proxy actually sends, never
/// waits for answers the server does not owe, never keeps a
/// ReadyForQuery from the client, and a `select 1` round then routes.
/// Half the sessions also run the validity gate (one rule on `items`), so
/// refusals raised inside the server's transaction are part of the mix.
#[test]
fn tracker_keeps_step_with_modelled_server() {
    let warn = enforcement(UnknownSaverPolicy::Warn, false);
    let strict = enforcement(UnknownSaverPolicy::Refuse, true);
    let pool = sql_pool();
    let rows = vec![msg(b'D', &common::checkpoint_row_body())];
    let strategy = (
        proptest::collection::vec(op(), 0..40),
        proptest::collection::vec(any::<u8>(), 1..64),
        any::<bool>(),
    );
    run_for("tracker vs model", strategy, |(ops, dice, enforcing)| {
        let shared = if enforcing { &strict } else { &warn };
        let mut s = Session::start(shared, rows.clone(), dice).map_err(fail)?;
        for (i, op) in ops.iter().enumerate() {
            s.client(&frame_of(op, &pool))
                .map_err(|e| fail(format!("{e} at op {i} {op:?}")))?;
        }
        s.check_select_one().map_err(fail)
    });
}

/// Captured client streams, mutated, through the guard in front of the
/// server model: the same properties as for generated scripts. A message
/// whose header does not frame ends the session at the relay (08P01)
/// before the guard sees it, so the stream stops there.
#[test]
fn tracker_survives_mutated_captured_sessions() {
    let warn = enforcement(UnknownSaverPolicy::Warn, false);
    let strategy = (
        corpus::mutated_session(),
        proptest::collection::vec(any::<u8>(), 1..64),
    );
    run_for("mutated sessions", strategy, |((i, edits), dice)| {
        let all = corpus();
        let c = &all[i % all.len()];
        let stream = corpus::apply(&c.client[first_packets_len(&c.client)..], &edits);
        let server = &c.server[server_typed_start(&c.server)..];
        let rows: Vec<Vec<u8>> = split_frames(server)
            .into_iter()
            .filter(|f| f.first() == Some(&b'D'))
            .take(4)
            .collect();
        let mut s = Session::start(&warn, rows, dice).map_err(fail)?;
        for frame in split_frames(&stream) {
            match peek_frame(&frame, 1 << 30) {
                Ok(Some(h)) if h.total_len == frame.len() => {}
                _ => break,
            }
            s.client(&frame)
                .map_err(|e| fail(format!("{e} in {} at {:?}", c.name, Frontend::read(&frame))))?;
        }
        s.check_select_one()
            .map_err(|e| fail(format!("{e} after {}", c.name)))
    });
}

/// Captured client streams with their captured server streams mutated:
/// whatever the server side says, the guard answers with a step or a
/// desync (the relay then closes the session), never a panic.
#[test]
fn guard_survives_mutated_server_streams() {
    let warn = enforcement(UnknownSaverPolicy::Warn, false);
    run_for(
        "mutated server streams",
        corpus::mutated_session(),
        |(i, edits)| {
            let all = corpus();
            let c = &all[i % all.len()];
            let client = split_frames(&c.client[first_packets_len(&c.client)..]);
            let server = split_frames(&corpus::apply(
                &c.server[server_typed_start(&c.server)..],
                &edits,
            ));
            let mut guard = warn.session(Default::default(), false);
            let (mut ci, mut si) = (0, 0);
            loop {
                while let Some(frame) = client.get(ci) {
                    match guard.on_client(frame, false) {
                        Ok(resumeguard::wire::guard::ClientStep::AwaitServer) => break,
                        Ok(_) => ci += 1,
                        Err(_) => return Ok(()),
                    }
                }
                let Some(frame) = server.get(si) else {
                    return Ok(());
                };
                if guard.on_server(frame).is_err() {
                    return Ok(());
                }
                si += 1;
            }
        },
    );
}
