//! The flags `serve` takes (shared with `config check` and `config show`,
//! so both judge the configuration `serve` would run with), and those two
//! commands: check a configuration without starting, print the one in
//! effect with where each value came from.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use resumeguard::config::{show, Config, ConfigError, Flags, Loader};
use resumeguard::pg::upstream_addr;

use crate::reload::load_rules;
use crate::serve_config::{load_for_serve, warn_unknown};

/// `serve`'s flags. Each overrides its key from the environment
/// (`RESUMEGUARD_<SECTION>_<KEY>`) and the file.
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML configuration file (examples in configs/; default:
    /// $RESUMEGUARD_CONFIG); RESUMEGUARD_* variables override it, flags
    /// override both.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:6432).
    #[arg(long)]
    listen: Option<String>,
    /// Upstream PostgreSQL: host:port or postgres:// URL.
    #[arg(long)]
    upstream: Option<String>,
    /// Directory of saver profiles and channel rules (default: the
    /// built-in profiles, no channel rules).
    #[arg(long)]
    rules: Option<PathBuf>,
    /// SQLite file of the audit trail (default <state-dir>/audit.sqlite).
    #[arg(long)]
    audit_db: Option<PathBuf>,
    /// Also write audit events as JSON lines to this file ("-" = stdout).
    #[arg(long)]
    audit_jsonl: Option<String>,
    /// Directory for the proxy's state (audit db, claims store, managed
    /// PostgreSQL); default .resumeguard.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Retired with the SQLite claims backend: refused, saying so (the
    /// claims live in the fronted PostgreSQL or [claims] dsn).
    #[arg(long, hide = true)]
    claims_store: Option<PathBuf>,
    /// This proxy's name in claims (default: hostname-pid).
    #[arg(long)]
    proxy_id: Option<String>,
    /// Turn every enforcement leg off: relay, recognize and audit only.
    #[arg(long)]
    no_enforce: bool,
    /// Address of the admin API and /metrics, "auto" (a free port on
    /// 127.0.0.1, printed as ADMIN_URL=) or "off" (default 127.0.0.1:6433;
    /// an address in use is an error).
    #[arg(long)]
    admin_listen: Option<String>,
    /// PEM certificate chain presented to clients (TLS, with --tls-key).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Refuse clients that do not use TLS.
    #[arg(long)]
    require_tls: bool,
}

impl ServeArgs {
    /// The flags as configuration keys.
    fn flags(&self) -> Flags {
        let mut f = Flags::default();
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        let values = [
            ("listen", self.listen.clone(), "--listen"),
            ("upstream", self.upstream.clone(), "--upstream"),
            ("audit.jsonl", self.audit_jsonl.clone(), "--audit-jsonl"),
            ("claims.proxy_id", self.proxy_id.clone(), "--proxy-id"),
            ("admin_listen", self.admin_listen.clone(), "--admin-listen"),
            ("rules_dir", path(&self.rules), "--rules"),
            ("audit.sqlite", path(&self.audit_db), "--audit-db"),
            ("state_dir", path(&self.state_dir), "--state-dir"),
            ("claims.store", path(&self.claims_store), "--claims-store"),
            ("tls.cert", path(&self.tls_cert), "--tls-cert"),
            ("tls.key", path(&self.tls_key), "--tls-key"),
        ];
        for (key, value, flag) in values {
            if let Some(v) = value {
                f.set(key, v, flag);
            }
        }
        if self.require_tls {
            f.set("tls.require", true, "--require-tls");
        }
        if self.no_enforce {
            for key in [
                "enforce.fork_filter",
                "enforce.validity",
                "enforce.consume_once",
            ] {
                f.set(key, false, "--no-enforce");
            }
            f.set("enforce.unknown_saver", "warn", "--no-enforce");
        }
        f
    }

    /// Where `serve` reads its configuration (again at each reload).
    pub fn loader(&self) -> Loader {
        Loader::new(self.config.clone(), self.flags())
    }
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Check the configuration `serve` would run with (file, environment,
    /// flags; the rules and certificate files it names) without starting;
    /// exits 1 with the reason.
    Check(ServeArgs),
    /// Print the configuration in effect as TOML, each value with where it
    /// was set (flag, env, file, default); secrets redacted.
    Show(ServeArgs),
}

pub fn run(command: ConfigCommand) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Check(args) => {
            let layered = load_for_serve(&args.loader())?;
            warn_unknown(&layered);
            check(&layered.config)?;
            match &layered.file {
                Some(f) => println!("configuration ok ({} and the environment)", f.display()),
                None => println!("configuration ok (no file: the environment and defaults)"),
            }
            Ok(())
        }
        ConfigCommand::Show(args) => {
            let layered = load_for_serve(&args.loader())?;
            warn_unknown(&layered);
            print!("{}", show::render(&layered)?);
            Ok(())
        }
    }
}

/// What `serve` checks before it starts anything, short of binding its
/// addresses and connecting: the rules load, the claims settings hold,
/// the upstream is named (or the managed server allowed), the TLS files
/// load.
pub fn check(cfg: &Config) -> anyhow::Result<()> {
    load_rules(cfg)?;
    cfg.claims_settings()?;
    match &cfg.upstream {
        Some(u) => {
            cfg.relay(upstream_addr(u)?)?;
        }
        None if !cfg.managed.enabled => return Err(ConfigError::NoUpstream.into()),
        None => {
            cfg.client_tls()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser;
    use resumeguard::config::Source;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn every_flag_lands_on_its_key_over_the_environment() {
        let args = Cli::parse_from([
            "serve",
            "--listen=1.2.3.4:1",
            "--upstream=db:1",
            "--rules=/r",
            "--audit-db=/a.db",
            "--audit-jsonl=-",
            "--state-dir=/s",
            "--claims-store=/c.db",
            "--proxy-id=p",
            "--no-enforce",
            "--admin-listen=off",
            "--tls-cert=/c.pem",
            "--tls-key=/k.pem",
            "--require-tls",
        ])
        .serve;
        let env = [("RESUMEGUARD_LISTEN", "9.9.9.9:9")]
            .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let l = Config::layered(None, env, &args.flags()).unwrap();
        let c = &l.config;
        assert_eq!(c.listen, "1.2.3.4:1");
        assert_eq!(l.source("listen"), &Source::Flag("--listen".into()));
        assert_eq!(c.upstream.as_deref(), Some("db:1"));
        assert_eq!(c.rules_dir, Some(PathBuf::from("/r")));
        assert_eq!(c.audit.sqlite, Some(PathBuf::from("/a.db")));
        assert_eq!(c.audit.jsonl.as_deref(), Some("-"));
        assert_eq!(c.state_dir, PathBuf::from("/s"));
        assert_eq!(c.claims.store, Some(PathBuf::from("/c.db")));
        assert_eq!(c.claims.proxy_id.as_deref(), Some("p"));
        assert!(!c.enforce.fork_filter && !c.enforce.validity && !c.enforce.consume_once);
        assert_eq!(c.admin_listen.as_deref(), Some("off"));
        assert_eq!(c.tls.cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(c.tls.key, Some(PathBuf::from("/k.pem")));
        assert!(c.tls.require);
    }
}
