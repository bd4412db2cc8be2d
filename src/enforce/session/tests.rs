//! A session's tracker and enforcer driven with the message sequences
//! psycopg sends for the saver, and the server's answers: the session and
//! message builders shared by the focused test files under `tests/`.

use std::ops::{Deref, DerefMut};

use super::*;
use crate::audit::Operation;
use crate::enforce::claim_gate::{ClaimRequest, ClaimsLeg, Head, Resolution};
use crate::enforce::{Enforcement, Legs};
use crate::saver::classify::Classifier;
use crate::saver::pg_array::ByteaArray;
use crate::saver::profile::SaverProfile;
use crate::wire::guard::{ClientStep, Guard};
use crate::wire::response_queue::{Desync, Route};
use crate::wire::tracker::Tracker;

/// The session as the relay drives it: the tracker with this session's
/// enforcer as its hooks.
struct SessionState(Tracker<SessionEnforcer>);

/// What the relay does with one server message, with the claim a held
/// row asks for.
#[derive(Debug)]
struct ServerVerdict {
    route: Route,
    fatal: bool,
    backend_key: Option<(i32, Vec<u8>)>,
    claim: Option<ClaimRequest>,
}

impl SessionState {
    fn new(classifier: Arc<Classifier>, legs: Legs, ctx: SessionContext) -> Self {
        let audit = crate::audit::AuditSink::disabled();
        let shared = Arc::new(Enforcement::new(classifier, legs, audit));
        SessionState(Tracker::new(SessionEnforcer::new(shared, ctx)))
    }

    fn on_client(&mut self, frame: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        let mut injected = Vec::new();
        loop {
            return Ok(match self.0.on_client(frame, false)? {
                ClientStep::Inject(bytes) => {
                    injected.extend(bytes);
                    continue;
                }
                ClientStep::Forward if injected.is_empty() => None,
                ClientStep::Forward => Some([injected, frame.to_vec()].concat()),
                ClientStep::Replace(bytes) => Some([injected, bytes].concat()),
                ClientStep::AwaitServer => panic!("unexpected wait for the server"),
                ClientStep::Blocks => panic!("a message blocked off a loop"),
            });
        }
    }

    fn on_server(&mut self, frame: &[u8]) -> Result<ServerVerdict, Desync> {
        let step = self.0.on_server(frame)?;
        let claim = step.hold().map(|_| {
            let ticket = self.0.hooks.held.as_ref().expect("a claim ticket");
            ticket.request.clone()
        });
        Ok(ServerVerdict {
            route: step.route,
            fatal: step.fatal,
            backend_key: step.backend_key().cloned(),
            claim,
        })
    }

    fn apply_claim(&mut self, req: &ClaimRequest, res: &Resolution) -> Option<Bytes> {
        let refusal = self.0.hooks.claim_resolved(req, res);
        if let Some(error) = &refusal {
            self.0.answered_front(error);
        }
        refusal
    }

    fn is_idle(&self) -> bool {
        self.0.is_idle()
    }
}

impl Deref for SessionState {
    type Target = SessionEnforcer;
    fn deref(&self) -> &SessionEnforcer {
        &self.0.hooks
    }
}

impl DerefMut for SessionState {
    fn deref_mut(&mut self) -> &mut SessionEnforcer {
        &mut self.0.hooks
    }
}

const WRITE_SQL: &str = "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob";
const READ_SQL: &str = "select thread_id, checkpoint, checkpoint_ns, checkpoint_id, parent_checkpoint_id, metadata, (select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob]) from checkpoint_blobs bl) as channel_values, (select array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob, convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea]) from checkpoint_writes cw) as pending_writes from checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1";

fn state() -> SessionState {
    let classifier = Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()]));
    SessionState::new(classifier, Legs::default(), SessionContext::default())
}

use crate::wire::connection::message as msg;

fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for s in [name, sql] {
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    }
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'P', &b)
}

