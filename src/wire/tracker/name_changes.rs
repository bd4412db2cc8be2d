//! One name's unanswered changes, oldest first, with alike neighbours
//! merged into runs: what a lookup asks of them (the latest change, and
//! whether every change leaves the name alike its confirmed state) is
//! answered in constant time however many changes wait.

use std::collections::VecDeque;

/// Runs kept allocated once a name's changes are all answered; a deep
/// pipeline's larger buffer is let go.
const KEEP_RUNS: usize = 64;

/// States of a name that no lookup tells apart: a change to one of them
/// cannot matter to a name in another of them.
pub(super) trait Alike {
    fn alike(a: Option<&Self>, b: Option<&Self>) -> bool;
}

/// When a change was sent: its place among every change the tracker
/// queued, and the client's Sync count then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sent {
    pub(super) order: u64,
    pub(super) segment: u64,
}

/// Consecutive changes alike one another.
#[derive(Debug)]
struct Run<T> {
    /// The name's state after the latest of them.
    effect: Option<T>,
    count: usize,
    /// The latest of them.
    latest: Sent,
}

#[derive(Debug)]
pub(super) struct NameChanges<T> {
    runs: VecDeque<Run<T>>,
}

impl<T> Default for NameChanges<T> {
    fn default() -> Self {
        NameChanges {
            runs: VecDeque::new(),
        }
    }
}

impl<T: Alike> NameChanges<T> {
    pub(super) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Adds the newest change: the name holds `effect` once it applies.
    pub(super) fn push_newest(&mut self, sent: Sent, effect: Option<T>) {
        if let Some(run) = self.runs.back_mut() {
            if T::alike(run.effect.as_ref(), effect.as_ref()) {
                run.effect = effect;
                run.count += 1;
                run.latest = sent;
                return;
            }
        }
        self.runs.push_back(Run {
            effect,
            count: 1,
            latest: sent,
        });
    }

    /// Forgets the oldest change (answered, or skipped by the server).
    /// False when there was none.
    pub(super) fn pop_oldest(&mut self) -> bool {
        let Some(run) = self.runs.front_mut() else {
            return false;
        };
        run.count -= 1;
        if run.count == 0 {
            self.runs.pop_front();
            if self.runs.is_empty() && self.runs.capacity() > KEEP_RUNS {
                self.runs.shrink_to(KEEP_RUNS);
            }
        }
        true
    }

    /// The newest change: when it was sent, and what it leaves.
    pub(super) fn latest(&self) -> Option<(Sent, Option<&T>)> {
        self.runs.back().map(|r| (r.latest, r.effect.as_ref()))
    }

    /// Whether every change leaves the name alike `confirmed`.
    pub(super) fn all_alike(&self, confirmed: Option<&T>) -> bool {
        match self.runs.len() {
            0 => true,
            // Alike neighbours are merged: two runs differ from each
            // other, so one of them differs from `confirmed`.
            1 => self
                .runs
                .front()
                .is_some_and(|r| T::alike(r.effect.as_ref(), confirmed)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Alike when equal; `Some(0)` is alike nothing, not even itself (as
    /// a watched portal is alike no other portal).
    impl Alike for u32 {
        fn alike(a: Option<&u32>, b: Option<&u32>) -> bool {
            a == b && a != Some(&0)
        }
    }

    fn sent(order: u64, segment: u64) -> Sent {
        Sent { order, segment }
    }

    #[test]
    fn the_latest_change_is_the_newest_pushed_whatever_was_merged() {
        let mut c = NameChanges::<u32>::default();
        assert!(c.latest().is_none());
        c.push_newest(sent(1, 0), Some(7));
        c.push_newest(sent(2, 0), Some(7));
        c.push_newest(sent(5, 1), Some(7));
        assert_eq!(c.latest(), Some((sent(5, 1), Some(&7))));
        assert_eq!(c.runs.len(), 1, "alike changes share one run");
        c.push_newest(sent(6, 1), None);
        assert_eq!(c.latest(), Some((sent(6, 1), None)));
    }

    #[test]
    fn all_alike_holds_only_while_every_change_is_alike_the_confirmed_state() {
        let mut c = NameChanges::<u32>::default();
        assert!(c.all_alike(None));
        c.push_newest(sent(1, 0), Some(7));
        c.push_newest(sent(2, 0), Some(7));
        assert!(c.all_alike(Some(&7)));
        assert!(!c.all_alike(Some(&8)));
        assert!(!c.all_alike(None));
        c.push_newest(sent(3, 0), Some(8));
        assert!(!c.all_alike(Some(&7)));
        assert!(!c.all_alike(Some(&8)));
    }

    #[test]
    fn changes_alike_nothing_are_never_merged_nor_alike() {
        let mut c = NameChanges::<u32>::default();
        c.push_newest(sent(1, 0), Some(0));
        c.push_newest(sent(2, 0), Some(0));
        assert_eq!(c.runs.len(), 2);
        assert!(!c.all_alike(Some(&0)));
        assert!(c.pop_oldest());
        assert!(!c.all_alike(Some(&0)));
    }

    #[test]
    fn popping_forgets_the_oldest_first() {
        let mut c = NameChanges::<u32>::default();
        c.push_newest(sent(1, 0), Some(7));
        c.push_newest(sent(2, 0), Some(7));
        c.push_newest(sent(3, 1), None);
        assert!(c.pop_oldest());
        // One of the two 7s is left before the None.
        assert!(!c.all_alike(None));
        assert!(c.pop_oldest());
        assert!(c.all_alike(None), "only the None is left");
        assert_eq!(c.latest(), Some((sent(3, 1), None)));
        assert!(c.pop_oldest());
        assert!(c.is_empty());
        assert!(!c.pop_oldest(), "nothing left to forget");
    }

    #[test]
    fn a_drained_deep_pipeline_lets_its_buffer_go() {
        let mut c = NameChanges::<u32>::default();
        for i in 0..10_000u64 {
            // Alternating states: one run each.
            c.push_newest(sent(i, 0), Some((i % 2 + 1) as u32));
        }
        assert_eq!(c.runs.len(), 10_000);
        for _ in 0..10_000 {
            assert!(c.pop_oldest());
        }
        assert!(c.is_empty());
        assert!(c.runs.capacity() <= KEEP_RUNS);
    }
}
