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

use std::time::Instant;

use resumeguard::claims::{ClaimKey, ClaimOutcome, ClaimRecord, ClaimState, Holder, RunLease};
use resumeguard::policy::claims::{
    commit_cover, decide_at, decide_write, ClaimDecision, WaitPolicy, WriteVerdict, Writer,
    COMMIT_COVER_MS,
};
use resumeguard::saver::checkpoint_ref::CheckpointRef;
use stateright::{Checker, Model, Property};

mod claims_rule;
use claims_rule::decide_existing;

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

// --- the store's updates, restated from its SQL -------------------------

/// PostgreSQL's `sweep`: claims and leases of holders on another proxy
/// process that is gone count as if their connection had closed.
fn sweep(w: &mut World, reader_proxy: usize, gone_until: i64) {
    let dead = |w: &World, h: &Holder| {
        let p = proxy_index(h);
        p != reader_proxy && w.proxies.get(p).is_none_or(|s| *s == ProxyState::Down)
    };
    if let Some(c) = w.claim.clone() {
        if dead(w, &c.holder)
            && matches!(c.state, ClaimState::Held | ClaimState::Consumed)
            && c.abandon_at_ms.is_none()
        {
            let c = w.claim.as_mut().expect("checked above");
            c.abandon_at_ms = Some(gone_until);
            if c.state == ClaimState::Held {
                c.lapse_at_ms = c.lapse_at_ms.min(gone_until);
            }
        }
    }
    if let Some(l) = w.lease.clone() {
        if dead(w, &l.holder) && l.until_ms > gone_until {
            w.lease.as_mut().expect("checked above").until_ms = gone_until;
        }
    }
}

/// `try_claim`: the sweep, then the shipped rule on the existing row.
fn try_claim(m: &ClaimsModel, w: &mut World, h: &Holder, reader_proxy: usize) -> ClaimOutcome {
    let now = w.now;
    let lapse_at = now + LAPSE_MS;
    let Some(prev) = w.claim.clone() else {
        let taken = ClaimRecord::taken(&m.key, h, now, lapse_at, 1);
        w.claim = Some(taken.clone());
        return ClaimOutcome::Taken(taken);
    };
    if !(prev.state == ClaimState::Held && prev.holder.same_session(h)) {
        sweep(w, reader_proxy, now + HOLDER_GONE_GRACE_MS);
    }
    let prev = w.claim.clone().expect("present above");
    let writing =
        prev.state == ClaimState::Consumed && w.lease.as_ref().is_some_and(|l| l.until_ms > now);
    let outcome = decide_existing(prev, h, now, lapse_at, writing);
    if let ClaimOutcome::Taken(r) | ClaimOutcome::TakenOver { now: r, .. } = &outcome {
        w.claim = Some(r.clone());
    }
    outcome
}

/// `consume` (and `move_on`'s consume): held claims taken by `taken_by`
/// become consumed and start their holder's run lease; live leases last
/// the run lease past this write.
fn consume(w: &mut World, taken_by: i64) {
    let now = w.now;
    if let Some(c) = w.claim.as_mut() {
        if c.state == ClaimState::Held && c.claimed_at_ms <= taken_by {
            c.state = ClaimState::Consumed;
            c.consumed_at_ms = Some(now);
            w.lease = Some(RunLease {
                thread_id: c.key.at.thread_id.clone(),
                checkpoint_ns: c.key.at.checkpoint_ns.clone(),
                answered_checkpoint_id: c.key.at.checkpoint_id.clone(),
                fingerprint: c.key.fingerprint.clone(),
                holder: c.holder.clone(),
                answered_at_ms: now,
                last_write_ms: now,
                until_ms: now + RUN_LEASE_MS,
            });
        }
    }
    if let Some(l) = w.lease.as_mut() {
        if l.until_ms > now {
            l.last_write_ms = now;
            l.until_ms = l.until_ms.max(now + RUN_LEASE_MS);
        }
    }
}