fn bind(stmt: &str, formats: &[i16], params: &[Option<&[u8]>], results: &[i16]) -> Vec<u8> {
    crate::saver::bind::tests::bind_frame(stmt, formats, params, results)
}

fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}

fn ready(status: u8) -> Vec<u8> {
    msg(b'Z', &[status])
}

fn interrupt_bind(stmt: &str) -> Vec<u8> {
    interrupt_bind_of(stmt, &[0x90])
}

/// The `__interrupt__` write of task-1 on t1/""/ck1 with this value.
fn interrupt_bind_of(stmt: &str, value: &[u8]) -> Vec<u8> {
    bind(
        stmt,
        &[0, 0, 0, 0, 0, 1, 0, 0, 1],
        &[
            Some(b"t1"),
            Some(b""),
            Some(b"ck1"),
            Some(b"task-1"),
            Some(b"~__pregel_pull, gate"),
            Some(&[0xff, 0xfd]),
            Some(b"__interrupt__"),
            Some(b"msgpack"),
            Some(value),
        ],
        &[],
    )
}

fn client(st: &mut SessionState, frames: &[Vec<u8>]) {
    for f in frames {
        st.on_client(f).unwrap();
    }
}

fn server(st: &mut SessionState, frames: &[Vec<u8>]) -> Vec<ServerVerdict> {
    frames.iter().map(|f| st.on_server(f).unwrap()).collect()
}

/// Where each of `frames` was routed.
fn server_routes(st: &mut SessionState, frames: &[Vec<u8>]) -> Vec<Route> {
    server(st, frames).into_iter().map(|v| v.route).collect()
}

fn ops(st: &mut SessionState) -> Vec<Operation> {
    std::mem::take(&mut st.ready_events)
        .into_iter()
        .map(|e| e.operation)
        .collect()
}

const BLOB_SQL: &str = "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING";

const PUT_SQL: &str = "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata";

fn blob_bind(blob: &[u8]) -> Vec<u8> {
    bind(
        "b",
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

/// A put of checkpoint `id` of t1/"" with no parent.
fn put_bind_at(id: &[u8]) -> Vec<u8> {
    put_bind_of(id, None)
}

/// A put of checkpoint `id` of t1/"", the child of `parent`.
fn put_bind_of(id: &[u8], parent: Option<&[u8]>) -> Vec<u8> {
    bind(
        "c",
        &[],
        &[
            Some(b"t1"),
            Some(b""),
            Some(id),
            parent,
            Some(br#"{"v": 4, "channel_values": {}}"#),
            Some(b"{}"),
        ],
        &[],
    )
}

fn is_raise(bytes: &[u8]) -> bool {
    bytes.first() == Some(&b'P') && String::from_utf8_lossy(bytes).contains("RAISE EXCEPTION")
}

/// A session with the consume-once leg on (the store is never touched by
/// the session state itself; the relay asks it).
fn claiming_state(inspection: &[&str], application_name: &str) -> SessionState {
    let unusable = crate::test_pg_server::unreachable();
    claiming_state_on(Arc::new(unusable), inspection, application_name)
}

fn claiming_state_on(
    store: Arc<crate::claims::ClaimStore>,
    inspection: &[&str],
    application_name: &str,
) -> SessionState {
    use crate::claims::timings::{ClaimsTimings, LiveClaimsTimings};
    use crate::policy::claims::WaitPolicy;

    let leg = ClaimsLeg {
        store,
        proxy_id: "proxy-a".into(),
        lapse_ms: 1_000,
        timings: LiveClaimsTimings::new(ClaimsTimings::default()),
        policy: WaitPolicy::Refuse,
        inspection_patterns: inspection
            .iter()
            .map(|p| regex::Regex::new(p).unwrap())
            .collect(),
        inspection_sql_hint: false,
        evidence: None,
        held: Arc::default(),
        parked: Arc::default(),
        draining: Default::default(),
        fence_in_transaction: None,
        fence_lookups: Arc::default(),
    };
    let classifier = Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()]));
    let legs = Legs {
        claims: Some(Arc::new(leg)),
        ..Legs::default()
    };
    let ctx = SessionContext {
        session_id: 7,
        application_name: application_name.into(),
        ..SessionContext::default()
    };
    SessionState::new(classifier, legs, ctx)
}

