//! Connections to the shared schema for the proxy's other users of it (the
//! audit trail of every replica): made as the claims store makes its own
//! (address, TLS, password), with the schema brought up to date (the
//! proxy) or required to be at a version already (operator commands, which
//! run no DDL).

use std::time::Duration;

use postgres::Client;

use super::schema;
use crate::pg::connect::{connect, error_text};
use crate::pg::PgTarget;

/// What a connection may do to the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaAccess {
    /// Create or upgrade it (the proxy).
    Migrate,
    /// It must be at this version at least; nothing is created.
    AtLeast(i32),
}

/// A connection for `application_name`, whose statements give up after
/// `statement_timeout`; errors are the server's message with its SQLSTATE.
pub fn connect_schema(
    target: &PgTarget,
    access: SchemaAccess,
    application_name: &str,
    statement_timeout: Duration,
) -> Result<Client, String> {
    let mut config = target
        .config_now()
        .map_err(|e| crate::error_chain::chain(&e).to_string())?;
    config.application_name(application_name);
    let mut client = connect(&config, target).map_err(|e| error_text(&e))?;
    let ms = statement_timeout.as_millis();
    client
        .batch_execute(&format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}"
        ))
        .map_err(|e| error_text(&e))?;
    let s = target.schema();
    match access {
        SchemaAccess::Migrate => schema::migrate(&mut client, s)
            .map_err(|e| format!("migrating schema {s}: {}", error_text(&e)))?,
        SchemaAccess::AtLeast(want) => {
            let at = schema::version(&mut client, s).map_err(|e| error_text(&e))?;
            if at < want {
                return Err(format!(
                    "schema {s} is at version {at}, version {want} is needed \
                     (no proxy of this version has used this database)"
                ));
            }
        }
    }
    Ok(client)
}
