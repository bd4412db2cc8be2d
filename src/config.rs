//! The TOML configuration (see `configs/` for examples). Every key is
//! optional; environment variables override the file and command-line
//! flags override both (`layers`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use regex::Regex;

use crate::admin::{AdminConfig, AdminListen};
use crate::audit::AuditConfig;
use crate::claims::timings::{
    ClaimsTimings, DEFAULT_HOLDER_GONE_GRACE_MS, DEFAULT_PROGRESS_HOLD_MS, DEFAULT_RUN_LEASE_MS,
};
use crate::managed_pg::ManagedConfig;
use crate::pg::url_tls_params;
use crate::policy::claims::WaitPolicy;
use crate::policy::ChannelRules;
use crate::saver::unknown::UnknownSaverPolicy;
use crate::wire::client_stream::ClientTls;
use crate::wire::keepalive::Keepalive;
use crate::wire::proxy::{LoopIo, RelayConfig};
use crate::wire::upstream::UpstreamAddr;
use crate::wire::upstream_tls::{UpstreamTls, UpstreamTlsParams};

pub mod claims_location;
mod error;
pub mod layers;
pub mod live;
pub mod shared_schema;
pub mod show;
use claims_location::ClaimsBackend;
pub use error::ConfigError;
pub use layers::{Flags, Layered, Loader, Source};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address clients connect to.
    pub listen: String,
    /// The PostgreSQL server behind the proxy (`host:port` or a
    /// `postgres://` URL, of which host, port and the TLS parameters
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `sslsni` are used:
    /// auth stays end to end). Absent: a managed local PostgreSQL is
    /// started.
    pub upstream: Option<String>,
    /// Directory of saver profiles; absent: the built-in LangGraph Python
    /// profile.
    pub rules_dir: Option<PathBuf>,
    /// Directory for the proxy's own state (audit database, managed
    /// PostgreSQL).
    pub state_dir: PathBuf,
    pub connect_timeout_ms: u64,
    pub startup_timeout_ms: u64,
    /// How long in-flight work may take to finish at shutdown.
    pub shutdown_grace_ms: u64,
    pub max_message_bytes: usize,
    /// Client connections served at once; more are refused with 53300.
    pub max_client_conn: usize,
    /// Event loops relaying sessions without TLS (default: one per two
    /// cores);
    /// 0: every session relays on two threads of its own.
    pub event_loops: usize,
    /// How the loops wait and write: `io_uring` (epoll where the kernel
    /// refuses a ring) or `epoll`.
    pub event_loop_io: LoopIo,
    pub audit: AuditConfig,
    pub managed: ManagedConfig,
    pub enforce: EnforceConfig,
    pub claims: ClaimsConfig,
    /// The admin API and `/metrics` (`--admin-listen`): an address, `auto`
    /// (a free port on 127.0.0.1) or `off`; absent: 127.0.0.1:6433. An
    /// address in use stops the proxy at start.
    pub admin_listen: Option<String>,
    pub admin: AdminConfig,
    pub tls: TlsConfig,
    /// TCP keepalives and user timeout of client and upstream sockets.
    pub keepalive: Keepalive,
    /// TLS towards the upstream; a parameter in the upstream URL's query
    /// overrides the same key here.
    pub upstream_tls: UpstreamTlsParams,
}

/// TLS towards clients (terminated by the proxy).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain the proxy presents; with `key`, SSLRequest
    /// is answered 'S'.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// Refuse clients that do not use TLS (FATAL 28000).
    pub require: bool,
}

/// The consume-once leg as configured: what the proxy needs to open its
/// store, start its evidence worker and decide reads.
#[derive(Debug, Clone)]
pub struct ClaimsSettings {
    pub proxy_id: String,
    pub lapse_ms: i64,
    pub policy: WaitPolicy,
    pub inspection_patterns: Vec<Regex>,
    pub inspection_sql_hint: bool,
    /// The timings a reload may change (`config::live`), as configured.
    pub timings: ClaimsTimings,
}