/// `holder_gone`: the session's held claims lapse, its claims count as
/// abandoned and its leases end, no later than the grace from now.
fn holder_gone(w: &mut World, h: &Holder) {
    let until = w.now + HOLDER_GONE_GRACE_MS;
    if let Some(c) = w.claim.as_mut() {
        if c.holder.same_session(h) {
            if c.state == ClaimState::Held && c.lapse_at_ms > until {
                c.lapse_at_ms = until;
            }
            if matches!(c.state, ClaimState::Held | ClaimState::Consumed)
                && c.abandon_at_ms.is_none()
            {
                c.abandon_at_ms = Some(until);
            }
        }
    }
    if let Some(l) = w.lease.as_mut() {
        if l.holder.same_session(h) && l.until_ms > until {
            l.until_ms = until;
        }
    }
}

/// `keep_until`: generation `epoch`, held or consumed, neither lapses nor
/// counts as abandoned before `until`.
fn keep_until(w: &mut World, epoch: i64, until: i64) -> bool {
    match w.claim.as_mut() {
        Some(c)
            if c.epoch == epoch && matches!(c.state, ClaimState::Held | ClaimState::Consumed) =>
        {
            if c.state == ClaimState::Held {
                c.lapse_at_ms = c.lapse_at_ms.max(until);
            }
            c.abandon_at_ms = c.abandon_at_ms.map(|at| at.max(until));
            true
        }
        _ => false,
    }
}

/// `move_on`: the thread put a checkpoint whose parent is the parked
/// one: every held claim on it is consumed, its rows superseded.
fn move_on(w: &mut World) {
    consume(w, i64::MAX);
    let now = w.now;
    if let Some(c) = w.claim.as_mut() {
        c.superseded_at_ms.get_or_insert(now);
    }
}

/// `current_holder`: the held or consumed claim on the checkpoint.
fn current_holder(w: &World) -> Option<ClaimRecord> {
    w.claim
        .clone()
        .filter(|c| matches!(c.state, ClaimState::Held | ClaimState::Consumed))
}

fn apply(m: &ClaimsModel, w: &mut World, p: usize, ev: Evidence) {
    let h = holder(&m.bounds, m.reader_of(ev.session()));
    debug_assert_eq!(m.proxy_of(m.reader_of(ev.session())), p);
    match ev {
        Evidence::Consumed { written_at, .. } => consume(w, written_at),
        Evidence::MovedOn { .. } => move_on(w),
        Evidence::HolderGone { .. } => holder_gone(w, &h),
    }
}

// --- the proxy's gate and fence, with the shipped decisions --------------

impl ClaimsModel {
    /// The gate asks the store and decides (`ClaimsLeg::resolve`, one
    /// round of its loop).
    fn ask(&self, w: &mut World, r: usize) {
        let h = holder(&self.bounds, r);
        let waited = match w.readers[r].phase {
            Phase::Waiting => w.now - w.readers[r].since,
            _ => 0,
        };
        let outcome = try_claim(self, w, &h, self.proxy_of(r));
        let epoch = match &outcome {
            ClaimOutcome::Taken(c)
            | ClaimOutcome::AlreadyHeld(c)
            | ClaimOutcome::TakenOver { now: c, .. } => Some(c.epoch),
            _ => None,
        };
        let reader = &mut w.readers[r];
        match decide_at(&Ok(outcome), &WAIT, waited, w.now) {
            ClaimDecision::Serve { .. } => {
                reader.epoch = epoch;
                reader.served_at = w.now;
                // A node served its parked head runs: its effect counts from
                // here, whatever happens to the connection.
                reader.fired = !reader.saw_answer;
                reader.phase = if reader.saw_answer {
                    Phase::Answered
                } else {
                    Phase::Served
                };
            }
            ClaimDecision::Refuse { .. } => reader.phase = Phase::Refused,
            ClaimDecision::RetryAfter { .. } => {
                if reader.phase != Phase::Waiting {
                    reader.since = w.now;
                }
                reader.phase = Phase::Waiting;
            }
        }
    }

