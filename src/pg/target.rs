//! Where the PostgreSQL database of the claims store and the audit trail
//! is: connection parameters taken from the upstream the proxy fronts (or
//! a separate `[claims] dsn`), its TLS, where its password comes from
//! (read at each connect, `credential`), and the bound within which a
//! network partition between the proxy and that database ends its
//! connections, on both ends (`dead_peer`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use rustls::ClientConfig;

use super::credential::{ConnectingTo, CredentialError, PasswordSource};
use super::dead_peer::DeadPeer;
use crate::pg::connection_string::{connection_string, Form};
use crate::pg::{address_of, url_tls_params, ConnectionStringError};
use crate::wire::tls_config::{self, TlsConfigError, Verify};
use crate::wire::upstream::UpstreamAddr;
use crate::wire::upstream_tls::{
    SslMode as UpstreamSslMode, UpstreamTls, UpstreamTlsError, UpstreamTlsParams,
};

/// The schema every replica shares.
pub const DEFAULT_SCHEMA: &str = "resumeguard";

/// Default bound for a partition to end the store's connections: the
/// server's keepalive probes and TCP user timeout on the lock connection
/// end it (and so the proxy's liveness lock) within this long, and the
/// proxy's own on every connection fail a statement waiting on a silent
/// database within this long.
pub const DEFAULT_LIVENESS_BOUND: Duration = Duration::from_secs(10);

/// A claims database that cannot be named.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("claims.dsn")]
    Dsn(#[source] Box<ConnectionStringError>),
    #[error("upstream")]
    Upstream(#[source] Box<ConnectionStringError>),
    #[error("claims.dsn's TLS settings")]
    DsnTls(#[source] Box<UpstreamTlsError>),
    #[error(
        "claims.password_command and claims.password_file are both set: keep the one \
         the password comes from"
    )]
    TwoPasswordSources,
    #[error("upstream {0:?} has no port")]
    NoPort(String),
    #[error("upstream port {port:?}")]
    Port {
        port: String,
        source: std::num::ParseIntError,
    },
    #[error("upstream socket {0:?} is not <dir>/.s.PGSQL.<port>")]
    Socket(String),
    #[error("TLS for claims.dsn")]
    Tls(#[source] TlsConfigError),
    #[error("claims schema {0:?}: lower-case letters, digits and _ only")]
    Schema(String),
}

/// How the claims store reaches its database.
#[derive(Clone)]
pub struct PgTarget {
    config: postgres::Config,
    /// TLS for `sslmode` prefer and require (`config` says which); `None`:
    /// plaintext only.
    tls: Option<Arc<ClientConfig>>,
    /// The `sslmode` the TLS settings came from (`tls` verifies as it
    /// says), as shown.
    mode: UpstreamSslMode,
    /// `user@host:port/db`, as shown in errors (never the password).
    shown: String,
    schema: String,
    /// Where the password comes from, read at each connect.
    password: PasswordSource,
    /// Within how long a partition ends the connections: the server's
    /// end of the liveness lock connection (then the lock goes) and the
    /// proxy's end of every connection (then what waits on it fails).
    liveness_bound: Duration,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget")
            .field("at", &self.shown)
            .field("schema", &self.schema)
            .field("password", &self.password)
            .field("liveness_bound", &self.liveness_bound)
            .finish()
    }
}

impl PgTarget {
    /// A libpq-style DSN or `postgres://` URL (`[claims] dsn`); a password
    /// it does not give comes from `PGPASSWORD` or the password file. Its
    /// TLS is read and checked as the upstream's: a URL's `sslmode`
    /// (`disable`, `prefer`, `require`, `verify-ca`, `verify-full`),
    /// `sslrootcert` (a PEM file, or `system`), `sslcert`/`sslkey`,
    /// `sslsni`; a `key=value` DSN's `sslmode` is the postgres crate's
    /// (`disable`, `prefer`, `require`).
    pub fn from_dsn(dsn: &str) -> Result<PgTarget, TargetError> {
        let unread = |e| TargetError::Dsn(Box::new(e));
        let parsed = connection_string(dsn).map_err(unread)?;
        let mut params = UpstreamTlsParams::default();
        match parsed.form {
            // A short form (`host:port?sslmode=…`) is read as the URL it
            // stands for.
            Form::Url if !dsn.contains("://") => {
                url_tls_params(&format!("postgres://{dsn}"), &mut params).map_err(unread)?
            }
            Form::Url => url_tls_params(dsn, &mut params).map_err(unread)?,
            Form::KeyValue => {
                params.sslmode = Some(
                    match parsed.config.get_ssl_mode() {
                        SslMode::Disable => "disable",
                        SslMode::Require => "require",
                        _ => "prefer",
                    }
                    .to_owned(),
                )
            }
        }
        let target = PgTarget::finish(parsed.config)?;
        let addr = address_of(&target.config, dsn).map_err(unread)?;
        let tls =
            UpstreamTls::build(&addr, &params).map_err(|e| TargetError::DsnTls(Box::new(e)))?;
        Ok(target.with_tls(tls.mode, tls.client_config()))
    }

