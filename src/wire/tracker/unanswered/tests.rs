//! One name's unanswered changes: merged runs, the latest change, and
//! whether all of them leave the name alike its confirmed state.

use super::{Alike, NameChanges, Sent, KEEP_RUNS};

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
