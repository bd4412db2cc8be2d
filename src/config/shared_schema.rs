//! The migrations of the schema the claims and the audit trail share
//! (`resumeguard` by default): the steps each owns, put together here,
//! above both, so neither needs the other's. Whichever of the claims
//! store and the audit writer reaches a fresh database first creates all
//! of it.

use crate::audit::AUDIT_MIGRATIONS;
use crate::claims::postgres::CLAIMS_MIGRATIONS;
use crate::pg::SchemaMigrations;

/// Every step of the shared schema: the claims' and the audit trail's.
pub const SHARED_SCHEMA: SchemaMigrations =
    SchemaMigrations::new(&[&CLAIMS_MIGRATIONS, &AUDIT_MIGRATIONS]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versions_are_one_to_the_current_each_once() {
        let versions: Vec<i32> = SHARED_SCHEMA.in_order().iter().map(|m| m.version).collect();
        let want: Vec<i32> = (1..=SHARED_SCHEMA.current_version()).collect();
        assert_eq!(versions, want);
    }
}
