//! A session's tracker and enforcer driven with the message sequences
//! psycopg sends for the saver, and the server's answers.

use std::ops::{Deref, DerefMut};

use super::*;
use crate::audit::Operation;
use crate::enforce::claim_gate::{ClaimsLeg, Resolution};
use crate::enforce::{Enforcement, Legs};
use crate::saver::classify::Classifier;
use crate::saver::pg_array::ByteaArray;
use crate::saver::profile::SaverProfile;
use crate::wire::guard::ClientStep;
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
        let shared = Arc::new(Enforcement {
            classifier,
            legs,
            audit,
        });
        SessionState(Tracker::new(SessionEnforcer::new(shared, ctx)))
    }

    fn on_client(&mut self, frame: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        Ok(match self.0.on_client(frame)? {
            ClientStep::Forward => None,
            ClientStep::Replace(bytes) => Some(bytes),
            ClientStep::AwaitServer => panic!("unexpected wait for the server"),
        })
    }

    fn on_server(&mut self, frame: &[u8]) -> Result<ServerVerdict, Desync> {
        let step = self.0.on_server(frame)?;
        let claim = step.hold.map(|HeldTicket(t)| {
            let ticket = t
                .into_any()
                .downcast::<ClaimTicket>()
                .expect("a claim ticket");
            ticket.request
        });
        Ok(ServerVerdict {
            route: step.route,
            fatal: step.fatal,
            backend_key: step.backend_key,
            claim,
        })
    }

    fn apply_claim(&mut self, req: &ClaimRequest, res: &Resolution) -> Option<Bytes> {
        let refusal = self.0.hooks.claim_resolved(req, res);
        if refusal.is_some() {
            self.0.swallow_front();
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

use crate::wire::frame::message as msg;

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

#[test]
fn a_committed_interrupt_write_is_audited_at_ready_for_query() {
    let mut st = state();
    client(
        &mut st,
        &[
            parse("_pg3_1", WRITE_SQL),
            interrupt_bind("_pg3_1"),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'2', b""), msg(b'n', b"")]);
    server(&mut st, &[msg(b'C', b"INSERT 0 1\0")]);
    assert!(
        ops(&mut st).is_empty(),
        "not durable before the Sync's answer"
    );
    server(&mut st, &[ready(b'I')]);
    let events = std::mem::take(&mut st.ready_events);
    let kinds: Vec<_> = events.iter().map(|e| e.operation).collect();
    assert_eq!(kinds, [Operation::WritesPut, Operation::InterruptParked]);
    assert_eq!(events[0].thread_id.as_deref(), Some("t1"));
    assert_eq!(events[0].task_id.as_deref(), Some("task-1"));
    assert_eq!(events[0].blob_sha256.len(), 1);
    assert!(st.is_idle());
}

#[test]
fn a_failed_segment_records_no_write() {
    let mut st = state();
    client(
        &mut st,
        &[
            parse("_pg3_1", WRITE_SQL),
            interrupt_bind("_pg3_1"),
            msg(b'D', b"P\0"),
            execute(),
            interrupt_bind("_pg3_1"),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            msg(b'E', b"SERROR\0C23505\0Mduplicate\0\0"),
            ready(b'I'),
        ],
    );
    assert!(
        ops(&mut st).is_empty(),
        "the first write rolled back with the segment"
    );
    assert!(st.is_idle());
}

#[test]
fn writes_in_an_explicit_transaction_wait_for_commit() {
    let mut st = state();
    client(&mut st, &[msg(b'Q', b"BEGIN\0")]);
    server(&mut st, &[msg(b'C', b"BEGIN\0"), ready(b'T')]);
    client(
        &mut st,
        &[
            parse("", WRITE_SQL),
            interrupt_bind(""),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'T'),
        ],
    );
    assert!(ops(&mut st).is_empty());
    assert!(!st.is_idle(), "a transaction is open");
    client(&mut st, &[msg(b'Q', b"COMMIT\0")]);
    server(&mut st, &[msg(b'C', b"COMMIT\0"), ready(b'I')]);
    assert_eq!(
        ops(&mut st),
        [Operation::WritesPut, Operation::InterruptParked]
    );
}

