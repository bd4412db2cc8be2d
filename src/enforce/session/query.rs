//! What a simple Query watches, or why it is refused.

use std::time::Instant;

use super::unknown_saver::unknown_refusal;
use super::SessionEnforcer;
use crate::enforce::watch::Watch;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer, sql: &str) -> Result<Option<Watch>, Refusal> {
    let class = session.shared.classifier.classify(sql);
    if let Some(refusal) = unknown_refusal(&class) {
        return Err(refusal);
    }
    Ok(class.kind.is_checkpoint_traffic().then(|| Watch {
        executed_at: Some(Instant::now()),
        ..Watch::new(class, None, false)
    }))
}
