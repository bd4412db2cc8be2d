//! A model of the consume-once claims protocol, checked exhaustively at
//! stated bounds: proxies, readers of one parked interrupt, client
//! crashes, proxy SIGKILLs and SIGTERM drains, evidence delayed, retried
//! and lost, time passing (lapses, holder-gone graces, run leases, commit
//! covers), each step decided by the shipped rules themselves.
//!
//! What is the shipped code: the read's decision
//! (`policy::claims::decide_at` under a wait policy), the write fence
//! (`policy::claims::decide_write`) and its commit cover
//! (`policy::claims::commit_cover`). What is restated from the store's
//! SQL: the claim rule (`claims_rule`, which the store's unit tests hold
//! to the SQL `claim` function on a real PostgreSQL), the evidence updates
//! (consume, move on, holder gone, keep until) and the sweep of holders
//! whose proxy process is gone.
//!
//! Two placements of the claims schema are modelled: in the sessions' own
//! database (the default), where a write that answers the interrupt
//! consumes its claim in its own transaction (`fence_write`), and in
//! another database, where only the evidence worker consumes it.
//!
//! `cargo test --test claims_model` checks the small bounds (2 proxies, 3
//! readers); `cargo test --test claims_model -- --ignored` the larger ones
//! (`integration/full_matrix.sh` runs it). `docs/guarantees.md` states the
//! bounds, the state counts and what is not modelled.
//!
//! The model's bounds and world are here with the tests; `claims_model/`
//! holds the store's updates, the proxy's gate and fence, and the model's
//! steps and properties.

use std::time::Instant;

use resumeguard::claims::{ClaimKey, ClaimOutcome, ClaimRecord, ClaimState, Holder, RunLease};
use resumeguard::policy::claims::WaitPolicy;
use resumeguard::saver::checkpoint_ref::CheckpointRef;
use stateright::{Checker, Model};

mod claims_rule;
#[path = "claims_model/model.rs"]
mod model;
#[path = "claims_model/proxy.rs"]
mod proxy;
#[path = "claims_model/store.rs"]
mod store;

/// One step of model time: every deadline below is a multiple of it.
const TICK_MS: i64 = 1_000;
/// `claims.lapse_ms`.
const LAPSE_MS: i64 = 2_000;
/// `claims.holder_gone_grace_ms`.
const HOLDER_GONE_GRACE_MS: i64 = 1_000;
/// `claims.run_lease_ms`.
const RUN_LEASE_MS: i64 = 2_000;
/// `shutdown_grace_ms`: at least the lapse, as `docs/rolling-restart.md`
/// asks, so a node that runs within its lapse finishes inside the grace.
const SHUTDOWN_GRACE_MS: i64 = 3_000;
/// `claims.policy = "wait"`: a reader waits this long for a live claim.
const WAIT: WaitPolicy = WaitPolicy::Wait {
    max_wait_ms: 3_000,
    poll_ms: 500,
};
/// Model time starts here (any instant would do).
const T0: i64 = 1_700_000_000_000;
/// Far enough past every deadline that only a stranded claim still refuses.
const LONG_AFTER_MS: i64 = 3_600_000;

/// How far the search goes.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    proxies: usize,
    /// Readers of the parked interrupt; reader `r` connects through proxy
    /// `r % proxies`, each from its own client.
    readers: usize,
    /// Time passes in [`TICK_MS`] steps up to this long after the start.
    horizon_ms: i64,
    /// Client processes that die (their connection closes).
    crashes: u8,
    /// Proxies killed (SIGKILL: sessions cut, pending evidence lost).
    kills: u8,
    /// Proxies stopped with SIGTERM (drained, then exit).
    drains: u8,
    /// Drops a timing assumption (see [`ClaimsModel::time_may_pass`]):
    /// evidence of an answer may wait in its proxy's queue while time
    /// passes (a locked or unreachable store, the retry's backoff), and is
    /// lost with its proxy.
    evidence_waits: bool,
    /// Drops a timing assumption: a run may take longer than its lapse
    /// from its serve to its next checkpoint. (A write always commits
    /// within the commit cover of its fence check.)
    slow_runs: bool,
    /// The claims schema is in the sessions' database: a write that
    /// answers (the gated task's results, the next checkpoint) consumes
    /// the claim in its own transaction. Otherwise only its evidence,
    /// applied by the proxy's worker, does.
    answer_in_write: bool,
}