#[test]
fn rolled_back_transaction_records_nothing() {
    let mut st = state();
    client(&mut st, &[msg(b'Q', b"BEGIN\0")]);
    server(&mut st, &[msg(b'C', b"BEGIN\0"), ready(b'T')]);
    client(
        &mut st,
        &[
            parse("", WRITE_SQL),
            interrupt_bind(""),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'T'),
        ],
    );
    client(&mut st, &[msg(b'Q', b"ROLLBACK\0")]);
    server(&mut st, &[msg(b'C', b"ROLLBACK\0"), ready(b'I')]);
    assert!(ops(&mut st).is_empty());
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

#[test]
fn a_read_of_a_parked_head_is_seen_as_parked() {
    let mut st = state();
    client(&mut st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    client(
        &mut st,
        &[
            bind("_pg3_0", &[], &[Some(b"t1"), Some(b"")], &[1]),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    let pending = bytea_2d(&[&[
        b"task-1",
        b"__interrupt__",
        b"msgpack",
        b"\x90",
        b"~__pregel_pull, gate",
        b"-3",
    ]]);
    let row = crate::wire::messages::data_row::data_row(&[
        Some(b"t1"),
        Some(b"\x01{\"v\": 4}"),
        Some(b""),
        Some(b"ck1"),
        Some(b"ck0"),
        Some(b"\x01{}"),
        None,
        Some(&pending),
    ]);
    let verdicts = server(
        &mut st,
        &[
            msg(b'2', b""),
            msg(b'T', b"\0\0"),
            row.to_vec(),
            msg(b'C', b"SELECT 1\0"),
            ready(b'I'),
        ],
    );
    assert!(verdicts.iter().all(|v| v.route == Route::Forward));
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].operation, Operation::ReadLatest);
    assert_eq!(events[0].checkpoint_id.as_deref(), Some("ck1"));
    assert_eq!(events[0].detail["parked"], true);
    assert_eq!(events[0].detail["rows"], 1);
}

#[test]
fn deallocate_all_forgets_named_statements() {
    let mut st = state();
    client(&mut st, &[parse("_pg3_1", WRITE_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    client(&mut st, &[msg(b'Q', b"DEALLOCATE ALL\0")]);
    server(&mut st, &[msg(b'C', b"DEALLOCATE ALL\0"), ready(b'I')]);
    // The name now means nothing to the proxy: even a malformed Bind of it
    // is passed on for the server to judge.
    st.on_client(&msg(b'B', b"\0_pg3_1\0\xff")).unwrap();
}

#[test]
fn close_forgets_a_statement() {
    let mut st = state();
    client(
        &mut st,
        &[parse("s1", WRITE_SQL), msg(b'C', b"Ss1\0"), msg(b'S', b"")],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'3', b""), ready(b'I')]);
    st.on_client(&msg(b'B', b"\0s1\0\xff")).unwrap();
}

#[test]
fn an_undecodable_bind_of_a_checkpoint_statement_fails_closed() {
    let mut st = state();
    client(&mut st, &[parse("s1", WRITE_SQL)]);
    let err = st.on_client(&msg(b'B', b"\0s1\0\0\x01")).unwrap_err();
    assert!(err.to_string().contains("checkpoint statement"), "{err}");
}

#[test]
fn backend_key_and_application_name_are_picked_up() {
    let mut st = state();
    st.0.expect_startup();
    let v = st
        .on_server(&msg(b'K', &[0, 0, 0, 42, 9, 9, 9, 9]))
        .unwrap();
    assert_eq!(v.backend_key, Some((42, vec![9, 9, 9, 9])));
    st.on_server(&msg(b'S', b"application_name\0worker-a\0"))
        .unwrap();
    assert_eq!(st.ctx.application_name, "worker-a");
    let fatal = st
        .on_server(&msg(b'E', b"SFATAL\0VFATAL\0C28P01\0Mno\0\0"))
        .unwrap();
    assert!(fatal.fatal);
}

const BLOB_SQL: &str = "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING";
const PUT_SQL: &str = "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata";

/// A session whose validity leg has one rule: `items` is a list of strings.
fn validating_state() -> SessionState {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rg-session-rules-{}-{n}", std::process::id()));
    std::fs::create_dir_all(dir.join("channels")).unwrap();
    std::fs::write(
        dir.join("channels/items.toml"),
        "[[channel]]\nname = \"items\"\nschema = { type = \"array\", items = { type = \"string\" } }\n",
    )
    .unwrap();
    let rules = crate::policy::ChannelRules::load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let classifier = Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()]));
    let legs = Legs {
        validity: Arc::new(rules),
        ..Legs::default()
    };
    SessionState::new(classifier, legs, SessionContext::default())
}

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

