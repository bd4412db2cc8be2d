//! Retention of the PostgreSQL table, run by the writer: rows older than
//! `retention_days` go, a chunk per step, each chunk recorded by an
//! `audit_pruned` event of the replica that deleted it. Every replica
//! prunes; the delete is by age, so what one removed the others find gone.
//! `max_rows` is not applied here: the table is every replica's, and no
//! replica's cap is the right one for all of them.

use std::time::{Duration, Instant, SystemTime};

use super::config::AuditConfig;
use super::postgres_store::{PgTrail, PRUNE_CHUNK};
use crate::error_chain::chain;
use crate::timestamp::format_rfc3339_millis;

pub struct PgRetention {
    cfg: AuditConfig,
    interval: Duration,
    next: Instant,
    /// The cutoff of a prune whose last chunk was full.
    active: Option<String>,
}

impl PgRetention {
    pub fn new(cfg: &AuditConfig) -> PgRetention {
        PgRetention {
            cfg: cfg.clone(),
            interval: Duration::from_millis(cfg.prune_interval_ms.max(1)),
            next: Instant::now(),
            active: None,
        }
    }

    /// Whether a prune has chunks left (the writer should not sleep).
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// One chunk of a prune under way, or the start of one when due (once
    /// the trail's database is known).
    pub fn tick(&mut self, trail: &mut PgTrail, proxy_id: &str) {
        if !trail.is_known() {
            return;
        }
        let cutoff = match self.active.take() {
            Some(cutoff) => cutoff,
            None => {
                let now = Instant::now();
                if now < self.next {
                    return;
                }
                self.next = now + self.interval;
                match self.cfg.retention_cutoff(SystemTime::now()) {
                    Some(before) => format_rfc3339_millis(before),
                    None => return,
                }
            }
        };
        match trail.prune_step(&cutoff, proxy_id) {
            Ok(rows) => {
                if rows > 0 {
                    tracing::info!(rows, %cutoff, "audit retention: pruned the PostgreSQL table \
                        (audit_pruned recorded)");
                }
                if rows as i64 >= PRUNE_CHUNK {
                    self.active = Some(cutoff);
                }
            }
            Err(error) => tracing::warn!(
                error = %chain(&error),
                "audit prune of the PostgreSQL table failed; retrying at the next interval"
            ),
        }
    }
}
