//! `resumeguard serve`: the one place that opens the proxy's stores,
//! starts its workers and servers, and wires them together. Configuration
//! arrives as data; everything with a lifetime is made here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

use resumeguard::admin::{
    self, AdminAuth, AdminControl, AdminLimits, AdminListen, AdminState, AdminToken, ChainCheck,
};
use resumeguard::audit::{AuditSink, TrailSource};
use resumeguard::claims::evidence;
use resumeguard::claims::postgres::check_once;
use resumeguard::claims::timings::{ClaimsTimings, LiveClaimsTimings};
use resumeguard::claims::ClaimStore;
use resumeguard::config::claims_location::{postgres_target, LocationError};
use resumeguard::config::shared_schema::SHARED_SCHEMA;
use resumeguard::config::{Config, ConfigError, Loader};
use resumeguard::enforce::claim_gate::{ClaimsLeg, InTransactionFence};
use resumeguard::enforce::own_schema::OwnSchema;
use resumeguard::enforce::reload::Reloadable;
use resumeguard::enforce::{Enforcement, Legs};
use resumeguard::fd_limit;
use resumeguard::pg::{connection_string, upstream_addr};
use resumeguard::pg::{PgTarget, DEFAULT_SCHEMA};
use resumeguard::policy::ChannelRules;
use resumeguard::wire::draining::Draining;
use resumeguard::wire::event_loop::EventLoops;
use resumeguard::wire::upstream::UpstreamAddr;
use resumeguard::wire::{listener, proxy::Proxy};

use crate::reload::{load_rules, Reloader, Running};
use crate::serve_config::{load_for_serve, warn_unknown};
use crate::startup::{start_managed, Received, Signals, Startup};

/// Raises the soft limit on open files to the hard one, and says when it
/// still admits fewer sessions than `max_client_conn` (two descriptors
/// each). The soft limit now, if it can be read.
fn open_file_limit(max_client_conn: usize) -> Option<u64> {
    match fd_limit::raise_nofile() {
        Ok((before, after)) => {
            if after > before {
                tracing::info!(before, after, "open file limit raised to the hard limit");
            }
            let sessions = after.saturating_sub(FDS_BESIDE_SESSIONS) / 2;
            if sessions < max_client_conn as u64 {
                tracing::warn!(open_file_limit = after, sessions, max_client_conn,
                    "the open file limit admits fewer sessions than max_client_conn: raise the hard limit (ulimit -Hn, LimitNOFILE=)");
            }
            Some(after)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open file limit");
            fd_limit::nofile().ok().map(|(soft, _)| soft)
        }
    }
}

/// How long shutdown waits for claim evidence to reach the store.
const EVIDENCE_FINISH: Duration = Duration::from_secs(5);

/// Descriptors the process holds besides its sessions' (listeners, the
/// runtime, stores, logs, the admin API's share), roughly.
const FDS_BESIDE_SESSIONS: u64 = 128;

