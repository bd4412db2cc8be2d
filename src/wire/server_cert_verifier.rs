//! How the proxy checks the upstream server's certificate, as libpq does:
//! none, the chain, or the chain and the host name — and, as libpq, a
//! certificate that is itself one of the trusted roots (an ordinary
//! self-signed server certificate given as `sslrootcert`) is accepted,
//! which webpki alone refuses (`CaUsedAsEndEntity`). The data path and
//! the claims/audit connections use this one verifier; their errors name
//! the certificate problem through [`certificate_problem`].

use std::error::Error as StdError;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Encryption only (sslmode prefer / require without a root file).
    Nothing,
    /// The chain up to a trusted root, any host name (verify-ca).
    Chain,
    /// The chain and the host name (verify-full).
    Full,
}

/// Where the trusted roots came from, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootsFrom {
    /// An `sslrootcert` PEM file.
    File(String),
    /// The operating system's store (`sslrootcert=system`, or none given).
    System,
}

impl std::fmt::Display for RootsFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootsFrom::File(path) => write!(f, "sslrootcert {path}"),
            RootsFrom::System => write!(f, "the system's trust store"),
        }
    }
}

/// A certificate refused for a reason rustls has no words for.
#[derive(Debug, thiserror::Error)]
pub enum CertificateProblem {
    #[error(
        "the server's certificate is self-signed and is not one of the roots in {roots} \
         (give that certificate as sslrootcert to trust it)"
    )]
    SelfSignedNotTrusted { roots: RootsFrom },
    #[error("the server's certificate is not issued by a root in {roots} (unknown issuer)")]
    UnknownIssuer { roots: RootsFrom },
}

/// libpq's checks: none, the chain, or the chain and the name. The
/// handshake's signatures are always checked against the presented
/// certificate.
#[derive(Debug)]
pub struct UpstreamVerifier {
    verify: Verify,
    /// The chain check; `None` under [`Verify::Nothing`] (no roots read).
    webpki: Option<Arc<WebPkiServerVerifier>>,
    /// The roots' own certificates, DER, for the self-signed case.
    anchors: Vec<CertificateDer<'static>>,
    roots: RootsFrom,
    provider: Arc<CryptoProvider>,
}

impl UpstreamVerifier {
    pub fn new(
        verify: Verify,
        webpki: Option<Arc<WebPkiServerVerifier>>,
        anchors: Vec<CertificateDer<'static>>,
        roots: RootsFrom,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        UpstreamVerifier {
            verify,
            webpki,
            anchors,
            roots,
            provider,
        }
    }

    /// The end-entity certificate is, byte for byte, a trusted root: libpq
    /// accepts it (OpenSSL finds it in the store). Its dates were checked
    /// by webpki before the error that brings it here (validity comes
    /// before basic constraints and the issuer search); its name is
    /// checked here under verify-full.
    fn anchor_itself(
        &self,
        end_entity: &CertificateDer<'_>,
        server_name: &ServerName<'_>,
    ) -> Result<bool, rustls::Error> {
        if !self
            .anchors
            .iter()
            .any(|a| a.as_ref() == end_entity.as_ref())
        {
            return Ok(false);
        }
        if self.verify == Verify::Full {
            verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
        }
        Ok(true)
    }
}

impl ServerCertVerifier for UpstreamVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = self
            .webpki
            .as_ref()
            .filter(|_| self.verify != Verify::Nothing)
        else {
            return Ok(ServerCertVerified::assertion());
        };
        let checked = webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        let not_trusted = |problem: CertificateProblem| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                problem,
            ))))
        };
        match checked {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.verify == Verify::Chain => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(other)))
                if is_ca_used_as_end_entity(&other) =>
            {
                if self.anchor_itself(end_entity, server_name)? {
                    return Ok(ServerCertVerified::assertion());
                }
                Err(not_trusted(CertificateProblem::SelfSignedNotTrusted {
                    roots: self.roots.clone(),
                }))
            }
            Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
                if self.anchor_itself(end_entity, server_name)? {
                    return Ok(ServerCertVerified::assertion());
                }
                Err(not_trusted(CertificateProblem::UnknownIssuer {
                    roots: self.roots.clone(),
                }))
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// rustls passes webpki's `CaUsedAsEndEntity` on as an opaque "other"
/// error.
fn is_ca_used_as_end_entity(other: &OtherError) -> bool {
    other.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity)
}

