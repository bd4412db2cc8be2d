//! Retention of the SQLite trail, run by its writer: every
//! `prune_interval_ms` a prune by `retention_days` and `max_rows` is
//! declared (an `audit_pruned` record) and then deleted a chunk per step,
//! so the writer never holds one long transaction.

use std::time::{Duration, Instant, SystemTime};

use super::config::AuditConfig;
use super::prune;
use super::sqlite_store::Store;
use crate::error_chain::chain;

pub struct SqliteRetention {
    cfg: AuditConfig,
    interval: Duration,
    next: Instant,
    /// A declared prune still has rows to delete.
    active: bool,
}

impl SqliteRetention {
    pub fn new(cfg: &AuditConfig) -> SqliteRetention {
        SqliteRetention {
            cfg: cfg.clone(),
            interval: Duration::from_millis(cfg.prune_interval_ms.max(1)),
            next: Instant::now(),
            active: false,
        }
    }

    /// Whether a declared prune has chunks left (the writer should not
    /// sleep).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// One unit of retention work: declare a prune when one is due, else
    /// delete one chunk of a declared one.
    pub fn tick(&mut self, store: &mut Store) {
        if self.active {
            match prune::step(store) {
                Ok(more) => self.active = more,
                Err(error) => {
                    tracing::warn!(
                        error = %chain(&error),
                        "audit prune step failed; retrying at the next interval"
                    );
                    self.active = false;
                }
            }
            return;
        }
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + self.interval;
        if let Some(rule) = self.cfg.prune_rule(SystemTime::now()) {
            match prune::begin(store, &rule, "retention") {
                Ok(Some(declared)) => tracing::info!(
                    rows = declared.rows,
                    below_id = declared.below_id,
                    "audit retention: pruning the oldest rows (audit_pruned recorded)"
                ),
                Ok(None) => {}
                Err(error) => tracing::warn!(error = %chain(&error), "audit prune failed"),
            }
        }
        self.active = prune::pending(store).unwrap_or(false);
    }
}
