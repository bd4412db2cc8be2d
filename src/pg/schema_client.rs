//! Connections to a shared schema for the proxy's users of it that keep
//! no connection pool of their own (the audit trail of every replica):
//! made as the claims store makes its own (address, TLS, password), with
//! the schema brought up to date (the proxy) or required to be at a
//! version already (operator commands, which run no DDL).

use std::time::Duration;

use postgres::Client;

use super::connect::{connect, error_text};
use super::credential::CredentialError;
use super::migration::{self, SchemaMigrations};
use super::PgTarget;

/// What a connection may do to the schema.
#[derive(Debug, Clone, Copy)]
pub enum SchemaAccess {
    /// Create or upgrade it with these migrations (the proxy).
    Migrate(SchemaMigrations),
    /// It must be at this version at least; nothing is created.
    AtLeast(i32),
}

/// Why [`connect_schema`] gave no connection; the texts are the server's
/// message with its SQLSTATE.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{}", crate::error_chain::chain(.0))]
    Credential(CredentialError),
    #[error("{}", error_text(.0))]
    Postgres(#[from] postgres::Error),
    #[error("migrating schema {schema}: {}", error_text(.error))]
    Migrating {
        schema: String,
        error: postgres::Error,
    },
    #[error(
        "schema {schema} is at version {at}, version {want} is needed \
         (no proxy of this version has used this database)"
    )]
    Behind { schema: String, at: i32, want: i32 },
}

/// A connection for `application_name`, whose statements give up after
/// `statement_timeout`.
pub fn connect_schema(
    target: &PgTarget,
    access: SchemaAccess,
    application_name: &str,
    statement_timeout: Duration,
) -> Result<Client, SchemaError> {
    let mut config = target.config_now().map_err(SchemaError::Credential)?;
    config.application_name(application_name);
    let mut client = connect(&config, target)?;
    let ms = statement_timeout.as_millis();
    client.batch_execute(&format!(
        "SET statement_timeout = {ms}; SET lock_timeout = {ms}"
    ))?;
    let s = target.schema();
    match access {
        SchemaAccess::Migrate(migrations) => migration::migrate(&mut client, s, migrations)
            .map_err(|error| SchemaError::Migrating {
                schema: s.to_owned(),
                error,
            })?,
        SchemaAccess::AtLeast(want) => {
            let at = migration::version(&mut client, s)?;
            if at < want {
                return Err(SchemaError::Behind {
                    schema: s.to_owned(),
                    at,
                    want,
                });
            }
        }
    }
    Ok(client)
}
