//! Why a configuration cannot be used: the file, the key or the upstream
//! URL value at fault, and the cause beneath it. The proxy refuses to start
//! on any of these.

use std::path::PathBuf;

use crate::claims::location::BackendError;
use crate::policy::RuleError;
use crate::wire::tls_config::TlsConfigError;
use crate::wire::upstream_tls::UpstreamTlsError;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("in config {}", .path.display())]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("upstream TLS")]
    UpstreamTls(#[source] UpstreamTlsError),
    #[error(transparent)]
    ClaimsBackend(#[from] BackendError),
    #[error("client TLS")]
    ClientTls(#[source] TlsConfigError),
    #[error("tls.require (--require-tls) needs a certificate: tls.cert and tls.key")]
    RequireTlsWithoutCertificate,
    #[error("tls.cert and tls.key (--tls-cert, --tls-key) go together")]
    HalfClientTls,
    /// A channel rule that does not load (its file and line).
    #[error(transparent)]
    Rules(#[from] RuleError),
    #[error("claims.policy must be \"wait\" or \"refuse\", not {0:?}")]
    ClaimsPolicy(String),
    #[error("claims.inspection_application_names: {pattern:?}")]
    InspectionPattern {
        pattern: String,
        source: regex::Error,
    },
    #[error("upstream URL scheme {0:?} is not postgres://")]
    UpstreamScheme(String),
    #[error("upstream {0:?} names no host")]
    UpstreamHost(String),
    #[error("upstream sslsni must be 0 or 1, not {0:?}")]
    UpstreamSni(String),
    #[error(
        "upstream URL parameter {key}={value} is not supported by the proxy \
         (supported: sslmode, sslrootcert, sslcert, sslkey, sslsni)"
    )]
    UpstreamParameter { key: String, value: String },
    #[error("bad %-escape in upstream URL value {0:?}")]
    UpstreamEscape(String),
    #[error("upstream URL value {0:?} is not UTF-8")]
    UpstreamUtf8(String),
}
