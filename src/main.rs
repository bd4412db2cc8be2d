//! The `resumeguard` command: `serve` runs the proxy, `config` checks or
//! shows its configuration, `audit` reads the audit trail, `claims` and
//! `rules` are the operator's views.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use resumeguard::audit::EventFilter;
use resumeguard::claims::{render_claims, ClaimRecord, ClaimStore};
use resumeguard::config::claims_location::{check_backend, postgres_target};
use resumeguard::config::{Config, Flags, Loader};
use resumeguard::log_text::escaped;
use resumeguard::managed_pg::running_socket;
use resumeguard::policy::ChannelRules;
use resumeguard::saver::profile::profiles_for;

mod audit_cmd;
mod config_cmd;
mod logging;
mod reload;
mod serve;
mod serve_config;
mod startup;
use audit_cmd::{AuditDbArgs, NoSuchThread, EXIT_NO_SUCH_THREAD};
use config_cmd::{ConfigCommand, ServeArgs};
use serve::serve;

#[derive(Parser)]
#[command(
    version,
    about = "A PostgreSQL proxy that makes LangGraph resume mean resume"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text, or as one JSON object each.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (with no upstream configured: in front of a managed
    /// local PostgreSQL). Configuration: flags > RESUMEGUARD_* environment >
    /// the --config file > defaults.
    Serve(ServeArgs),
    /// Check the configuration, or print the one in effect.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Consume-once claims: list them, or release them (operator).
    Claims {
        #[command(subcommand)]
        command: ClaimsCommand,
    },
    /// Saver profiles and channel rules.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Print the audit trail of one thread (`--thread T`), list the threads
    /// (`--threads`), or prune the trail.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Audit {
        #[command(subcommand)]
        command: Option<AuditCommand>,
        /// The thread whose timeline to print.
        #[arg(long, required_unless_present = "threads", conflicts_with = "threads")]
        thread: Option<String>,
        /// List the threads on record with their last activity, most
        /// recent first (with --since/--until/--op: threads with such events).
        #[arg(long)]
        threads: bool,
        /// Only events at or after this time: RFC 3339 UTC
        /// (2026-11-30T09:00:00Z) or an age (2h, 7d).
        #[arg(long)]
        since: Option<String>,
        /// Only events at or before this time: RFC 3339 UTC or an age.
        #[arg(long)]
        until: Option<String>,
        /// Only these operations (resume_recorded, claim_consumed, ...);
        /// repeat the flag or separate with commas.
        #[arg(long, value_delimiter = ',')]
        op: Vec<String>,
        /// Machine-readable JSON instead of the timeline.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: AuditDbArgs,
    },
}

/// Where the claims store is, found as `serve` finds it: the
/// configuration's `[claims] dsn`, else the PostgreSQL the proxy fronts
/// (`--upstream`, or the running managed server of the state directory).
#[derive(Args)]
struct ClaimsStoreArgs {
    /// Retired with the SQLite claims backend: refused, saying so.
    #[arg(long, hide = true)]
    store: Option<PathBuf>,
    /// The proxy's state directory (its managed server).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The upstream `serve` fronts (its database holds the claims).
    #[arg(long)]
    upstream: Option<String>,
    /// The configuration `serve` ran with.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ClaimsStoreArgs {
    fn open(self) -> anyhow::Result<ClaimStore> {
        let mut cfg = load_config(self.config)?;
        cfg.state_dir = self.state_dir.unwrap_or(cfg.state_dir);
        cfg.upstream = self.upstream.or(cfg.upstream);
        cfg.claims.store = self.store.or(cfg.claims.store);
        check_backend(&cfg)?;
        let managed = match (&cfg.upstream, &cfg.claims.dsn) {
            (None, None) => Some(running_socket(&cfg.managed, &cfg.state_dir)?),
            _ => None,
        };
        Ok(ClaimStore::open_existing(postgres_target(
            &cfg,
            managed.as_ref(),
        )?)?)
    }
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Remove the trail's rows older than a time, leaving an `audit_pruned`
    /// record of how many and why. Safe while the proxy runs.
    Prune {
        /// An RFC 3339 UTC time (2026-11-01T00:00:00Z) or an age (7d, 12h).
        #[arg(long)]
        before: String,
        #[command(flatten)]
        db: AuditDbArgs,
    },
    /// Walk every chain of the trail (each record carries the hash of its
    /// replica's record before it) and report the first record removed or
    /// changed after it was written; exits 1 when one is found.
    Verify {
        /// Machine-readable JSON (chains, heads and breaks).
        #[arg(long)]
        json: bool,
        /// A JSON Lines output file to verify instead (a record is a line).
        #[arg(long, value_name = "FILE")]
        jsonl: Option<PathBuf>,
        #[command(flatten)]
        db: AuditDbArgs,
    },
}

