//! Which statement texts the server may get at all: none that writes the
//! proxy's own schema.

use super::SessionEnforcer;
use crate::log_text::shown;
use crate::wire::tracker::Refusal;

pub(super) fn handle(session: &mut SessionEnforcer, sql: &str) -> Result<(), Refusal> {
    let own = &session.shared.legs.own_schema;
    own.check(sql).map_err(|breach| {
        tracing::warn!(
            schema = own.name(),
            sql = %shown(sql.trim()),
            "statement on the proxy's schema refused: {}",
            shown(&breach.to_string())
        );
        metrics::counter!(crate::metrics::OWN_SCHEMA_REFUSED).increment(1);
        own.refusal(&breach)
    })
}