pub fn serve(loader: Loader) -> anyhow::Result<()> {
    let layered = load_for_serve(&loader)?;
    warn_unknown(&layered);
    let cfg = layered.config.clone();
    if cfg.upstream.is_none() && !cfg.managed.enabled {
        return Err(ConfigError::NoUpstream.into());
    }
    // The event loop only accepts connections and watches for signals;
    // each session relays on threads of its own (wire/session.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Signals are ours before anything else is done (loading rules can
    // take a while), so none of them can end the process early, nor
    // between starting the managed server and stopping it.
    let mut signals = runtime.block_on(async { Signals::install() })?;
    let rules = load_rules(&cfg)?;
    // The claims timings a reload stores (config::live), which the store,
    // the evidence worker and the gate read at each decision.
    let claims_timings = LiveClaimsTimings::new(ClaimsTimings::of(&cfg));
    if let Some(parent) = cfg.audit_db().parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    // The addresses are taken before anything is started: a busy port
    // fails here, with no managed server to clean up.
    let listener = bind(&cfg.listen).with_context(|| format!("listening on {}", cfg.listen))?;
    let inspection = match &cfg.claims.inspection_listen {
        Some(addr) => {
            Some(bind(addr).with_context(|| format!("listening for inspection on {addr}"))?)
        }
        None => None,
    };
    let audit = AuditSink::start(&cfg.audit, &cfg.proxy_id())?;
    // Settings are checked before anything starts; the store is opened
    // once the upstream (perhaps the managed server) is known.
    cfg.claims_settings()?;
    let managed = match &cfg.upstream {
        Some(_) => None,
        None => {
            let started = runtime.block_on(start_managed(&cfg, &mut signals));
            match started {
                Ok(Startup::Running(m)) => Some(m),
                Ok(Startup::Interrupted(m)) => {
                    m.stop();
                    audit.shutdown(Duration::from_secs(5));
                    return Ok(());
                }
                Err(e) => {
                    audit.shutdown(Duration::from_secs(5));
                    return Err(e);
                }
            }
        }
    };
    let upstream = match (&managed, &cfg.upstream) {
        (Some(m), _) => Ok(m.socket()),
        (None, u) => upstream_addr(u.as_deref().unwrap_or_default()),
    };
    let managed_socket = managed.as_ref().map(|m| m.socket());
    let claims_at = postgres_target(&cfg, managed_socket.as_ref());
    warn_if_clients_share_the_store_role(&cfg, claims_at.as_ref().ok());
    // The claims store checks its database at start (consume-once on): the
    // audit table's is the same one.
    let claims_check_it = cfg.enforce.consume_once && claims_at.is_ok();
    let audit_db = match cfg.audit.postgres {
        true => connect_audit(&cfg, &audit, managed_socket.as_ref(), !claims_check_it),
        false => Ok(()),
    };
    // The claims store's blocking client runs a runtime of its own: the
    // legs are made outside this one.
    let validity = rules.validity;
    // Shared by the sessions and the consume-once gate: set at shutdown.
    let draining = Draining::default();
    let ready = audit_db
        .and(upstream.map_err(|e| anyhow::Error::from(e).context("upstream")))
        .and_then(|u| {
            let at = claims_at.as_ref();
            let legs = legs(&cfg, &audit, validity, at, &claims_timings, &draining)?;
            Ok((u, legs))
        })
        .map(|(u, mut legs)| {
            legs.own_schema = Arc::new(own_schema(&cfg, managed_socket.as_ref()));
            (u, legs)
        });
    // With consume-once off, the admin API opens the store per request, if
    // one is configured.
    let claims_at =
        claims_at.map_err(|why| Arc::new(why) as Arc<dyn std::error::Error + Send + Sync>);
    let result = match ready {
        Ok((upstream, legs)) => runtime.block_on(async {
            let claims_store = legs.claims.as_ref().map(|leg| Arc::clone(&leg.store));
            let evidence = legs.claims.as_ref().and_then(|leg| leg.evidence.clone());
            let listener = TcpListener::from_std(listener)?;
            let local = listener.local_addr()?;
            let (stop_tx, stop_rx) = watch::channel(false);
            let enforcement = Reloadable::new(Enforcement::new(rules.classifier, legs, audit.clone()));
            let proxy = Arc::new(
                Proxy::new(
                    cfg.relay(upstream.clone())?,
                    Arc::new(Arc::clone(&enforcement)),
                )
                .with_draining(draining),
            );
            let token = AdminToken::new(cfg.admin.token.clone());
            let reloader = Arc::new(Reloader::new(
                loader,
                layered,
                Running {
                    rules: enforcement,
                    proxy: Arc::clone(&proxy),
                    audit: audit.clone(),
                    token: token.clone(),
                    claims_timings,
                },
            ));
            let admin_state = |metrics| AdminState {
                proxy: Arc::clone(&proxy),
                metrics,
                audit: audit.clone(),
                audit_trail: audit_trail(&cfg, managed_socket.as_ref()),
                claims: claims_store,
                claims_at,
                token,
                auth: AdminAuth::default(),
                chain_check: ChainCheck::default(),
                control: Some(Arc::clone(&reloader) as Arc<dyn AdminControl>),
            };
            let loops = EventLoops::configured(proxy.config.event_loops, proxy.config.event_loop_io);
            let nofile = open_file_limit(proxy.config.max_client_conn);
            let admin_limits = AdminLimits::new(cfg.admin.max_connections, nofile);
            let max_connections = admin_limits.max_connections;
            let admin_listen = cfg.admin_listen();
            let admin_at = admin::start(
                &admin_listen,
                cfg.admin.metrics_listen.as_deref(),
                admin_limits,
                admin_state,
            ).await?;
            if let Some(addr) = admin_at {
                tracing::info!(listen = %addr, max_connections, "admin API and /metrics");
            }
            reloader.describe_metrics();
            tracing::info!(listen = %local, %upstream, audit = %cfg.audit_db().display(), "resumeguard serving");
            announce(&cfg, &format!("DATABASE_URL={}", client_url(&cfg, managed.is_some(), local)));
            if let (AdminListen::Auto, Some(addr)) = (admin_listen, admin_at) {
                announce(&cfg, &format!("ADMIN_URL=http://{addr}"));
            }
            let inspection = match inspection {
                Some(l) => {
                    let l = TcpListener::from_std(l)?;
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
                while signals.next().await == Received::Hangup {
                    let reloader = Arc::clone(&reloader);
                    let reload = move || reloader.reload("SIGHUP");
                    if let Err(e) = tokio::task::spawn_blocking(reload).await {
                        tracing::error!(error = %e, "SIGHUP: the reload did not finish");
                    }
                }
                tracing::info!("shutdown requested");
                let _ = stop_tx.send(true);
            });
            let main_loop = listener::run(
                Arc::clone(&proxy),
                loops.clone(),
                listener,
                false,
                stopped(stop_rx.clone()),
            );
            let inspection_loop = async {
                if let Some(l) = inspection {
                    let stop = stopped(stop_rx.clone());
                    listener::run(Arc::clone(&proxy), loops.clone(), l, true, stop).await;
                }
            };
            tokio::join!(main_loop, inspection_loop);
            listener::drain(&proxy, grace).await;
            if let Some(evidence) = evidence {
                // What the closed sessions' writes and goodbyes told the
                // claims reaches the store before the process ends.
                let finish = move || evidence.finish(EVIDENCE_FINISH);
                if let Err(e) = tokio::task::spawn_blocking(finish).await {
                    tracing::error!(error = %e, "claim evidence not finished at exit");
                }
            }
            anyhow::Ok(())
        }),
        Err(e) => Err(e),
    };
    audit.shutdown(Duration::from_secs(5));
    if let Some(m) = managed {
        m.stop();
    }
    result
}

