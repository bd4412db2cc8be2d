//! rustls configurations built from PEM files at startup: the proxy's
//! certificate towards clients, and the trust (and client certificate)
//! it uses towards the upstream server. A file that does not load stops
//! the proxy before it serves anything.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::{VerifierBuilderError, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub use super::server_cert_verifier::Verify;
use super::server_cert_verifier::{RootsFrom, UpstreamVerifier};

/// The ALPN name of the PostgreSQL protocol (direct TLS, PostgreSQL 17).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// The `sslrootcert` value that means the operating system's store, as
/// in libpq.
pub const SYSTEM_ROOTS: &str = "system";

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
    #[error(
        "no trusted root certificate in the system's store ({errors}); install the \
         ca-certificates package or give sslrootcert"
    )]
    NoSystemRoots { errors: String },
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

/// The operating system's trusted roots (as OpenSSL finds them: its
/// certificate file and directory, `SSL_CERT_FILE`, `SSL_CERT_DIR`). A
/// store that holds none is an error; unreadable entries beside good ones
/// are logged.
fn system_roots() -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let found = rustls_native_certs::load_native_certs();
    let errors = found
        .errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    if found.certs.is_empty() {
        return Err(TlsConfigError::NoSystemRoots {
            errors: if errors.is_empty() {
                "none found".into()
            } else {
                errors
            },
        });
    }
    if !errors.is_empty() {
        tracing::warn!(%errors, "some of the system's root certificates did not load");
    }
    Ok(found.certs)
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

/// The proxy's side towards the upstream server. `roots`: a PEM file of
/// trusted roots, or `system` for the operating system's store; absent:
/// the system's store too (read only when the chain is checked).
/// `identity`: a client certificate and key to present.
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
    let (anchors, from) = match roots {
        Some(path) if path == Path::new(SYSTEM_ROOTS) => (system_roots()?, RootsFrom::System),
        Some(path) => (
            load_certs(path)?,
            RootsFrom::File(path.display().to_string()),
        ),
        None if verify == Verify::Nothing => (Vec::new(), RootsFrom::System),
        None => (system_roots()?, RootsFrom::System),
    };
    let mut store = RootCertStore::empty();
    if let (Some(path), RootsFrom::File(_)) = (roots, &from) {
        for cert in &anchors {
            store
                .add(cert.clone())
                .map_err(|source| TlsConfigError::RootCertificate {
                    path: path.to_path_buf(),
                    source,
                })?;
        }
    } else {
        store.add_parsable_certificates(anchors.iter().cloned());
    }
    let webpki = match verify {
        Verify::Nothing => None,
        Verify::Chain | Verify::Full => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
                .build()
                .map_err(TlsConfigError::Verifier)?,
        ),
    };
    let verifier = Arc::new(UpstreamVerifier::new(
        verify, webpki, anchors, from, provider,
    ));
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
