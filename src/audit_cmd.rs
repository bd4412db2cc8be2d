//! `resumeguard audit`: where the trail is read (this replica's SQLite
//! file, or the PostgreSQL table of every replica), and what each read mode
//! prints.

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context;
use clap::Args;

use resumeguard::audit::{self, EventFilter, TrailSource};
use resumeguard::config::claims_location::postgres_target;
use resumeguard::log_text::escaped;
use resumeguard::managed_pg::running_socket;

use crate::load_config;

/// Where the audit trail is, found as `serve` finds it: `--audit-db`, else
/// with the configuration's `[audit] postgres = true` the PostgreSQL table
/// of every replica (where the claims are: `[claims] dsn`, the upstream, or
/// the state directory's running managed server), else the configuration's
/// `[audit] sqlite`, else `<state dir>/audit.sqlite` (`--state-dir` over
/// the configuration's `state_dir`).
#[derive(Args)]
pub struct AuditDbArgs {
    /// The audit database file (default <state-dir>/audit.sqlite).
    #[arg(long, conflicts_with = "state_dir")]
    audit_db: Option<PathBuf>,
    /// The proxy's state directory: the audit database is <DIR>/audit.sqlite.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The configuration `serve` ran with (its state_dir, [audit] sqlite or
    /// postgres, upstream and [claims] dsn).
    #[arg(long)]
    config: Option<PathBuf>,
}

impl AuditDbArgs {
    pub fn path(self) -> anyhow::Result<PathBuf> {
        let mut cfg = load_config(self.config)?;
        cfg.state_dir = self.state_dir.unwrap_or(cfg.state_dir);
        Ok(self.audit_db.unwrap_or_else(|| cfg.audit_db()))
    }

    /// The trail to read: [`AuditDbArgs::path`]'s file, or the PostgreSQL
    /// table when the configuration keeps the trail there (and no
    /// `--audit-db` names a file).
    pub fn source(self) -> anyhow::Result<TrailSource> {
        let mut cfg = load_config(self.config)?;
        cfg.state_dir = self.state_dir.unwrap_or(cfg.state_dir);
        if cfg.audit.postgres && self.audit_db.is_none() {
            let managed = match (&cfg.upstream, &cfg.claims.dsn) {
                (None, None) => Some(running_socket(&cfg.managed, &cfg.state_dir)?),
                _ => None,
            };
            let target = postgres_target(&cfg, managed.as_ref())?;
            return Ok(TrailSource::Postgres(Box::new(target)));
        }
        Ok(TrailSource::Sqlite(
            self.audit_db.unwrap_or_else(|| cfg.audit_db()),
        ))
    }
}

/// `audit prune --before B`: removes the SQLite trail's rows older than
/// `before`, recording it.
pub fn prune(before: &str, db: AuditDbArgs) -> anyhow::Result<()> {
    let db = db.path()?;
    let before = audit::parse_before(before, SystemTime::now())?;
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

/// `audit verify`: each chain's records, start and head, then each break;
/// a trail that does not verify is an error (exit 1).
pub fn verify(jsonl: Option<PathBuf>, db: AuditDbArgs, json: bool) -> anyhow::Result<()> {
    let (verdict, described) = match jsonl {
        Some(path) => {
            let described = format!("jsonl {} (a record is a line)", path.display());
            let verdict = audit::verify_jsonl(&path);
            (verdict, described)
        }
        None => {
            let source = db.source()?;
            (source.verify(), source.describe())
        }
    };
    let verdict = verdict.with_context(|| format!("verifying audit trail {described}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        println!("audit trail: {described}");
        for c in &verdict.chains {
            let start = match (c.first_id, c.after_prune) {
                (None, _) => "no hashed record".to_owned(),
                (Some(id), true) => {
                    format!("from record {id}, after a prune (or an earlier, rotated file)")
                }
                (Some(id), false) => format!("from record {id}"),
            };
            let unhashed = match c.unhashed_before {
                0 => String::new(),
                n => format!(", {n} older record(s) written before hashing"),
            };
            println!(
                "chain {}: {} record(s) {start}{unhashed}; head {}",
                escaped(&c.proxy_id),
                c.records,
                c.head
            );
        }
        for b in &verdict.breaks {
            println!("BROKEN: {b}");
        }
    }
    if verdict.holds() {
        if !json {
            println!("verified: every chain holds");
        }
        Ok(())
    } else {
        anyhow::bail!(
            "audit trail {described} does not verify: {} chain(s) broken, first at record {}",
            verdict.breaks.len(),
            verdict.breaks.first().map_or(0, |b| b.id())
        )
    }
}

/// `audit --threads`: the threads the filter keeps, under a line naming the
/// trail that answered (on stderr with `--json`, whose output stays JSON,
/// and when no thread matches).
pub fn list_threads(source: &TrailSource, filter: &EventFilter, json: bool) -> anyhow::Result<()> {
    let list = source
        .threads(filter)
        .with_context(|| format!("reading audit trail {}", source.describe()))?;
    if json {
        eprintln!("audit trail: {}", source.describe());
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else if list.is_empty() {
        eprintln!("audit trail: {}: no thread matches", source.describe());
    } else {
        println!("audit trail: {}", source.describe());
        print!("{}", audit::render_threads(&list));
    }
    Ok(())
}

/// Prints one thread's events (those the filter keeps) under a line
/// naming the trail that answered (on stderr with `--json`, whose output
/// stays one array); a thread with no events on record is an error.
pub fn thread(
    source: &TrailSource,
    thread: &str,
    filter: &EventFilter,
    json: bool,
) -> anyhow::Result<()> {
    let mut events = source
        .thread_events(thread)
        .with_context(|| format!("reading audit trail {}", source.describe()))?;
    if events.is_empty() {
        return Err(NoSuchThread(format!(
            "no audit events for thread {thread:?} in {} \
             (`resumeguard audit --threads` lists the threads on record)",
            source.describe()
        ))
        .into());
    }
    audit::approver::attribute(&mut events);
    events.retain(|e| filter.keeps(e));
    if json {
        eprintln!("audit trail: {}", source.describe());
        println!("{}", audit::render_json(&events));
    } else if events.is_empty() {
        eprintln!(
            "thread {}: no event matches --since/--until/--op",
            escaped(thread)
        );
    } else {
        println!("audit trail: {}", source.describe());
        print!("{}", audit::render_timeline(&events));
    }
    Ok(())
}

/// An `audit --thread` of a thread the trail has never seen.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoSuchThread(String);

/// Exit status of [`NoSuchThread`], so scripts tell it from other failures.
pub const EXIT_NO_SUCH_THREAD: u8 = 3;
