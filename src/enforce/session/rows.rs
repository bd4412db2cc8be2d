//! The rows of a watched answer: a head row's rewrite and the claim it is
//! held for (refused at once where the server converts the session's
//! encoding and the head's key is not ASCII, or the row does not decode),
//! and the RowDescription that loses the head column.

use std::sync::Arc;

use bytes::Bytes;

use super::SessionEnforcer;
use crate::enforce::claim_gate::{ClaimRequest, ClaimTicket, Head};
use crate::enforce::watch::Watch;
use crate::policy::claims::Refusal;
use crate::wire::guard::{HeldTicket, ServerStep};
use crate::wire::messages::row_description::drop_last_column_description;

pub(super) fn row(
    session: &mut SessionEnforcer,
    watch: &mut Watch,
    frame: &[u8],
    step: &mut ServerStep,
) {
    if watch.fence.is_some() {
        return;
    }
    step.set_replace(watch.on_data_row(frame));
    let Some(leg) = session.shared.legs.claims.as_ref() else {
        return;
    };
    let (request, refusal) = if let Some(request) = session.claim_request(watch) {
        let converted = session.encodings.converts_at(&request.key.at);
        let refusal = converted.map(|encoding| Refusal::ClientEncoding(encoding.to_owned()));
        (request, refusal)
    } else if let Some((key, why)) = watch.undecodable_head() {
        let request = ClaimRequest {
            key,
            holder: leg.holder(&session.ctx),
            head: Head::Undecodable,
        };
        (request, Some(Refusal::Undecodable(why.to_owned())))
    } else {
        return;
    };
    let leg = Arc::clone(leg);
    let ticket = match refusal {
        Some(reason) => ClaimTicket::refused(leg, request, reason),
        None => ClaimTicket::new(leg, request, watch.ahead.take()),
    };
    let ticket = Arc::new(ticket);
    step.set_hold(HeldTicket(Arc::clone(&ticket) as _));
    session.held = Some(ticket);
}

pub(super) fn description(
    _session: &mut SessionEnforcer,
    watch: &Watch,
    frame: &[u8],
) -> Option<Bytes> {
    if watch.head_column {
        drop_last_column_description(frame)
    } else {
        None
    }
}

impl SessionEnforcer {
    /// The claim request a decoded head row asks for, if any.
    fn claim_request(&self, watch: &Watch) -> Option<ClaimRequest> {
        let leg = self.shared.legs.claims.as_ref()?;
        let (key, head) = match watch.parked_claim_key() {
            Some(key) => (key, Head::Parked),
            None if leg.run_lease() => (watch.running_head_key()?, Head::Running),
            None => return None,
        };
        Some(ClaimRequest {
            key,
            holder: leg.holder(&self.ctx),
            head,
        })
    }
}
