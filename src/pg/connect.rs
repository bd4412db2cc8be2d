//! A connection to the proxy's own database as a [`PgTarget`] says (TLS
//! where it has it), and the text of a failure of one: what every user of
//! that database (the claims store, the audit trail) connects and reports
//! with.

use postgres::{Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::PgTarget;
use crate::wire::server_cert_verifier::certificate_problem;

/// A connection with `config`, over TLS where `target` has it (its
/// `sslmode` says whether TLS is required or only preferred).
pub fn connect(config: &postgres::Config, target: &PgTarget) -> Result<Client, postgres::Error> {
    match target.tls() {
        Some(tls) => config.connect(MakeRustlsConnect::new((**tls).clone())),
        None => config.connect(NoTls),
    }
}

/// The server's message, with its SQLSTATE, or the client's with every
/// cause under it (`invalid configuration: password missing`, `error
/// connecting to server: Connection refused (os error 111)`).
pub fn error_text(e: &postgres::Error) -> String {
    if let Some(why) = certificate_problem(e) {
        return format!("{e}: {why}");
    }
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => crate::error_chain::chain(e).to_string(),
    }
}
