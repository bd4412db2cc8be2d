//! Which failures of the proxy's own connection to its claims database no
//! retry mends (a refused credential, a missing password or database, no
//! right to create the schema), and what an operator sets to mend each:
//! `serve` stops at start on these rather than refuse every parked read.
//! Everything else (refused, unreachable, timed out) is transient.

use postgres::error::SqlState;

use super::credential::CredentialError;
use crate::claims::error::StoreError;
use crate::error_chain::chain;

/// Where the proxy's password can be given, as the fixes say it.
const PASSWORD_KEYS: &str = "PGPASSWORD, [claims] password_file or password_command \
    (RESUMEGUARD_CLAIMS_PASSWORD_FILE, RESUMEGUARD_CLAIMS_PASSWORD_COMMAND), the password \
    of [claims] dsn or of the upstream URL, or ~/.pgpass";

/// The first connect's failure, and for a permanent one its fix.
#[derive(Debug, Clone)]
pub struct StartFault {
    pub error: StoreError,
    /// What to set; `None`: transient (the proxy starts and retries).
    pub fix: Option<String>,
}

/// The fix of a permanent failure `e` of the proxy's connection, `None`
/// when it may pass by itself.
pub(super) fn fix_for(e: &postgres::Error, schema: &str) -> Option<String> {
    if let Some(code) = e.code() {
        return if *code == SqlState::INVALID_PASSWORD {
            Some(format!(
                "authentication failed: give the proxy's role its current password: \
                 {PASSWORD_KEYS}"
            ))
        } else if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
            Some(
                "the server refuses the proxy's role: set the user in [claims] dsn \
                 (RESUMEGUARD_CLAIMS_DSN) or the upstream URL, and allow it in pg_hba.conf"
                    .into(),
            )
        } else if *code == SqlState::INVALID_CATALOG_NAME {
            Some(
                "the database does not exist: name an existing one in [claims] dsn \
                 (RESUMEGUARD_CLAIMS_DSN) or in the upstream URL's path"
                    .into(),
            )
        } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            Some(format!(
                "the proxy's role may not create or use schema {schema}: have an \
                 administrator create it for that role once (docs/operations.md, \
                 \"Least privileges\"), or give [claims] dsn a role that may"
            ))
        } else {
            None
        };
    }
    // The client's own refusal, before the server could say anything:
    // the server asked for a password and none was given.
    chain(e)
        .to_string()
        .contains("password missing")
        .then(|| format!("the server asks for a password and none is given: set {PASSWORD_KEYS}"))
}

/// The fix of a password that could not be read, `None` for a command
/// that timed out (its token service may be back at the next connect).
pub(super) fn credential_fix(e: &CredentialError) -> Option<String> {
    match e {
        CredentialError::Timeout { .. } => None,
        CredentialError::File { .. } | CredentialError::EmptyFile(_) => Some(
            "make claims.password_file (RESUMEGUARD_CLAIMS_PASSWORD_FILE) a readable file \
             holding the password"
                .into(),
        ),
        _ => Some(
            "make claims.password_command (RESUMEGUARD_CLAIMS_PASSWORD_COMMAND) exit 0 \
             and print the password"
                .into(),
        ),
    }
}
