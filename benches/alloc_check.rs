//! Allocation check: no allocation per forwarded message in the steady
//! state of ordinary (non-checkpoint) traffic.
//!
//! Installs a counting global allocator and drives `SessionGuard` (and the
//! relay's `ReadBuffer`) through many rounds of pgbench-style traffic in
//! each protocol mode, counting allocations (alloc, alloc_zeroed and
//! realloc calls) per round and per message type. Exits non-zero when the steady state of ordinary traffic
//! allocates more than `MAX_ALLOCS_PER_ROUND`; checkpoint rounds (which
//! decode parameters and rows and build audit events, so allocate by
//! design) are reported for information only.
//!
//! `cargo bench --bench alloc_check`

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use resumeguard::enforce::SessionGuard;
use resumeguard::wire::connection::ReadBuffer;
use resumeguard::wire::guard::Guard;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(l.size() as u64, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(l.size() as u64, Ordering::Relaxed);
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new as u64, Ordering::Relaxed);
        System.realloc(p, l, new)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Ordinary traffic must not allocate at all in the steady state.
const MAX_ALLOCS_PER_ROUND: f64 = 0.0;
const WARMUP_ROUNDS: usize = 1_000;
const ROUNDS: usize = 100_000;
/// Checkpoint rounds are slower and only reported.
const CHECKPOINT_ROUNDS: usize = 10_000;

struct Workload {
    name: &'static str,
    session: SessionGuard,
    client: Vec<Vec<u8>>,
    server: Vec<Vec<u8>>,
    checked: bool,
}

struct Counts {
    per_round: f64,
    bytes_per_round: f64,
    /// Allocations attributed to each message ("F B" = client Bind, "B D" = server DataRow).
    by_message: BTreeMap<String, u64>,
}

