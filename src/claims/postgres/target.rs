//! Where the PostgreSQL claims store is: connection parameters taken from
//! the upstream the proxy fronts (or a separate `[claims] dsn`), the
//! password from the URL, `PGPASSWORD` or the password file, and the bound
//! within which a network partition between the proxy and that database
//! ends its connections, on both ends.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use rustls::ClientConfig;

use crate::wire::tls_config::{self, TlsConfigError, Verify};
use crate::wire::upstream::UpstreamAddr;
use crate::wire::upstream_tls::SslMode as UpstreamSslMode;

/// The schema every replica shares.
pub const DEFAULT_SCHEMA: &str = "resumeguard";

/// Default bound for a partition to end the store's connections: the
/// server's keepalive probes and TCP user timeout on the lock connection
/// end it (and so the proxy's liveness lock) within this long, and the
/// proxy's own on every connection fail a statement waiting on a silent
/// database within this long.
pub const DEFAULT_LIVENESS_BOUND: Duration = Duration::from_secs(10);

/// TCP keepalive probes and user timeout with which one end of a
/// connection counts the other gone within a bound: an idle connection is
/// probed after half the bound, three probes fill the rest; data left
/// unacknowledged for the whole bound ends it. Probes are whole seconds,
/// as the server's `tcp_keepalives_*` settings and the kernel take them;
/// under a bound of 5 s they overshoot it and the user timeout (which
/// Linux also applies to unanswered probes) holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DeadPeer {
    pub(super) idle: Duration,
    pub(super) interval: Duration,
    pub(super) retries: u32,
    pub(super) user_timeout: Duration,
}

impl DeadPeer {
    pub(super) fn within(bound: Duration) -> DeadPeer {
        let secs = bound.as_secs().max(2);
        let idle = (secs / 2).max(1);
        let retries = 3;
        let interval = ((secs - idle) / u64::from(retries)).max(1);
        DeadPeer {
            idle: Duration::from_secs(idle),
            interval: Duration::from_secs(interval),
            retries,
            user_timeout: bound,
        }
    }

    /// The client's side: every connection made with `config` (TCP;
    /// a Unix socket has no such settings and needs none).
    fn apply(self, config: &mut postgres::Config) {
        config
            .keepalives(true)
            .keepalives_idle(self.idle)
            .keepalives_interval(self.interval)
            .keepalives_retries(self.retries)
            .tcp_user_timeout(self.user_timeout);
    }
}

/// A claims database that cannot be named.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("claims.dsn")]
    Dsn(#[source] postgres::Error),
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
    pub(super) config: postgres::Config,
    /// TLS for `sslmode` prefer and require (`config` says which); `None`:
    /// plaintext only.
    pub(super) tls: Option<Arc<ClientConfig>>,
    /// `user@host:port/db`, as shown in errors (never the password).
    pub(super) shown: String,
    pub(super) schema: String,
    /// Within how long a partition ends the connections: the server's
    /// end of the liveness lock connection (then the lock goes) and the
    /// proxy's end of every connection (then what waits on it fails).
    pub(super) liveness_bound: Duration,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget")
            .field("at", &self.shown)
            .field("schema", &self.schema)
            .field("liveness_bound", &self.liveness_bound)
            .finish()
    }
}

impl PgTarget {
    /// A libpq-style DSN or `postgres://` URL (`[claims] dsn`); a password
    /// it does not give comes from `PGPASSWORD` or the password file.
    pub fn from_dsn(dsn: &str) -> Result<PgTarget, TargetError> {
        let config = postgres::Config::from_str(dsn).map_err(TargetError::Dsn)?;
        PgTarget::finish(config)
    }

