//! What a Parse prepares: the statement's class, whether it ends the
//! transaction, and the fork rewrite the server gets in its place when the
//! fork filter is on.

use super::{Prepared, SessionEnforcer};
use crate::enforce::transaction_end::transaction_end;
use crate::policy::claims::has_inspection_hint;

pub(super) fn handle(session: &mut SessionEnforcer, sql: &str) -> (Prepared, Option<String>) {
    if let Some(ends_transaction) = session.plain_parse.get(sql) {
        let plain = Prepared {
            ends_transaction,
            ..session.prepared(session.shared.classifier.other())
        };
        return (plain, None);
    }
    let class = match session.is_ordinary(sql.as_bytes()) {
        true => session.shared.classifier.other(),
        false => session.shared.classifier.classify(sql),
    };
    let replacement = match (&class.fork_sql, session.shared.legs.fork_filter) {
        (Some(sql), true) => Some(sql.clone()),
        _ => None,
    };
    let inspect_hint = session
        .shared
        .legs
        .claims
        .as_ref()
        .is_some_and(|l| l.inspection_sql_hint)
        && class.kind.is_checkpoint_traffic()
        && has_inspection_hint(sql);
    let prepared = Prepared {
        class,
        rewritten: replacement.is_some(),
        inspect_hint,
        ends_transaction: transaction_end(sql),
    };
    // Ordinary traffic is classified with no other effect, never
    // rewritten and never hinted: the same text prepares the same again.
    if session.shared.classifier.is_other(&prepared.class) {
        session.plain_parse.remember(sql, prepared.ends_transaction);
    }
    (prepared, replacement)
}
