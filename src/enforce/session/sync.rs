//! What a Sync raises first: a write the validity gate refuses only once
//! its segment is complete. A simple Query and a statement ending the
//! transaction raise it the same way, before the write can commit. A Sync
//! (and a statement committing the transaction) also ends the fence
//! verdicts taken so far: the writes after it may run in another
//! transaction (see `fencing`).

use super::SessionEnforcer;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer) -> Option<Refusal> {
    session.fencing.end_transaction();
    let rejection = session.validity.at_end()?;
    let (refusal, event) = rejection.refuse(&session.ctx);
    session.ready_events.push(event);
    Some(refusal)
}