    /// The fence on a write of reader `r`'s run continuing the parked
    /// checkpoint (`enforce::fencing`'s store lookup): accepted (with the
    /// claim kept through the commit) or fenced.
    fn fence(&self, w: &mut World, r: usize) -> bool {
        let h = holder(&self.bounds, r);
        let took: Vec<(String, i64)> = w.readers[r]
            .epoch
            .map(|e| (self.key.fingerprint.clone(), e))
            .into_iter()
            .collect();
        let writer = Writer {
            session: &h,
            took: &took,
            known_claimed: true,
        };
        let current = current_holder(w);
        let verdict = decide_write(&writer, &Ok(current.clone()));
        if let (Some(c), WriteVerdict::Accept(_)) = (&current, &verdict) {
            if let Some(until) = commit_cover(&verdict, c, w.now) {
                if !keep_until(w, c.epoch, until) {
                    return false;
                }
            }
        }
        matches!(verdict, WriteVerdict::Accept(_))
    }

    /// A write of reader `r` commits: it must still be the holder.
    fn commit(&self, w: &mut World, r: usize) {
        let h = holder(&self.bounds, r);
        let mine = current_holder(w)
            .is_none_or(|c| c.holder.same_session(&h) && Some(c.epoch) == w.readers[r].epoch);
        if !mine {
            w.stale_commit.get_or_insert(r);
        }
    }

    fn send(&self, w: &mut World, r: usize, ev: Evidence) {
        let p = self.proxy_of(r);
        if w.proxies[p] != ProxyState::Down {
            w.evidence[p].push(ev);
        }
    }

    /// A session closes: the proxy sends its holder-gone evidence.
    fn close(&self, w: &mut World, r: usize) {
        if w.readers[r].session {
            w.readers[r].session = false;
            if w.readers[r].epoch.is_some() {
                self.send(
                    w,
                    r,
                    Evidence::HolderGone {
                        session: r as u64 + 1,
                    },
                );
            }
        }
    }

    /// Whether time may pass one tick: the modelling assumptions that a
    /// live client's gated node reaches its write before its claim's lapse,
    /// and a write passed by the fence commits within the commit cover.
    fn time_may_pass(&self, w: &World) -> bool {
        let next = w.now + TICK_MS;
        if next > T0 + self.bounds.horizon_ms {
            return false;
        }
        if !self.bounds.evidence_waits && self.answer_pending(w) {
            return false;
        }
        // A run of a live client reaches its next checkpoint within its
        // lapse from its serve (slow runs: any time later).
        let prompt = |r: &Reader| self.bounds.slow_runs || next < r.served_at + LAPSE_MS;
        w.readers.iter().all(|r| {
            let live = r.client && r.session;
            match r.phase {
                Phase::Checked if live => next < r.since + COMMIT_COVER_MS && prompt(r),
                Phase::Served | Phase::Answered if live => prompt(r),
                _ => true,
            }
        })
    }

    /// Whether evidence of an answer waits in a live proxy's queue.
    fn answer_pending(&self, w: &World) -> bool {
        w.proxies
            .iter()
            .zip(&w.evidence)
            .any(|(p, queue)| *p != ProxyState::Down && self.lost_answer(queue))
    }

    /// Whether a queue about to be lost holds evidence of an answer that
    /// only it would record (not when its write recorded it).
    fn lost_answer(&self, queue: &[Evidence]) -> bool {
        !self.bounds.answer_in_write && queue.iter().any(Evidence::answers)
    }

    /// Whether a reader arriving long after now, through a new proxy, with
    /// every pending evidence of a live proxy applied, is refused the
    /// interrupt although the thread never moved on.
    fn stranded(&self, w: &World) -> bool {
        let mut s = w.clone();
        for p in 0..s.proxies.len() {
            if s.proxies[p] != ProxyState::Down {
                for ev in std::mem::take(&mut s.evidence[p]) {
                    apply(self, &mut s, p, ev);
                }
            }
        }
        let fresh = Holder {
            proxy_id: proxy_id(s.proxies.len()),
            session_id: 1_000,
            client_addr: "10.0.1.1:50000".to_owned(),
            application_name: "agent".to_owned(),
        };
        s.proxies.push(ProxyState::Up);
        let fresh_proxy = s.proxies.len() - 1;
        // The first ask finds gone holders (the sweep), the next one after
        // their grace takes what they left.
        s.now += LONG_AFTER_MS;
        try_claim(self, &mut s, &fresh, fresh_proxy);
        s.now += LONG_AFTER_MS;
        let outcome = try_claim(self, &mut s, &fresh, fresh_proxy);
        !matches!(
            decide_at(&Ok(outcome), &WaitPolicy::Refuse, 0, s.now),
            ClaimDecision::Serve { .. }
        )
    }
}