fn put_bind() -> Vec<u8> {
    put_bind_at(b"ck-42")
}

/// A put of checkpoint `id` of t1/"" with no parent.
fn put_bind_at(id: &[u8]) -> Vec<u8> {
    bind(
        "c",
        &[],
        &[
            Some(b"t1"),
            Some(b""),
            Some(id),
            None,
            Some(br#"{"v": 4, "channel_values": {}}"#),
            Some(b"{}"),
        ],
        &[],
    )
}

fn is_raise(bytes: &[u8]) -> bool {
    bytes.first() == Some(&b'P') && String::from_utf8_lossy(bytes).contains("RAISE EXCEPTION")
}

#[test]
fn an_invalid_blob_is_refused_at_the_checkpoint_row_that_names_it() {
    let mut st = validating_state();
    client(&mut st, &[parse("b", BLOB_SQL), parse("c", PUT_SQL)]);
    // msgpack [None]: the blob itself passes through (it runs in the
    // transaction the rejection aborts) ...
    assert_eq!(st.on_client(&blob_bind(b"\x91\xc0")).unwrap(), None);
    client(&mut st, &[msg(b'D', b"P\0"), execute()]);
    // ... and the checkpoint row of the same put carries the rejection.
    let injected = st.on_client(&put_bind()).unwrap().expect("rejected");
    assert!(is_raise(&injected));
    let text = crate::wire::reject::readable(&injected);
    assert!(text.contains("23514"), "{text}");
    assert!(text.contains("checkpoint ck-42"), "{text}");
    assert!(text.contains("/items/type"), "{text}");
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].operation, Operation::WriteRejected);
    assert_eq!(events[0].checkpoint_id.as_deref(), Some("ck-42"));
    // The Sync passes unchanged: nothing is left waiting.
    assert_eq!(st.on_client(&msg(b'S', b"")).unwrap(), None);
}

#[test]
fn an_invalid_blob_without_its_checkpoint_row_is_refused_before_sync() {
    let mut st = validating_state();
    client(&mut st, &[parse("b", BLOB_SQL)]);
    assert_eq!(st.on_client(&blob_bind(b"\x91\xc0")).unwrap(), None);
    let sync = msg(b'S', b"");
    let injected = st.on_client(&sync).unwrap().expect("rejected at Sync");
    assert!(is_raise(&injected));
    assert!(injected.ends_with(&sync), "the Sync still follows");
}