    /// The upstream the proxy fronts: its address, and user, database and
    /// password from `spec` when it is a `postgres://` URL (else `PGUSER`,
    /// `PGDATABASE`, `postgres`).
    pub fn from_upstream(spec: Option<&str>, addr: &UpstreamAddr) -> Result<PgTarget, TargetError> {
        let url = spec.and_then(UrlParts::parse).unwrap_or_default();
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
            .user
            .or_else(|| std::env::var("PGUSER").ok())
            .unwrap_or_else(|| "postgres".into());
        let dbname = url
            .dbname
            .or_else(|| std::env::var("PGDATABASE").ok())
            .unwrap_or_else(|| user.clone());
        config.user(&user).dbname(&dbname);
        if let Some(p) = url.password {
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
        if config.get_password().is_none() {
            if let Ok(p) = std::env::var("PGPASSWORD") {
                config.password(p);
            } else if let Some(p) = pgpass_lookup(&host, port, &db, &user) {
                config.password(p);
            }
        }
        let target = PgTarget {
            shown: format!("postgres {user}@{host}:{port}/{db}"),
            config,
            tls,
            schema: DEFAULT_SCHEMA.into(),
            liveness_bound: DEFAULT_LIVENESS_BOUND,
        };
        Ok(target.with_liveness_bound(DEFAULT_LIVENESS_BOUND))
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

    /// Whether the connections use TLS: `disable`, `prefer` or `require`.
    pub fn sslmode(&self) -> &'static str {
        match (self.config.get_ssl_mode(), &self.tls) {
            (SslMode::Disable, _) | (_, None) => "disable",
            (SslMode::Prefer, Some(_)) => "prefer",
            (_, Some(_)) => "require",
        }
    }

    /// The database as shown in errors.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

/// User, password and database of a `postgres://` URL.
#[derive(Debug, Default, PartialEq, Eq)]
struct UrlParts {
    user: Option<String>,
    password: Option<String>,
    dbname: Option<String>,
}

impl UrlParts {
    fn parse(spec: &str) -> Option<UrlParts> {
        let (_, rest) = spec.split_once("://")?;
        let rest = rest.split('?').next().unwrap_or_default();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
        let (user, password) = match userinfo {
            Some(u) => match u.split_once(':') {
                Some((u, p)) => (Some(decode(u)), Some(decode(p))),
                None => (Some(decode(u)), None),
            },
            None => (None, None),
        };
        Some(UrlParts {
            user: user.filter(|u| !u.is_empty()),
            password,
            dbname: Some(decode(path)).filter(|d| !d.is_empty()),
        })
    }
}

/// `%XX` escapes decoded; a malformed escape is kept as written.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = s
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The password file: `PGPASSFILE`, else `~/.pgpass`.
fn pgpass_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGPASSFILE") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass"))
}

fn pgpass_lookup(host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let text = std::fs::read_to_string(pgpass_path()?).ok()?;
    // libpq matches a socket directory as "localhost".
    let host = if host.starts_with('/') {
        "localhost"
    } else {
        host
    };
    pgpass_match(&text, host, &port.to_string(), db, user)
}

/// The password of the first `host:port:db:user:password` line matching
/// (`*` matches anything; `\:` and `\\` are escapes).
fn pgpass_match(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass(line);
            let [h, p, d, u, pw] = <[String; 5]>::try_from(fields).ok()?;
            let m = |pat: &str, v: &str| pat == "*" || pat == v;
            (m(&h, host) && m(&p, port) && m(&d, db) && m(&u, user)).then_some(pw)
        })
}

fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(last)) = (chars.next(), fields.last_mut()) {
                    last.push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(last) = fields.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parts() {
        let p = UrlParts::parse("postgres://app%40x:s%3Acret@db:5432/checkpoints?sslmode=disable")
            .unwrap();
        assert_eq!(p.user.as_deref(), Some("app@x"));
        assert_eq!(p.password.as_deref(), Some("s:cret"));
        assert_eq!(p.dbname.as_deref(), Some("checkpoints"));
        assert_eq!(UrlParts::parse("db:5432"), None);
    }

    #[test]
    fn pgpass_lines_match_with_wildcards_and_escapes() {
        let text = "# comment\nother:5432:*:app:no\ndb:*:app\\:db:app:pa\\:ss\n*:*:*:*:any\n";
        assert_eq!(
            pgpass_match(text, "db", "5432", "app:db", "app").as_deref(),
            Some("pa:ss")
        );
        assert_eq!(
            pgpass_match(text, "x", "1", "y", "z").as_deref(),
            Some("any")
        );
        assert_eq!(pgpass_match("a:b:c\n", "a", "b", "c", "d"), None);
    }

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
