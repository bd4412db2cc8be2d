//! The time base of every claim: the claims database's own clock, read
//! where it decides, so proxies on hosts whose clocks disagree still agree
//! on when a claim lapses, a lease ends or a holder counts as gone.
//!
//! Every lapse, lease expiry, takeover, abandoned-run and holder-gone time
//! is computed in SQL from the server's `clock_timestamp()`
//! (`<schema>.clock_ms()`, see `claims::postgres::db_clock`). The proxy
//! passes durations (the lapse, the lease, a grace, how long ago a write
//! passed it), never instants: the proxies' clocks never meet.
//!
//! Waits measured inside the proxy (how long a reader has waited, how
//! long ago a write passed, until when a remembered claim is answered
//! from memory) use the monotonic clock.

use std::time::Instant;

/// Milliseconds since `at` on this process's monotonic clock.
pub fn elapsed_ms(at: Instant) -> i64 {
    i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds since `at`, rounded up, on this process's monotonic clock.
fn elapsed_ms_ceil(at: Instant) -> i64 {
    let micros = at.elapsed().as_micros();
    i64::try_from(micros.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// This host's wall clock, ms since the Unix epoch: tests place instants
/// of the test server's clock with it (it runs on this host).
#[cfg(test)]
pub fn wall_clock_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// When a claims operation is decided: on the store's clock as it reads
/// when it decides. Tests replaying a history give the store a fixed
/// instant of its clock instead (`From<i64>`, test builds only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now(Option<i64>);

impl Now {
    /// The store's clock, read by the store as it decides.
    pub const STORE: Now = Now(None);

    /// The fixed instant a test gave, if any.
    pub fn fixed(self) -> Option<i64> {
        self.0
    }
}

#[cfg(test)]
impl From<i64> for Now {
    fn from(ms: i64) -> Now {
        Now(Some(ms))
    }
}

/// When the write that is a claim's evidence passed the proxy: claims
/// taken after it (on a newer interrupt of the same checkpoint) are not
/// consumed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrittenAt {
    /// At this instant of this process's monotonic clock: the store
    /// places it on its own clock as "this long before now".
    Sent(Instant),
    /// At this instant of the store's clock (tests; `i64::MAX`: by any
    /// time).
    #[cfg(test)]
    Store(i64),
}

impl WrittenAt {
    /// How many ms before `now` the write passed (negative: after it).
    #[cfg_attr(not(test), allow(unused_variables))]
    pub fn ago_ms(self, now: Now) -> i64 {
        match self {
            WrittenAt::Sent(at) => elapsed_ms(at),
            #[cfg(test)]
            WrittenAt::Store(ms) => now.fixed().unwrap_or_else(wall_clock_ms).saturating_sub(ms),
        }
    }

    /// How many ms before `now` the write passed, for a consumption: the
    /// elapsed time rounded up and one ms more, so the store's whole-ms
    /// clock never places a claim taken after the write (a newer interrupt
    /// of the same checkpoint, read a fraction of a ms after the write
    /// committed) at or before it. The claim taken by the resume the write
    /// belongs to came a client's round trip before it; one taken less
    /// than about 3 ms before (the rounding up, the extra ms, the store's
    /// rounding of its own clock) is consumed by the next checkpoint
    /// instead.
    #[cfg_attr(not(test), allow(unused_variables))]
    pub fn consumed_ago_ms(self, now: Now) -> i64 {
        match self {
            WrittenAt::Sent(at) => elapsed_ms_ceil(at).saturating_add(1),
            #[cfg(test)]
            WrittenAt::Store(_) => self.ago_ms(now),
        }
    }
}

#[cfg(test)]
impl From<i64> for WrittenAt {
    fn from(ms: i64) -> WrittenAt {
        WrittenAt::Store(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_sent_now_is_placed_at_the_stores_now() {
        let sent = WrittenAt::Sent(Instant::now());
        assert!(sent.ago_ms(Now::STORE) >= 0);
        assert_eq!(WrittenAt::from(900).ago_ms(Now::from(1_000)), 100);
        assert!(WrittenAt::from(i64::MAX).ago_ms(Now::from(1_000)) < 0);
    }

    #[test]
    fn a_consumption_is_placed_a_whole_ms_before_the_write_passed() {
        let at = Instant::now();
        let sent = WrittenAt::Sent(at);
        // measured first: at most the elapsed time the placement sees
        let elapsed = at.elapsed().as_micros() as i64;
        let ago = sent.consumed_ago_ms(Now::STORE);
        // rounded up and one ms more: more than a whole ms before the write
        assert!(ago * 1000 >= elapsed + 1000, "{ago} ms for {elapsed} µs");
    }
}
