//! Claim evidence the store could not take yet (a claim row locked past
//! the lock timeout, the store down): kept in arrival order and retried
//! with backoff until applied, so a thread never stays refused because
//! its evidence was lost. Bounded: on overflow the oldest item is dropped,
//! and the caller reports each drop loudly.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::pg::Backoff;

/// First delay before a retry; doubled after each round that failed.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest delay between retry rounds.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Items waiting for a retry, each with the lane it is ordered in (the
/// session that produced it): a later item of a lane never overtakes an
/// earlier one that failed.
#[derive(Debug)]
pub struct RetryQueue<T> {
    items: VecDeque<(u64, T)>,
    bound: usize,
    backoff: Backoff,
    due: Option<Instant>,
    /// Retries made since the queue was last empty.
    retries: u64,
}

/// What one retry round did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub applied: usize,
    pub failed: usize,
}

impl<T> RetryQueue<T> {
    pub fn new(bound: usize) -> Self {
        RetryQueue {
            items: VecDeque::new(),
            bound: bound.max(1),
            backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            due: None,
            retries: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Retries made since the queue was last empty.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// Whether `lane` has an item waiting: its next item must queue
    /// behind it rather than be applied first.
    pub fn holds_lane(&self, lane: u64) -> bool {
        self.items.iter().any(|(l, _)| *l == lane)
    }

    /// Queues `item` for a retry after the current backoff; returns the
    /// oldest item when the bound overflows (the caller reports it lost).
    pub fn push(&mut self, lane: u64, item: T, now: Instant) -> Option<T> {
        self.items.push_back((lane, item));
        self.due.get_or_insert(now + self.backoff.wait());
        if self.items.len() > self.bound {
            return self.items.pop_front().map(|(_, item)| item);
        }
        None
    }

    /// How long until the next retry round; `None` when nothing waits.
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        if self.items.is_empty() {
            return None;
        }
        Some(
            self.due
                .map_or(Duration::ZERO, |d| d.saturating_duration_since(now)),
        )
    }

    /// Retries every waiting item, in order, with `apply` (true when the
    /// store took it). An item whose lane already failed in this round is
    /// not tried. After a round with failures the next waits twice as
    /// long (bounded); a clean round resets the backoff.
    pub fn retry(&mut self, now: Instant, mut apply: impl FnMut(&T) -> bool) -> Round {
        let mut round = Round::default();
        let mut failed_lanes: Vec<u64> = Vec::new();
        let mut kept = VecDeque::with_capacity(self.items.len());
        for (lane, item) in self.items.drain(..) {
            if !failed_lanes.contains(&lane) {
                self.retries += 1;
                if apply(&item) {
                    round.applied += 1;
                    continue;
                }
                failed_lanes.push(lane);
            }
            round.failed += 1;
            kept.push_back((lane, item));
        }
        self.items = kept;
        if self.items.is_empty() {
            self.backoff.reset();
            self.due = None;
            self.retries = 0;
        } else {
            self.backoff.grow();
            self.due = Some(now + self.backoff.wait());
        }
        round
    }

    /// Everything still waiting, oldest first (at shutdown).
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.due = None;
        self.items.drain(..).map(|(_, item)| item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_item_is_retried_in_order_until_applied() {
        let t0 = Instant::now();
        let mut q = RetryQueue::new(8);
        assert_eq!(q.push(1, "a", t0), None);
        assert_eq!(q.push(1, "b", t0), None);
        assert_eq!(q.due_in(t0), Some(FIRST_BACKOFF));
        let mut tried = Vec::new();
        // The store still refuses "a": "b" of the same lane is not tried.
        let round = q.retry(t0, |i| {
            tried.push(*i);
            false
        });
        assert_eq!(
            round,
            Round {
                applied: 0,
                failed: 2
            }
        );
        assert_eq!(tried, ["a"]);
        assert_eq!(q.due_in(t0), Some(FIRST_BACKOFF * 2));
        let mut tried = Vec::new();
        let round = q.retry(t0, |i| {
            tried.push(*i);
            true
        });
        assert_eq!(
            round,
            Round {
                applied: 2,
                failed: 0
            }
        );
        assert_eq!(tried, ["a", "b"]);
        assert!(q.is_empty());
        assert_eq!(q.due_in(t0), None);
        assert_eq!(q.retries(), 0);
    }

    #[test]
    fn another_lane_is_not_held_up_by_a_failing_one() {
        let t0 = Instant::now();
        let mut q = RetryQueue::new(8);
        q.push(1, "stuck", t0);
        q.push(2, "free", t0);
        assert!(q.holds_lane(1) && q.holds_lane(2) && !q.holds_lane(3));
        let round = q.retry(t0, |i| *i == "free");
        assert_eq!(
            round,
            Round {
                applied: 1,
                failed: 1
            }
        );
        assert_eq!(q.len(), 1);
        assert!(!q.holds_lane(2));
        assert_eq!(q.retries(), 2);
    }

    #[test]
    fn the_backoff_is_bounded_and_overflow_gives_back_the_oldest() {
        let t0 = Instant::now();
        let mut q = RetryQueue::new(2);
        q.push(1, 1, t0);
        q.push(2, 2, t0);
        assert_eq!(q.push(3, 3, t0), Some(1));
        for _ in 0..20 {
            q.retry(t0, |_| false);
        }
        assert_eq!(q.due_in(t0), Some(MAX_BACKOFF));
        assert_eq!(q.drain().collect::<Vec<_>>(), [2, 3]);
    }
}