#[test]
fn the_injected_answers_are_swallowed_and_the_error_forwarded() {
    let mut st = validating_state();
    client(&mut st, &[parse("b", BLOB_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    st.on_client(&blob_bind(b"\x91\xa1a")).unwrap();
    client(&mut st, &[msg(b'D', b"P\0"), execute()]);
    st.on_client(&msg(b'S', b"")).unwrap();
    // Valid blob: its own answers, then the Sync's.
    let routes = server_routes(
        &mut st,
        &[
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'I'),
        ],
    );
    assert!(routes.iter().all(|r| *r == Route::Forward));
    // Invalid blob, refused at Sync: the injected Parse/Bind answers are
    // the proxy's, the raised error reaches the client, then ReadyForQuery.
    st.on_client(&blob_bind(b"\x91\xc0")).unwrap();
    client(&mut st, &[msg(b'D', b"P\0"), execute()]);
    st.on_client(&msg(b'S', b"")).unwrap();
    let routes = server_routes(
        &mut st,
        &[
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'E', b"SERROR\0C23514\0Mrejected\0\0"),
            ready(b'I'),
        ],
    );
    assert_eq!(
        routes,
        [
            Route::Forward,
            Route::Forward,
            Route::Forward,
            Route::Swallow,
            Route::Swallow,
            Route::Forward,
            Route::Forward
        ]
    );
    assert!(st.is_idle());
}

/// A session with the consume-once leg on (the store is never touched by
/// the session state itself; the relay asks it).
fn claiming_state(inspection: &[&str], application_name: &str) -> SessionState {
    let unusable = crate::claims::postgres::test_server::unreachable();
    claiming_state_on(Arc::new(unusable), inspection, application_name)
}

fn claiming_state_on(
    store: Arc<crate::claims::ClaimStore>,
    inspection: &[&str],
    application_name: &str,
) -> SessionState {
    use crate::config::live::{ClaimsTimings, LiveClaimsTimings};
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
    let pending = bytea_2d(&[&[
        b"task-1",
        b"__interrupt__",
        b"msgpack",
        b"\x91\xa1q",
        b"~__pregel_pull, gate",
        b"-3",
    ]]);
    read_head(st, br#"{"v": 4}"#, Some(&pending))
}

/// Drives a READ(latest) returning one row with this checkpoint JSON and
/// pending writes; returns the verdict of the DataRow.
fn read_head(st: &mut SessionState, checkpoint: &[u8], pending: Option<&[u8]>) -> ServerVerdict {
    client(st, &[parse("_pg3_0", READ_SQL), msg(b'S', b"")]);
    server(st, &[msg(b'1', b""), ready(b'I')]);
    client(
        st,
        &[
            bind("_pg3_0", &[], &[Some(b"t1"), Some(b"")], &[1]),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(st, &[msg(b'2', b""), msg(b'T', b"\0\0")]);
    let mut jsonb = vec![1u8];
    jsonb.extend_from_slice(checkpoint);
    let row = crate::wire::messages::data_row::data_row(&[
        Some(b"t1"),
        Some(&jsonb),
        Some(b""),
        Some(b"ck1"),
        None,
        Some(b"\x01{}"),
        None,
        pending,
    ]);
    st.on_server(&row).unwrap()
}

#[test]
fn a_head_with_tasks_to_run_asks_for_the_run_lease_and_a_finished_one_does_not() {
    let mut st = claiming_state(&[], "worker");
    let running = read_head(
        &mut st,
        br#"{"v": 4, "updated_channels": ["items", "branch:to:after"]}"#,
        None,
    );
    let req = running.claim.expect("the run lease is asked");
    assert_eq!(req.head, Head::Running);
    assert_eq!(
        (
            req.key.at.thread_id.as_str(),
            req.key.at.checkpoint_id.as_str()
        ),
        ("t1", "ck1")
    );
    assert!(req.key.fingerprint.is_empty());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    for finished in [
        &br#"{"v": 4, "updated_channels": ["items"]}"#[..],
        br#"{"v": 4}"#,
    ] {
        assert!(read_head(&mut st, finished, None).claim.is_none());
        server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    }
    // A parked head is a claim even if its last step wrote a trigger.
    assert_eq!(
        read_parked_head(&mut st).claim.map(|r| r.head),
        Some(Head::Parked)
    );
    // Inspection never asks.
    let mut st = claiming_state(&["^inspect"], "inspector-ui");
    let cp = br#"{"updated_channels": ["branch:to:after"]}"#;
    assert!(read_head(&mut st, cp, None).claim.is_none());
}

/// A refusal replaced the held row with a 55000 ErrorResponse, and the
/// rest of that statement's answer is swallowed up to ReadyForQuery.
fn assert_refused_and_rest_swallowed(st: &mut SessionState, error: Option<Bytes>) {
    let error = error.expect("an error replaces the row");
    let fields: Vec<_> = crate::wire::messages::error_response::error_fields(&error).collect();
    assert!(fields.contains(&(b'C', &b"55000"[..])));
    let routes = server_routes(st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert_eq!(routes, [Route::Answered, Route::Forward]);
}

#[test]
fn a_refused_running_head_names_the_run_and_a_served_one_records_nothing() {
    use crate::claims::{Holder, RunLease};
    use crate::policy::claims::{ClaimDecision, Refusal};
    let cp = br#"{"updated_channels": ["branch:to:after"]}"#;
    let mut st = claiming_state(&[], "worker");
    let req = read_head(&mut st, cp, None).claim.unwrap();
    let served = Resolution {
        decision: ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        displaced: None,
        epoch: None,
        takeover: None,
    };
    assert!(st.apply_claim(&req, &served).is_none());
    assert!(st.ready_events.is_empty(), "{:?}", st.ready_events);
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);

    let req = read_head(&mut st, cp, None).claim.unwrap();
    let lease = RunLease {
        thread_id: "t1".into(),
        checkpoint_ns: String::new(),
        answered_checkpoint_id: "ck0".into(),
        fingerprint: "0123456789abcdef".repeat(4),
        holder: Holder {
            proxy_id: "proxy-b".into(),
            session_id: 3,
            client_addr: "10.0.0.9:5000".into(),
            application_name: "approver".into(),
        },
        answered_at_ms: 0,
        last_write_ms: 5,
        until_ms: 10_005,
    };
    let refused = Resolution {
        decision: ClaimDecision::Refuse {
            reason: Refusal::RunInProgress { lease },
        },
        waited_ms: 0,
        displaced: None,
        epoch: None,
        takeover: None,
    };
    let error = st.apply_claim(&req, &refused);
    assert_refused_and_rest_swallowed(&mut st, error);
    let refusal = st
        .ready_events
        .iter()
        .find(|e| e.operation == Operation::ClaimRefused)
        .expect("claim_refused");
    assert_eq!(refusal.detail["head"], "running");
    assert_eq!(refusal.detail["interrupt"], "0123456789ab");
}

#[test]
fn a_parked_head_asks_for_a_claim_keyed_by_its_interrupt() {
    let mut st = claiming_state(&[], "worker");
    let verdict = read_parked_head(&mut st);
    let req = verdict.claim.expect("a claim is requested");
    assert_eq!(
        (
            req.key.at.thread_id.as_str(),
            req.key.at.checkpoint_ns.as_str(),
            req.key.at.checkpoint_id.as_str()
        ),
        ("t1", "", "ck1")
    );
    assert_eq!(
        req.key.fingerprint,
        crate::claims::interrupt_fingerprint(&[("task-1", Some(&b"\x91\xa1q"[..]))])
    );
    assert_eq!(
        (req.holder.proxy_id.as_str(), req.holder.session_id),
        ("proxy-a", 7)
    );
}

#[test]
fn a_committed_interrupt_write_parks_its_head_under_the_key_its_read_claims() {
    let mut st = claiming_state(&[], "worker");
    let parked = match &st.shared.legs.claims {
        Some(leg) => Arc::clone(&leg.parked),
        None => panic!("the claims leg is on"),
    };
    client(
        &mut st,
        &[
            parse("_pg3_1", WRITE_SQL),
            interrupt_bind_of("_pg3_1", b"\x91\xa1q"),
            msg(b'D', b"P\0"),
            execute(),
            msg(b'S', b""),
        ],
    );
    server(&mut st, &[msg(b'1', b""), msg(b'2', b""), msg(b'n', b"")]);
    server(&mut st, &[msg(b'C', b"INSERT 0 1\0")]);
    assert_eq!(parked.expected("t1", ""), None, "not before it committed");
    server(&mut st, &[ready(b'I')]);
    let expected = parked.expected("t1", "").expect("parked once committed");
    // A saver may put the checkpoint after its interrupts: that moves nothing.
    client(
        &mut st,
        &[
            parse("b", BLOB_SQL),
            parse("c", PUT_SQL),
            blob_bind(b"\x91\xc0"),
            execute(),
            put_bind_at(b"ck1"),
            execute(),
            msg(b'S', b""),
        ],
    );
    let (parsed, bound) = (msg(b'1', b""), msg(b'2', b""));
    let done = msg(b'C', b"INSERT 0 1\0");
    let answers = [
        parsed.clone(),
        parsed,
        bound.clone(),
        done.clone(),
        bound,
        done,
    ];
    server(&mut st, &answers);
    server(&mut st, &[ready(b'I')]);
    assert_eq!(parked.expected("t1", ""), Some(expected.clone()));
    let req = read_parked_head(&mut st)
        .claim
        .expect("a claim is requested");
    assert_eq!(expected, req.key, "the key the read of that head claims");
}

#[test]
fn inspection_sessions_never_claim() {
    let mut st = claiming_state(&["^inspect"], "inspector-ui");
    assert!(read_parked_head(&mut st).claim.is_none());
    let mut st = claiming_state(&["^inspect"], "worker");
    st.inspection_listener = true;
    assert!(read_parked_head(&mut st).claim.is_none());
}

#[test]
fn a_refused_claim_replaces_the_row_and_swallows_the_rest_of_its_answer() {
    use crate::claims::Holder;
    use crate::policy::claims::{ClaimDecision, Refusal};
    let mut st = claiming_state(&[], "worker");
    let req = read_parked_head(&mut st).claim.unwrap();
    let winner = Holder {
        proxy_id: "proxy-b".into(),
        session_id: 3,
        client_addr: "10.0.0.9:5000".into(),
        application_name: "approver".into(),
    };
    let refusal = st.apply_claim(
        &req,
        &Resolution {
            decision: ClaimDecision::Refuse {
                reason: Refusal::Answered {
                    by: winner,
                    at_ms: 0,
                },
            },
            waited_ms: 0,
            displaced: None,
            epoch: None,
            takeover: None,
        },
    );
    assert_refused_and_rest_swallowed(&mut st, refusal);
    let ops: Vec<_> = std::mem::take(&mut st.ready_events)
        .into_iter()
        .map(|e| e.operation)
        .collect();
    assert!(ops.contains(&Operation::ClaimRefused), "{ops:?}");
    assert!(st.is_idle());
}

/// A session whose classifier refuses checkpoint statements no profile
/// recognizes (`[enforce] unknown_saver = "refuse"`).
fn refusing_state() -> SessionState {
    use crate::saver::unknown::UnknownSaverPolicy;
    let classifier = Classifier::new(vec![SaverProfile::langgraph_python()])
        .with_unknown_policy(UnknownSaverPolicy::Refuse);
    SessionState::new(
        Arc::new(classifier),
        Legs::default(),
        SessionContext::default(),
    )
}

#[test]
fn an_unknown_checkpoint_statement_is_refused_under_refuse() {
    let mut st = refusing_state();
    // Extended protocol: the server raises the refusal in place of the Bind.
    client(
        &mut st,
        &[parse("u1", "UPDATE checkpoints SET metadata = '{}'")],
    );
    let injected = st
        .on_client(&bind("u1", &[], &[], &[]))
        .unwrap()
        .expect("refused at Bind");
    assert_eq!(
        &injected[..1],
        b"P",
        "a raising statement replaces the Bind"
    );
    // Simple query: the whole text is replaced by a raising one.
    let replaced = st
        .on_client(&msg(
            b'Q',
            b"DELETE FROM checkpoints WHERE metadata ? 'x'\0",
        ))
        .unwrap()
        .expect("refused");
    assert_eq!(replaced[0], b'Q');
    assert!(!String::from_utf8_lossy(&replaced).contains("DELETE FROM"));
    // Recognized and ordinary traffic passes.
    assert_eq!(st.on_client(&msg(b'Q', b"select 1\0")).unwrap(), None);
    assert_eq!(st.on_client(&parse("w", WRITE_SQL)).unwrap(), None);
}

#[test]
fn an_unknown_checkpoint_statement_passes_under_warn() {
    let mut st = state();
    client(
        &mut st,
        &[parse("u1", "UPDATE checkpoints SET metadata = '{}'")],
    );
    assert_eq!(st.on_client(&bind("u1", &[], &[], &[])).unwrap(), None);
    assert_eq!(
        st.on_client(&msg(
            b'Q',
            b"DELETE FROM checkpoints WHERE metadata ? 'x'\0"
        ))
        .unwrap(),
        None
    );
}

/// The gated task's pending write on `checkpoint_id` of thread t1.
fn task_write_bind(checkpoint_id: &[u8]) -> Vec<u8> {
    bind(
        "w",
        &[0, 0, 0, 0, 0, 1, 0, 0, 1],
        &[
            Some(b"t1"),
            Some(b""),
            Some(checkpoint_id),
            Some(b"task-1"),
            Some(b"~__pregel_pull, gate"),
            Some(&[0, 0]),
            Some(b"approved"),
            Some(b"msgpack"),
            Some(&[0xc3]),
        ],
        &[],
    )
}

#[test]
fn a_write_continuing_a_claimed_checkpoint_fails_closed_while_the_store_cannot_answer() {
    use crate::policy::claims::ClaimDecision;
    // The store's path does not exist: every lookup fails.
    let mut st = claiming_state(&[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL)]);
    // A checkpoint nothing says is claimed: the write passes.
    assert_eq!(st.on_client(&task_write_bind(b"ck0")).unwrap(), None);
    assert!(st.ready_events.is_empty(), "{:?}", st.ready_events);
    client(&mut st, &[msg(b'D', b"P\0"), execute(), msg(b'S', b"")]);
    server(
        &mut st,
        &[
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'n', b""),
            msg(b'C', b"INSERT 0 1\0"),
            ready(b'I'),
        ],
    );
    std::mem::take(&mut st.ready_events);
    // This session was served the claim on ck1 (before the store failed).
    let req = read_parked_head(&mut st).claim.unwrap();
    let served = Resolution {
        decision: ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        displaced: None,
        epoch: Some(1),
        takeover: None,
    };
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    std::mem::take(&mut st.ready_events);
    // Its task's write on ck1 cannot be checked against the holder: refused.
    let injected = st
        .on_client(&task_write_bind(b"ck1"))
        .unwrap()
        .expect("refused");
    assert!(is_raise(&injected));
    let text = crate::wire::reject::readable(&injected);
    assert!(text.contains("58000"), "{text}");
    assert!(text.contains("claim store unavailable"), "{text}");
    let events = std::mem::take(&mut st.ready_events);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].operation, Operation::WriteFenced);
    assert_eq!(events[0].detail["fence"], "store_unavailable");
    assert_eq!(events[0].detail["continues"], "ck1");
    assert_eq!(events[0].task_id.as_deref(), Some("task-1"));
}

