//! SIGHUP (and the admin API's `POST /reload`): the configuration file is
//! read again and what can change without a restart is put in effect —
//! the rules, the consume-once gate's `lapse_ms` and wait policy, the
//! claims timings (run lease, progress hold, holder-gone grace), the fork
//! filter switch, the admin token, the JSONL file — while a changed
//! key that needs a restart (listen addresses, the upstream, the stores) is
//! named in the log and stays as it was. Then the files the configuration
//! names are read again: saver profiles and channel rules, the certificate
//! and key shown to clients, the upstream's roots and client certificate,
//! and the JSONL audit file is reopened (logrotate without copytruncate).
//! None of it drops a session. Each part that loads takes effect for what
//! starts after it; a part that does not load keeps what it had, says why
//! at ERROR, and is counted as failed.

use std::sync::{Arc, Mutex, MutexGuard};

use metrics::{counter, describe_counter};
use serde_json::json;

use resumeguard::admin::{AdminControl, AdminToken};
use resumeguard::audit::{AuditEvent, AuditSink, Operation, SessionContext};
use resumeguard::claims::timings::{ClaimsTimings, LiveClaimsTimings};
use resumeguard::config::live::CLAIMS_TIMING_KEYS;
use resumeguard::config::{show, Config, Layered, Loader};
use resumeguard::enforce::claim_gate::ClaimsLeg;
use resumeguard::enforce::reload::Reloadable;
use resumeguard::enforce::Legs;
use resumeguard::policy::ChannelRules;
use resumeguard::saver::classify::Classifier;
use resumeguard::saver::profile::profiles_for;
use resumeguard::wire::client_stream::ClientTls;
use resumeguard::wire::proxy::Proxy;
use resumeguard::wire::upstream_tls::UpstreamTls;

use crate::serve_config::{load_for_serve, warn_unknown};

/// Reloads, by part, counted under this name with `part` and `result`.
const RELOADS: &str = "resumeguard_reloads_total";

/// The keys the rules part reads (the profiles, the channel rules and
/// whether they are checked, the unknown-saver policy).
const RULE_KEYS: &[&str] = &["rules_dir", "enforce.validity", "enforce.unknown_saver"];

/// The keys of the enforcement legs a reload replaces (the consume-once
/// gate's own settings; its store and worker stay).
const LEG_KEYS: &[&str] = &[
    "enforce.fork_filter",
    "claims.lapse_ms",
    "claims.policy",
    "claims.max_wait_ms",
    "claims.poll_ms",
    "claims.inspection_application_names",
    "claims.inspection_sql_hint",
];

/// Whether a reload puts a change of `key` in effect; every other key is
/// read at start only.
fn applies_live(key: &str, old: &Config, new: &Config) -> bool {
    match key {
        k if RULE_KEYS.contains(&k) || LEG_KEYS.contains(&k) => true,
        k if CLAIMS_TIMING_KEYS.contains(&k) => true,
        "admin.token" | "admin.token_file" => true,
        // Another file for the JSONL output; adding or removing the output
        // needs a restart.
        "audit.jsonl" => old.audit.jsonl.is_some() && new.audit.jsonl.is_some(),
        _ => false,
    }
}

/// The saver profiles and channel rules the configuration names.
pub struct Rules {
    pub classifier: Arc<Classifier>,
    pub validity: Arc<ChannelRules>,
    profiles: usize,
}

/// Loads the rules now: the profiles of `rules_dir` (or the built-in
/// ones) and its channel rules (none with the validity leg off).
pub fn load_rules(cfg: &Config) -> anyhow::Result<Rules> {
    let profiles = profiles_for(cfg.rules_dir.as_deref())?;
    let count = profiles.len();
    let classifier = Classifier::new(profiles).with_unknown_policy(cfg.enforce.unknown_saver);
    Ok(Rules {
        classifier: Arc::new(classifier),
        validity: Arc::new(cfg.channel_rules()?),
        profiles: count,
    })
}

