//! A transaction's end: what its writes did is kept when it commits and
//! dropped when it rolls back, whole or to a savepoint set before them.

use super::uncommitted::UnknownSavepoint;
use super::SessionEnforcer;
use crate::claims::evidence::lost_event;
use crate::wire::tracker::{SavepointChange, TxnStatus};

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
            done.clear();
        }
        // An implicit transaction failed: nothing it wrote is kept.
        TxnStatus::Idle => session.uncommitted.clear(),
        // A failed transaction block keeps what it wrote until the client
        // ends it: a ROLLBACK drops it all, a `ROLLBACK TO` what came
        // after its savepoint.
        TxnStatus::Failed | TxnStatus::InBlock => {}
    }
    if status != TxnStatus::InBlock {
        session.fencing.end_transaction();
    }
    if status == TxnStatus::Idle {
        session.segment_failed = false;
    }
}

pub(super) fn rollback(session: &mut SessionEnforcer) {
    session.uncommitted.clear();
    session.fencing.end_transaction();
}

pub(super) fn savepoint(session: &mut SessionEnforcer, change: SavepointChange<'_>) {
    let name = match change {
        SavepointChange::Set(name) => return session.uncommitted.set(name),
        SavepointChange::Released(name) => return session.uncommitted.released(name),
        SavepointChange::RolledBackTo(name) => name,
    };
    // The transaction is usable again, and what the fence checks since the
    // savepoint saw (locks, rows) is undone with the rest.
    session.segment_failed = false;
    session.fencing.end_transaction();
    if session.uncommitted.rolled_back_to(name) == Err(UnknownSavepoint) {
        // Never set through this session as far as the proxy read it: what
        // the rollback undid is unknown, so nothing the transaction wrote
        // is acted on (a claim it would have consumed lapses instead), and
        // each piece of claim evidence dropped is counted and audited lost.
        tracing::error!(
            savepoint = ?String::from_utf8_lossy(name),
            evidence = session.uncommitted.evidence.len(),
            "ROLLBACK TO a savepoint this session was not seen to set: the transaction's \
             claim evidence and audit events are dropped"
        );
        for ev in &session.uncommitted.evidence {
            let lost = lost_event(&session.ctx, ev, "unknown_savepoint");
            session.ready_events.push(lost);
        }
        session.uncommitted.clear();
    }
}
