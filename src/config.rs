//! The TOML configuration (see `configs/` for examples). Every key is
//! optional; command-line flags override the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::audit::AuditConfig;
use crate::policy::ChannelRules;
use crate::wire::proxy::{Legs, RelayConfig};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address clients connect to.
    pub listen: String,
    /// The PostgreSQL server behind the proxy (`host:port` or a
    /// `postgres://` URL, of which only host and port are used: auth stays
    /// end to end). Absent: a managed local PostgreSQL is started.
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
    pub audit: AuditConfig,
    pub managed: ManagedConfig,
    pub enforce: EnforceConfig,
}

/// Which enforcement legs run (all on by default).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnforceConfig {
    /// Fork determinism: hide recorded answers from forks.
    pub fork_filter: bool,
    /// Checkpoint validity: validate writes against `rules/channels`.
    pub validity: bool,
}

impl Default for EnforceConfig {
    fn default() -> Self {
        EnforceConfig {
            fork_filter: true,
            validity: true,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagedConfig {
    /// Where the PostgreSQL server binaries live; absent: the newest
    /// `/usr/lib/postgresql/*/bin`.
    pub bin_dir: Option<PathBuf>,
    /// Data directory; absent: `<state_dir>/postgres`.
    pub data_dir: Option<PathBuf>,
    /// Loopback port for the managed server; 0 picks a free one.
    pub port: u16,
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
            audit: AuditConfig::default(),
            managed: ManagedConfig::default(),
            enforce: EnforceConfig::default(),
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("in config {}", path.display()))
    }

    /// The relay settings for an upstream address.
    pub fn relay(&self, upstream: String) -> RelayConfig {
        RelayConfig {
            upstream,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            startup_timeout: Duration::from_millis(self.startup_timeout_ms),
            max_message_bytes: self.max_message_bytes,
            ..RelayConfig::default()
        }
    }

    /// The enforcement legs, with the channel rules loaded from the rules
    /// directory (a rule that does not load stops the proxy: it must not
    /// run without a rule it was given).
    pub fn legs(&self) -> anyhow::Result<Legs> {
        let validity = match (&self.rules_dir, self.enforce.validity) {
            (Some(dir), true) => ChannelRules::load(dir).map_err(|e| anyhow::anyhow!("{e}"))?,
            _ => ChannelRules::default(),
        };
        Ok(Legs {
            fork_filter: self.enforce.fork_filter,
            validity: std::sync::Arc::new(validity),
        })
    }

    /// The audit database, defaulting into the state directory.
    pub fn audit_db(&self) -> PathBuf {
        self.audit
            .sqlite
            .clone()
            .unwrap_or_else(|| self.state_dir.join("audit.sqlite"))
    }
}

/// `host:port` from `host:port`, `host` or a `postgres://` URL.
pub fn upstream_addr(spec: &str) -> anyhow::Result<String> {
    let rest = match spec.split_once("://") {
        Some((scheme, rest)) if scheme == "postgres" || scheme == "postgresql" => rest,
        Some((scheme, _)) => bail!("upstream URL scheme {scheme:?} is not postgres://"),
        None => spec,
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.is_empty() {
        bail!("upstream {spec:?} names no host (Unix sockets are not supported)");
    }
    let has_port = match hostport.rsplit_once(':') {
        Some((_, port)) => !port.is_empty() && !hostport.ends_with(']'),
        None => false,
    };
    Ok(if has_port {
        hostport.to_owned()
    } else {
        format!("{hostport}:5432")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_forms() {
        assert_eq!(upstream_addr("127.0.0.1:5433").unwrap(), "127.0.0.1:5433");
        assert_eq!(upstream_addr("db").unwrap(), "db:5432");
        assert_eq!(
            upstream_addr("postgres://u:p@10.0.0.1:6000/app?sslmode=disable").unwrap(),
            "10.0.0.1:6000"
        );
        assert_eq!(
            upstream_addr("postgresql://localhost/app").unwrap(),
            "localhost:5432"
        );
        assert!(upstream_addr("mysql://x").is_err());
        assert!(upstream_addr("postgres:///app").is_err());
    }

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
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<Config>("lisen = 'x'").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }
}
