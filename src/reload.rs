//! SIGHUP: the files the configuration names are read again — saver
//! profiles and channel rules, the certificate and key shown to clients,
//! the upstream's roots and client certificate — without dropping a
//! session. Each part that loads takes effect for what starts after it;
//! a part that does not load keeps what it had, says why at ERROR, and
//! is counted as failed. The configuration file itself is not read again.

use std::sync::Arc;

use metrics::{counter, describe_counter};
use serde_json::json;

use resumeguard::audit::{AuditEvent, AuditSink, Operation, SessionContext};
use resumeguard::config::Config;
use resumeguard::enforce::reload::Reloadable;
use resumeguard::policy::ChannelRules;
use resumeguard::saver::classify::Classifier;
use resumeguard::saver::profile::profiles_for;
use resumeguard::wire::client_stream::ClientTls;
use resumeguard::wire::proxy::Proxy;
use resumeguard::wire::upstream_tls::UpstreamTls;

/// Reloads, by part, counted under this name with `part` and `result`.
const RELOADS: &str = "resumeguard_reloads_total";

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
    /// `rules`, `client_tls` or `upstream_tls`.
    pub part: &'static str,
    /// What is in effect now, or why the old one stays.
    pub result: Result<String, String>,
}

/// Everything SIGHUP reloads, and where it goes.
pub struct Reloader {
    cfg: Config,
    rules: Arc<Reloadable>,
    proxy: Arc<Proxy>,
    /// Each part's outcome is audited (`config_reloaded`).
    audit: AuditSink,
}

impl Reloader {
    /// Starts the counters at zero, so a scrape shows them before the
    /// first SIGHUP (call it once the metrics recorder is installed).
    pub fn new(
        cfg: Config,
        rules: Arc<Reloadable>,
        proxy: Arc<Proxy>,
        audit: AuditSink,
    ) -> Reloader {
        describe_counter!(
            RELOADS,
            "SIGHUP reloads by part (rules, client_tls, upstream_tls) and result (ok, failed: \
             the previous files stay in effect)"
        );
        let reloader = Reloader {
            cfg,
            rules,
            proxy,
            audit,
        };
        for part in reloader.parts() {
            for result in ["ok", "failed"] {
                counter!(RELOADS, "part" => part.name(), "result" => result).increment(0);
            }
        }
        reloader
    }

    /// The parts there is something to reload for.
    fn parts(&self) -> Vec<Part<'_>> {
        let relay = &self.proxy.config;
        let mut parts = vec![Part::Rules];
        if let Some(tls) = &relay.client_tls {
            parts.push(Part::ClientTls(tls));
        }
        if relay.upstream_tls.has_files() {
            parts.push(Part::UpstreamTls(&relay.upstream_tls));
        }
        parts
    }

    /// Reloads every part (blocking: it reads files); logs and counts
    /// each outcome.
    pub fn reload(&self) -> Vec<Outcome> {
        tracing::info!("SIGHUP received: reloading the rules and certificates");
        let outcomes: Vec<Outcome> = self
            .parts()
            .into_iter()
            .map(|part| Outcome {
                part: part.name(),
                result: self.reload_part(part).map_err(|e| format!("{e:#}")),
            })
            .collect();
        for o in &outcomes {
            match &o.result {
                Ok(now) => tracing::info!(part = o.part, "SIGHUP: reloaded: {now}"),
                Err(why) => tracing::error!(
                    part = o.part,
                    "SIGHUP: reload failed, the previous files stay in effect: {why}"
                ),
            }
            let result = if o.result.is_ok() { "ok" } else { "failed" };
            counter!(RELOADS, "part" => o.part, "result" => result).increment(1);
            let (now, reason) = match &o.result {
                Ok(now) => (Some(now.as_str()), None),
                Err(why) => (None, Some(why.as_str())),
            };
            self.audit.record(
                AuditEvent::new(&SessionContext::internal(), Operation::ConfigReloaded)
                    .with_detail(json!({
                        "part": o.part,
                        "result": result,
                        "loaded": now,
                        "reason": reason,
                    })),
            );
        }
        outcomes
    }

    fn reload_part(&self, part: Part<'_>) -> anyhow::Result<String> {
        match part {
            Part::Rules => {
                let rules = load_rules(&self.cfg)?;
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
        }
    }
}

/// One thing a reload reads again.
enum Part<'a> {
    Rules,
    ClientTls(&'a ClientTls),
    UpstreamTls(&'a UpstreamTls),
}

impl Part<'_> {
    fn name(&self) -> &'static str {
        match self {
            Part::Rules => "rules",
            Part::ClientTls(_) => "client_tls",
            Part::UpstreamTls(_) => "upstream_tls",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use resumeguard::audit::AuditSink;
    use resumeguard::enforce::{Enforcement, Legs};
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
        let cfg = Config {
            rules_dir: Some(dir.to_owned()),
            ..Config::default()
        };
        let rules = load_rules(&cfg).unwrap();
        let enforcement = Reloadable::new(Enforcement {
            classifier: rules.classifier,
            legs: Legs {
                validity: rules.validity,
                ..Legs::default()
            },
            audit: AuditSink::disabled(),
        });
        let guards = Arc::new(Arc::clone(&enforcement));
        let proxy = Arc::new(Proxy::new(RelayConfig::default(), guards));
        Reloader::new(cfg, enforcement, proxy, AuditSink::disabled())
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
        let outcomes = r.reload();
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
        let outcomes = r.reload();
        let why = outcomes[0].result.as_ref().unwrap_err();
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
        let why = r.reload().remove(0).result.unwrap_err();
        assert!(why.contains("custom.toml"), "{why}");
        assert_eq!(channels(&r), 1);
        std::fs::remove_dir_all(&dir).ok();
    }
}
