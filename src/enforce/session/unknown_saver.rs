//! Under `[enforce] unknown_saver = "refuse"`, a checkpoint statement no
//! saver profile recognizes fails before anything of it runs, whether it
//! comes as a Bind or in a simple Query.

use super::SessionEnforcer;
use crate::enforce::events::{statement_refused, StatementRefusal};
use crate::saver::classify::Classified;
use crate::saver::unknown::REFUSAL_SQLSTATE;
use crate::wire::tracker::Refusal;

/// The refusal of a checkpoint statement no profile recognizes, when the
/// policy refuses it; recorded in the audit trail (`statement_refused`).
pub(super) fn unknown_refusal(
    session: &mut SessionEnforcer,
    class: &Classified,
) -> Option<Refusal> {
    let message = class.refusal.as_ref()?;
    let refusal = Refusal {
        sqlstate: REFUSAL_SQLSTATE,
        message: message.clone(),
        detail: class
            .unenforced
            .as_ref()
            .map(|u| format!("legs off for it: {}", u.legs_off))
            .unwrap_or_default(),
    };
    let event = statement_refused(
        &session.ctx,
        StatementRefusal::UnknownSaver,
        Some(class.kind.label()),
        &refusal,
    );
    session.ready_events.push(event);
    Some(refusal)
}
