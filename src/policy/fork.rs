//! Fork determinism (LangGraph #6663).
//!
//! A read that addresses a checkpoint by id while that checkpoint is no
//! longer the head of its (thread_id, checkpoint_ns) is a request for a new
//! branch. Recorded answers (`__resume__` writes, run-level and
//! task-level) belong to the branch that already ran from there; served to
//! the fork they replace the fork's own answer. So such a read is served
//! without them. A read of the head, even by explicit id, is untouched:
//! a node with several `interrupt()` calls resumes at its head and needs
//! the answers recorded so far.

use crate::saver::checkpoint_row::PendingWrite;

/// The channel LangGraph records answers to interrupts on.
pub const RESUME: &str = "__resume__";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkVerdict {
    /// The addressed checkpoint is the head: serve the row as stored.
    Untouched,
    /// A fork: serve the row without the pending writes at these indexes.
    Fork { hide: Vec<usize> },
}

/// Decides what a read of checkpoint `addressed` may see of its pending
/// writes, given the head of its namespace in the same snapshot.
pub fn fork_filter(addressed: &str, head: Option<&str>, pending: &[PendingWrite]) -> ForkVerdict {
    if head == Some(addressed) {
        return ForkVerdict::Untouched;
    }
    let hide = pending
        .iter()
        .enumerate()
        .filter(|(_, w)| w.channel == RESUME)
        .map(|(i, _)| i)
        .collect();
    ForkVerdict::Fork { hide }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(task: &str, channel: &str) -> PendingWrite {
        PendingWrite {
            task_id: task.into(),
            channel: channel.into(),
            type_tag: "msgpack".into(),
            blob: None,
            task_path: String::new(),
            idx: None,
        }
    }

    fn pending() -> Vec<PendingWrite> {
        vec![
            write("gate-task", "__interrupt__"),
            write("00000000-0000-0000-0000-000000000000", RESUME),
            write("gate-task", RESUME),
            write("gate-task", "items"),
        ]
    }

    #[test]
    fn the_head_is_untouched_even_by_explicit_id() {
        assert_eq!(
            fork_filter("c5", Some("c5"), &pending()),
            ForkVerdict::Untouched
        );
    }

    #[test]
    fn a_superseded_checkpoint_hides_every_recorded_answer() {
        assert_eq!(
            fork_filter("c3", Some("c9"), &pending()),
            ForkVerdict::Fork { hide: vec![1, 2] }
        );
    }

    #[test]
    fn a_fork_with_nothing_recorded_hides_nothing() {
        let only_interrupt = vec![write("gate-task", "__interrupt__")];
        assert_eq!(
            fork_filter("c3", Some("c9"), &only_interrupt),
            ForkVerdict::Fork { hide: vec![] }
        );
    }

    #[test]
    fn an_unknown_head_is_treated_as_a_fork() {
        // The head query found nothing (the namespace vanished between
        // statements): nothing recorded may leak into a new branch.
        assert_eq!(
            fork_filter("c3", None, &pending()),
            ForkVerdict::Fork { hide: vec![1, 2] }
        );
    }
}
