//! SQL PREPARE, EXECUTE, DECLARE and FETCH: checkpoint statements in forms
//! the proxy cannot watch are refused while any leg is on.

use super::{Binding, Prepared, SessionEnforcer};
use crate::enforce::events::{statement_refused, StatementRefusal};
use crate::log_text::shown;
use crate::saver::classify::Classified;
use crate::wire::tracker::{Refusal, FEATURE_NOT_SUPPORTED};

pub(super) fn prepare(session: &mut SessionEnforcer, inner: &str) -> Result<Prepared, Refusal> {
    // Bound through the protocol, a statement prepared in SQL is
    // watched like any other, except a read by id: its fork rewrite
    // happens at Parse, which SQL PREPARE does not pass through.
    let class = session.shared.classifier.classify(inner);
    if class.fork_sql.is_some() && session.shared.legs.fork_filter {
        session.unwatchable(&class, "SQL PREPARE")?;
    }
    Ok(session.prepared(class))
}

pub(super) fn execute(session: &mut SessionEnforcer, statement: &Prepared) -> Result<(), Refusal> {
    session.unwatchable(&statement.class, "SQL EXECUTE")
}

pub(super) fn declare(session: &mut SessionEnforcer, inner: &str) -> Result<(), Refusal> {
    let class = session.shared.classifier.classify(inner);
    session.unwatchable(&class, "a cursor")
}

/// A portal of a checkpoint statement, bound by the protocol, read by SQL
/// FETCH: its rows would pass unwatched (a parked head unclaimed, a fork's
/// recorded answer unfiltered).
pub(super) fn fetch(session: &mut SessionEnforcer, portal: &Binding) -> Result<(), Refusal> {
    session.unwatchable(&portal.class, "SQL FETCH")
}

impl SessionEnforcer {
    /// A checkpoint statement in a form the proxy cannot watch: refused
    /// while any leg is on, logged at WARN and recorded in the audit trail
    /// (`statement_refused`).
    fn unwatchable(&mut self, class: &Classified, form: &str) -> Result<(), Refusal> {
        if !class.kind.is_checkpoint_traffic() || !self.shared.legs.any() {
            return Ok(());
        }
        let statement = class.kind.label();
        let refusal = Refusal {
            sqlstate: FEATURE_NOT_SUPPORTED,
            message: format!("resumeguard: checkpoint statements cannot run through {form}"),
            detail: "run checkpoint statements with the protocol's Parse, Bind and Execute, as the savers do"
                .into(),
        };
        tracing::warn!(statement, "{}", shown(&refusal.message));
        let event = statement_refused(
            &self.ctx,
            StatementRefusal::SqlForm,
            Some(statement),
            &refusal,
        );
        self.ready_events.push(event);
        Err(refusal)
    }
}
