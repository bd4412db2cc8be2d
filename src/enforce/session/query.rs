//! What a simple Query watches, or why it is refused (a blob refusal still
//! waiting is raised in its place).

use std::time::Instant;

use super::sync;
use super::unknown_saver::unknown_refusal;
use super::SessionEnforcer;
use crate::enforce::transaction_end::{transaction_end, TransactionEnd};
use crate::enforce::watch::Watch;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer, sql: &str) -> Result<Option<Watch>, Refusal> {
    // A simple Query ends the segment (and the implicit transaction) as a
    // Sync does: the fence verdicts end, and a blob refusal still waiting
    // is raised in its place, unless the Query rolls the blob back with
    // everything else.
    session.fencing.end_transaction();
    if session.validity.waiting() {
        if transaction_end(sql) == Some(TransactionEnd::Rollback) {
            session.validity.rolled_back();
        } else if let Some(refusal) = sync::handle(session) {
            return Err(refusal);
        }
    }
    let class = match session.is_ordinary(sql.as_bytes()) {
        true => session.shared.classifier.other(),
        false => session.shared.classifier.classify(sql),
    };
    if let Some(refusal) = unknown_refusal(session, &class) {
        return Err(refusal);
    }
    // Any other statement, or one beside it in the text, may change the
    // client encoding before this text's rows are sent.
    if !class.kind.is_checkpoint_traffic() || has_more_than_one_statement(sql) {
        session.encodings.unsettle();
    }
    Ok(class.kind.is_checkpoint_traffic().then(|| Watch {
        executed_at: Some(Instant::now()),
        ..Watch::new(class, None, false)
    }))
}

/// The tracker refused the Query itself: the transaction it would have run
/// in aborts with that error, and a blob refusal still waiting goes with
/// the blob it refuses (raised later, it would land on another statement).
pub(super) fn refused(session: &mut SessionEnforcer) {
    session.validity.rolled_back();
}

/// Whether `sql` may hold more than one statement: a `;` before its last
/// non-blank character (one in a string counts too).
fn has_more_than_one_statement(sql: &str) -> bool {
    sql.trim_end().trim_end_matches(';').contains(';')
}
