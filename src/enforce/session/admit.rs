//! Which statement texts the server may get at all: none that writes the
//! proxy's own schema.

use super::SessionEnforcer;
use crate::enforce::events::{statement_refused, StatementRefusal};
use crate::log_text::shown;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer, sql: &str) -> Result<(), Refusal> {
    // The Parse text sent again: admitted before, under the same rules.
    if session.plain_parse.get(sql).is_some() || session.is_ordinary(sql.as_bytes()) {
        return Ok(());
    }
    let own = &session.shared.legs.own_schema;
    let Err(breach) = own.check(sql) else {
        return Ok(());
    };
    tracing::warn!(
        schema = own.name(),
        sql = %shown(sql.trim()),
        "statement on the proxy's schema refused: {}",
        shown(&breach.to_string())
    );
    metrics::counter!(crate::metrics::OWN_SCHEMA_REFUSED).increment(1);
    let refusal = own.refusal(&breach);
    let event = statement_refused(&session.ctx, StatementRefusal::OwnSchema, None, &refusal);
    session.ready_events.push(event);
    Err(refusal)
}
