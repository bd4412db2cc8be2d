//! A held head row's claim, decided: what the session now holds, the
//! audit of the decision, and the refusal the client gets instead of the
//! row.

use bytes::Bytes;

use super::SessionEnforcer;
use crate::enforce::claim_gate::{apply_claim, ClaimRequest, Head, Resolution};
use crate::policy::claims::{ClaimDecision, Refusal as ClaimRefusal};

pub(super) fn handle(session: &mut SessionEnforcer) -> Option<Bytes> {
    let ticket = session.held.take()?;
    let resolution = ticket.resolution.get()?;
    session.claim_resolved(&ticket.request, resolution)
}

impl SessionEnforcer {
    /// A held head row's claim was decided: what this session now holds
    /// is remembered for fencing, the decision audited; returns the
    /// refusal the client gets instead of the row, if any.
    pub fn claim_resolved(&mut self, req: &ClaimRequest, res: &Resolution) -> Option<Bytes> {
        if req.head == Head::Parked {
            match res.epoch {
                Some(epoch) => self.fencing.took(&req.key, epoch),
                None => self.fencing.read_parked(&req.key),
            }
            if matches!(res.decision, ClaimDecision::Serve { .. }) {
                self.run_open = true;
            }
        }
        let remedy = match (&res.decision, self.shared.legs.claims.as_deref()) {
            (
                ClaimDecision::Refuse {
                    reason: ClaimRefusal::RunInProgress { .. },
                },
                Some(leg),
            ) => Some(leg.inspection_remedy()),
            _ => None,
        };
        apply_claim(
            &self.ctx,
            req,
            res,
            remedy.as_deref(),
            &mut self.ready_events,
        )
    }
}