    /// The upstream the proxy fronts: its address, and user, database and
    /// password from `spec` when it is a `postgres://` URL (else `PGUSER`,
    /// `PGDATABASE`, `postgres`).
    pub fn from_upstream(spec: Option<&str>, addr: &UpstreamAddr) -> Result<PgTarget, TargetError> {
        let url = match spec {
            Some(spec) if spec.starts_with('/') || spec.starts_with("unix:") => None,
            Some(spec) => {
                Some(connection_string(spec).map_err(|e| TargetError::Upstream(Box::new(e)))?)
            }
            None => None,
        };
        let url = url.as_ref().map(|u| &u.config);
        let mut config = postgres::Config::new();
        match addr {
            UpstreamAddr::Tcp(hostport) => {
                let (host, port) = hostport
                    .rsplit_once(':')
                    .ok_or_else(|| TargetError::NoPort(hostport.clone()))?;
                let port: u16 = port.parse().map_err(|source| TargetError::Port {
                    port: port.to_owned(),
                    source,
                })?;
                config
                    .host(host.trim_start_matches('[').trim_end_matches(']'))
                    .port(port);
            }
            UpstreamAddr::Unix(socket) => {
                let (dir, file) = socket
                    .rsplit_once('/')
                    .ok_or_else(|| TargetError::Socket(socket.clone()))?;
                let port = file
                    .strip_prefix(".s.PGSQL.")
                    .and_then(|p| p.parse::<u16>().ok())
                    .ok_or_else(|| TargetError::Socket(socket.clone()))?;
                config
                    .host_path(if dir.is_empty() { "/" } else { dir })
                    .port(port);
            }
        }
        let user = url
            .and_then(|u| u.get_user().map(str::to_owned))
            .or_else(|| std::env::var("PGUSER").ok())
            .unwrap_or_else(|| "postgres".into());
        let dbname = url
            .and_then(|u| u.get_dbname().map(str::to_owned))
            .or_else(|| std::env::var("PGDATABASE").ok())
            .unwrap_or_else(|| user.clone());
        config.user(&user).dbname(&dbname);
        if let Some(p) = url.and_then(|u| u.get_password()) {
            config.password(p);
        }
        PgTarget::finish(config)
    }

