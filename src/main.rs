//! The `resumeguard` command: `serve` runs the proxy, `audit` reads the
//! audit trail.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;
use tokio::sync::watch;

use resumeguard::audit::{self, AuditSink};
use resumeguard::claims::{render_claims, ClaimStore};
use resumeguard::config::{upstream_addr, Config};
use resumeguard::enforce::Enforcement;
use resumeguard::managed_pg::ManagedPostgres;
use resumeguard::policy::ChannelRules;
use resumeguard::saver::classify::Classifier;
use resumeguard::saver::profile::profiles_for;
use resumeguard::wire::{listener, proxy::Proxy};

#[derive(Parser)]
#[command(
    version,
    about = "A PostgreSQL proxy that makes LangGraph resume mean resume"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (with no upstream configured: in front of a managed
    /// local PostgreSQL).
    Serve {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on (default 127.0.0.1:6432).
        #[arg(long)]
        listen: Option<String>,
        /// Upstream PostgreSQL: host:port or postgres:// URL.
        #[arg(long)]
        upstream: Option<String>,
        /// Directory of saver profiles.
        #[arg(long)]
        rules: Option<PathBuf>,
        /// SQLite file of the audit trail.
        #[arg(long)]
        audit_db: Option<PathBuf>,
        /// Also write audit events as JSON lines to this file ("-" = stdout).
        #[arg(long)]
        audit_jsonl: Option<String>,
        /// Directory for the proxy's state (audit db, managed PostgreSQL).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// SQLite file of consume-once claims (shared by replicas).
        #[arg(long)]
        claims_store: Option<PathBuf>,
        /// This proxy's name in claims (default: hostname-pid).
        #[arg(long)]
        proxy_id: Option<String>,
        /// Turn every enforcement leg off: relay, recognize and audit only.
        #[arg(long)]
        no_enforce: bool,
        /// PEM certificate chain presented to clients (TLS, with --tls-key).
        #[arg(long)]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert.
        #[arg(long)]
        tls_key: Option<PathBuf>,
        /// Refuse clients that do not use TLS.
        #[arg(long)]
        require_tls: bool,
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
    /// Print the audit trail of one thread (`--thread T`), or prune it.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Audit {
        #[command(subcommand)]
        command: Option<AuditCommand>,
        #[arg(long, required = true)]
        thread: Option<String>,
        /// Machine-readable JSON instead of the timeline.
        #[arg(long)]
        json: bool,
        #[arg(long)]
        audit_db: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Remove the trail's rows older than a time, leaving an `audit_pruned`
    /// record of how many and why. Safe while the proxy runs.
    Prune {
        /// An RFC 3339 UTC time (2026-11-01T00:00:00Z) or an age (7d, 12h).
        #[arg(long)]
        before: String,
        /// The audit database is <DIR>/audit.sqlite.
        #[arg(long, conflicts_with = "audit_db")]
        state_dir: Option<PathBuf>,
        #[arg(long)]
        audit_db: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ClaimsCommand {
    /// Print the claims (of one thread).
    List {
        #[arg(long)]
        thread: Option<String>,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Release the claims of a thread that hold it: held claims, and answered
    /// ones whose run never wrote its next checkpoint (it died), so the next
    /// resume may take them. With --checkpoint, only that checkpoint's, and
    /// its answered claims even if the thread had moved on (rewound to it).
    Release {
        #[arg(long)]
        thread: String,
        #[arg(long)]
        checkpoint: Option<String>,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Load a rules directory as `serve` would and print what each rule
    /// matches; exits non-zero on the first error (file:line: what).
    Check {
        /// The rules directory (default: ./rules).
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("resumeguard: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "resumeguard=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match Cli::parse().command {
        Command::Serve {
            config,
            listen,
            upstream,
            rules,
            audit_db,
            audit_jsonl,
            state_dir,
            claims_store,
            proxy_id,
            no_enforce,
            tls_cert,
            tls_key,
            require_tls,
        } => {
            let mut cfg = load_config(config)?;
            cfg.listen = listen.unwrap_or(cfg.listen);
            cfg.upstream = upstream.or(cfg.upstream);
            cfg.rules_dir = rules.or(cfg.rules_dir);
            cfg.state_dir = state_dir.unwrap_or(cfg.state_dir);
            cfg.audit.sqlite = Some(audit_db.unwrap_or_else(|| cfg.audit_db()));
            cfg.audit.jsonl = audit_jsonl.or(cfg.audit.jsonl);
            cfg.claims.store = claims_store.or(cfg.claims.store);
            cfg.claims.proxy_id = proxy_id.or(cfg.claims.proxy_id);
            cfg.tls.cert = tls_cert.or(cfg.tls.cert);
            cfg.tls.key = tls_key.or(cfg.tls.key);
            cfg.tls.require |= require_tls;
            if no_enforce {
                cfg.enforce.fork_filter = false;
                cfg.enforce.validity = false;
                cfg.enforce.consume_once = false;
                cfg.enforce.unknown_saver = Default::default();
            }
            serve(cfg)
        }
        Command::Claims {
            command:
                ClaimsCommand::List {
                    thread,
                    store,
                    config,
                },
        } => {
            let cfg = load_config(config)?;
            let store =
                ClaimStore::open_existing(&store.unwrap_or_else(|| cfg.claims_store_path()))?;
            print!("{}", render_claims(&store.list(thread.as_deref())?));
            Ok(())
        }
        Command::Claims {
            command:
                ClaimsCommand::Release {
                    thread,
                    checkpoint,
                    store,
                    config,
                },
        } => {
            let cfg = load_config(config)?;
            let store =
                ClaimStore::open_existing(&store.unwrap_or_else(|| cfg.claims_store_path()))?;
            let n = store.release(&thread, checkpoint.as_deref())?;
            println!("released {n} claim(s)");
            Ok(())
        }
        Command::Rules {
            command: RulesCommand::Check { dir },
        } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from("rules"));
            let profiles = profiles_for(Some(&dir))?;
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
            let rules = ChannelRules::load(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
            print!("{}", rules.describe());
            Ok(())
        }
        Command::Audit {
            command:
                Some(AuditCommand::Prune {
                    before,
                    state_dir,
                    audit_db,
                    config,
                }),
            ..
        } => {
            let mut cfg = load_config(config)?;
            cfg.state_dir = state_dir.unwrap_or(cfg.state_dir);
            let db = audit_db.unwrap_or_else(|| cfg.audit_db());
            let before = audit::parse_before(&before, SystemTime::now())?;
            let mut store = audit::Store::open_existing(&db)?;
            let rule = audit::PruneRule {
                before: Some(before),
                max_rows: None,
            };
            let cutoff = audit::format_rfc3339_millis(before);
            match audit::prune(&mut store, &rule, "cli")? {
                Some(d) => println!(
                    "pruned {} row(s) before {cutoff} from {} (audit_pruned recorded)",
                    d.rows,
                    db.display()
                ),
                None => println!("nothing before {cutoff} in {}", db.display()),
            }
            Ok(())
        }
        Command::Audit {
            thread,
            json,
            audit_db,
            config,
            ..
        } => {
            let cfg = load_config(config)?;
            let db = audit_db.unwrap_or_else(|| cfg.audit_db());
            let thread = thread.context("audit needs --thread T (or the prune subcommand)")?;
            let events = audit::thread_events(&db, &thread)
                .with_context(|| format!("reading audit trail {}", db.display()))?;
            if json {
                println!("{}", audit::render_json(&events));
            } else {
                print!("{}", audit::render_timeline(&events));
            }
            Ok(())
        }
    }
}

fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Config::load(&p),
        None => Ok(Config::default()),
    }
}

fn serve(cfg: Config) -> anyhow::Result<()> {
    let profiles = profiles_for(cfg.rules_dir.as_deref())?;
    if let Some(parent) = cfg.audit_db().parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    if cfg.claims.store.is_none() {
        std::fs::create_dir_all(&cfg.state_dir)
            .with_context(|| format!("creating {}", cfg.state_dir.display()))?;
    }
    let audit = AuditSink::start(&cfg.audit)?;
    let legs = cfg.legs(&audit)?;
    let managed = match &cfg.upstream {
        Some(_) => None,
        None => Some(ManagedPostgres::start(&cfg.managed, &cfg.state_dir)?),
    };
    let upstream = match (&managed, &cfg.upstream) {
        (Some(m), _) => m.socket(),
        (None, u) => upstream_addr(u.as_deref().unwrap_or_default())?,
    };
    // The event loop only accepts connections and watches for signals;
    // each session relays on threads of its own (wire/session.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let listener = TcpListener::bind(&cfg.listen)
            .await
            .with_context(|| format!("listening on {}", cfg.listen))?;
        let local = listener.local_addr()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let enforcement = Arc::new(Enforcement {
            classifier: Arc::new(
                Classifier::new(profiles).with_unknown_policy(cfg.enforce.unknown_saver),
            ),
            legs,
            audit: audit.clone(),
        });
        let proxy = Arc::new(Proxy::new(
            cfg.relay(upstream.clone())?,
            Arc::new(enforcement),
        ));
        tracing::info!(listen = %local, %upstream, audit = %cfg.audit_db().display(), "resumeguard serving");
        let user = if managed.is_some() { "postgres@" } else { "" };
        println!("DATABASE_URL=postgres://{user}{local}/postgres");
        let inspection = match &cfg.claims.inspection_listen {
            Some(addr) => {
                let l = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listening for inspection on {addr}"))?;
                tracing::info!(listen = %l.local_addr()?, "inspection listener (reads never claim)");
                Some(l)
            }
            None => None,
        };
        let grace = Duration::from_millis(cfg.shutdown_grace_ms);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            let _ = stop_tx.send(true);
        });
        let main_loop = listener::run(
            Arc::clone(&proxy),
            listener,
            false,
            stopped(stop_rx.clone()),
        );
        let inspection_loop = async {
            if let Some(l) = inspection {
                let stop = stopped(stop_rx.clone());
                listener::run(Arc::clone(&proxy), l, true, stop).await;
            }
        };
        tokio::join!(main_loop, inspection_loop);
        listener::drain(&proxy, grace).await;
        anyhow::Ok(())
    });
    audit.shutdown(Duration::from_secs(5));
    if let Some(m) = managed {
        m.stop();
    }
    result
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