/// Consume-once claims (docs/architecture.md, "Consume-once").
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimsConfig {
    /// `postgres`, the only backend (the SQLite backend was retired:
    /// `sqlite` is refused at start, saying so).
    pub backend: Option<ClaimsBackend>,
    /// The claims database when it is not the upstream's (libpq DSN or
    /// `postgres://` URL); absent: the upstream (or the managed server).
    pub dsn: Option<String>,
    /// A file whose content is the proxy's password for the claims (and
    /// audit) database, read again at each connect (a rotated secret
    /// needs no restart).
    pub password_file: Option<PathBuf>,
    /// A command (`sh -c`) run at each connect whose standard output,
    /// trimmed, is that password: how IAM tokens (RDS, Cloud SQL) are
    /// minted. At most 10 s; a failure is an error naming it.
    pub password_command: Option<String>,
    /// With `dsn`: the database the sessions reach through the upstream
    /// that is the one `dsn` names, reached another way (a transaction
    /// pooler in between), so their writes are fenced by the server inside
    /// their own transaction; absent: a store lookup per write.
    pub fence_database: Option<String>,
    /// How soon the liveness lock of a proxy cut off from the database
    /// goes, so other proxies count its holders as gone (PostgreSQL).
    pub liveness_bound_ms: u64,
    /// Retired with the SQLite backend: any value is refused at start,
    /// saying what to remove.
    pub store: Option<PathBuf>,
    /// This proxy's name in claims; absent: `<hostname>-<pid>`.
    pub proxy_id: Option<String>,
    /// How long a claim with no evidence of its run holds. A resume racing
    /// an unmarked inspection waits at most this long.
    pub lapse_ms: i64,
    /// `wait` (poll until consumed or lapsed, bounded) or `refuse`.
    pub policy: String,
    /// Longest a reader waits under `wait`; absent: lapse_ms + 2000.
    pub max_wait_ms: Option<i64>,
    pub poll_ms: i64,
    /// How long a claim stays held after its run-level answer is recorded
    /// (a bare-form resume's node is running).
    pub progress_hold_ms: i64,
    /// How soon the claim of a holder whose connection closed lapses.
    pub holder_gone_grace_ms: i64,
    /// After an interrupt is answered, for this long past the answering
    /// run's latest write, another session's read of the thread's head
    /// with tasks still to run is refused (a late duplicate resume would
    /// run them again). 0 turns the run lease off.
    pub run_lease_ms: i64,
    /// application_name regexes whose reads are inspection (never claim).
    pub inspection_application_names: Vec<String>,
    /// A second listen address whose sessions are all inspection.
    pub inspection_listen: Option<String>,
    /// Whether a `/* resumeguard:inspect */` comment in a checkpoint read
    /// marks it as inspection (never claims). Off by default: the comment
    /// is free for any client to write, and a resume carrying it would
    /// fire however many others race it.
    pub inspection_sql_hint: bool,
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        ClaimsConfig {
            backend: None,
            dsn: None,
            password_file: None,
            password_command: None,
            fence_database: None,
            liveness_bound_ms: 10_000,
            store: None,
            proxy_id: None,
            lapse_ms: 2_000,
            policy: "wait".into(),
            max_wait_ms: None,
            poll_ms: 20,
            progress_hold_ms: DEFAULT_PROGRESS_HOLD_MS,
            holder_gone_grace_ms: DEFAULT_HOLDER_GONE_GRACE_MS,
            run_lease_ms: DEFAULT_RUN_LEASE_MS,
            inspection_application_names: Vec::new(),
            inspection_listen: None,
            inspection_sql_hint: false,
        }
    }
}

/// Which enforcement legs run (all on by default).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnforceConfig {
    /// Fork determinism: hide recorded answers from forks.
    pub fork_filter: bool,
    /// Checkpoint validity: validate writes against `rules/channels`.
    pub validity: bool,
    /// Consume-once: claim parked heads at the read.
    pub consume_once: bool,
    /// Checkpoint-table traffic no saver profile recognizes: `warn`
    /// forwards it (ERROR once per statement shape, counted), `refuse`
    /// fails it.
    pub unknown_saver: UnknownSaverPolicy,
}

