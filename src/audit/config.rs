//! Where the audit trail goes and how much the queue may hold.

use std::path::PathBuf;

use serde::Deserialize;

/// Default queue depth: deep enough to absorb bursts from many sessions
/// while the writer commits, small enough to bound memory (events are boxed,
/// so an empty slot costs one pointer).
pub const DEFAULT_QUEUE_CAPACITY: usize = 65_536;

/// `[audit]` section of the proxy configuration. Both outputs may be set at
/// once; with neither, auditing is off.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// SQLite database file for the queryable trail.
    pub sqlite: Option<PathBuf>,
    /// JSON Lines output: a file path (appended to) or `"-"` for stdout.
    pub jsonl: Option<String>,
    /// Events that may wait for the writer before new ones are dropped.
    pub queue_capacity: usize,
    /// Whether producers may put parameter values (not just digests) into
    /// `detail`. Off by default: the trail should not leak user data.
    pub log_values: bool,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            sqlite: None,
            jsonl: None,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            log_values: false,
        }
    }
}

impl AuditConfig {
    /// True when at least one output is configured.
    pub fn is_enabled(&self) -> bool {
        self.sqlite.is_some() || self.jsonl.is_some()
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
        assert_eq!(cfg.queue_capacity, DEFAULT_QUEUE_CAPACITY);
        assert!(!cfg.log_values);
        assert!(cfg.is_enabled());
        assert!(!AuditConfig::default().is_enabled());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<AuditConfig>(r#"{"sqlite_path":"x"}"#);
        assert!(err.is_err());
    }
}
