//! What a Sync raises first: a write the validity gate refuses only once
//! its segment is complete.

use super::SessionEnforcer;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer) -> Option<Refusal> {
    let rejection = session.validity.at_sync()?;
    let (refusal, event) = rejection.refuse(&session.ctx);
    session.ready_events.push(event);
    Some(refusal)
}