/// Drives a READ(latest) whose row is parked; returns the verdict of the
/// DataRow.
fn read_parked_head(st: &mut SessionState) -> ServerVerdict {
    read_parked_head_of(st, b"t1", &[])
}

/// [`read_parked_head`] of `thread`, behind the statements `pipelined`.
fn read_parked_head_of(st: &mut SessionState, thread: &[u8], pipelined: &[&str]) -> ServerVerdict {
    read_head_of(
        st,
        thread,
        br#"{"v": 4}"#,
        Some(&parked_pending()),
        pipelined,
    )
}

/// The pending writes of a head parked on one interrupt.
fn parked_pending() -> Vec<u8> {
    bytea_2d(&[&[
        b"task-1",
        b"__interrupt__",
        b"msgpack",
        b"\x91\xa1q",
        b"~__pregel_pull, gate",
        b"-3",
    ]])
}

/// The head row of `thread`, parked on one interrupt.
fn parked_head_row(thread: &[u8]) -> Vec<u8> {
    head_row(thread, br#"{"v": 4}"#, Some(&parked_pending()))
}

/// The saver's head row of `thread`.
fn head_row(thread: &[u8], checkpoint: &[u8], pending: Option<&[u8]>) -> Vec<u8> {
    let mut jsonb = vec![1u8];
    jsonb.extend_from_slice(checkpoint);
    crate::wire::messages::data_row::data_row(&[
        Some(thread),
        Some(&jsonb),
        Some(b""),
        Some(b"ck1"),
        None,
        Some(b"\x01{}"),
        None,
        pending,
    ])
    .to_vec()
}

/// A binary bytea[] of `rows` rows (the saver's 2-D layout).
fn bytea_2d(rows: &[&[&[u8]]]) -> Vec<u8> {
    let width = rows.first().map_or(0, |r| r.len());
    ByteaArray {
        dims: vec![rows.len(), width],
        elements: rows
            .iter()
            .flat_map(|r| r.iter().map(|e| Some(Bytes::copy_from_slice(e))))
            .collect(),
    }
    .encode_binary()
}

/// Drives a READ(latest) returning one row with this checkpoint JSON and
/// pending writes; returns the verdict of the DataRow.
fn read_head(st: &mut SessionState, checkpoint: &[u8], pending: Option<&[u8]>) -> ServerVerdict {
    read_head_of(st, b"t1", checkpoint, pending, &[])
}

/// The saver's READ(latest) of `thread`, prepared as `_pg3_0`: its Bind,
/// Describe, Execute and Sync.
fn head_read(thread: &[u8]) -> [Vec<u8>; 4] {
    [
        bind("_pg3_0", &[], &[Some(thread), Some(b"")], &[1]),
        msg(b'D', b"P\0"),
        execute(),
        msg(b'S', b""),
    ]
}

/// [`read_head`] of `thread`.
fn read_head_of(
    st: &mut SessionState,
    thread: &[u8],
    checkpoint: &[u8],
    pending: Option<&[u8]>,
    pipelined: &[&str],
) -> ServerVerdict {
    client(st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
    server(st, &[msg(b'1', b""), ready(b'I')]);
    // Each of `pipelined` run by the unnamed statement, in the read's
    // segment before it.
    for sql in pipelined {
        client(st, &[parse("", sql), bind("", &[], &[], &[]), execute()]);
    }
    client(st, &head_read(thread));
    for _ in pipelined {
        server(st, &[msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SET\0")]);
    }
    server(st, &[msg(b'2', b""), msg(b'T', b"\0\0")]);
    st.on_server(&head_row(thread, checkpoint, pending))
        .unwrap()
}

mod claims;
mod commit;
mod fencing;
mod refusals;
mod statements;
mod validity;