/// What one part of a reload did.
#[derive(Debug)]
pub struct Outcome {
    /// `config`, `rules`, `client_tls`, `upstream_tls` or `audit_jsonl`.
    pub part: &'static str,
    /// What is in effect now, or why the old one stays.
    pub result: Result<String, ReloadFailure>,
}

/// Why a part of a reload keeps what it had: the failure and its causes,
/// shown on one line.
#[derive(Debug, thiserror::Error)]
#[error("{}", one_line(&format!("{:#}", .0)))]
pub struct ReloadFailure(anyhow::Error);

/// The configuration in effect and what a reload found it cannot apply.
struct InEffect {
    layered: Layered,
    /// Keys the file (or environment) changed that wait for a restart.
    awaiting_restart: Vec<String>,
}

/// Everything a reload reads again, and where it goes.
pub struct Reloader {
    /// Reads the configuration as `serve` did (the same file and flags).
    loader: Loader,
    /// One reload at a time (SIGHUP and `POST /reload` may meet).
    in_effect: Mutex<InEffect>,
    rules: Arc<Reloadable>,
    proxy: Arc<Proxy>,
    /// Each part's outcome is audited (`config_reloaded`).
    audit: AuditSink,
    token: AdminToken,
    claims_timings: Arc<LiveClaimsTimings>,
}

/// The running proxy's parts a reload acts on.
pub struct Running {
    pub rules: Arc<Reloadable>,
    pub proxy: Arc<Proxy>,
    pub audit: AuditSink,
    pub token: AdminToken,
    pub claims_timings: Arc<LiveClaimsTimings>,
}

impl Reloader {
    pub fn new(loader: Loader, layered: Layered, running: Running) -> Reloader {
        Reloader {
            loader,
            in_effect: Mutex::new(InEffect {
                layered,
                awaiting_restart: Vec::new(),
            }),
            rules: running.rules,
            proxy: running.proxy,
            audit: running.audit,
            token: running.token,
            claims_timings: running.claims_timings,
        }
    }