#[derive(Subcommand)]
enum ClaimsCommand {
    /// Print the claims (of one thread).
    List {
        /// Only this thread's claims.
        #[arg(long)]
        thread: Option<String>,
        #[command(flatten)]
        store: ClaimsStoreArgs,
    },
    /// Release the claims of a thread that hold it: held claims, and answered
    /// ones whose run never wrote its next checkpoint (it died), so the next
    /// resume may take them. With --checkpoint, only that checkpoint's, and
    /// its answered claims even if the thread had moved on (rewound to it).
    Release {
        /// The thread whose claims to release.
        #[arg(long)]
        thread: String,
        /// Only the claims of this checkpoint id.
        #[arg(long)]
        checkpoint: Option<String>,
        #[command(flatten)]
        store: ClaimsStoreArgs,
    },
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Load saver profiles and channel rules as `serve` would and print what
    /// each rule matches; exits non-zero on the first error (file:line: what).
    Check {
        /// The rules directory (default: the configuration's rules_dir, else
        /// what `serve` uses without one: the built-in profiles, no channel
        /// rules).
        dir: Option<PathBuf>,
        /// The configuration `serve` runs with (its rules_dir).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("resumeguard: {e:#}");
            if e.is::<NoSuchThread>() {
                ExitCode::from(EXIT_NO_SUCH_THREAD)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => serve(args.loader()),
        Command::Config { command } => config_cmd::run(command),
        Command::Claims {
            command: ClaimsCommand::List { thread, store },
        } => {
            let claims = store.open()?.list(thread.as_deref())?;
            print!("{}", render_claims(&printable_claims(claims)));
            Ok(())
        }
        Command::Claims {
            command:
                ClaimsCommand::Release {
                    thread,
                    checkpoint,
                    store,
                },
        } => {
            let n = store.open()?.release(&thread, checkpoint.as_deref())?;
            println!("released {n} claim(s)");
            Ok(())
        }
        Command::Rules {
            command: RulesCommand::Check { dir, config },
        } => rules_check(dir.or(load_config(config)?.rules_dir)),
        Command::Audit {
            command: Some(AuditCommand::Prune { before, db }),
            ..
        } => audit_cmd::prune(&before, db),
        Command::Audit {
            command: Some(AuditCommand::Verify { json, jsonl, db }),
            ..
        } => audit_cmd::verify(jsonl, db, json),
        Command::Audit {
            thread,
            threads,
            since,
            until,
            op,
            json,
            db,
            ..
        } => {
            let filter =
                EventFilter::parse(since.as_deref(), until.as_deref(), &op, SystemTime::now())?;
            let source = db.source()?;
            if threads {
                return audit_cmd::list_threads(&source, &filter, json);
            }
            let thread = thread.context("audit needs --thread T or --threads")?;
            audit_cmd::thread(&source, &thread, &filter, json)
        }
    }
}

/// Claims as `claims list` prints them: every text a client gave (thread
/// and checkpoint ids, application name, evidence) or the store's table
/// holds escaped, so none starts a line or reaches the terminal as an
/// escape sequence.
fn printable_claims(claims: Vec<ClaimRecord>) -> Vec<ClaimRecord> {
    let text = |s: &mut String| *s = escaped(s).to_string();
    claims
        .into_iter()
        .map(|mut c| {
            text(&mut c.key.at.thread_id);
            text(&mut c.key.at.checkpoint_ns);
            text(&mut c.key.at.checkpoint_id);
            text(&mut c.key.fingerprint);
            text(&mut c.holder.proxy_id);
            text(&mut c.holder.client_addr);
            text(&mut c.holder.application_name);
            if let Some(e) = c.evidence.as_mut() {
                text(e);
            }
            c
        })
        .collect()
}

/// Loads profiles and channel rules from `dir`, or names the built-in
/// profiles `serve` uses without one, and prints what each matches.
fn rules_check(dir: Option<PathBuf>) -> anyhow::Result<()> {
    match &dir {
        Some(d) => println!("rules directory {}", d.display()),
        None => println!("no rules directory: the built-in profiles, as `serve` uses by default"),
    }
    let profiles = profiles_for(dir.as_deref())?;
    for p in &profiles {
        println!(
            "profile {}: tables {}, {}, {}, {}{}",
            p.name,
            p.tables.checkpoints,
            p.tables.blobs,
            p.tables.writes,
            p.tables.migrations,
            p.schema
                .as_deref()
                .map(|s| format!(" (schema {s})"))
                .unwrap_or_default()
        );
        for k in &p.rows.pending_writes {
            println!("  saver {}: pending_writes rows {:?}", k.saver, k.elements);
        }
    }
    let rules = match &dir {
        Some(d) => ChannelRules::load(d)?,
        None => ChannelRules::default(),
    };
    print!("{}", rules.describe());
    Ok(())
}

/// The configuration the operator commands read: the file (`--config`,
/// else `RESUMEGUARD_CONFIG`) under the `RESUMEGUARD_*` variables, as
/// `serve` reads it.
fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    Ok(Loader::new(path, Flags::default()).load()?.config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("resumeguard").chain(args.iter().copied()))
    }

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "resumeguard", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:?}");
    }

    #[test]
    fn audit_reads_the_postgres_table_when_the_configuration_keeps_the_trail_there() {
        let dir = std::env::temp_dir().join(format!("rg-audit-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("a.toml");
        std::fs::write(
            &conf,
            "upstream = 'postgres://rg@db:6000/app'\n[audit]\npostgres = true\n",
        )
        .unwrap();
        let source = |args: &[&str]| {
            let Command::Audit { db, .. } = parse(args).unwrap().command else {
                panic!("not audit")
            };
            db.source().unwrap().describe()
        };
        let c = conf.to_str().unwrap();
        assert_eq!(
            source(&["audit", "--threads", "--config", c]),
            "postgres rg@db:6000/app schema resumeguard (every replica)"
        );
        assert_eq!(
            source(&["audit", "--threads", "--config", c, "--audit-db", "/a.db"]),
            "sqlite /a.db (this replica)",
            "a file named on the command line is read"
        );
        std::fs::write(&conf, "upstream = 'db:6000'\nstate_dir = '/s'\n").unwrap();
        assert_eq!(
            source(&["audit", "--threads", "--config", c]),
            "sqlite /s/audit.sqlite (this replica)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn audit_and_claims_take_the_state_dir() {
        let Command::Audit { threads, db, .. } =
            parse(&["audit", "--threads", "--state-dir", "/s"])
                .unwrap()
                .command
        else {
            panic!("not audit")
        };
        assert!(threads);
        assert_eq!(db.path().unwrap(), PathBuf::from("/s/audit.sqlite"));
        let Command::Audit { thread, op, .. } = parse(&[
            "audit",
            "--thread",
            "t",
            "--op",
            "resume_recorded,claim_consumed",
            "--op",
            "fork_served",
        ])
        .unwrap()
        .command
        else {
            panic!("not audit")
        };
        assert_eq!(thread.as_deref(), Some("t"));
        assert_eq!(op, ["resume_recorded", "claim_consumed", "fork_served"]);
        let Command::Claims {
            command: ClaimsCommand::List { store, .. },
        } = parse(&["claims", "list", "--state-dir", "/s"])
            .unwrap()
            .command
        else {
            panic!("not claims list")
        };
        assert_eq!(store.state_dir, Some(PathBuf::from("/s")));
        assert!(parse(&["claims", "release", "--thread", "t", "--state-dir", "/s"]).is_ok());
        assert!(parse(&["audit", "prune", "--before", "7d", "--state-dir", "/s"]).is_ok());
        // One place or the other, and a thread or the list.
        assert!(parse(&[
            "audit",
            "--threads",
            "--state-dir",
            "/s",
            "--audit-db",
            "/a"
        ])
        .is_err());
        assert!(parse(&["audit", "--threads", "--thread", "t"]).is_err());
        assert!(parse(&["audit"]).is_err());
    }
}
