//! A transaction's end: what its writes did is kept when it commits and
//! dropped when it fails or rolls back.

use super::SessionEnforcer;
use crate::wire::tracker::TxnStatus;

pub(super) fn error(session: &mut SessionEnforcer) {
    session.segment_failed = true;
}

pub(super) fn handle(session: &mut SessionEnforcer, status: TxnStatus) {
    match status {
        // Committed (or never in a transaction): writes are durable.
        TxnStatus::Idle if !session.segment_failed => {
            let done = &mut session.uncommitted;
            session.ready_events.append(&mut done.events);
            session.ready_evidence.append(&mut done.evidence);
            // The granted run reached a durable checkpoint.
            session.run_open &= done.created.is_empty();
            for at in done.created.drain(..) {
                session.fencing.created(at);
            }
            if let Some(leg) = &session.shared.legs.claims {
                for (at, interrupt) in done.parks.drain(..) {
                    leg.parked.interrupt_written(&at, interrupt);
                }
            }
        }
        TxnStatus::Idle | TxnStatus::Failed => session.uncommitted.clear(),
        TxnStatus::InBlock => {}
    }
    if status != TxnStatus::InBlock {
        session.segment_failed = false;
        session.fencing.end_transaction();
    }
}

pub(super) fn rollback(session: &mut SessionEnforcer) {
    session.uncommitted.clear();
    session.fencing.end_transaction();
}
