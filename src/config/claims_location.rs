//! Where the claims database is: `[claims] dsn`, else the upstream the
//! proxy fronts, else the managed server. The SQLite claims backend was
//! retired (it kept a second copy of the claims rules, on the host's
//! clock): a configuration that still names it is refused, saying what
//! to remove.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};
use crate::pg::upstream_addr;
use crate::pg::{PgTarget, TargetError};
use crate::wire::upstream::UpstreamAddr;
use crate::wire::upstream_tls::{UpstreamTls, UpstreamTlsError};

/// What every refusal of the retired backend's keys starts with.
const RETIRED: &str = "the SQLite claims backend was retired: claims live in PostgreSQL \
    (the database the proxy fronts by default, or [claims] dsn)";

/// A `[claims] backend` or `store` no build serves.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "{RETIRED}; remove claims.backend = \"sqlite\" ([claims] backend, \
         RESUMEGUARD_CLAIMS_BACKEND)"
    )]
    SqliteRetired,
    #[error(
        "{RETIRED}; remove claims.store = {} ([claims] store, RESUMEGUARD_CLAIMS_STORE, \
         --claims-store, claims list/release --store)",
        .0.display()
    )]
    StoreRetired(PathBuf),
    #[error("claims.backend must be \"postgres\", not {0:?}")]
    UnknownBackend(String),
}

/// `[claims] backend` as written: `postgres`, the only backend served;
/// [`check_backend`] refuses the others, saying why.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(from = "String", into = "String")]
pub enum ClaimsBackend {
    Postgres,
    /// The retired SQLite backend.
    Sqlite,
    /// A name no build ever served.
    Unknown(String),
}

impl From<String> for ClaimsBackend {
    fn from(name: String) -> ClaimsBackend {
        match name.as_str() {
            "postgres" => ClaimsBackend::Postgres,
            "sqlite" => ClaimsBackend::Sqlite,
            _ => ClaimsBackend::Unknown(name),
        }
    }
}

impl From<ClaimsBackend> for String {
    fn from(backend: ClaimsBackend) -> String {
        match backend {
            ClaimsBackend::Postgres => "postgres".to_owned(),
            ClaimsBackend::Sqlite => "sqlite".to_owned(),
            ClaimsBackend::Unknown(name) => name,
        }
    }
}

/// Refuses `[claims] backend` other than `postgres` and any `[claims]
/// store`: `serve`, `config check`, a reload and the operator commands
/// check it first.
pub fn check_backend(cfg: &Config) -> Result<(), BackendError> {
    let c = &cfg.claims;
    if let Some(file) = &c.store {
        return Err(BackendError::StoreRetired(file.clone()));
    }
    match &c.backend {
        None | Some(ClaimsBackend::Postgres) => Ok(()),
        Some(ClaimsBackend::Sqlite) => Err(BackendError::SqliteRetired),
        Some(ClaimsBackend::Unknown(other)) => Err(BackendError::UnknownBackend(other.clone())),
    }
}

/// A claims configuration that names no usable database.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error(
        "the PostgreSQL claims store needs a database: no upstream, no managed server \
         running, no [claims] dsn"
    )]
    NoDatabase,
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Config(#[from] Box<ConfigError>),
    #[error(transparent)]
    Tls(#[from] UpstreamTlsError),
}

/// The PostgreSQL database of the shared schema: the claims, and the
/// audit trail of every replica. `managed` is the managed server's socket
/// when the proxy runs one (no upstream configured); its superuser is
/// `postgres`.
pub fn postgres_target(
    cfg: &Config,
    managed: Option<&UpstreamAddr>,
) -> Result<PgTarget, LocationError> {
    let bound = Duration::from_millis(cfg.claims.liveness_bound_ms);
    let command = cfg.claims.password_command.as_deref();
    let file = cfg.claims.password_file.as_deref();
    if let Some(dsn) = &cfg.claims.dsn {
        let target = PgTarget::from_dsn(dsn)?.with_password_from(command, file)?;
        return Ok(target.with_liveness_bound(bound));
    }
    let target = match (managed, cfg.upstream.as_deref()) {
        (Some(socket), _) => {
            PgTarget::from_upstream(Some("postgres://postgres@/postgres"), socket)?
        }
        (None, Some(spec)) => {
            // The proxy's own connections take the upstream's TLS settings.
            let addr = upstream_addr(spec).map_err(|e| Box::new(ConfigError::from(e)))?;
            let params = cfg.upstream_tls_params().map_err(Box::new)?;
            let tls = UpstreamTls::build(&addr, &params)?;
            PgTarget::from_upstream(Some(spec), &addr)?.with_tls(tls.mode, tls.client_config())
        }
        (None, None) => return Err(LocationError::NoDatabase),
    };
    Ok(target
        .with_password_from(command, file)?
        .with_liveness_bound(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(toml_text: &str) -> Config {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn postgres_is_the_only_backend_and_the_sqlite_keys_say_they_were_retired() {
        assert!(check_backend(&cfg("")).is_ok());
        assert!(check_backend(&cfg("[claims]\nbackend = 'postgres'")).is_ok());
        let store = check_backend(&cfg("[claims]\nstore = '/x/c.db'")).unwrap_err();
        let text = store.to_string();
        assert!(
            text.starts_with("the SQLite claims backend was retired")
                && text.contains("remove claims.store = /x/c.db"),
            "{text}"
        );
        let sqlite = check_backend(&cfg("[claims]\nbackend = 'sqlite'")).unwrap_err();
        assert!(
            sqlite
                .to_string()
                .contains("remove claims.backend = \"sqlite\""),
            "{sqlite}"
        );
        assert!(check_backend(&cfg("[claims]\nbackend = 'redis'")).is_err());
    }

    #[test]
    fn the_upstream_is_the_store_with_its_tls_settings() {
        let at = postgres_target(&cfg("upstream = 'postgres://app@db:6000/ck'"), None).unwrap();
        assert_eq!(at.shown(), "postgres app@db:6000/ck");
        assert_eq!(at.sslmode(), "prefer", "libpq's default");
        let tls = cfg("upstream = 'postgres://app@db:6000/ck?sslmode=require'");
        assert_eq!(postgres_target(&tls, None).unwrap().sslmode(), "require");
        let off = cfg("upstream = 'postgres://app@db:6000/ck?sslmode=disable'");
        assert_eq!(postgres_target(&off, None).unwrap().sslmode(), "disable");
        let missing_roots = cfg(
            "upstream = 'postgres://app@db:6000/ck?sslmode=verify-full&sslrootcert=/no/ca.pem'",
        );
        let err = postgres_target(&missing_roots, None).unwrap_err();
        assert!(
            crate::error_chain::chain(&err)
                .to_string()
                .contains("/no/ca.pem"),
            "{err}"
        );
        let dsn = cfg(
            "upstream = 'db?sslmode=require'\n[claims]\ndsn = 'host=/run/pg user=rg dbname=ck'",
        );
        assert!(postgres_target(&dsn, None).is_ok());
        let managed = UpstreamAddr::Unix("/s/postgres/.s.PGSQL.6001".into());
        let at = postgres_target(&cfg(""), Some(&managed)).unwrap();
        assert_eq!(at.shown(), "postgres postgres@/s/postgres:6001/postgres");
    }
}
