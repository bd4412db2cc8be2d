//! A connection to the proxy's own database as a [`PgTarget`] says (TLS
//! where it has it), and the text of a failure of one: what every user of
//! that database (the claims store, the audit trail) connects and reports
//! with.

use postgres::{Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::PgTarget;
use crate::log_text::escaped;
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
/// connecting to server: Connection refused (os error 111)`). The server's
/// message is escaped: it may quote values a client wrote (a key, a
/// thread id in a raised error), and it reaches logs and refusals.
pub fn error_text(e: &postgres::Error) -> String {
    if let Some(why) = certificate_problem(e) {
        return format!("{e}: {why}");
    }
    match e.as_db_error() {
        Some(db) => format!("{} ({})", escaped(db.message()), db.code().code()),
        None => crate::error_chain::chain(e).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_pg_server::PgSchema;

    #[test]
    fn a_servers_message_is_escaped() {
        let db = PgSchema::new("error-text");
        let e = db
            .admin()
            .batch_execute(r"DO $$ BEGIN RAISE EXCEPTION 'thread %', E'x\nFORGED \x1b[31m'; END $$")
            .expect_err("raised");
        let text = error_text(&e);
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        assert!(
            text.contains(r"thread x\nFORGED \u{1b}[31m (P0001)"),
            "{text}"
        );
    }
}