fn run(w: &mut Workload, rounds: usize) -> Counts {
    let mut by_message: BTreeMap<String, u64> = BTreeMap::new();
    let (a0, b0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    for _ in 0..rounds {
        for f in &w.client {
            let before = ALLOCS.load(Ordering::Relaxed);
            w.session
                .on_client(f, false)
                .expect("client message refused");
            let n = ALLOCS.load(Ordering::Relaxed) - before;
            if n > 0 {
                *by_message.entry(format!("F {}", f[0] as char)).or_default() += n;
            }
        }
        for f in &w.server {
            let before = ALLOCS.load(Ordering::Relaxed);
            let v = w.session.on_server(f).expect("server message out of sync");
            drop(v);
            let n = ALLOCS.load(Ordering::Relaxed) - before;
            if n > 0 {
                *by_message.entry(format!("B {}", f[0] as char)).or_default() += n;
            }
        }
        if !w.session.hooks.ready_events.is_empty() {
            // What session.rs does after each batch (std::mem::take), so the
            // events of checkpoint rounds do not pile up.
            let before = ALLOCS.load(Ordering::Relaxed);
            drop(std::mem::take(&mut w.session.hooks.ready_events));
            let n = ALLOCS.load(Ordering::Relaxed) - before;
            if n > 0 {
                *by_message.entry("audit events".into()).or_default() += n;
            }
        }
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - a0;
    let bytes = BYTES.load(Ordering::Relaxed) - b0;
    // The map's own nodes were allocated while counting; they are few and
    // only exist when something allocated in the first place.
    Counts {
        per_round: allocs as f64 / rounds as f64,
        bytes_per_round: bytes as f64 / rounds as f64,
        by_message,
    }
}

/// Allocations per round of a `ReadBuffer` that receives `bytes` in one
/// read and splits off `frames` (their lengths) one by one.
fn read_buffer_allocs(bytes: &[u8], frames: &[Vec<u8>]) -> f64 {
    let mut rb = ReadBuffer::default();
    let round = |rb: &mut ReadBuffer| {
        let n = rb.fill(bytes).expect("in-memory read");
        assert_eq!(n, bytes.len());
        for f in frames {
            drop(rb.bytes.split_to(f.len()));
        }
        assert!(rb.bytes.is_empty());
        rb.shrink_if_drained();
    };
    for _ in 0..WARMUP_ROUNDS {
        round(&mut rb);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..ROUNDS {
        round(&mut rb);
    }
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / ROUNDS as f64
}

fn simple_query(sql: &str) -> Vec<u8> {
    let mut b = sql.as_bytes().to_vec();
    b.push(0);
    common::msg(b'Q', &b)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let select_rows = || {
        vec![
            common::row_description(&[("abalance", 23, 0)]),
            common::msg(b'D', &common::data_row_body(&[Some(b"-2718")])),
            common::command_complete("SELECT 1"),
            common::ready(b'I'),
        ]
    };
    let r = common::pgbench_prepared_round();
    let mut workloads = vec![
        Workload {
            name: "pgbench -M prepared select (Bind/Describe/Execute/Sync)",
            session: common::prepared_session("P0_1", common::PGBENCH_SELECT_PREPARED, &[]),
            client: r.client,
            server: r.server,
            checked: true,
        },
        Workload {
            name: "prepared select without Describe (Bind/Execute/Sync)",
            session: common::prepared_session("P0_1", common::PGBENCH_SELECT_PREPARED, &[]),
            client: vec![
                common::bind("", "P0_1", &[], &[Some(b"412337")], &[]),
                common::execute(),
                common::sync(),
            ],
            server: vec![
                common::msg(b'2', b""),
                common::msg(b'D', &common::data_row_body(&[Some(b"-2718")])),
                common::command_complete("SELECT 1"),
                common::ready(b'I'),
            ],
            checked: true,
        },
        Workload {
            name: "pgbench -M extended select (unnamed Parse/Bind/Describe/Execute/Sync)",
            session: common::prepared_session("", "SELECT 1", &[]),
            client: vec![
                common::parse("", common::PGBENCH_SELECT_PREPARED, &[]),
                common::bind("", "", &[], &[Some(b"412337")], &[]),
                common::describe_portal(),
                common::execute(),
                common::sync(),
            ],
            server: {
                let mut s = vec![common::msg(b'1', b""), common::msg(b'2', b"")];
                s.extend(select_rows());
                s
            },
            checked: true,
        },
        Workload {
            name: "pgbench -M simple select (Query)",
            session: common::prepared_session("", "SELECT 1", &[]),
            client: vec![simple_query(common::PGBENCH_SELECT_SIMPLE)],
            server: select_rows(),
            checked: true,
        },
    ];
    let cr = common::checkpoint_read_round();
    workloads.push(Workload {
        name: "saver READ(latest) of a parked checkpoint (decodes the row, audits)",
        session: common::prepared_session("_pg3_1", &common::read_latest_sql(), &[0, 0]),
        client: cr.client,
        server: cr.server,
        checked: false,
    });
    let wr = common::interrupt_write_round();
    workloads.push(Workload {
        name: "saver __interrupt__ upsert (decodes the Bind, audits)",
        session: common::prepared_session(
            "_pg3_2",
            common::saver_sql::UPSERT_WRITES,
            &[0, 0, 0, 0, 0, 21, 0, 0, 17],
        ),
        client: wr.client,
        server: wr.server,
        checked: false,
    });

    let mut failed = false;
    println!("allocations per round (steady state; threshold for ordinary traffic: {MAX_ALLOCS_PER_ROUND})");
    for w in &mut workloads {
        let rounds = if w.checked { ROUNDS } else { CHECKPOINT_ROUNDS };
        run(w, WARMUP_ROUNDS);
        let c = run(w, rounds);
        let msgs = w.client.len() + w.server.len();
        let verdict = if !w.checked {
            "info"
        } else if c.per_round <= MAX_ALLOCS_PER_ROUND {
            "ok"
        } else {
            failed = true;
            "FAIL"
        };
        println!(
            "  [{verdict:4}] {:<72} {:>8.2} allocs/round ({:.3}/message, {:.0} B/round) over {rounds} rounds of {msgs} messages",
            w.name,
            c.per_round,
            c.per_round / msgs as f64,
            c.bytes_per_round
        );
        for (m, n) in &c.by_message {
            println!("           {m}: {:.2} per round", *n as f64 / rounds as f64);
        }
        assert!(
            w.session.is_idle(),
            "{}: session not idle after the rounds",
            w.name
        );
    }
    // The relay threads' read buffers: each round arrives in one read and is
    // split into its messages, which are dropped after routing.
    let server_bytes: Vec<u8> = workloads[0].server.concat();
    let per_round = read_buffer_allocs(&server_bytes, &workloads[0].server);
    let verdict = if per_round <= MAX_ALLOCS_PER_ROUND {
        "ok"
    } else {
        failed = true;
        "FAIL"
    };
    println!(
        "  [{verdict:4}] {:<72} {per_round:>8.2} allocs/round over {ROUNDS} rounds",
        "ReadBuffer: fill from the socket, split into frames, drop them"
    );
    if failed {
        println!("alloc_check: FAILED: ordinary traffic allocates in the steady state");
        std::process::exit(1);
    }
    println!("alloc_check: ok");
}
