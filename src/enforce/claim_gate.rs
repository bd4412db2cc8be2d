//! The consume-once gate: when a read of a thread's head
//! returns a parked checkpoint, the proxy holds that row and takes a claim
//! in the shared store (waiting as the policy says); only then does the
//! session's release (`session/release.rs`) let the row through, or send
//! the refusal in its place, before any node runs.
//! A head past the parked checkpoint with tasks still to run is held the
//! same way while the store is asked whether another session's answering
//! run holds the thread's run lease.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use regex::Regex;

use super::claim_ahead::AheadClaim;
use super::held_claims::HeldClaims;
use super::parked_heads::ParkedHeads;
use crate::audit::SessionContext;
use crate::log_text::shown;
use crate::metrics::claims_store_call;
use crate::wire::draining::Draining;
use crate::wire::guard::{Ticket, WaitEnd};

use crate::claims::evidence::EvidenceSender;
use crate::claims::failure_streak::FailureStreak;
use crate::claims::timings::LiveClaimsTimings;
use crate::claims::{ClaimKey, ClaimOutcome, ClaimState, ClaimStore, Holder, Now, StoreError};
use crate::policy::claims::{
    decide_at, decide_running_head, takeover_metric_label, takeover_reason, ClaimDecision, Refusal,
    WaitPolicy, COMMIT_COVER_MS,
};

/// The consume-once leg as configured for one proxy process.
pub struct ClaimsLeg {
    /// The shared store. While it cannot answer (not opened yet, removed
    /// or replaced, locked) every read of a parked head is refused (fail
    /// closed) while everything else flows.
    pub store: Arc<ClaimStore>,
    pub proxy_id: String,
    /// How long a claim with no evidence holds.
    pub lapse_ms: i64,
    /// The run lease and progress hold in effect, read at each decision
    /// (shared with the store and the evidence worker; a reload updates it).
    pub timings: Arc<LiveClaimsTimings>,
    pub policy: WaitPolicy,
    /// application_name patterns that mark a session's reads as inspection.
    pub inspection_patterns: Vec<Regex>,
    /// Whether the `/* resumeguard:inspect */` SQL comment marks a read as
    /// inspection (`claims.inspection_sql_hint`). Off by default: any
    /// client can write the comment, and a resume carrying it would never
    /// claim.
    pub inspection_sql_hint: bool,
    pub evidence: Option<EvidenceSender>,
    /// The claims this proxy's sessions hold, as last answered (shared by
    /// the legs a reload makes).
    pub held: Arc<HeldClaims>,
    /// The parked heads this proxy's sessions last read, whose claims are
    /// asked beside the next read (shared by the legs a reload makes).
    pub parked: Arc<ParkedHeads>,
    /// Set when the proxy begins shutting down: from then on no claim,
    /// takeover or run is granted, and waiting readers are refused.
    pub draining: Draining,
    /// Where the server itself fences writes inside their transaction:
    /// the claims schema is in that database of the server the proxy
    /// fronts (see `enforce::fencing`). `None`: fenced by a store lookup.
    pub fence_in_transaction: Option<InTransactionFence>,
    /// Whether the store lookups fencing writes are failing now: said at
    /// ERROR when they begin to, at INFO when they answer again (shared by
    /// the legs a reload makes).
    pub fence_lookups: Arc<FailureStreak>,
}

/// The database of the fronted server that holds the claims schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InTransactionFence {
    pub database: String,
    /// The schema's name, as the proxy's own SQL names it.
    pub schema: String,
}

/// A read of a thread's head waiting for the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// For a running head, the fingerprint is empty.
    pub key: ClaimKey,
    /// The reading session.
    pub holder: Holder,
    pub head: Head,
}

/// What the head read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Parked on an interrupt: the reader takes a claim.
    Parked,
    /// Not parked, tasks still to run: checked against the run lease.
    Running,
    /// Its row does not decode: refused without asking the store.
    Undecodable,
}

