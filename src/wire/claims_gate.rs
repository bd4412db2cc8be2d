//! The consume-once gate on the wire: when a read of a thread's head
//! returns a parked checkpoint, the proxy holds that row, takes a claim in
//! the shared store (waiting as the policy says), and only then lets the
//! row through, or sends the refusal in its place, before any node runs.

use std::sync::Arc;
use std::time::Duration;

use regex::Regex;

use crate::claims::evidence::EvidenceSender;
use crate::claims::{now_ms, ClaimKey, ClaimOutcome, ClaimStore, Holder, StoreError};
use crate::policy::claims::{decide, ClaimDecision, Refusal, WaitPolicy};

/// The consume-once leg as configured for one proxy process.
pub struct ClaimsLeg {
    /// The shared store; an error here means every read of a parked head
    /// is refused (fail closed) while everything else flows.
    pub store: Result<Arc<ClaimStore>, StoreError>,
    pub proxy_id: String,
    /// How long a claim with no evidence holds.
    pub lapse_ms: i64,
    pub policy: WaitPolicy,
    /// application_name patterns that mark a session's reads as inspection.
    pub inspection_patterns: Vec<Regex>,
    pub evidence: Option<EvidenceSender>,
}

/// A read of a parked head waiting for its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    pub key: ClaimKey,
    pub holder: Holder,
}

/// How a claim request ended.
#[derive(Debug)]
pub struct Resolution {
    /// `Serve` or `Refuse` (never `RetryAfter`).
    pub decision: ClaimDecision,
    pub waited_ms: i64,
    /// The holder a takeover displaced.
    pub displaced: Option<Holder>,
}

impl ClaimsLeg {
    /// Takes the claim, polling while another live claim holds it.
    pub async fn resolve(&self, req: &ClaimRequest) -> Resolution {
        let started = now_ms();
        let mut waited_ms = 0;
        loop {
            let outcome = self.try_claim(req).await;
            let displaced = match &outcome {
                Ok(ClaimOutcome::TakenOver { previous, .. }) => Some(previous.holder.clone()),
                _ => None,
            };
            match decide(&outcome, &self.policy, waited_ms) {
                ClaimDecision::RetryAfter { ms } => {
                    tokio::time::sleep(Duration::from_millis(ms.max(1) as u64)).await;
                    waited_ms = now_ms() - started;
                }
                decision => {
                    if let ClaimDecision::Refuse {
                        reason: Refusal::Answered { .. } | Refusal::InFlight { .. },
                    } = &decision
                    {
                        self.note_refusal(&req.key).await;
                    }
                    return Resolution {
                        decision,
                        waited_ms,
                        displaced,
                    };
                }
            }
        }
    }

    async fn try_claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let store = match &self.store {
            Ok(s) => Arc::clone(s),
            Err(e) => return Err(e.clone()),
        };
        let (key, holder, lapse) = (req.key.clone(), req.holder.clone(), self.lapse_ms);
        let joined =
            tokio::task::spawn_blocking(move || store.try_claim(&key, &holder, now_ms(), lapse))
                .await;
        match joined {
            Ok(outcome) => outcome,
            Err(e) => Err(StoreError::Open {
                path: "claim store".into(),
                reason: format!("claim task failed: {e}"),
            }),
        }
    }

    async fn note_refusal(&self, key: &ClaimKey) {
        if let Ok(store) = &self.store {
            let (store, key) = (Arc::clone(store), key.clone());
            let done = tokio::task::spawn_blocking(move || store.note_refusal(&key)).await;
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "refusal not counted in the claim store");
            }
        }
    }
}
