//! rustls configurations built from PEM files at startup: the proxy's
//! certificate towards clients, and the trust (and client certificate)
//! it uses towards the upstream server. A file that does not load stops
//! the proxy before it serves anything.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{VerifierBuilderError, WebPkiServerVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};

use super::client_stream::ALPN_POSTGRESQL;

/// A TLS file that does not load, or a TLS setting rustls refuses; each
/// names the file(s) involved.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("reading certificates from {}", .path.display())]
    ReadCerts { path: PathBuf, source: pem::Error },
    #[error("parsing certificates in {}", .path.display())]
    ParseCerts { path: PathBuf, source: pem::Error },
    #[error("{} holds no PEM certificate", .path.display())]
    NoCertificate { path: PathBuf },
    #[error("reading a PEM private key from {}", .path.display())]
    ReadKey { path: PathBuf, source: pem::Error },
    #[error("certificate {} with key {}", .cert.display(), .key.display())]
    ServerIdentity {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("client certificate {} with key {}", .cert.display(), .key.display())]
    ClientIdentity {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("a root certificate in {}", .path.display())]
    RootCertificate {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("building the upstream certificate verifier")]
    Verifier(#[source] VerifierBuilderError),
    /// The provider's protocol versions (never expected with ring).
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// The one crypto provider: ring.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let path_buf = || path.to_path_buf();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsConfigError::ReadCerts {
            path: path_buf(),
            source,
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsConfigError::ParseCerts {
            path: path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsConfigError::NoCertificate { path: path_buf() });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsConfigError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsConfigError::ReadKey {
        path: path.to_path_buf(),
        source,
    })
}

/// The proxy's side towards clients: its certificate chain and key.
/// ALPN "postgresql" is offered (clients that send none are served too).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .map_err(|source| TlsConfigError::ServerIdentity {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            source,
        })?;
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Arc::new(config))
}

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

/// The proxy's side towards the upstream server. `roots`: a PEM file of
/// trusted roots; absent: Mozilla's roots (webpki-roots). `identity`: a
/// client certificate and key to present.
pub fn client_config(
    verify: Verify,
    roots: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    sni: bool,
) -> Result<Arc<ClientConfig>, TlsConfigError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .dangerous();
    let mut store = RootCertStore::empty();
    match roots {
        Some(path) => {
            for cert in load_certs(path)? {
                store
                    .add(cert)
                    .map_err(|source| TlsConfigError::RootCertificate {
                        path: path.to_path_buf(),
                        source,
                    })?;
            }
        }
        None => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .build()
        .map_err(TlsConfigError::Verifier)?;
    let verifier = Arc::new(UpstreamVerifier {
        verify,
        webpki,
        provider,
    });
    let builder = builder.with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|source| TlsConfigError::ClientIdentity {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                source,
            })?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    config.enable_sni = sni;
    Ok(Arc::new(config))
}

/// libpq's checks: none, the chain, or the chain and the name. The
/// handshake's signatures are always checked against the presented
/// certificate.
#[derive(Debug)]
struct UpstreamVerifier {
    verify: Verify,
    webpki: Arc<WebPkiServerVerifier>,
    provider: Arc<CryptoProvider>,
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
        if self.verify == Verify::Nothing {
            return Ok(ServerCertVerified::assertion());
        }
        let checked =
            self.webpki
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        match checked {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.verify == Verify::Chain => Ok(ServerCertVerified::assertion()),
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