impl Default for EnforceConfig {
    fn default() -> Self {
        EnforceConfig {
            fork_filter: true,
            validity: true,
            consume_once: true,
            unknown_saver: UnknownSaverPolicy::Warn,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        let relay = RelayConfig::default();
        Config {
            listen: "127.0.0.1:6432".into(),
            upstream: None,
            rules_dir: None,
            state_dir: PathBuf::from(".resumeguard"),
            connect_timeout_ms: relay.connect_timeout.as_millis() as u64,
            startup_timeout_ms: relay.startup_timeout.as_millis() as u64,
            shutdown_grace_ms: 10_000,
            max_message_bytes: relay.max_message_bytes,
            max_client_conn: relay.max_client_conn,
            event_loops: relay.event_loops,
            event_loop_io: relay.event_loop_io,
            audit: AuditConfig::default(),
            managed: ManagedConfig::default(),
            enforce: EnforceConfig::default(),
            claims: ClaimsConfig::default(),
            admin_listen: None,
            admin: AdminConfig::default(),
            tls: TlsConfig::default(),
            keepalive: relay.keepalive,
            upstream_tls: UpstreamTlsParams::default(),
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The relay settings for an upstream address, TLS files loaded (one
    /// that does not load, or a TLS setting that cannot be honoured,
    /// stops the proxy).
    pub fn relay(&self, upstream: UpstreamAddr) -> Result<RelayConfig, ConfigError> {
        let upstream_tls = UpstreamTls::build(&upstream, &self.upstream_tls_params()?)
            .map_err(ConfigError::UpstreamTls)?;
        Ok(RelayConfig {
            upstream,
            upstream_tls,
            client_tls: self.client_tls()?,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            startup_timeout: Duration::from_millis(self.startup_timeout_ms),
            keepalive: self.keepalive,
            max_message_bytes: self.max_message_bytes,
            max_client_conn: self.max_client_conn,
            event_loops: self.event_loops,
            event_loop_io: self.event_loop_io,
            ..RelayConfig::default()
        })
    }

    /// TLS towards clients: both files or neither.
    pub fn client_tls(&self) -> Result<Option<ClientTls>, ConfigError> {
        match (&self.tls.cert, &self.tls.key) {
            (Some(cert), Some(key)) => Ok(Some(
                ClientTls::load(cert, key, self.tls.require).map_err(ConfigError::ClientTls)?,
            )),
            (None, None) if self.tls.require => Err(ConfigError::RequireTlsWithoutCertificate),
            (None, None) => Ok(None),
            _ => Err(ConfigError::HalfClientTls),
        }
    }

    /// The upstream TLS parameters: the URL's query over `[upstream_tls]`.
    pub fn upstream_tls_params(&self) -> Result<UpstreamTlsParams, ConfigError> {
        let mut p = self.upstream_tls.clone();
        if let Some(spec) = &self.upstream {
            url_tls_params(spec, &mut p)?;
        }
        Ok(p)
    }

    /// The channel rules of the validity leg, loaded from the rules
    /// directory (a rule that does not load stops the proxy: it must not
    /// run without a rule it was given).
    pub fn channel_rules(&self) -> Result<ChannelRules, ConfigError> {
        Ok(match (&self.rules_dir, self.enforce.validity) {
            (Some(dir), true) => ChannelRules::load(dir)?,
            _ => ChannelRules::default(),
        })
    }

    /// The consume-once leg's settings, checked (`None`: the leg is off).
    /// Opening the store and starting its worker is the caller's.
    /// The retired SQLite backend's keys are refused whether or not the
    /// leg is on.
    pub fn claims_settings(&self) -> Result<Option<ClaimsSettings>, ConfigError> {
        claims_location::check_backend(self)?;
        if !self.enforce.consume_once {
            return Ok(None);
        }
        let c = &self.claims;
        let policy = match c.policy.as_str() {
            "wait" => WaitPolicy::Wait {
                max_wait_ms: c.max_wait_ms.unwrap_or(c.lapse_ms + 2_000),
                poll_ms: c.poll_ms,
            },
            "refuse" => WaitPolicy::Refuse,
            other => return Err(ConfigError::ClaimsPolicy(other.to_owned())),
        };
        let inspection_patterns = c
            .inspection_application_names
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|source| ConfigError::InspectionPattern {
                    pattern: p.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(ClaimsSettings {
            proxy_id: self.proxy_id(),
            lapse_ms: c.lapse_ms,
            policy,
            inspection_patterns,
            inspection_sql_hint: c.inspection_sql_hint,
            timings: ClaimsTimings::of_claims(c),
        }))
    }

    /// This replica's name in claims and audit events: `[claims]
    /// proxy_id`, else `<hostname>-<pid>`.
    pub fn proxy_id(&self) -> String {
        self.claims
            .proxy_id
            .clone()
            .unwrap_or_else(default_proxy_id)
    }

    /// Where the admin API listens.
    pub fn admin_listen(&self) -> AdminListen {
        AdminListen::parse(self.admin_listen.as_deref())
    }

    /// The audit database, defaulting into the state directory.
    pub fn audit_db(&self) -> PathBuf {
        self.audit
            .sqlite
            .clone()
            .unwrap_or_else(|| self.state_dir.join("audit.sqlite"))
    }
}

fn default_proxy_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "resumeguard".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_configurations_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let upstream = Config::load(&dir.join("upstream.toml")).expect("upstream.toml");
        assert!(upstream.audit.postgres);
        assert_eq!(upstream.proxy_id(), "replica-1");
        Config::load(&dir.join("embedded.toml")).expect("embedded.toml");
    }
    use crate::error_chain::chain;
    use crate::wire::tls_config::TlsConfigError;
    use crate::wire::upstream_tls::UpstreamTlsError;

    #[test]
    fn example_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            Config::load(&path).unwrap();
            seen += 1;
        }
        assert!(seen >= 2);
    }

