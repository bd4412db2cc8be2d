//! What a Sync raises first: a write the validity gate refuses only once
//! its segment is complete.

use super::SessionEnforcer;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer) -> Option<Refusal> {
    let rejection = session.validity.at_sync()?;
    Some(session.refuse_write(rejection))
}