/// One fault kind per search at small bounds (their state spaces add
/// up instead of multiplying): the default placement, evidence that may
/// wait any time.
const fn small(crashes: u8, kills: u8, drains: u8) -> Bounds {
    Bounds {
        proxies: 2,
        readers: 3,
        horizon_ms: 4_000,
        crashes,
        kills,
        drains,
        evidence_waits: true,
        slow_runs: false,
        answer_in_write: true,
    }
}

/// The claims schema in another database: the guarantees rest on the
/// evidence of an answer being applied promptly.
const fn elsewhere(b: Bounds) -> Bounds {
    Bounds {
        evidence_waits: false,
        answer_in_write: false,
        ..b
    }
}

/// The bounds `cargo test` checks.
const SMALL: [Bounds; 3] = [small(1, 0, 0), small(0, 1, 0), small(0, 0, 1)];

/// The bounds of the full run: a fourth reader and a third proxy for each
/// fault kind, and every fault kind together at the small size; the same
/// for the claims schema in another database.
const LARGE: [Bounds; 8] = [
    large(1, 0, 0),
    large(0, 1, 0),
    large(0, 0, 1),
    small(1, 1, 1),
    elsewhere(large(1, 0, 0)),
    elsewhere(large(0, 1, 0)),
    elsewhere(large(0, 0, 1)),
    elsewhere(small(1, 1, 1)),
];

