//! Which failures of the proxy's own connection to its claims database no
//! retry mends (a refused credential, a missing password or database, no
//! right to create the schema, a server certificate the proxy does not
//! trust, a server without the TLS the settings require), and what an
//! operator sets to mend each: `serve` stops at start on these rather than
//! refuse every parked read. Everything else (refused, unreachable, timed
//! out) is transient.

use postgres::error::SqlState;

use crate::claims::error::StoreError;
use crate::error_chain::chain;
use crate::pg::credential::CredentialError;
use crate::wire::server_cert_verifier::certificate_problem;

/// Where the claims connection's TLS is set, as the fixes say it.
const TLS_KEYS: &str = "sslmode and sslrootcert in [claims] dsn (RESUMEGUARD_CLAIMS_DSN), or \
    in the upstream URL or [upstream_tls] when the claims database is the upstream";

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
    // The TLS handshake: the server's certificate is not trusted (wrong
    // name, unknown issuer, expired), or the server offers no TLS where
    // the settings require it. Neither passes by itself.
    if let Some(why) = certificate_problem(e) {
        return Some(format!(
            "{why}; the claims connection checks the certificate as the settings say: \
             set {TLS_KEYS}"
        ));
    }
    let text = chain(e).to_string();
    if text.contains("server does not support TLS") {
        return Some(format!(
            "the server offers no TLS and sslmode=require (or verify-ca, verify-full) \
             requires it: turn ssl on in the server, or set {TLS_KEYS}"
        ));
    }
    // The client's own refusal, before the server could say anything:
    // the server asked for a password and none was given.
    text.contains("password missing")
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use rcgen::{CertificateParams, KeyPair};

    use super::*;
    use crate::claims::postgres::reaped::reaped;
    use crate::pg::connect::connect;
    use crate::pg::PgTarget;
    use crate::wire::tls_config::server_config;

    /// A listener that answers one connection's SSLRequest with `answer`
    /// and, on `S`, runs the TLS handshake with the certificate of
    /// `name` (it never gets as far as PostgreSQL's startup).
    fn tls_endpoint(answer: u8, name: &str) -> (u16, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "rg-fault-{}-{}",
            std::process::id(),
            name.replace('.', "-")
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (crt, pem) = (dir.join("server.crt"), dir.join("server.key"));
        std::fs::write(&crt, cert.pem()).unwrap();
        std::fs::write(&pem, key.serialize_pem()).unwrap();
        let config = server_config(&crt, &pem).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let Ok((mut sock, _)) = listener.accept() else {
                return;
            };
            let mut request = [0u8; 8];
            if sock.read_exact(&mut request).is_err() || sock.write_all(&[answer]).is_err() {
                return;
            }
            if answer == b'S' {
                if let Ok(mut tls) = rustls::ServerConnection::new(config) {
                    while tls.is_handshaking() && tls.complete_io(&mut sock).is_ok() {}
                }
            }
        });
        (port, crt)
    }

    fn refusal(dsn: &str) -> postgres::Error {
        let target = PgTarget::from_dsn(dsn).unwrap();
        let config = target.config_now().unwrap();
        connect(&config, &target).err().expect("refused")
    }

    #[test]
    fn a_refused_certificate_is_a_permanent_fault_naming_it_never_a_reaper() {
        let (port, crt) = tls_endpoint(b'S', "db.example.com");
        let e = refusal(&format!(
            "postgres://rg@127.0.0.1:{port}/ck?sslmode=verify-full&sslrootcert={}",
            crt.display()
        ));
        assert!(!reaped(&e), "{e:?}");
        let fix = fix_for(&e, "resumeguard").expect("permanent");
        assert!(
            fix.contains("does not match the host name \"127.0.0.1\"")
                && fix.contains("db.example.com")
                && fix.contains("sslrootcert"),
            "{fix}"
        );

        // A server without TLS under sslmode=require.
        let (port, _) = tls_endpoint(b'N', "no-tls.example.com");
        let e = refusal(&format!(
            "postgres://rg@127.0.0.1:{port}/ck?sslmode=require"
        ));
        assert!(!reaped(&e), "{e:?}");
        let fix = fix_for(&e, "resumeguard").expect("permanent");
        assert!(fix.contains("offers no TLS"), "{fix}");

        // Refused at once: an outage to back off from, not a reaper.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let e = refusal(&format!(
            "postgres://rg@127.0.0.1:{port}/ck?sslmode=disable"
        ));
        assert!(!reaped(&e), "{e:?}");
        assert_eq!(fix_for(&e, "resumeguard"), None);
    }
}
