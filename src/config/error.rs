//! Why a configuration cannot be used: the file, the key or the upstream
//! URL value at fault, and the cause beneath it. The proxy refuses to start
//! on any of these.

use std::path::PathBuf;

use super::claims_location::BackendError;
use crate::pg::ConnectionStringError;
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
    /// A `RESUMEGUARD_*` variable whose value does not fit its key.
    #[error(
        "environment variable {var}{}: {reason}",
        .value.as_ref().map(|v| format!("={v:?}")).unwrap_or_default()
    )]
    Env {
        var: String,
        /// The value as given (`None`: read from a file, maybe a secret).
        value: Option<String>,
        /// Why the last reading of the value did not fit (in the text,
        /// not the error's source: the message carries it whole).
        reason: serde_json::Error,
    },
    #[error("environment variable {var}: reading {}", .path.display())]
    EnvFile {
        var: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("environment variables {var} and {var}_FILE are both set")]
    EnvTwice { var: String },
    #[error("environment variable {0} is not UTF-8")]
    EnvNotUtf8(String),
    /// The layers did not make a configuration (a flag's value).
    #[error("combining the configuration's layers")]
    Layers(#[source] serde_json::Error),
    #[error("admin.token_file: reading {}", .path.display())]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("admin.token_file {} is empty", .0.display())]
    EmptyTokenFile(PathBuf),
    #[error("admin.token and admin.token_file are both set in one place")]
    TokenTwice,
    #[error(
        "no upstream is configured (upstream, RESUMEGUARD_UPSTREAM, --upstream) and the \
         managed PostgreSQL is off (managed.enabled = false)"
    )]
    NoUpstream,
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
    /// An address (the upstream, `[claims] dsn`) that cannot be read.
    #[error(transparent)]
    ConnectionString(#[from] ConnectionStringError),
}