const fn large(crashes: u8, kills: u8, drains: u8) -> Bounds {
    Bounds {
        proxies: 3,
        readers: 4,
        ..small(crashes, kills, drains)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ProxyState {
    Up,
    /// SIGTERM at some time: grants nothing new; sessions holding a claim
    /// keep their connection until their run's next checkpoint or `until`.
    Draining {
        until: i64,
    },
    /// Every session closed; pending evidence is still applied until exit.
    Flushing,
    /// Exited or killed: its liveness lock is gone, its evidence lost.
    Down,
}

/// Where one reader (one client session racing to resume) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    /// Has not read the thread's head yet.
    Idle,
    /// Read the parked head; the gate holds the row and polls the store.
    Waiting,
    /// Refused before its node ran (55000, 55006, shutting down).
    Refused,
    /// Served the parked head: its gated node runs (its effect happens,
    /// even if the connection is cut meanwhile) and reaches its write.
    Served,
    /// Its task write passed the fence; the commit follows.
    Checked,
    /// Its task write committed (the interrupt's answer is recorded), or
    /// it was served a head whose answer was already recorded; its run goes
    /// on to the next checkpoint.
    Answered,
    /// Its run put the next checkpoint.
    Done,
    /// A write of its run was fenced (RGF01): nothing of it committed.
    Fenced,
    /// Read the head after the thread moved on: nothing to gate.
    Late,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Reader {
    phase: Phase,
    /// The session's connection through the proxy is open.
    session: bool,
    /// The client process is alive (its node runs even with the
    /// connection gone).
    client: bool,
    /// A crash cut its connection (client death or proxy SIGKILL): a run
    /// cut after its node was served may run again elsewhere, by design.
    cut: bool,
    /// The claim generation it was served.
    epoch: Option<i64>,
    fired: bool,
    /// The answer's writes were committed when it read the head: LangGraph
    /// applies them instead of running the node again.
    saw_answer: bool,
    /// When it started waiting, or passed the fence.
    since: i64,
    /// When it was served.
    served_at: i64,
}

/// Claim evidence sent by a proxy's session, in its worker's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Evidence {
    /// The gated task's writes committed (taken-by time `written_at`).
    Consumed { session: u64, written_at: i64 },
    /// A checkpoint whose parent is the parked one committed.
    MovedOn { session: u64 },
    /// The session's connection closed.
    HolderGone { session: u64 },
}

impl Evidence {
    /// Whether it tells of an answer (rather than of a closed session).
    fn answers(&self) -> bool {
        !matches!(self, Evidence::HolderGone { .. })
    }

    /// The session that sent it.
    fn session(&self) -> u64 {
        match *self {
            Evidence::Consumed { session, .. }
            | Evidence::MovedOn { session }
            | Evidence::HolderGone { session } => session,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    now: i64,
    proxies: Vec<ProxyState>,
    readers: Vec<Reader>,
    /// The claim row of the interrupt, as the store holds it.
    claim: Option<ClaimRecord>,
    /// The thread's run lease row.
    lease: Option<RunLease>,
    /// A gated task write committed in PostgreSQL.
    answered: bool,
    /// The thread's next checkpoint committed in PostgreSQL.
    head_moved: bool,
    /// Each proxy's evidence worker queue (applied, retried, or lost).
    evidence: Vec<Vec<Evidence>>,
    crashes: u8,
    kills: u8,
    drains: u8,
    /// A reader whose write committed while another session held the
    /// claim (a fenced write that committed).
    stale_commit: Option<usize>,
    /// Evidence of an answer was lost with its proxy (killed, or exited
    /// before the store took it): the crash window.
    answer_lost: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// Time passes by one tick.
    Tick,
    Read(usize),
    Poll(usize),
    Check(usize),
    Commit(usize),
    PutNext(usize),
    Crash(usize),
    Kill(usize),
    Drain(usize),
    DrainEnd(usize),
    Exit(usize),
    /// The proxy's evidence worker applies the oldest item of its queue
    /// (until then the store is busy or down: the item waits, retried).
    Apply(usize),
}

struct ClaimsModel {
    bounds: Bounds,
    key: ClaimKey,
}

fn proxy_id(p: usize) -> String {
    format!("proxy-{p}")
}

fn holder(bounds: &Bounds, r: usize) -> Holder {
    Holder {
        proxy_id: proxy_id(r % bounds.proxies),
        session_id: r as u64 + 1,
        client_addr: format!("10.0.0.{}:40{r:03}", r + 1),
        application_name: "agent".to_owned(),
    }
}

impl ClaimsModel {
    fn new(bounds: Bounds) -> Self {
        ClaimsModel {
            bounds,
            key: ClaimKey {
                at: CheckpointRef {
                    thread_id: "thread-1".to_owned(),
                    checkpoint_ns: String::new(),
                    checkpoint_id: "parked".to_owned(),
                },
                fingerprint: "f1".to_owned(),
            },
        }
    }

    fn proxy_of(&self, r: usize) -> usize {
        r % self.bounds.proxies
    }

    fn reader_of(&self, session: u64) -> usize {
        session as usize - 1
    }
}

/// The index of the proxy a holder's session is on.
fn proxy_index(h: &Holder) -> usize {
    h.proxy_id
        .strip_prefix("proxy-")
        .and_then(|p| p.parse().ok())
        .unwrap_or(usize::MAX)
}

/// Searches every state within `bounds`, saying how many and how long.
fn search(bounds: Bounds) -> impl Checker<ClaimsModel> {
    let started = Instant::now();
    let checker = ClaimsModel::new(bounds)
        .checker()
        .threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .spawn_bfs()
        .join();
    println!(
        "claims model {bounds:?}: {} states ({} unique), depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker
}

fn check(bounds: Bounds) {
    search(bounds).assert_properties();
}

/// Checks the bounds `RG_MODEL_BOUNDS` names (`crashes,kills,drains,
/// proxies,readers,horizon_ms`), when set, instead of `default`: the
/// default placement with evidence that may wait, or with
/// `RG_MODEL_ELSEWHERE=1` the claims schema in another database with its
/// evidence applied promptly; `RG_MODEL_EVIDENCE_WAITS=1` and
/// `RG_MODEL_SLOW_RUNS=1` drop those timing assumptions.
fn check_all(default: &[Bounds]) {
    match std::env::var("RG_MODEL_BOUNDS") {
        Ok(spec) => {
            let n: Vec<i64> = spec
                .split(',')
                .filter_map(|v| v.trim().parse().ok())
                .collect();
            let [crashes, kills, drains, proxies, readers, horizon_ms] = n[..] else {
                panic!(
                    "RG_MODEL_BOUNDS: six numbers: crashes,kills,drains,proxies,readers,horizon_ms"
                );
            };
            let set = |name| std::env::var_os(name).is_some();
            let placed = Bounds {
                proxies: proxies as usize,
                readers: readers as usize,
                horizon_ms,
                ..small(crashes as u8, kills as u8, drains as u8)
            };
            let placed = if set("RG_MODEL_ELSEWHERE") {
                elsewhere(placed)
            } else {
                placed
            };
            check(Bounds {
                evidence_waits: placed.evidence_waits || set("RG_MODEL_EVIDENCE_WAITS"),
                slow_runs: set("RG_MODEL_SLOW_RUNS"),
                ..placed
            });
        }
        Err(_) => default.iter().copied().for_each(check),
    }
}

#[test]
fn claims_protocol_holds_at_small_bounds() {
    check_all(&SMALL);
}

#[test]
#[ignore = "larger bounds: minutes; run by integration/full_matrix.sh"]
fn claims_protocol_holds_at_large_bounds() {
    check_all(&LARGE);
}

/// Prints a counterexample's steps.
fn print_trace(what: &str, trace: stateright::Path<World, Step>) {
    println!("{what}:");
    for step in trace.into_actions() {
        println!("  {step:?}");
    }
}

/// The claims schema in another database, its evidence applied promptly:
/// the protocol holds (the search is the same as the default placement's,
/// with only the worker consuming claims).
#[test]
fn with_the_claims_elsewhere_and_prompt_evidence_the_protocol_holds() {
    check(Bounds {
        readers: 2,
        ..elsewhere(small(1, 0, 0))
    });
}

/// Where only the evidence worker consumes a claim (the claims schema in
/// another database), evidence that waits past the claim's lapse lets a
/// racer that read the parked head before the answer committed run the
/// node a second time: it waits, the claim lapses while the answer's
/// evidence still waits in its proxy's queue, the racer takes the claim
/// over and the gate serves it the row it had read before the answer.
/// (The default placement's search, `claims_protocol_holds_at_small_bounds`,
/// lets evidence wait as long and finds no such run.) The counterexample
/// is printed.
#[test]
fn without_the_answer_in_its_write_late_evidence_runs_the_node_again() {
    let checker = search(Bounds {
        readers: 2,
        evidence_waits: true,
        ..elsewhere(small(0, 0, 0))
    });
    checker.assert_no_discovery("no fenced write commits");
    checker.assert_no_discovery("no thread stranded once its holders are gone");
    let trace = checker.assert_any_discovery("one gated run per answer");
    print_trace("two gated runs, the answer's evidence late", trace);
}

/// A run slower than its lapse (from its serve to its next checkpoint)
/// is the timing assumption left with the answer in its write: the
/// protocol still never commits a fenced write and never strands the
/// thread, but a racer takes over a claim that lapsed while the first
/// run's node still ran (its writes are then fenced, its effect happened),
/// or that its session left abandoned before its next checkpoint. The
/// counterexample is printed.
#[test]
fn a_run_slower_than_its_lapse_can_run_the_node_again() {
    let checker = search(Bounds {
        readers: 2,
        slow_runs: true,
        ..small(0, 0, 0)
    });
    checker.assert_no_discovery("no fenced write commits");
    checker.assert_no_discovery("no thread stranded once its holders are gone");
    checker.assert_any_discovery("a racer is fenced");
    let trace = checker.assert_any_discovery("one gated run per answer");
    print_trace("two gated runs, a run slower than its lapse", trace);
}
