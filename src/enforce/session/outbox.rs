//! What the session recorded, handed to its stores: audit events and the
//! claim evidence of committed writes, and word of a client gone.

use super::SessionEnforcer;
use crate::claims::evidence::Evidence;

pub(super) fn flush(session: &mut SessionEnforcer) {
    for event in std::mem::take(&mut session.ready_events) {
        session.shared.audit.record(event);
    }
    if session.ready_evidence.is_empty() {
        return;
    }
    let evidence = std::mem::take(&mut session.ready_evidence);
    if let Some(sender) = session.evidence_sender() {
        for ev in evidence {
            sender.send(&session.ctx, ev);
        }
    }
}

/// A holder that goes away mid-gate must not strand its thread.
pub(super) fn closed(session: &mut SessionEnforcer) {
    if let Some(sender) = session.evidence_sender() {
        sender.send(
            &session.ctx,
            Evidence::HolderGone {
                session_id: session.ctx.session_id,
            },
        );
    }
}
