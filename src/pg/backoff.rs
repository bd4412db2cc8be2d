//! How long a retry waits after failures: the first wait, doubled after
//! each failure up to a bound, and back to the first after a success. The
//! claims store's reconnects, the audit trail's and the claim evidence's
//! retries all wait so.

use std::time::Duration;

/// The wait before the next retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    wait: Duration,
}

impl Backoff {
    /// Waits `first` first, at most `max` ever.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            wait: first,
        }
    }

    /// The wait before the next retry.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// After a failure: the next wait is twice this one, up to the bound.
    pub fn grow(&mut self) {
        self.wait = (self.wait * 2).min(self.max);
    }

    /// After a success: the next wait is the first again.
    pub fn reset(&mut self) {
        self.wait = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_bound_and_a_success_starts_over() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let mut waits = Vec::new();
        for _ in 0..5 {
            waits.push(b.wait());
            b.grow();
        }
        assert_eq!(waits, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.wait(), ms(100));
    }
}
