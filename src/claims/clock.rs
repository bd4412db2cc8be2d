//! The time base of every claim: the claims database's clock, as this
//! process estimates it, so proxies on hosts whose clocks disagree still
//! agree on when a claim lapses, a lease ends or a holder counts as gone.
//!
//! Each proxy samples the PostgreSQL store's `clock_timestamp()` on its
//! liveness connection (at connect, then every heartbeat, off the request
//! path) and keeps the offset from its own wall clock, taken at the
//! middle of the sample's round trip: the estimate is off by at most half
//! that round trip. Claim times are this process's wall clock plus that
//! offset; the proxies' own clocks never meet. With the SQLite store (one
//! host, one clock) the offset stays 0.
//!
//! Waits measured inside the proxy (how long a reader has waited) use the
//! monotonic clock, never this one.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds to add to this host's wall clock to read the claims
/// database's.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// This host's wall clock, milliseconds since the Unix epoch.
pub fn local_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// The claims database's clock now, milliseconds since the Unix epoch:
/// the time base of every claim, lease and holder-gone time.
pub fn now_ms() -> i64 {
    local_ms().saturating_add(OFFSET_MS.load(Ordering::Relaxed))
}

/// The offset currently applied (database minus this host), in ms.
pub fn offset_ms() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}

/// One reading of the database's clock: `server_ms`, read by a statement
/// sent at local time `sent_ms` and answered at `answered_ms`. Returns
/// the offset it implies (the server read its clock, at the latest, when
/// it answered and, at the earliest, when the statement arrived: the
/// middle of the round trip is the best guess).
pub fn offset_of(sent_ms: i64, server_ms: i64, answered_ms: i64) -> i64 {
    let middle = sent_ms + (answered_ms.saturating_sub(sent_ms)) / 2;
    server_ms.saturating_sub(middle)
}

/// Applies a reading (see [`offset_of`]); logs when the offset moves by
/// more than a second (a clock stepped on either side).
pub fn observe(sent_ms: i64, server_ms: i64, answered_ms: i64) {
    let offset = offset_of(sent_ms, server_ms, answered_ms);
    let before = OFFSET_MS.swap(offset, Ordering::Relaxed);
    if (offset - before).abs() > 1_000 {
        tracing::info!(
            offset_ms = offset,
            previous_ms = before,
            "claims clock: this host's clock differs from the claims database's; claim times \
             follow the database's"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_round_trip() {
        // Sent at 1000, answered at 1010, the server read 31005: 30 s ahead.
        assert_eq!(offset_of(1_000, 31_005, 1_010), 30_000);
        // A server behind this host.
        assert_eq!(offset_of(50_000, 20_001, 50_002), -30_000);
    }
}
