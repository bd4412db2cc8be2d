//! What an Execute watches: the bound statement's answer, whether it is an
//! inspection, and the claim asked beside a read of a parked head.

use std::sync::Arc;
use std::time::Instant;

use super::{Binding, SessionEnforcer};
use crate::enforce::claim_ahead::AheadClaim;
use crate::enforce::watch::Watch;
use crate::policy::claims::is_inspection;
use crate::saver::classify::StatementKind;

pub(super) fn handle(session: &mut SessionEnforcer, portal: Option<&Binding>) -> Option<Watch> {
    let Some(b) = portal else {
        // Not checkpoint traffic: it may change the client encoding.
        session.encodings.unsettle();
        return None;
    };
    let mut w = Watch::new(
        Arc::clone(&b.class),
        Some(Arc::clone(&b.bound)),
        b.rewritten,
    );
    w.record = b.record.clone();
    w.inspect = session.inspecting() || b.inspect_hint;
    w.executed_at = Some(Instant::now());
    if !w.inspect {
        w.ahead = session.claim_ahead(&w);
    }
    if session.shared.legs.claims.is_some() && !matches!(b.class.kind, StatementKind::Read(_)) {
        w.sent_at = w.executed_at;
    }
    Some(w)
}

impl SessionEnforcer {
    /// Whether this session's reads are inspection (never claim).
    fn inspecting(&self) -> bool {
        match &self.shared.legs.claims {
            Some(leg) => is_inspection(
                &self.ctx.application_name,
                &leg.inspection_patterns,
                false,
                self.inspection_listener,
            ),
            None => true,
        }
    }

    /// For a read of a head this proxy last saw parked, and whose claim
    /// this session is not known to hold: that claim, asked now, beside
    /// the read (see `claim_ahead`).
    fn claim_ahead(&self, watch: &Watch) -> Option<AheadClaim> {
        let leg = self.shared.legs.claims.as_ref()?;
        if leg.draining.is_set() || !leg.store.live() {
            return None;
        }
        let (thread, ns) = watch.head_address()?;
        // A key the server converts is refused at the head row: asked now,
        // it would claim other characters' thread.
        if self
            .encodings
            .converts_any([thread.as_str(), ns.as_str()].into_iter())
            .is_some()
        {
            return None;
        }
        let key = leg.parked.expected(&thread, &ns)?;
        let holder = leg.holder(&self.ctx);
        if leg.held.answer(&key, &holder, Instant::now()).is_some() {
            return None;
        }
        AheadClaim::ask(Arc::clone(&leg.store), key, holder, leg.lapse_ms)
    }
}
