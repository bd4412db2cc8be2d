//! Claims timings a reload may change, in one shared handle: `serve` makes
//! it from the configuration and each reload stores the new values; the
//! claims store and its evidence worker are to read it per decision.
//! Until they do ([`CLAIMS_READ_LIVE_TIMINGS`]), a change of these keys
//! is reported as needing a restart.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Config;

/// Whether the claims code reads [`LiveClaimsTimings`] (so a reload puts
/// a change of [`ClaimsTimings`] in effect). `false`: the store and the
/// evidence worker keep the values they were started with.
pub const CLAIMS_READ_LIVE_TIMINGS: bool = false;

/// The keys of [`ClaimsTimings`].
pub const CLAIMS_TIMING_KEYS: &[&str] = &[
    "claims.run_lease_ms",
    "claims.progress_hold_ms",
    "claims.holder_gone_grace_ms",
];

/// The claims timings held by the store and the evidence worker (not by
/// the gate, whose `lapse_ms` and wait policy a reload replaces itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimsTimings {
    /// `[claims] run_lease_ms` (0: no run lease).
    pub run_lease_ms: i64,
    /// `[claims] progress_hold_ms`.
    pub progress_hold_ms: i64,
    /// `[claims] holder_gone_grace_ms`.
    pub holder_gone_grace_ms: i64,
}

impl ClaimsTimings {
    pub fn of(cfg: &Config) -> ClaimsTimings {
        ClaimsTimings {
            run_lease_ms: cfg.claims.run_lease_ms,
            progress_hold_ms: cfg.claims.progress_hold_ms,
            holder_gone_grace_ms: cfg.claims.holder_gone_grace_ms,
        }
    }
}

/// The timings in effect, shared; cheap to read (one atomic load).
#[derive(Debug)]
pub struct LiveClaimsTimings(ArcSwap<ClaimsTimings>);

impl LiveClaimsTimings {
    pub fn new(timings: ClaimsTimings) -> Arc<LiveClaimsTimings> {
        Arc::new(LiveClaimsTimings(ArcSwap::from_pointee(timings)))
    }

    pub fn current(&self) -> ClaimsTimings {
        **self.0.load()
    }

    pub fn replace(&self, timings: ClaimsTimings) {
        self.0.store(Arc::new(timings));
    }
}
