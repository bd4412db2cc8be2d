//! What a Sync raises first: a write the validity gate refuses only once
//! its segment is complete. A simple Query and a statement ending the
//! transaction raise it the same way, before the write can commit.

use super::SessionEnforcer;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer) -> Option<Refusal> {
    let rejection = session.validity.at_end()?;
    let (refusal, event) = rejection.refuse(&session.ctx);
    session.ready_events.push(event);
    Some(refusal)
}