impl Model for ClaimsModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        let b = &self.bounds;
        vec![World {
            now: T0,
            proxies: vec![ProxyState::Up; b.proxies],
            readers: vec![
                Reader {
                    phase: Phase::Idle,
                    session: true,
                    client: true,
                    cut: false,
                    epoch: None,
                    fired: false,
                    saw_answer: false,
                    since: T0,
                    served_at: T0,
                };
                b.readers
            ],
            claim: None,
            lease: None,
            answered: false,
            head_moved: false,
            evidence: vec![Vec::new(); b.proxies],
            crashes: 0,
            kills: 0,
            drains: 0,
            stale_commit: None,
            answer_lost: false,
        }]
    }

    fn actions(&self, w: &World, steps: &mut Vec<Step>) {
        if self.time_may_pass(w) {
            steps.push(Step::Tick);
        }
        for (r, reader) in w.readers.iter().enumerate() {
            let up = w.proxies[self.proxy_of(r)] == ProxyState::Up;
            let live = reader.session && reader.client;
            match reader.phase {
                Phase::Idle if live && up => steps.push(Step::Read(r)),
                Phase::Waiting if live && up => steps.push(Step::Poll(r)),
                Phase::Served if live => steps.push(Step::Check(r)),
                Phase::Checked if live => steps.push(Step::Commit(r)),
                Phase::Answered if live => steps.push(Step::PutNext(r)),
                _ => {}
            }
            let running = matches!(
                reader.phase,
                Phase::Served | Phase::Checked | Phase::Answered
            );
            if running && reader.client && w.crashes < self.bounds.crashes {
                steps.push(Step::Crash(r));
            }
        }
        for (p, state) in w.proxies.iter().enumerate() {
            match *state {
                ProxyState::Up if w.drains < self.bounds.drains => steps.push(Step::Drain(p)),
                ProxyState::Draining { until } => {
                    let holding = w.readers.iter().enumerate().any(|(r, reader)| {
                        self.proxy_of(r) == p
                            && reader.session
                            && matches!(
                                reader.phase,
                                Phase::Served | Phase::Checked | Phase::Answered
                            )
                    });
                    if !holding || w.now >= until {
                        steps.push(Step::DrainEnd(p));
                    }
                }
                // The exit flush applies what the store takes; answers are
                // lost at exit only where they may wait.
                ProxyState::Flushing if self.bounds.evidence_waits || !self.answer_pending(w) => {
                    steps.push(Step::Exit(p))
                }
                _ => {}
            }
            if *state != ProxyState::Down && w.kills < self.bounds.kills {
                steps.push(Step::Kill(p));
            }
            if *state != ProxyState::Down && !w.evidence[p].is_empty() {
                steps.push(Step::Apply(p));
            }
        }
    }

    fn next_state(&self, last: &World, step: Step) -> Option<World> {
        let mut w = last.clone();
        match step {
            Step::Tick => w.now += TICK_MS,
            Step::Read(r) => {
                if w.head_moved {
                    w.readers[r].phase = Phase::Late;
                } else {
                    w.readers[r].saw_answer = w.answered;
                    self.ask(&mut w, r);
                }
            }
            Step::Poll(r) => self.ask(&mut w, r),
            Step::Check(r) => {
                if self.fence(&mut w, r) {
                    w.readers[r].phase = Phase::Checked;
                    w.readers[r].since = w.now;
                } else {
                    w.readers[r].phase = Phase::Fenced;
                }
            }
            Step::Commit(r) => {
                self.commit(&mut w, r);
                w.answered = true;
                if self.bounds.answer_in_write {
                    let now = w.now;
                    consume(&mut w, now);
                }
                w.readers[r].phase = Phase::Answered;
                let ev = Evidence::Consumed {
                    session: r as u64 + 1,
                    written_at: w.now,
                };
                self.send(&mut w, r, ev);
            }
            Step::PutNext(r) => {
                if self.fence(&mut w, r) {
                    self.commit(&mut w, r);
                    w.head_moved = true;
                    if self.bounds.answer_in_write {
                        move_on(&mut w);
                    }
                    w.readers[r].phase = Phase::Done;
                    let ev = Evidence::MovedOn {
                        session: r as u64 + 1,
                    };
                    self.send(&mut w, r, ev);
                } else {
                    w.readers[r].phase = Phase::Fenced;
                }
            }
            Step::Crash(r) => {
                w.crashes += 1;
                w.readers[r].client = false;
                w.readers[r].cut = true;
                self.close(&mut w, r);
            }
            Step::Kill(p) => {
                w.kills += 1;
                w.proxies[p] = ProxyState::Down;
                w.answer_lost |= self.lost_answer(&w.evidence[p]);
                w.evidence[p].clear();
                for r in (0..w.readers.len()).filter(|r| self.proxy_of(*r) == p) {
                    if w.readers[r].session {
                        w.readers[r].session = false;
                        w.readers[r].cut = true;
                    }
                }
            }
            Step::Drain(p) => {
                w.drains += 1;
                w.proxies[p] = ProxyState::Draining {
                    until: w.now + SHUTDOWN_GRACE_MS,
                };
                // Waiting readers are refused at once; no new read is served.
                for r in (0..w.readers.len()).filter(|r| self.proxy_of(*r) == p) {
                    if matches!(w.readers[r].phase, Phase::Idle | Phase::Waiting) {
                        w.readers[r].phase = Phase::Refused;
                    }
                }
            }
            Step::DrainEnd(p) => {
                for r in (0..w.readers.len()).filter(|r| self.proxy_of(*r) == p) {
                    self.close(&mut w, r);
                }
                w.proxies[p] = ProxyState::Flushing;
            }
            Step::Exit(p) => {
                w.proxies[p] = ProxyState::Down;
                w.answer_lost |= self.lost_answer(&w.evidence[p]);
                w.evidence[p].clear();
            }
            Step::Apply(p) => {
                let ev = w.evidence[p].remove(0);
                apply(self, &mut w, p, ev);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // A run cut by a crash after its serve, or an answer whose
            // evidence died with its proxy, may be run again (by design).
            Property::always("one gated run per answer", |_, w: &World| {
                w.answer_lost || w.readers.iter().filter(|r| r.fired && !r.cut).count() <= 1
            }),
            Property::always("no fenced write commits", |_, w: &World| {
                w.stale_commit.is_none()
            }),
            Property::always(
                "no thread stranded once its holders are gone",
                |m, w: &World| {
                    let holders_gone = w.readers.iter().all(|r| r.epoch.is_none() || !r.session);
                    w.head_moved || !holders_gone || !m.stranded(w)
                },
            ),
            // Reachability: the search covers what the properties are about.
            // (Each holds trivially where its fault is not in the bounds.)
            Property::sometimes("a takeover runs the node after a crash", |m, w: &World| {
                m.bounds.crashes + m.bounds.kills == 0
                    || w.readers.iter().filter(|r| r.fired).count() >= 2
            }),
            Property::sometimes("a drained holder's run moves on", |m, w: &World| {
                m.bounds.drains == 0 || w.head_moved && w.proxies.contains(&ProxyState::Flushing)
            }),
            // Only a holder slower than its lapse is ever fenced.
            Property::sometimes("a racer is fenced", |m, w: &World| {
                !m.bounds.slow_runs || w.readers.iter().any(|r| r.phase == Phase::Fenced)
            }),
        ]
    }
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