/// The URL clients connect to through the proxy at `local`: the managed
/// server's superuser and database, or the upstream URL's user and
/// database (the database defaulting to the user, as libpq's), never its
/// password; `/postgres` when the upstream names neither.
fn client_url(cfg: &Config, managed: bool, local: std::net::SocketAddr) -> String {
    let address = local.to_string();
    if managed {
        return connection_string::client_url(Some("postgres"), &address, Some("postgres"));
    }
    let named = cfg
        .upstream
        .as_deref()
        .filter(|u| !u.starts_with('/') && !u.starts_with("unix:"))
        .and_then(|u| connection_string::connection_string(u).ok());
    let user = named.as_ref().and_then(|n| n.config.get_user());
    let db = named
        .as_ref()
        .and_then(|n| n.config.get_dbname())
        .or(user)
        .or(Some("postgres"));
    connection_string::client_url(user, &address, db)
}

/// Prints a line for whoever started the proxy (`DATABASE_URL=`): on
/// stdout, unless the audit JSONL goes there (`[audit] jsonl = "-"`), which
/// keeps stdout to JSON lines; then on stderr.
fn announce(cfg: &Config, line: &str) {
    if cfg.audit.jsonl.as_deref() == Some("-") {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Gives the audit trail's PostgreSQL output its database: where the
/// claims store is. A database
/// that cannot be named is an ERROR; auditing goes on in the other
/// outputs, and the PostgreSQL output counts its events as lost. With
/// `check`, it is connected once first: a fault no retry mends (the
/// proxy's password, the database, the schema's privileges) stops `serve`
/// with its fix.
fn connect_audit(
    cfg: &Config,
    audit: &AuditSink,
    managed: Option<&UpstreamAddr>,
    check: bool,
) -> anyhow::Result<()> {
    match postgres_target(cfg, managed) {
        Ok(target) => {
            if check {
                if let Err(fault) = check_once(&target, SHARED_SCHEMA) {
                    match fault.fix {
                        Some(fix) => anyhow::bail!("[audit] postgres: {}; {fix}", fault.error),
                        None => tracing::error!(error = %fault.error, "[audit] postgres: \
                            database not reachable at start: the audit table output retries \
                            and records its gap as for any failure"),
                    }
                }
            }
            tracing::info!(at = %target.shown(), "audit trail also kept in PostgreSQL");
            audit.connect_postgres(target, SHARED_SCHEMA);
        }
        Err(e) => tracing::error!(
            error = %resumeguard::error_chain::chain(&e),
            "[audit] postgres: no database for the audit trail; its events are lost"
        ),
    }
    Ok(())
}

/// Where `GET /threads/{id}` reads: the PostgreSQL table (every replica)
/// with `[audit] postgres`, else this replica's SQLite file.
fn audit_trail(cfg: &Config, managed: Option<&UpstreamAddr>) -> Option<TrailSource> {
    if cfg.audit.postgres {
        if let Ok(target) = postgres_target(cfg, managed) {
            return Some(TrailSource::Postgres(Box::new(target)));
        }
    }
    cfg.audit.sqlite.clone().map(TrailSource::Sqlite)
}

/// The schema the proxy keeps its claims and audit table in, which client
/// statements may only read (see `enforce::own_schema`).
fn own_schema(cfg: &Config, managed: Option<&UpstreamAddr>) -> OwnSchema {
    let name = postgres_target(cfg, managed)
        .map(|target| target.schema().to_owned())
        .unwrap_or_else(|_| DEFAULT_SCHEMA.to_owned());
    OwnSchema::new(&name)
}

/// Whether the proxy keeps claims (consume-once on) or its audit table in
/// the database it fronts under the role derived from the upstream, no
/// `[claims] dsn`: the role the application logs in as, in the usual
/// setup, which can change them at the database directly.
fn store_shares_the_clients_role(cfg: &Config) -> bool {
    cfg.claims.dsn.is_none() && (cfg.enforce.consume_once || cfg.audit.postgres)
}

/// Says once, at start, that claims and audit rows are as safe as the
/// role they live under when that role is the clients' own.
fn warn_if_clients_share_the_store_role(cfg: &Config, at: Option<&PgTarget>) {
    if !store_shares_the_clients_role(cfg) {
        return;
    }
    let at = at.map_or("the upstream", PgTarget::shown);
    tracing::warn!(
        at = %at,
        "claims and audit rows are kept in the database the proxy fronts under the role \
         derived from the upstream, which clients may log in as and use to change them \
         directly, around the proxy (statements through the proxy are refused): give \
         [claims] dsn a role the application cannot log in as (docs/architecture.md, \"The schema is the proxy's\")"
    );
}

/// A listening socket for tokio, bound now.
fn bind(addr: &str) -> anyhow::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The enforcement legs: the channel rules, and for consume-once the
/// shared claims store and its evidence worker. A store that does not
/// open is not fatal: the proxy runs and refuses reads of parked heads
/// until it does (fail closed), says so, and retries opening it on use.
fn legs(
    cfg: &Config,
    audit: &AuditSink,
    validity: Arc<ChannelRules>,
    at: Result<&PgTarget, &LocationError>,
    timings: &Arc<LiveClaimsTimings>,
    draining: &Draining,
) -> anyhow::Result<Legs> {
    let claims = match cfg.claims_settings()? {
        Some(c) => {
            let at = at.map_err(|e| {
                anyhow::anyhow!("claims store: {}", resumeguard::error_chain::chain(e))
            })?;
            tracing::info!(at = %at.shown(), "claims store");
            resumeguard::claims::postgres::pooler::refuse_transaction_pooler(at)?;
            let store = Arc::new(
                ClaimStore::connect(at.clone(), SHARED_SCHEMA).with_timings(Arc::clone(timings)),
            );
            if let Some(fault) = store.start_fault() {
                match fault.fix {
                    // Refusing every parked read until an operator acts
                    // helps no one: stop now, saying what to set.
                    Some(fix) => anyhow::bail!("{}; {fix}", fault.error),
                    None => tracing::error!(error = %fault.error, "claims database not \
                        reachable at start: serving, refusing parked reads (58000) and \
                        /readyz 503 until it is; retried on use and by /readyz"),
                }
            }
            let evidence = evidence::start(
                Arc::clone(&store),
                c.proxy_id.clone(),
                Arc::clone(timings),
                {
                    let audit = audit.clone();
                    Arc::new(move |event| audit.record(event))
                },
            );
            let fence_in_transaction = in_transaction_fence(cfg, at);
            match &fence_in_transaction {
                Some(f) => tracing::info!(database = %f.database, "fencing: checked by the server \
                    inside each write's transaction for sessions of this database (no extra \
                    round trip)"),
                None => tracing::info!(
                    "fencing: checked by a claim store lookup per write \
                    (claims are not in a database the proxy fronts)"
                ),
            }
            Some(Arc::new(ClaimsLeg {
                fence_in_transaction,
                store,
                proxy_id: c.proxy_id,
                lapse_ms: c.lapse_ms,
                timings: Arc::clone(timings),
                policy: c.policy,
                inspection_patterns: c.inspection_patterns,
                inspection_sql_hint: c.inspection_sql_hint,
                evidence: Some(evidence),
                held: Arc::default(),
                parked: Arc::default(),
                draining: draining.clone(),
                fence_lookups: Arc::default(),
            }))
        }
        None => None,
    };
    Ok(Legs {
        fork_filter: cfg.enforce.fork_filter,
        validity,
        claims,
        ..Legs::default()
    })
}

/// Where writes are fenced inside their own transaction: the claims
/// schema's database when it is on the server the proxy fronts (no
/// `[claims] dsn` naming another place), or the database
/// `[claims] fence_database` says a `dsn` reaches by another way.
fn in_transaction_fence(cfg: &Config, target: &PgTarget) -> Option<InTransactionFence> {
    if cfg.claims.dsn.is_some() {
        return cfg
            .claims
            .fence_database
            .as_ref()
            .map(|database| InTransactionFence {
                database: database.clone(),
                schema: target.schema().to_owned(),
            });
    }
    Some(InTransactionFence {
        database: target.database()?.to_owned(),
        schema: target.schema().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_fences_in_transaction_only_where_fence_database_says() {
        let cfg = |text: &str| -> Config { toml::from_str(text).unwrap() };
        let at = PgTarget::from_dsn("postgres://rg@db:5432/app").unwrap();
        let dsn = "[claims]\ndsn = 'postgres://rg@db:5432/app'";
        assert_eq!(in_transaction_fence(&cfg(dsn), &at), None);
        let named = format!("{dsn}\nfence_database = 'app'");
        let fence = in_transaction_fence(&cfg(&named), &at).unwrap();
        assert_eq!(
            (fence.database.as_str(), fence.schema.as_str()),
            ("app", "resumeguard")
        );
    }

    #[test]
    fn a_store_without_its_own_dsn_shares_the_clients_role() {
        let cfg = |text: &str| -> Config { toml::from_str(text).unwrap() };
        assert!(store_shares_the_clients_role(&cfg("")));
        let dsn = "[claims]\ndsn = 'postgres://resumeguard@db/app'";
        assert!(!store_shares_the_clients_role(&cfg(dsn)));
        let off = "[enforce]\nconsume_once = false";
        assert!(!store_shares_the_clients_role(&cfg(off)));
        let audit = "[enforce]\nconsume_once = false\n[audit]\npostgres = true";
        assert!(store_shares_the_clients_role(&cfg(audit)));
    }

    #[test]
    fn a_taken_listen_address_fails_before_anything_starts() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        assert!(bind(&addr).is_err());
        drop(taken);
        assert!(bind(&addr).is_ok());
    }
}