    /// Starts the counters at zero, so a scrape shows them before the
    /// first reload (call it once the metrics recorder is installed).
    pub fn describe_metrics(&self) {
        describe_counter!(
            RELOADS,
            "Reloads (SIGHUP, POST /reload) by part (config, rules, client_tls, upstream_tls, \
             audit_jsonl) and result (ok, failed: what was in effect stays)"
        );
        let cfg = self.lock().layered.config.clone();
        for part in self.parts(&cfg) {
            for result in ["ok", "failed"] {
                counter!(RELOADS, "part" => part.name(), "result" => result).increment(0);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, InEffect> {
        self.in_effect.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parts there is something to reload for, after the configuration.
    fn parts<'a>(&'a self, cfg: &'a Config) -> Vec<Part<'a>> {
        let relay = &self.proxy.config;
        let mut parts = vec![Part::Rules];
        if let Some(tls) = &relay.client_tls {
            parts.push(Part::ClientTls(tls));
        }
        if relay.upstream_tls.has_files() {
            parts.push(Part::UpstreamTls(&relay.upstream_tls));
        }
        if let Some(path) = cfg.audit.jsonl.as_deref().filter(|p| *p != "-") {
            parts.push(Part::AuditJsonl(path));
        }
        if self.loader.file.is_some() {
            parts.insert(0, Part::Config);
        }
        parts
    }

    /// Reloads every part (blocking: it reads files); logs, counts and
    /// audits each outcome. `trigger` says what asked (`SIGHUP`).
    pub fn reload(&self, trigger: &str) -> Vec<Outcome> {
        tracing::info!(
            "{trigger} received: reloading the configuration, rules, certificates and JSONL file"
        );
        let mut in_effect = self.lock();
        let before = in_effect.layered.clone();
        let mut outcomes = Vec::new();
        if self.loader.file.is_some() {
            let result = self.reload_config(&mut in_effect);
            outcomes.push(Outcome {
                part: "config",
                result: result.map_err(ReloadFailure),
            });
        }
        let cfg = in_effect.layered.config.clone();
        for part in self.parts(&cfg) {
            if matches!(part, Part::Config) {
                continue;
            }
            let result = self.reload_part(&part, &cfg);
            if result.is_err() && matches!(part, Part::Rules) {
                // The rules in effect stay, and so do the keys they came from.
                let keys: Vec<String> = RULE_KEYS.iter().map(|k| k.to_string()).collect();
                let layered = in_effect.layered.clone();
                if let Ok(kept) = layered.keeping(&before, &keys) {
                    in_effect.layered = kept;
                }
            }
            outcomes.push(Outcome {
                part: part.name(),
                result: result.map_err(ReloadFailure),
            });
        }
        drop(in_effect);
        for o in &outcomes {
            self.report(trigger, o);
        }
        outcomes
    }

    fn report(&self, trigger: &str, o: &Outcome) {
        match &o.result {
            Ok(now) => tracing::info!(part = o.part, "{trigger}: reloaded: {now}"),
            Err(why) => tracing::error!(
                part = o.part,
                "{trigger}: reload failed, the previous files stay in effect: {why}"
            ),
        }
        let result = if o.result.is_ok() { "ok" } else { "failed" };
        counter!(RELOADS, "part" => o.part, "result" => result).increment(1);
        let (now, reason) = match &o.result {
            Ok(now) => (Some(now.as_str()), None),
            Err(why) => (None, Some(why.to_string())),
        };
        self.audit.record(
            AuditEvent::new(&SessionContext::internal(), Operation::ConfigReloaded).with_detail(
                json!({
                    "part": o.part,
                    "result": result,
                    "loaded": now,
                    "reason": reason,
                }),
            ),
        );
    }

    /// Reads the configuration again and puts in effect what can be; the
    /// summary names the keys applied and those waiting for a restart.
    fn reload_config(&self, in_effect: &mut InEffect) -> anyhow::Result<String> {
        let old = in_effect.layered.clone();
        let new = load_for_serve(&self.loader)?;
        warn_unknown(&new);
        new.config.claims_settings()?;
        let changed = old.changed(&new)?;
        let (live, restart): (Vec<String>, Vec<String>) = changed
            .into_iter()
            .partition(|k| applies_live(k, &old.config, &new.config));
        let layered = new.keeping(&old, &restart)?;
        let cfg = &layered.config;
        // The store, the evidence worker and the gate read them at their
        // next decision.
        self.claims_timings.replace(ClaimsTimings::of(cfg));
        if live.iter().any(|k| LEG_KEYS.contains(&k.as_str())) {
            self.replace_legs(cfg)?;
        }
        if live.iter().any(|k| k.starts_with("admin.token")) {
            self.token.replace(cfg.admin.token.clone());
        }
        if !restart.is_empty() {
            tracing::warn!(
                keys = %restart.join(", "),
                "the configuration changed keys that need a restart; until then the values \
                 the proxy started with stay in effect"
            );
        }
        in_effect.layered = layered;
        in_effect.awaiting_restart = restart.clone();
        let file = self
            .loader
            .file
            .as_deref()
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        Ok(match (live.is_empty(), restart.is_empty()) {
            (true, true) => format!("configuration {file}: no change"),
            (_, true) => format!("configuration {file}: applied {}", shown(&live)),
            (true, _) => format!(
                "configuration {file}: needs a restart for {}",
                shown(&restart)
            ),
            _ => format!(
                "configuration {file}: applied {}; needs a restart for {}",
                shown(&live),
                shown(&restart)
            ),
        })
    }

    /// The fork filter switch and the consume-once gate's settings of
    /// `cfg`; the gate keeps its store and evidence worker.
    fn replace_legs(&self, cfg: &Config) -> anyhow::Result<()> {
        let settings = cfg.claims_settings()?;
        self.rules.replace_legs(|legs| {
            let claims = match (&legs.claims, &settings) {
                (Some(leg), Some(s)) => Some(Arc::new(ClaimsLeg {
                    store: Arc::clone(&leg.store),
                    proxy_id: leg.proxy_id.clone(),
                    lapse_ms: s.lapse_ms,
                    timings: Arc::clone(&leg.timings),
                    policy: s.policy,
                    inspection_patterns: s.inspection_patterns.clone(),
                    inspection_sql_hint: s.inspection_sql_hint,
                    evidence: leg.evidence.clone(),
                    held: Arc::clone(&leg.held),
                    parked: Arc::clone(&leg.parked),
                    draining: leg.draining.clone(),
                    fence_in_transaction: leg.fence_in_transaction.clone(),
                    fence_lookups: Arc::clone(&leg.fence_lookups),
                })),
                (leg, _) => leg.clone(),
            };
            Legs {
                fork_filter: cfg.enforce.fork_filter,
                claims,
                ..legs.clone()
            }
        });
        Ok(())
    }

    fn reload_part(&self, part: &Part<'_>, cfg: &Config) -> anyhow::Result<String> {
        match part {
            Part::Config => Ok(String::new()),
            Part::Rules => {
                let rules = load_rules(cfg)?;
                let summary = format!(
                    "{} saver profiles, {} channel rules",
                    rules.profiles,
                    rules.validity.len()
                );
                self.rules.replace(rules.classifier, rules.validity);
                Ok(summary)
            }
            Part::ClientTls(tls) => {
                tls.reload()?;
                Ok(format!("client certificate {}", tls.cert_path().display()))
            }
            Part::UpstreamTls(tls) => {
                tls.reload()?;
                Ok("upstream TLS roots and client certificate".to_owned())
            }
            Part::AuditJsonl(path) => {
                self.audit.reopen_jsonl(path)?;
                Ok(format!("audit JSONL file {path} reopened"))
            }
        }
    }
}

/// An error's text on one line (a TOML error shows the line at fault
/// beneath its message), so the log line carries its part.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

/// Keys as a list for a log line.
fn shown(keys: &[String]) -> String {
    keys.join(", ")
}

impl AdminControl for Reloader {
    fn config(&self) -> String {
        let in_effect = self.lock();
        let mut text = show::render(&in_effect.layered).unwrap_or_else(|e| format!("# {e}\n"));
        if !in_effect.awaiting_restart.is_empty() {
            text.push_str(&format!(
                "\n# changed by the last reload, in effect after a restart: {}\n",
                shown(&in_effect.awaiting_restart)
            ));
        }
        text
    }

    fn reload(&self) -> serde_json::Value {
        let outcomes = Reloader::reload(self, "POST /reload");
        let parts: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|o| match &o.result {
                Ok(now) => json!({"part": o.part, "result": "ok", "loaded": now}),
                Err(why) => json!({"part": o.part, "result": "failed", "reason": why.to_string()}),
            })
            .collect();
        let awaiting = self.lock().awaiting_restart.clone();
        json!({"parts": parts, "awaiting_restart": awaiting})
    }
}

/// One thing a reload reads again.
enum Part<'a> {
    Config,
    Rules,
    ClientTls(&'a ClientTls),
    UpstreamTls(&'a UpstreamTls),
    /// The JSONL audit file, by path.
    AuditJsonl(&'a str),
}

impl Part<'_> {
    fn name(&self) -> &'static str {
        match self {
            Part::Config => "config",
            Part::Rules => "rules",
            Part::ClientTls(_) => "client_tls",
            Part::UpstreamTls(_) => "upstream_tls",
            Part::AuditJsonl(_) => "audit_jsonl",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use resumeguard::audit::AuditSink;
    use resumeguard::claims::ClaimStore;
    use resumeguard::config::shared_schema::SHARED_SCHEMA;
    use resumeguard::config::Flags;
    use resumeguard::enforce::{Enforcement, Legs};
    use resumeguard::pg::PgTarget;
    use resumeguard::policy::claims::COMMIT_COVER_MS;
    use resumeguard::wire::proxy::RelayConfig;

    use super::*;

    const ITEMS: &str = "[[channel]]\nname = \"items\"\nschema = { type = \"array\", items = { type = \"string\" } }\n";
    const COUNT: &str = "[[channel]]\nname = \"count\"\nschema = { type = \"integer\" }\n";

    fn rules_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rg-sighup-{}-{tag}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(dir.join("channels")).unwrap();
        std::fs::write(dir.join("channels/items.toml"), ITEMS).unwrap();
        dir
    }

    fn reloader(dir: &Path) -> Reloader {
        let mut flags = Flags::default();
        flags.set("rules_dir", dir.to_str().unwrap(), "--rules");
        started(Loader { file: None, flags }, None)
    }

    /// A reloader of what `loader` reads, with the consume-once gate over
    /// `claims` if given.
    /// A claim store nothing answers: these tests read the leg's
    /// timings, never a claim.
    fn unreachable_store() -> ClaimStore {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let dsn = format!("host=127.0.0.1 port={port} user=rg dbname=claims");
        ClaimStore::connect(PgTarget::from_dsn(&dsn).unwrap(), SHARED_SCHEMA)
    }

    fn started(loader: Loader, claims: Option<Arc<ClaimStore>>) -> Reloader {
        let layered = load_for_serve(&loader).unwrap();
        let cfg = &layered.config;
        let rules = load_rules(cfg).unwrap();
        let timings = LiveClaimsTimings::new(ClaimsTimings::of(cfg));
        let claims = claims.map(|store| {
            let s = cfg.claims_settings().unwrap().unwrap();
            Arc::new(ClaimsLeg {
                store,
                proxy_id: s.proxy_id,
                lapse_ms: s.lapse_ms,
                timings: Arc::clone(&timings),
                policy: s.policy,
                inspection_patterns: s.inspection_patterns,
                inspection_sql_hint: s.inspection_sql_hint,
                evidence: None,
                held: Arc::default(),
                parked: Arc::default(),
                draining: Default::default(),
                fence_in_transaction: None,
                fence_lookups: Arc::default(),
            })
        });
        let enforcement = Reloadable::new(Enforcement::new(
            rules.classifier,
            Legs {
                validity: rules.validity,
                claims,
                ..Legs::default()
            },
            AuditSink::disabled(),
        ));
        let guards = Arc::new(Arc::clone(&enforcement));
        let proxy = Arc::new(Proxy::new(RelayConfig::default(), guards));
        let running = Running {
            rules: enforcement,
            proxy,
            audit: AuditSink::disabled(),
            token: AdminToken::new(cfg.admin.token.clone()),
            claims_timings: timings,
        };
        Reloader::new(loader, layered, running)
    }

    fn channels(r: &Reloader) -> usize {
        r.rules.current().legs.validity.len()
    }

    #[test]
    fn a_changed_rule_file_is_in_effect_after_a_reload() {
        let dir = rules_dir("changed");
        let r = reloader(&dir);
        assert_eq!(channels(&r), 1);
        std::fs::write(dir.join("channels/count.toml"), COUNT).unwrap();
        assert_eq!(channels(&r), 1, "nothing changes before the signal");
        let outcomes = r.reload("SIGHUP");
        assert_eq!(outcomes.len(), 1, "no TLS configured: rules only");
        let done = outcomes[0].result.as_ref().unwrap();
        assert!(done.contains("2 channel rules"), "{done}");
        assert_eq!(channels(&r), 2);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_broken_rule_file_keeps_the_rules_in_effect() {
        let dir = rules_dir("broken");
        let r = reloader(&dir);
        let before = r.rules.current();
        std::fs::write(dir.join("channels/count.toml"), "[[channel]\nname = ").unwrap();
        let outcomes = r.reload("SIGHUP");
        let why = outcomes[0].result.as_ref().unwrap_err().to_string();
        assert!(why.contains("count.toml"), "{why}");
        assert!(
            Arc::ptr_eq(&before, &r.rules.current()),
            "the old set stays"
        );
        // A profile that does not load fails the whole part too: the
        // channel rules beside it are not taken alone.
        std::fs::remove_file(dir.join("channels/count.toml")).unwrap();
        std::fs::write(dir.join("channels/count.toml"), COUNT).unwrap();
        std::fs::write(dir.join("custom.toml"), "not = [a profile").unwrap();
        let why = r.reload("SIGHUP").remove(0).result.unwrap_err().to_string();
        assert!(why.contains("custom.toml"), "{why}");
        assert_eq!(channels(&r), 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_reload_puts_new_claims_timings_in_effect_for_the_gate_and_the_store() {
        let dir = rules_dir("timings");
        let file = dir.join("rg.toml");
        let text = |lease: i64, hold: i64| {
            format!("[claims]\nrun_lease_ms = {lease}\nprogress_hold_ms = {hold}\n")
        };
        std::fs::write(&file, text(0, 1_000)).unwrap();
        let store = Arc::new(unreachable_store());
        let r = started(
            Loader::new(Some(file.clone()), Flags::default()),
            Some(store),
        );
        let leg = r.rules.current().legs.claims.clone().unwrap();
        assert!(!leg.run_lease(), "no run lease configured");
        assert_eq!(leg.fence_cover_ms(), COMMIT_COVER_MS.max(1_000));

        std::fs::write(&file, text(5_000, 30_000)).unwrap();
        let outcomes = r.reload("SIGHUP");
        let done = outcomes[0].result.as_ref().unwrap();
        assert!(
            done.contains("applied claims.progress_hold_ms, claims.run_lease_ms")
                && !done.contains("restart"),
            "{done}"
        );
        // The gate the sessions hold sees them without being replaced.
        assert!(leg.run_lease());
        assert_eq!(leg.fence_cover_ms(), 30_000);
        assert_eq!(r.claims_timings.current().run_lease_ms, 5_000);
        std::fs::remove_dir_all(&dir).ok();
    }

    fn lapse_ms(r: &Reloader) -> i64 {
        r.rules.current().legs.claims.as_ref().unwrap().lapse_ms
    }

    #[test]
    fn a_changed_configuration_file_applies_what_it_can_and_names_the_rest() {
        let dir = rules_dir("config");
        let file = dir.join("rg.toml");
        let token = dir.join("token");
        std::fs::write(&token, "first\n").unwrap();
        let text = |lapse: i64, listen: &str, proxy_id: &str| {
            format!(
                "listen = '{listen}'\n[claims]\nlapse_ms = {lapse}\nproxy_id = '{proxy_id}'\n\
                 [admin]\ntoken_file = '{}'\n",
                token.display()
            )
        };
        std::fs::write(&file, text(2_000, "127.0.0.1:7000", "a")).unwrap();
        let store = Arc::new(unreachable_store());
        let r = started(
            Loader::new(Some(file.clone()), Flags::default()),
            Some(store),
        );
        assert_eq!(lapse_ms(&r), 2_000);
        assert_eq!(
            r.token.current().as_deref().map(String::as_str),
            Some("first")
        );

        std::fs::write(&file, text(300, "127.0.0.1:7001", "b")).unwrap();
        std::fs::write(&token, "second\n").unwrap();
        let outcomes = r.reload("SIGHUP");
        assert_eq!(outcomes[0].part, "config");
        let done = outcomes[0].result.as_ref().unwrap();
        assert!(
            done.contains("applied admin.token, claims.lapse_ms")
                && done.contains("needs a restart for claims.proxy_id, listen"),
            "{done}"
        );
        assert_eq!(lapse_ms(&r), 300, "the gate takes the new lapse");
        assert_eq!(
            r.token.current().as_deref().map(String::as_str),
            Some("second")
        );
        let shown = AdminControl::config(&r);
        assert!(shown.contains("lapse_ms = 300  # file"), "{shown}");
        assert!(shown.contains("listen = \"127.0.0.1:7000\""), "{shown}");
        assert!(
            shown.contains("in effect after a restart: claims.proxy_id, listen"),
            "{shown}"
        );
        assert!(!shown.contains("second"), "{shown}");

        // A file that does not load changes nothing.
        std::fs::write(&file, "[claims]\nlapse_ms = 'soon'\n").unwrap();
        let outcomes = r.reload("SIGHUP");
        let why = outcomes[0].result.as_ref().unwrap_err().to_string();
        assert!(why.contains("rg.toml"), "{why}");
        assert_eq!(lapse_ms(&r), 300);
        assert_eq!(outcomes[1].part, "rules", "the rules are read all the same");
        std::fs::remove_dir_all(&dir).ok();
    }
}