/// How a claim request ended.
#[derive(Debug)]
pub struct Resolution {
    /// `Serve` or `Refuse` (never `RetryAfter`).
    pub decision: ClaimDecision,
    pub waited_ms: i64,
    /// The reader held this claim already (its holder reading the head
    /// again): nothing new was decided.
    pub held_already: bool,
    /// The holder a takeover displaced.
    pub displaced: Option<Holder>,
    /// Why the displaced holder's claim could be taken over.
    pub takeover: Option<&'static str>,
    /// The claim generation this session holds, when it was served one.
    pub epoch: Option<i64>,
    /// A running head served with its run lease unknown: the claim
    /// store's error when asked for it.
    pub lease_unknown: Option<String>,
}

impl ClaimsLeg {
    /// A session of this proxy as a claim holder.
    pub fn holder(&self, session: &SessionContext) -> Holder {
        Holder {
            proxy_id: self.proxy_id.clone(),
            session_id: session.session_id,
            client_addr: session.client_addr.clone(),
            application_name: session.application_name.clone(),
        }
    }

    /// Whether running heads are checked against run leases (a run lease
    /// is configured now).
    pub fn run_lease(&self) -> bool {
        self.timings.current().run_lease_ms > 0
    }

    /// How long a write accepted inside its transaction keeps its claim
    /// from lapsing or counting as abandoned, from the check: the commit
    /// cover, or the progress hold in effect if longer. Made inside the
    /// write's transaction, it holds from its commit until the write's
    /// evidence is applied, and vanishes with a rollback.
    pub fn fence_cover_ms(&self) -> i64 {
        COMMIT_COVER_MS.max(self.timings.current().progress_hold_ms)
    }

    /// Takes the claim, polling while another live claim holds it. Blocks
    /// the calling session thread (and only it) while it waits.
    /// `ends` tells whether the server has ended the reader's own
    /// session: such a reader is never served a parked head, since its
    /// node would run with nothing it writes able to commit (a claim it
    /// took is then its session's to lose, as a crash's is); or whether
    /// the reader's client canceled while it waited, which refuses the
    /// read as PostgreSQL cancels a statement.
    /// `ahead` is the claim asked beside the read, if it was.
    pub fn resolve(
        &self,
        req: &ClaimRequest,
        ahead: Option<AheadClaim>,
        ends: &dyn Fn() -> Option<WaitEnd>,
    ) -> Resolution {
        if req.head == Head::Running {
            return self.check_run_lease(req);
        }
        let known = match ahead {
            Some(_) => None,
            None => self.known_held(req),
        };
        let mut resolution = match known {
            Some(held) => held,
            None => self.wait_for_claim(req, ahead, ends),
        };
        if matches!(resolution.decision, ClaimDecision::Serve { .. })
            && ends() == Some(WaitEnd::ServerClosed)
        {
            resolution.decision = session_ended();
        }
        resolution
    }