    fn finish(mut config: postgres::Config) -> Result<PgTarget, TargetError> {
        if config.get_hosts().is_empty() {
            config.host("localhost");
        }
        if config.get_ports().is_empty() {
            config.port(5432);
        }
        if config.get_user().is_none() {
            config.user(&std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into()));
        }
        if config.get_dbname().is_none() {
            let user = config.get_user().unwrap_or("postgres").to_owned();
            config.dbname(&std::env::var("PGDATABASE").unwrap_or(user));
        }
        // A DSN's prefer and require encrypt without verifying the
        // server, as libpq's do; the upstream's own settings (verify-ca,
        // verify-full, roots, client certificate) come in `with_tls`.
        let tls = match config.get_ssl_mode() {
            SslMode::Disable => None,
            _ => Some(
                tls_config::client_config(Verify::Nothing, None, None, true)
                    .map_err(TargetError::Tls)?,
            ),
        };
        config.application_name("resumeguard-claims");
        config.connect_timeout(Duration::from_secs(2));
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().unwrap_or_default().to_owned();
        let db = config.get_dbname().unwrap_or_default().to_owned();
        let password = PasswordSource::choose(None, None, config.get_password());
        let mode = match (config.get_ssl_mode(), &tls) {
            (SslMode::Disable, _) | (_, None) => UpstreamSslMode::Disable,
            (SslMode::Prefer, Some(_)) => UpstreamSslMode::Prefer,
            (_, Some(_)) => UpstreamSslMode::Require,
        };
        let target = PgTarget {
            shown: format!("postgres {user}@{host}:{port}/{db}"),
            config,
            mode,
            tls,
            schema: DEFAULT_SCHEMA.into(),
            password,
            liveness_bound: DEFAULT_LIVENESS_BOUND,
        };
        Ok(target.with_liveness_bound(DEFAULT_LIVENESS_BOUND))
    }

    /// Takes the password from `command` (run at each connect) or `file`
    /// (read at each connect) when either is set (`[claims]
    /// password_command`, `password_file`), over the URL's, `PGPASSWORD`
    /// and the password file.
    pub fn with_password_from(
        mut self,
        command: Option<&str>,
        file: Option<&Path>,
    ) -> Result<PgTarget, TargetError> {
        if command.is_some() && file.is_some() {
            return Err(TargetError::TwoPasswordSources);
        }
        if command.is_some() || file.is_some() {
            self.password = PasswordSource::choose(command, file, None);
        }
        Ok(self)
    }

    /// The connection parameters as configured, without a password read.
    pub fn config(&self) -> &postgres::Config {
        &self.config
    }

    /// The parameters to change (a test's store whose connections carry
    /// an application_name of its own).
    #[cfg(test)]
    pub(crate) fn config_mut(&mut self) -> &mut postgres::Config {
        &mut self.config
    }

    /// TLS for `sslmode` prefer and require; `None`: plaintext only.
    pub fn tls(&self) -> Option<&Arc<ClientConfig>> {
        self.tls.as_ref()
    }

    /// Within how long a partition ends the connections.
    pub fn liveness_bound(&self) -> Duration {
        self.liveness_bound
    }

    /// The connection parameters with the password read now.
    pub fn config_now(&self) -> Result<postgres::Config, CredentialError> {
        let mut config = self.config.clone();
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let to = ConnectingTo {
            host: &host,
            port: config.get_ports().first().copied().unwrap_or(5432),
            db: config.get_dbname().unwrap_or_default(),
            user: config.get_user().unwrap_or_default(),
        };
        if let Some(p) = self.password.read(&to)? {
            config.password(p);
        }
        Ok(config)
    }

    /// Where the password comes from, as said in errors.
    pub fn password_source(&self) -> String {
        self.password.shown()
    }

    /// Connects as the proxy connects to the upstream: plaintext under
    /// `disable`, TLS when the server offers it under `prefer`, TLS
    /// required (verified as `client` verifies: chain, host name, roots,
    /// client certificate) under `require`, `verify-ca`, `verify-full`.
    pub fn with_tls(mut self, mode: UpstreamSslMode, client: Option<Arc<ClientConfig>>) -> Self {
        let ssl_mode = match (mode, &client) {
            (UpstreamSslMode::Disable, _) | (_, None) => SslMode::Disable,
            (UpstreamSslMode::Prefer, Some(_)) => SslMode::Prefer,
            (_, Some(_)) => SslMode::Require,
        };
        self.config.ssl_mode(ssl_mode);
        self.tls = client.filter(|_| ssl_mode != SslMode::Disable);
        self.mode = if self.tls.is_some() {
            mode
        } else {
            UpstreamSslMode::Disable
        };
        self
    }

    /// The database the claims schema is in.
    pub fn database(&self) -> Option<&str> {
        self.config.get_dbname()
    }

    /// The claims schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Keeps the claims in another schema (tests: one per test).
    pub fn with_schema(mut self, schema: &str) -> Result<PgTarget, TargetError> {
        let ok = !schema.is_empty()
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(TargetError::Schema(schema.to_owned()));
        }
        self.schema = schema.into();
        Ok(self)
    }

    /// Sets the bound (at least 2 s) within which a partition ends the
    /// connections: a partitioned proxy's liveness lock goes, and a
    /// statement the proxy sent to a silent database fails (client-side
    /// keepalives and TCP user timeout on every connection made from this
    /// target).
    pub fn with_liveness_bound(mut self, bound: Duration) -> PgTarget {
        self.liveness_bound = bound.max(Duration::from_secs(2));
        DeadPeer::within(self.liveness_bound).apply(&mut self.config);
        self
    }

    /// How the connections use TLS: `disable`, `prefer`, `require`,
    /// `verify-ca` or `verify-full`.
    pub fn sslmode(&self) -> &'static str {
        self.mode.name()
    }

    /// The database as shown in errors.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_sockets_and_urls_become_connection_parameters() {
        let t = PgTarget::from_upstream(
            Some("postgres://app:pw@db.internal:6000/ck"),
            &UpstreamAddr::Tcp("db.internal:6000".into()),
        )
        .unwrap();
        assert_eq!(t.shown(), "postgres app@db.internal:6000/ck");
        assert_eq!(t.config.get_password(), Some(&b"pw"[..]));
        let s = PgTarget::from_upstream(None, &UpstreamAddr::Unix("/run/pg/.s.PGSQL.5433".into()))
            .unwrap();
        assert!(s.shown().contains("/run/pg:5433/"), "{}", s.shown());
        // A DSN's own sslmode: require encrypts (unverified), disable never.
        assert_eq!(
            PgTarget::from_dsn("host=db sslmode=require")
                .unwrap()
                .sslmode(),
            "require"
        );
        assert_eq!(
            PgTarget::from_dsn("host=db sslmode=disable")
                .unwrap()
                .sslmode(),
            "disable"
        );
        assert!(PgTarget::from_dsn("host=db")
            .unwrap()
            .with_schema("Bad;")
            .is_err());
        // A URL's sslmode is read; what a claims DSN cannot do is refused.
        assert_eq!(
            PgTarget::from_dsn("postgres://rg@db/ck?sslmode=require")
                .unwrap()
                .sslmode(),
            "require"
        );
        // The upstream's modes too, with its checks (system roots only
        // under verify-full; no TLS on a Unix socket).
        assert_eq!(
            PgTarget::from_dsn("postgres://rg@db/ck?sslmode=verify-full")
                .unwrap()
                .sslmode(),
            "verify-full"
        );
        assert_eq!(
            PgTarget::from_dsn("db:5433?sslmode=verify-full")
                .unwrap()
                .sslmode(),
            "verify-full"
        );
        assert_eq!(
            PgTarget::from_dsn("postgres://rg@db/ck?sslrootcert=system")
                .unwrap()
                .sslmode(),
            "verify-full"
        );
        assert!(matches!(
            PgTarget::from_dsn("postgres://rg@db/ck?sslmode=verify-ca&sslrootcert=system"),
            Err(TargetError::DsnTls(e)) if matches!(*e, UpstreamTlsError::WeakModeWithSystemRoots(_))
        ));
        assert!(matches!(
            PgTarget::from_dsn("postgres://rg@db/ck?sslmode=verify-full&sslrootcert=/no/ca.pem"),
            Err(TargetError::DsnTls(e)) if matches!(*e, UpstreamTlsError::Files(_))
        ));
        assert!(matches!(
            PgTarget::from_dsn("postgres://rg@db/ck?sslcrl=/x.crl"),
            Err(TargetError::Dsn(_))
        ));
        assert!(matches!(
            PgTarget::from_dsn("postgres://rg@/ck?host=/run/pg&sslmode=require"),
            Err(TargetError::DsnTls(e)) if matches!(*e, UpstreamTlsError::UnixSocket { .. })
        ));
        assert!(matches!(
            PgTarget::from_dsn("postgres//db/ck"),
            Err(TargetError::Dsn(_))
        ));
    }

    #[test]
    fn every_connection_notices_a_silent_database_within_the_bound() {
        let probes = |c: &postgres::Config| {
            (
                c.get_keepalives(),
                c.get_keepalives_idle(),
                c.get_keepalives_interval(),
                c.get_keepalives_retries(),
                c.get_tcp_user_timeout().copied(),
            )
        };
        let s = Duration::from_secs;
        // The default bound, whichever way the target is named.
        let dsn = PgTarget::from_dsn("host=db").unwrap();
        let upstream = PgTarget::from_upstream(None, &UpstreamAddr::Tcp("db:5432".into())).unwrap();
        for t in [&dsn, &upstream] {
            assert_eq!(
                probes(&t.config),
                (true, s(5), Some(s(1)), Some(3), Some(s(10)))
            );
        }
        // A configured bound replaces it; a DSN's own keepalive settings
        // do not loosen it.
        let t = PgTarget::from_dsn("host=db keepalives=0 keepalives_idle=7200")
            .unwrap()
            .with_liveness_bound(s(6));
        assert_eq!(
            probes(&t.config),
            (true, s(3), Some(s(1)), Some(3), Some(s(6)))
        );
        // Idle plus three probes fit in a bound of 5 s or more (below, the
        // probes are whole seconds and the user timeout, which Linux
        // applies to unanswered probes too, holds the bound).
        for secs in [5, 6, 10, 30, 61] {
            let p = DeadPeer::within(s(secs));
            assert!(p.idle + p.interval * p.retries <= s(secs), "{secs}: {p:?}");
            assert_eq!(p.user_timeout, s(secs));
        }
    }
}