    #[test]
    fn unknown_saver_policy() {
        let default = toml::from_str::<Config>("").unwrap();
        assert_eq!(default.enforce.unknown_saver, UnknownSaverPolicy::Warn);
        let refuse = toml::from_str::<Config>("[enforce]\nunknown_saver = \"refuse\"").unwrap();
        assert_eq!(refuse.enforce.unknown_saver, UnknownSaverPolicy::Refuse);
        let err = toml::from_str::<Config>("[enforce]\nunknown_saver = \"ignore\"").unwrap_err();
        assert!(err.to_string().contains("ignore"), "{err}");
    }

    #[test]
    fn the_inspection_sql_hint_is_off_unless_configured() {
        let off = toml::from_str::<Config>("[claims]\nlapse_ms = 10").unwrap();
        assert!(!off.claims.inspection_sql_hint);
        let on = toml::from_str::<Config>("[claims]\ninspection_sql_hint = true").unwrap();
        assert!(on.claims.inspection_sql_hint);
    }

    #[test]
    fn admin_listen_and_token() {
        let default = toml::from_str::<Config>("").unwrap();
        assert_eq!(
            default.admin_listen(),
            AdminListen::Addr("127.0.0.1:6433".into())
        );
        let auto = toml::from_str::<Config>("admin_listen = \"auto\"").unwrap();
        assert_eq!(auto.admin_listen(), AdminListen::Auto);
        assert_eq!(default.admin.token, None);
        assert_eq!(default.admin.max_connections, 64);
        let off = toml::from_str::<Config>("admin_listen = \"off\"").unwrap();
        assert_eq!(off.admin_listen(), AdminListen::Off);
        let set =
            toml::from_str::<Config>("admin_listen = \"0.0.0.0:9187\"\n[admin]\ntoken = \"s3\"")
                .unwrap();
        assert_eq!(set.admin_listen(), AdminListen::Addr("0.0.0.0:9187".into()));
        assert_eq!(set.admin.token.as_deref(), Some("s3"));
        assert_eq!(
            set.admin.max_connections, 64,
            "the token alone keeps the cap"
        );
        let capped = toml::from_str::<Config>("[admin]\nmax_connections = 8").unwrap();
        assert_eq!(capped.admin.max_connections, 8);
        assert!(toml::from_str::<Config>("[admin]\ntokn = \"x\"").is_err());
    }