    /// Asks the store until it decides (see [`Self::resolve`]); the claim
    /// asked ahead, if it answers for this head, is the first answer.
    fn wait_for_claim(
        &self,
        req: &ClaimRequest,
        mut ahead: Option<AheadClaim>,
        ends: &dyn Fn() -> Option<WaitEnd>,
    ) -> Resolution {
        // A local wait: the monotonic clock, not the claims clock.
        let started = Instant::now();
        let mut waited_ms = 0;
        loop {
            if self.draining.is_set() {
                return Resolution {
                    decision: ClaimDecision::Refuse {
                        reason: Refusal::ShuttingDown,
                    },
                    waited_ms,
                    held_already: false,
                    displaced: None,
                    takeover: None,
                    epoch: None,
                    lease_unknown: None,
                };
            }
            if let Some(end) = ends() {
                return Resolution {
                    decision: match end {
                        WaitEnd::ServerClosed => session_ended(),
                        WaitEnd::Canceled => ClaimDecision::Refuse {
                            reason: Refusal::Canceled,
                        },
                    },
                    waited_ms,
                    held_already: false,
                    displaced: None,
                    takeover: None,
                    epoch: None,
                    lease_unknown: None,
                };
            }
            let answered_ahead = ahead.take().and_then(|a| a.answer_for(&req.key));
            let (outcome, decided_at_ms, asked_at) = match answered_ahead {
                Some((outcome, at, asked_at)) => (Ok(outcome), at, asked_at),
                None => {
                    let asked_at = Instant::now();
                    match self.try_claim(req) {
                        Ok((outcome, at)) => (Ok(outcome), at, asked_at),
                        Err(e) => (Err(e), 0, asked_at),
                    }
                }
            };
            let (displaced, takeover) = match &outcome {
                Ok(ClaimOutcome::TakenOver { previous, .. }) => {
                    let why = takeover_reason(previous);
                    if previous.state == ClaimState::Consumed {
                        tracing::warn!(thread = %shown(&req.key.at.thread_id), checkpoint = %shown(&req.key.at.checkpoint_id),
                            holder = %previous.holder.proxy_id, session = previous.holder.session_id,
                            "{why}: the thread continues with this reader");
                    }
                    (Some(previous.holder.clone()), Some(why))
                }
                _ => (None, None),
            };
            let epoch = match &outcome {
                Ok(
                    ClaimOutcome::Taken(r)
                    | ClaimOutcome::AlreadyHeld(r)
                    | ClaimOutcome::TakenOver { now: r, .. },
                ) => {
                    self.held.remember(r, decided_at_ms, asked_at);
                    Some(r.epoch)
                }
                _ => {
                    self.held.forget_key(&req.key);
                    None
                }
            };
            match decide_at(&outcome, &self.policy, waited_ms, decided_at_ms) {
                ClaimDecision::RetryAfter { ms } => {
                    std::thread::sleep(Duration::from_millis(ms.max(1) as u64));
                    waited_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
                }
                decision => {
                    if let ClaimDecision::Refuse {
                        reason: Refusal::Answered { .. } | Refusal::InFlight { .. },
                    } = &decision
                    {
                        self.note_refusal(&req.key);
                    }
                    return Resolution {
                        decision,
                        waited_ms,
                        held_already: matches!(outcome, Ok(ClaimOutcome::AlreadyHeld(_))),
                        displaced,
                        takeover,
                        epoch,
                        lease_unknown: None,
                    };
                }
            }
        }
    }

    /// The reader's own claim, answered from memory (`held_claims`)
    /// while the store says this process's holders still stand.
    fn known_held(&self, req: &ClaimRequest) -> Option<Resolution> {
        if !self.store.live() {
            return None;
        }
        let record = self.held.answer(&req.key, &req.holder, Instant::now())?;
        metrics::counter!(crate::metrics::CLAIMS, "outcome" => "held_known").increment(1);
        let epoch = Some(record.epoch);
        Some(Resolution {
            // The store's clock matters only to a busy claim's wait.
            decision: decide_at(&Ok(ClaimOutcome::AlreadyHeld(record)), &self.policy, 0, 0),
            waited_ms: 0,
            held_already: true,
            displaced: None,
            takeover: None,
            epoch,
            lease_unknown: None,
        })
    }

    fn check_run_lease(&self, req: &ClaimRequest) -> Resolution {
        let at = &req.key.at;
        let lease = claims_store_call("run_lease", || {
            self.store
                .run_lease(&at.thread_id, &at.checkpoint_ns, Now::STORE)
        });
        let decision = decide_running_head(&lease, &req.holder, self.draining.is_set());
        let lease_unknown = match (&lease, &decision) {
            (Err(e), ClaimDecision::Serve { .. }) => {
                crate::metrics::run_lease_unchecked();
                tracing::error!(error = %e, thread = %shown(&at.thread_id),
                    "run lease unknown (claim store failed): running head served unchecked, a \
                     late resume may repeat another session's run");
                Some(e.to_string())
            }
            _ => None,
        };
        Resolution {
            decision,
            waited_ms: 0,
            held_already: false,
            displaced: None,
            takeover: None,
            epoch: None,
            lease_unknown,
        }
    }

