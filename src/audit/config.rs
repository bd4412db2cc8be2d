//! Where the audit trail goes and how much the queue may hold.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::prune::PruneRule;

/// Default queue depth: deep enough to absorb bursts from many sessions
/// while the writer commits, small enough to bound memory (events are boxed,
/// so an empty slot costs one pointer).
pub const DEFAULT_QUEUE_CAPACITY: usize = 65_536;

/// Default age limit: a month of history answers "who resumed this run?"
/// for any run still being looked into.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;

/// Default row limit: at about 350 bytes a row, about 3.5 GB of trail,
/// whatever the traffic.
pub const DEFAULT_MAX_ROWS: u64 = 10_000_000;

/// Default time between the writer's retention checks.
pub const DEFAULT_PRUNE_INTERVAL_MS: u64 = 600_000;

/// `[audit]` section of the proxy configuration. The outputs may be set
/// together; with none, auditing is off.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// SQLite database file for the queryable trail.
    pub sqlite: Option<PathBuf>,
    /// JSON Lines output: a file path (appended to) or `"-"` for stdout.
    pub jsonl: Option<String>,
    /// Also keep the trail in `<schema>.audit_events` of the shared
    /// PostgreSQL schema (where the claims store is), so every replica's
    /// events for a thread are read as one timeline.
    pub postgres: bool,
    /// Events that may wait for each output's writer before that output
    /// drops new ones (a queue per output).
    pub queue_capacity: usize,
    /// Whether producers may put parameter values (not just digests) into
    /// `detail`. Off by default: the trail should not leak user data.
    pub log_values: bool,
    /// Rows older than this many days are pruned (SQLite and PostgreSQL);
    /// 0 keeps them.
    pub retention_days: u64,
    /// Only the newest this many SQLite rows are kept; 0: no limit. (The
    /// PostgreSQL table is shared by the replicas: no per-replica cap.)
    pub max_rows: u64,
    /// How often the writer applies the two limits above.
    pub prune_interval_ms: u64,
    /// Checkpoint metadata keys that name the person behind a run (LangGraph
    /// copies `config["configurable"]` and `config["metadata"]` entries into
    /// it); their values, and only theirs, are recorded as the approver.
    pub approver_keys: Vec<String>,
    /// JSON pointers (RFC 6901) into an answer's resume value (e.g. `/by`
    /// for `Command(resume={"approved": true, "by": "alice"})`): the first
    /// that names a value is recorded as the answer's approver, for every
    /// saver alike. Empty: off (the metadata keys only).
    pub approver_pointers: Vec<String>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            sqlite: None,
            jsonl: None,
            postgres: false,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            log_values: false,
            retention_days: DEFAULT_RETENTION_DAYS,
            max_rows: DEFAULT_MAX_ROWS,
            prune_interval_ms: DEFAULT_PRUNE_INTERVAL_MS,
            approver_keys: super::approver::default_keys(),
            approver_pointers: Vec::new(),
        }
    }
}

impl AuditConfig {
    /// True when at least one output is configured.
    pub fn is_enabled(&self) -> bool {
        self.sqlite.is_some() || self.jsonl.is_some() || self.postgres
    }

    /// The instant before which rows are pruned at `now` by age; `None`
    /// when `retention_days` is 0.
    pub fn retention_cutoff(&self, now: SystemTime) -> Option<SystemTime> {
        (self.retention_days > 0)
            .then(|| {
                now.checked_sub(Duration::from_secs(
                    self.retention_days.saturating_mul(86_400),
                ))
            })
            .flatten()
    }

    /// What the writer's periodic prune removes at `now`; `None` when
    /// both limits are off.
    pub fn prune_rule(&self, now: SystemTime) -> Option<PruneRule> {
        let before = self.retention_cutoff(now);
        let max_rows = (self.max_rows > 0).then_some(self.max_rows);
        (before.is_some() || max_rows.is_some()).then_some(PruneRule { before, max_rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_to_missing_fields() {
        let cfg: AuditConfig = serde_json::from_str(r#"{"jsonl":"-"}"#).unwrap();
        assert_eq!(cfg.jsonl.as_deref(), Some("-"));
        assert_eq!(cfg.sqlite, None);
        assert!(!cfg.postgres, "the PostgreSQL output is off by default");
        assert_eq!(cfg.queue_capacity, DEFAULT_QUEUE_CAPACITY);
        assert!(!cfg.log_values);
        assert!(cfg.is_enabled());
        assert!(!AuditConfig::default().is_enabled());
        assert_eq!(
            (cfg.retention_days, cfg.max_rows),
            (DEFAULT_RETENTION_DAYS, DEFAULT_MAX_ROWS)
        );
        assert_eq!(cfg.approver_keys, ["user_id", "user", "approver", "email"]);
        let pg: AuditConfig = serde_json::from_str(r#"{"postgres":true}"#).unwrap();
        assert!(pg.postgres && pg.is_enabled());
        let custom: AuditConfig = serde_json::from_str(r#"{"approver_keys":["sub"]}"#).unwrap();
        assert_eq!(custom.approver_keys, ["sub"]);
    }

    #[test]
    fn prune_rule_follows_the_limits() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 86_400);
        let rule = AuditConfig::default().prune_rule(now).unwrap();
        assert_eq!(
            rule.before,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(70 * 86_400))
        );
        assert_eq!(rule.max_rows, Some(DEFAULT_MAX_ROWS));
        let off = AuditConfig {
            retention_days: 0,
            max_rows: 0,
            ..AuditConfig::default()
        };
        assert_eq!(off.prune_rule(now), None);
        assert_eq!(off.retention_cutoff(now), None);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<AuditConfig>(r#"{"sqlite_path":"x"}"#);
        assert!(err.is_err());
    }
}