    #[test]
    fn upstream_tls_from_url_over_config() {
        let cfg = toml::from_str::<Config>(
            "upstream = 'postgres://u@db:5432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x'\n\
             [upstream_tls]\nsslmode = 'require'\nsslcert = '/c.pem'\nsslkey = '/k.pem'",
        )
        .unwrap();
        let p = cfg.upstream_tls_params().unwrap();
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(p.sslcert, Some(PathBuf::from("/c.pem")));
        assert_eq!(p.sni, None);
    }

    #[test]
    fn unsupported_tls_parameters_are_refused() {
        let with = |u: &str| Config {
            upstream: Some(u.into()),
            ..Config::default()
        };
        let err = with("postgres://db/app?sslcrl=/x.crl")
            .upstream_tls_params()
            .unwrap_err();
        assert!(err.to_string().contains("sslcrl"), "{err}");
        assert!(with("postgres://db/app?sslsni=yes")
            .upstream_tls_params()
            .is_err());
        let err = with("postgres://db/app?sslmode=verify_full")
            .relay(UpstreamAddr::Tcp("db:5432".into()))
            .unwrap_err();
        assert!(
            chain(&err).to_string().contains("verify_full"),
            "{}",
            chain(&err)
        );
        let half = toml::from_str::<Config>("[tls]\ncert = '/x.pem'").unwrap();
        assert!(half.relay(UpstreamAddr::Tcp("db:5432".into())).is_err());
        let missing =
            toml::from_str::<Config>("[tls]\ncert = '/no/x.pem'\nkey = '/no/k.pem'").unwrap();
        let err = missing
            .relay(UpstreamAddr::Tcp("db:5432".into()))
            .unwrap_err();
        assert!(
            chain(&err).to_string().contains("/no/x.pem"),
            "{}",
            chain(&err)
        );
    }

    #[test]
    fn tls_errors_name_their_side_and_file() {
        let missing =
            toml::from_str::<Config>("[tls]\ncert = '/no/x.pem'\nkey = '/no/k.pem'").unwrap();
        let err = missing
            .relay(UpstreamAddr::Tcp("db:5432".into()))
            .unwrap_err();
        match &err {
            ConfigError::ClientTls(TlsConfigError::ReadCerts { path, .. }) => {
                assert_eq!(path, Path::new("/no/x.pem"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.to_string(), "client TLS");
        assert!(
            chain(&err)
                .to_string()
                .starts_with("client TLS: reading certificates from /no/x.pem: "),
            "{}",
            chain(&err)
        );
        let bad_mode = Config {
            upstream: Some("postgres://db/app?sslmode=verify_full".into()),
            ..Config::default()
        };
        let err = bad_mode
            .relay(UpstreamAddr::Tcp("db:5432".into()))
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::UpstreamTls(UpstreamTlsError::UnknownMode(m)) if m == "verify_full"),
            "{err:?}"
        );
    }

    #[test]
    fn a_config_file_error_names_the_file() {
        let path = std::env::temp_dir().join(format!("rg-config-{}.toml", std::process::id()));
        std::fs::write(&path, "listen = 6432\n").unwrap();
        let err = Config::load(&path).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(
            matches!(&err, ConfigError::Parse { path: p, .. } if *p == path),
            "{err:?}"
        );
        assert_eq!(err.to_string(), format!("in config {}", path.display()));
        assert!(
            chain(&err).to_string().contains("invalid type"),
            "{}",
            chain(&err)
        );
        let err = Config::load(Path::new("/no/such/config.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<Config>("lisen = 'x'").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }
}
