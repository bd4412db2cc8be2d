//! Which claims backend a configuration names, and where its store is:
//! PostgreSQL by default (`[claims] dsn`, else the upstream the proxy
//! fronts, else the managed server), SQLite when `backend = "sqlite"` or a
//! `[claims] store` file is given.

use std::path::PathBuf;
use std::time::Duration;

use super::backend::StoreLocation;
use super::postgres::{PgTarget, TargetError};
use crate::config::{upstream_addr, Config, ConfigError};
use crate::wire::upstream::UpstreamAddr;
use crate::wire::upstream_tls::{UpstreamTls, UpstreamTlsError};

/// `[claims] backend` and `store` that contradict each other.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "claims.store {} names a SQLite file but claims.backend is \"postgres\": \
         drop one of them",
        .0.display()
    )]
    StoreWithPostgres(PathBuf),
    #[error("claims.backend must be \"postgres\" or \"sqlite\", not {0:?}")]
    UnknownBackend(String),
}

/// A claims configuration that names no usable store.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error(transparent)]
    Backend(#[from] BackendError),
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

/// The configured backend, before the upstream is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Sqlite(PathBuf),
    Postgres,
}

impl Backend {
    /// `[claims] backend` and `store` checked against each other.
    pub fn of(cfg: &Config) -> Result<Backend, BackendError> {
        let c = &cfg.claims;
        match (c.backend.as_deref(), &c.store) {
            (Some("sqlite"), _) | (None, Some(_)) => Ok(Backend::Sqlite(cfg.claims_store_path())),
            (Some("postgres") | None, None) => Ok(Backend::Postgres),
            (Some("postgres"), Some(f)) => Err(BackendError::StoreWithPostgres(f.clone())),
            (Some(other), _) => Err(BackendError::UnknownBackend(other.to_owned())),
        }
    }
}

/// Where the claims of `cfg` live. `managed` is the managed server's
/// socket when the proxy runs one (no upstream configured); its superuser
/// is `postgres`.
pub fn store_location(
    cfg: &Config,
    managed: Option<&UpstreamAddr>,
) -> Result<StoreLocation, LocationError> {
    let target = match Backend::of(cfg)? {
        Backend::Sqlite(path) => return Ok(StoreLocation::Sqlite(path)),
        Backend::Postgres => postgres_target(cfg, managed)?,
    };
    Ok(StoreLocation::Postgres(Box::new(target)))
}

/// The PostgreSQL database of the shared schema, whichever claims backend
/// is configured (the audit trail of every replica is kept there too).
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
            let addr = upstream_addr(spec).map_err(Box::new)?;
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
    fn postgres_is_the_default_and_a_store_file_means_sqlite() {
        assert_eq!(Backend::of(&cfg("")).unwrap(), Backend::Postgres);
        assert_eq!(
            Backend::of(&cfg("[claims]\nstore = '/x/c.db'")).unwrap(),
            Backend::Sqlite("/x/c.db".into())
        );
        assert_eq!(
            Backend::of(&cfg("state_dir = '/s'\n[claims]\nbackend = 'sqlite'")).unwrap(),
            Backend::Sqlite("/s/claims.sqlite".into())
        );
        assert!(Backend::of(&cfg("[claims]\nbackend = 'postgres'\nstore = '/x'")).is_err());
        assert!(Backend::of(&cfg("[claims]\nbackend = 'redis'")).is_err());
    }

    #[test]
    fn the_upstream_is_the_store_with_its_tls_settings() {
        let sslmode = |at: StoreLocation| match at {
            StoreLocation::Postgres(t) => t.sslmode(),
            StoreLocation::Sqlite(_) => "sqlite",
        };
        let at = store_location(&cfg("upstream = 'postgres://app@db:6000/ck'"), None).unwrap();
        assert_eq!(at.shown(), "postgres app@db:6000/ck");
        assert_eq!(sslmode(at), "prefer", "libpq's default");
        let tls = cfg("upstream = 'postgres://app@db:6000/ck?sslmode=require'");
        assert_eq!(sslmode(store_location(&tls, None).unwrap()), "require");
        let off = cfg("upstream = 'postgres://app@db:6000/ck?sslmode=disable'");
        assert_eq!(sslmode(store_location(&off, None).unwrap()), "disable");
        let missing_roots = cfg(
            "upstream = 'postgres://app@db:6000/ck?sslmode=verify-full&sslrootcert=/no/ca.pem'",
        );
        let err = store_location(&missing_roots, None).unwrap_err();
        assert!(
            crate::error_chain::chain(&err)
                .to_string()
                .contains("/no/ca.pem"),
            "{err}"
        );
        let dsn = cfg(
            "upstream = 'db?sslmode=require'\n[claims]\ndsn = 'host=/run/pg user=rg dbname=ck'",
        );
        assert!(store_location(&dsn, None).is_ok());
        let managed = UpstreamAddr::Unix("/s/postgres/.s.PGSQL.6001".into());
        let at = store_location(&cfg(""), Some(&managed)).unwrap();
        assert_eq!(at.shown(), "postgres postgres@/s/postgres:6001/postgres");
    }
}
