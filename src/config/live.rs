//! The claims timings a reload may change ([`ClaimsTimings`], shared
//! through `claims::timings::LiveClaimsTimings`) as the configuration
//! sets them: which keys they are, and their values from `[claims]`.

use super::{ClaimsConfig, Config};
use crate::claims::timings::ClaimsTimings;

/// The keys of [`ClaimsTimings`].
pub const CLAIMS_TIMING_KEYS: &[&str] = &[
    "claims.run_lease_ms",
    "claims.progress_hold_ms",
    "claims.holder_gone_grace_ms",
];

impl ClaimsTimings {
    pub fn of(cfg: &Config) -> ClaimsTimings {
        ClaimsTimings::of_claims(&cfg.claims)
    }

    /// The timings of `[claims]`; a negative value counts as 0.
    pub fn of_claims(c: &ClaimsConfig) -> ClaimsTimings {
        ClaimsTimings {
            run_lease_ms: c.run_lease_ms.max(0),
            progress_hold_ms: c.progress_hold_ms.max(0),
            holder_gone_grace_ms: c.holder_gone_grace_ms.max(0),
        }
    }
}