#[test]
fn a_holders_write_keeps_its_claim_from_lapsing_until_the_write_can_commit() {
    use crate::claims::clock::wall_clock_ms as now_ms;
    use crate::claims::ClaimOutcome;
    use crate::policy::claims::{ClaimDecision, COMMIT_COVER_MS};

    // The test server runs on this host: its clock is this host's.
    let db = crate::claims::postgres::test_server::PgSchema::new("session-cover");
    let store = Arc::new(db.open());
    let mut st = claiming_state_on(store.clone(), &[], "worker");
    client(&mut st, &[parse("w", WRITE_SQL), msg(b'S', b"")]);
    server(&mut st, &[msg(b'1', b""), ready(b'I')]);
    let req = read_parked_head(&mut st).claim.expect("a claim is asked");
    // The claim was taken long enough ago that it lapses within the cover.
    let taken_at = now_ms() - 29_500;
    let outcome = store
        .try_claim(&req.key, &req.holder, taken_at, 30_000)
        .expect("claim");
    assert!(matches!(outcome, ClaimOutcome::Taken(_)), "{outcome:?}");
    let served = Resolution {
        decision: ClaimDecision::Serve { takeover: false },
        waited_ms: 0,
        displaced: None,
        epoch: Some(1),
        takeover: None,
    };
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    // The holder's task write on the parked checkpoint passes...
    let before = now_ms();
    assert_eq!(st.on_client(&task_write_bind(b"ck1")).unwrap(), None);
    // ...and its claim cannot lapse before the write has had time to commit.
    let row = store.get(&req.key).expect("read").expect("row");
    assert!(
        row.lapse_at_ms >= before + COMMIT_COVER_MS,
        "lapse {} < {}",
        row.lapse_at_ms,
        before + COMMIT_COVER_MS
    );
    let other = crate::claims::Holder {
        proxy_id: "proxy-b".into(),
        session_id: 9,
        client_addr: "10.0.0.9:5009".into(),
        application_name: "racer".into(),
    };
    let racer = store
        .try_claim(&req.key, &other, taken_at + 30_000, 30_000)
        .expect("claim");
    assert!(matches!(racer, ClaimOutcome::Busy(_)), "{racer:?}");
}

#[test]
fn a_granted_claim_holds_work_and_a_refused_one_does_not() {
    use crate::policy::claims::{ClaimDecision, Refusal};
    let resolution = |decision| Resolution {
        decision,
        waited_ms: 0,
        displaced: None,
        epoch: Some(1),
        takeover: None,
    };
    let mut st = claiming_state(&[], "worker");
    let req = read_parked_head(&mut st).claim.unwrap();
    let refused = resolution(ClaimDecision::Refuse {
        reason: Refusal::ShuttingDown,
    });
    assert!(st.apply_claim(&req, &refused).is_some());
    assert!(!st.run_open(), "a refused reader has no run to finish");
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);

    let req = read_parked_head(&mut st).claim.unwrap();
    let served = resolution(ClaimDecision::Serve { takeover: false });
    assert!(st.apply_claim(&req, &served).is_none());
    server(&mut st, &[msg(b'C', b"SELECT 1\0"), ready(b'I')]);
    assert!(
        st.run_open(),
        "the holder's run has not written its next checkpoint"
    );
}
