//! Evidence that arrives together, gathered so the store takes it in one
//! statement: a run's writes commit within milliseconds of each other, and
//! one round trip for all of them costs the store (and the host it shares
//! with the sessions) one wake-up instead of one per write. Gathering ends
//! when nothing more arrived for [`QUIET`], when the first item has waited
//! [`MAX_WAIT`], or at [`MAX_ITEMS`]: evidence is never held back longer
//! than that.
//!
//! The quiet time is longer than the gap between an operation's writes
//! (1–5 ms near the database, a round trip at a distance), so an
//! operation's evidence is applied once it has ended, in one statement,
//! rather than part-way through it, where its statement would compete
//! with the operation's own for the host's cores. Holding it back costs
//! nothing a decision needs: in the fronted placement an answering write
//! consumes its claim, and a progress write keeps its claim, inside its
//! own transaction; elsewhere the longest wait is far below every lapse
//! and lease. A decision that reads what evidence leaves behind (a late
//! duplicate's first answer) has the worker apply what it gathered first
//! (`EvidenceSender::flush`).

use std::time::{Duration, Instant};

/// Gathering ends once nothing more arrived for this long.
pub const QUIET: Duration = Duration::from_millis(10);

/// The longest the first gathered item waits.
pub const MAX_WAIT: Duration = Duration::from_millis(50);

/// The most items one statement applies.
pub const MAX_ITEMS: usize = 128;

/// Items gathered for one statement, in arrival order.
#[derive(Debug)]
pub struct Gathered<T> {
    items: Vec<T>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl<T> Gathered<T> {
    pub fn new() -> Self {
        Gathered {
            items: Vec::new(),
            first: None,
            last: None,
        }
    }

    /// Adds `item`, arrived at `now`; says whether the gathering is full.
    pub fn push(&mut self, item: T, now: Instant) -> bool {
        self.items.push(item);
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.items.len() >= MAX_ITEMS
    }

    /// How long until the gathered items are due; `None` when there are
    /// none.
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        let (first, last) = (self.first?, self.last?);
        let due = (last + QUIET).min(first + MAX_WAIT);
        Some(due.saturating_duration_since(now))
    }

    /// The gathered items, in arrival order; gathering starts afresh.
    pub fn take(&mut self) -> Vec<T> {
        self.first = None;
        self.last = None;
        std::mem::take(&mut self.items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_due_once_nothing_more_arrived_for_the_quiet_time() {
        let t0 = Instant::now();
        let mut g = Gathered::new();
        assert_eq!(g.due_in(t0), None);
        assert!(!g.push(1, t0));
        let t1 = t0 + Duration::from_millis(2);
        assert!(!g.push(2, t1));
        assert_eq!(g.due_in(t1), Some(QUIET));
        assert_eq!(g.due_in(t1 + QUIET), Some(Duration::ZERO));
        assert_eq!(g.take(), vec![1, 2]);
        assert_eq!(g.due_in(t1), None);
    }

    #[test]
    fn a_steady_stream_is_cut_at_the_longest_wait() {
        let t0 = Instant::now();
        let mut g = Gathered::new();
        let mut now = t0;
        while now < t0 + MAX_WAIT {
            g.push((), now);
            now += Duration::from_millis(1);
        }
        assert_eq!(g.due_in(now), Some(Duration::ZERO));
        // A new gathering starts its own wait.
        g.take();
        g.push((), now);
        assert_eq!(g.due_in(now), Some(QUIET));
    }

    #[test]
    fn a_full_gathering_says_so() {
        let now = Instant::now();
        let mut g = Gathered::new();
        let full: Vec<bool> = (0..MAX_ITEMS).map(|i| g.push(i, now)).collect();
        assert!(full[..MAX_ITEMS - 1].iter().all(|f| !f));
        assert!(full[MAX_ITEMS - 1]);
    }
}
