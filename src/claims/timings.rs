//! Claims timings a reload may change, in one shared handle: `serve` makes
//! it from the configuration (`config::live`), each reload stores the new
//! values, and the claims store, its evidence worker and the consume-once
//! gate read it at each decision.

use std::sync::Arc;

use arc_swap::ArcSwap;

/// Default run lease: how long after the answering run's latest write
/// another session's read of a thread head with tasks still to run is
/// refused (it would run the same tasks again).
pub const DEFAULT_RUN_LEASE_MS: i64 = 10 * 1000;
/// Default of how long a claim stays held after its run-level answer is
/// recorded.
pub const DEFAULT_PROGRESS_HOLD_MS: i64 = 10_000;
/// Default of how soon the claim of a holder whose connection closed
/// lapses.
pub const DEFAULT_HOLDER_GONE_GRACE_MS: i64 = 1_000;

/// The claims timings read through the shared handle (not the gate's
/// `lapse_ms` and wait policy, which a reload replaces with the gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimsTimings {
    /// `[claims] run_lease_ms` (0: no run lease).
    pub run_lease_ms: i64,
    /// `[claims] progress_hold_ms`: how long a claim stays held after its
    /// run-level answer is recorded.
    pub progress_hold_ms: i64,
    /// `[claims] holder_gone_grace_ms`: how soon the claim of a holder
    /// whose connection closed lapses.
    pub holder_gone_grace_ms: i64,
}

impl Default for ClaimsTimings {
    /// The defaults of `[claims]`.
    fn default() -> ClaimsTimings {
        ClaimsTimings {
            run_lease_ms: DEFAULT_RUN_LEASE_MS,
            progress_hold_ms: DEFAULT_PROGRESS_HOLD_MS,
            holder_gone_grace_ms: DEFAULT_HOLDER_GONE_GRACE_MS,
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

    /// A handle of its own holding these timings with `change` made (a
    /// store in a test with one value set).
    #[cfg(test)]
    pub fn changed(&self, change: impl FnOnce(&mut ClaimsTimings)) -> Arc<LiveClaimsTimings> {
        let mut timings = self.current();
        change(&mut timings);
        LiveClaimsTimings::new(timings)
    }
}
