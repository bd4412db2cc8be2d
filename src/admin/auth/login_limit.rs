//! Failed console logins, counted per client address: past
//! [`MAX_FAILURES`] in a [`WINDOW`], that address is answered 429 until
//! its oldest failure leaves the window. Bounded in addresses kept.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed logins an address may make in [`WINDOW`].
pub const MAX_FAILURES: usize = 5;

/// The window failed logins are counted in.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Addresses tracked at once; past it the quietest are forgotten.
const MAX_ADDRESSES: usize = 4096;

#[derive(Default)]
pub struct LoginLimit {
    failures: Mutex<HashMap<IpAddr, VecDeque<Instant>>>,
}

impl LoginLimit {
    /// Whether `addr` has used up its failed logins for now.
    pub fn blocked(&self, addr: IpAddr) -> bool {
        let mut map = self.lock();
        let now = Instant::now();
        match map.get_mut(&addr) {
            Some(times) => {
                forget_old(times, now);
                times.len() >= MAX_FAILURES
            }
            None => false,
        }
    }

    /// Counts a failed login of `addr`; how many it made in the window.
    pub fn failed(&self, addr: IpAddr) -> usize {
        let mut map = self.lock();
        let now = Instant::now();
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&addr) {
            map.retain(|_, times| {
                forget_old(times, now);
                !times.is_empty()
            });
            if map.len() >= MAX_ADDRESSES {
                let quietest = map
                    .iter()
                    .min_by_key(|(_, t)| t.back().copied())
                    .map(|(a, _)| *a);
                if let Some(a) = quietest {
                    map.remove(&a);
                }
            }
        }
        let times = map.entry(addr).or_default();
        forget_old(times, now);
        times.push_back(now);
        times.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, VecDeque<Instant>>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn forget_old(times: &mut VecDeque<Instant>, now: Instant) {
    while times
        .front()
        .is_some_and(|t| now.duration_since(*t) >= WINDOW)
    {
        times.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_blocked_after_its_failures_and_others_are_not() {
        let limit = LoginLimit::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for n in 1..=MAX_FAILURES {
            assert!(!limit.blocked(a));
            assert_eq!(limit.failed(a), n);
        }
        assert!(limit.blocked(a));
        assert!(!limit.blocked(b));
    }
}