    /// The store's answer, and its clock when it decided.
    fn try_claim(&self, req: &ClaimRequest) -> Result<(ClaimOutcome, i64), StoreError> {
        claims_store_call("claim", || {
            self.store
                .try_claim_timed(&req.key, &req.holder, Now::STORE, self.lapse_ms)
        })
    }

    fn note_refusal(&self, key: &ClaimKey) {
        if let Err(e) = self.store.note_refusal(key) {
            tracing::warn!(error = %e, "refusal not counted in the claim store");
        }
    }
}

/// The refusal of a reader whose server session ended while it waited.
fn session_ended() -> ClaimDecision {
    ClaimDecision::Refuse {
        reason: Refusal::SessionEnded,
    }
}

/// A held head row's claim, decided outside the session lock.
#[derive(Debug)]
pub struct ClaimTicket {
    leg: Arc<ClaimsLeg>,
    pub request: ClaimRequest,
    /// The claim asked beside the read, if it was; taken when deciding.
    ahead: Mutex<Option<AheadClaim>>,
    /// Set once decided.
    pub resolution: OnceLock<Resolution>,
}

impl ClaimTicket {
    pub fn new(leg: Arc<ClaimsLeg>, request: ClaimRequest, ahead: Option<AheadClaim>) -> Self {
        ClaimTicket {
            leg,
            request,
            ahead: Mutex::new(ahead),
            resolution: OnceLock::new(),
        }
    }

    /// A ticket decided already: refused for `reason`, the store not asked.
    pub fn refused(leg: Arc<ClaimsLeg>, request: ClaimRequest, reason: Refusal) -> Self {
        let resolution = Resolution {
            decision: ClaimDecision::Refuse { reason },
            waited_ms: 0,
            held_already: false,
            displaced: None,
            takeover: None,
            epoch: None,
            lease_unknown: None,
        };
        count_decision(request.head, &resolution);
        ClaimTicket {
            leg,
            request,
            ahead: Mutex::new(None),
            resolution: OnceLock::from(resolution),
        }
    }
}

impl std::fmt::Debug for ClaimsLeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsLeg")
            .field("proxy_id", &self.proxy_id)
            .finish_non_exhaustive()
    }
}

impl Ticket for ClaimTicket {
    /// Decides once; a ticket already decided keeps its decision.
    fn decide(&self, ends: &dyn Fn() -> Option<WaitEnd>) {
        self.resolution.get_or_init(|| {
            let ahead = match self.ahead.lock() {
                Ok(mut ahead) => ahead.take(),
                Err(poisoned) => poisoned.into_inner().take(),
            };
            let resolution = self.leg.resolve(&self.request, ahead, ends);
            count_decision(self.request.head, &resolution);
            resolution
        });
    }
}

/// Counts a decided claim: its wait, and whether it was refused, taken or
/// taken over (a running head served outside any lease claimed nothing).
fn count_decision(head: Head, res: &Resolution) {
    if res.waited_ms > 0 {
        crate::metrics::claim_waited();
    }
    match &res.decision {
        ClaimDecision::Refuse { reason } => crate::metrics::claim_refused(reason.metric_label()),
        ClaimDecision::Serve { .. } if head == Head::Running => {}
        ClaimDecision::Serve { takeover } => {
            crate::metrics::claim_served(takeover.then(|| takeover_metric_label(res.takeover)))
        }
        ClaimDecision::RetryAfter { .. } => {}
    }
}

#[cfg(test)]
pub(crate) mod tests;