/// The certificate problem in `error`'s chain, in words: wrong host name,
/// expired, not yet valid, unknown issuer, self-signed and not trusted;
/// `None` when the chain holds no refused certificate. Finds a rustls
/// error inside an `io::Error` too (where TLS streams put it).
pub fn certificate_problem(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(rustls::Error::InvalidCertificate(c)) = as_rustls(e) {
            return Some(describe(c));
        }
        cause = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

fn as_rustls<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    e.downcast_ref::<rustls::Error>()
}

/// A name as rustls presents it (`DnsName("db.example.com")`,
/// `IpAddress(10.0.0.1)`), as a user writes it.
fn bare_name(presented: &str) -> &str {
    presented
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .map_or(presented, |inner| inner.trim_matches('"'))
}

fn describe(c: &CertificateError) -> String {
    match c {
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => {
            let names = if presented.is_empty() {
                "no host name".to_owned()
            } else {
                presented
                    .iter()
                    .map(|p| bare_name(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "the server's certificate does not match the host name {:?} (it is valid for \
                 {names}); verify-full checks the name: connect by a name the certificate \
                 carries",
                expected.to_str()
            )
        }
        CertificateError::NotValidForName => {
            "the server's certificate does not match the host name (verify-full checks it)"
                .to_owned()
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            format!("the server's certificate has expired ({c})")
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            format!("the server's certificate is not valid yet ({c})")
        }
        CertificateError::UnknownIssuer => {
            "the server's certificate is not issued by a trusted root (unknown issuer)".to_owned()
        }
        CertificateError::Other(OtherError(inner)) => {
            match inner.downcast_ref::<CertificateProblem>() {
                Some(problem) => problem.to_string(),
                None => format!("the server's certificate is refused: {inner}"),
            }
        }
        other => format!("the server's certificate is refused: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    use crate::wire::client_stream::tests::{handshake, scratch};
    use crate::wire::tls_config::{client_config, server_config};

    use super::*;

    /// A self-signed CA:TRUE certificate for `name` (what `openssl req
    /// -x509` makes), valid until `not_after_year`; written to `dir` as
    /// `<tag>.crt` and `<tag>.key`.
    fn ca_server(dir: &Path, tag: &str, name: &str, not_after_year: i32) -> std::path::PathBuf {
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after_year, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{tag}.crt"));
        std::fs::write(&path, cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{tag}.key")), key.serialize_pem()).unwrap();
        path
    }

    fn refusal(verify: Verify, root: &Path, served: &Path) -> Option<String> {
        let client = client_config(verify, Some(root), None, true).unwrap();
        let server = server_config(served, &served.with_extension("key")).unwrap();
        handshake(client, server)
            .err()
            .map(|e| certificate_problem(&e).unwrap_or_else(|| format!("unnamed: {e}")))
    }

    #[test]
    fn a_self_signed_certificate_that_is_the_root_is_accepted_as_libpq_does() {
        let dir = scratch("anchor-itself");
        let good = ca_server(&dir, "good", "localhost", 2090);
        assert_eq!(refusal(Verify::Full, &good, &good), None);
        assert_eq!(refusal(Verify::Chain, &good, &good), None);

        let other_name = ca_server(&dir, "other", "db.example.com", 2090);
        let why = refusal(Verify::Full, &other_name, &other_name).unwrap();
        assert!(
            why.contains("does not match the host name \"localhost\""),
            "{why}"
        );
        assert!(why.contains("(it is valid for db.example.com)"), "{why}");
        assert_eq!(refusal(Verify::Chain, &other_name, &other_name), None);

        let why = refusal(Verify::Full, &good, &other_name).unwrap();
        assert!(
            why.contains("self-signed and is not one of the roots"),
            "{why}"
        );
        assert!(why.contains("good.crt"), "{why}");

        let expired = ca_server(&dir, "expired", "localhost", 2001);
        let why = refusal(Verify::Full, &expired, &expired).unwrap();
        assert!(why.contains("has expired"), "{why}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
