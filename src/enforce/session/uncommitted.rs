//! What the writes of the open transaction did, kept until it ends: acted
//! on once it commits, dropped if it rolls back, and cut back to where a
//! savepoint was set when a `ROLLBACK TO` undoes what came after it.

use crate::audit::AuditEvent;
use crate::claims::evidence::Evidence;
use crate::enforce::parked_heads::Interrupt;
use crate::saver::checkpoint_ref::CheckpointRef;

#[derive(Debug, Default)]
pub(super) struct Uncommitted {
    /// Their audit events.
    pub(super) events: Vec<AuditEvent>,
    /// Their claim evidence.
    pub(super) evidence: Vec<Evidence>,
    /// The checkpoints they put.
    pub(super) created: Vec<CheckpointRef>,
    /// Their `__interrupt__` writes: the heads they park (see
    /// `parked_heads`).
    pub(super) parks: Vec<(CheckpointRef, Interrupt)>,
    /// The savepoints set in the transaction and not released or rolled
    /// past, oldest first.
    savepoints: Vec<Savepoint>,
}

/// A savepoint: its name, and how much of each record came before it.
#[derive(Debug)]
struct Savepoint {
    name: Vec<u8>,
    events: usize,
    evidence: usize,
    created: usize,
    parks: usize,
}

/// A `ROLLBACK TO` named a savepoint this session never saw set: what it
/// undid is unknown.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct UnknownSavepoint;

impl Uncommitted {
    /// The transaction ended: nothing is kept.
    pub(super) fn clear(&mut self) {
        self.events.clear();
        self.evidence.clear();
        self.created.clear();
        self.parks.clear();
        self.savepoints.clear();
    }

    /// A savepoint was set: what comes after it can be undone alone.
    pub(super) fn set(&mut self, name: &[u8]) {
        self.savepoints.push(Savepoint {
            name: name.to_vec(),
            events: self.events.len(),
            evidence: self.evidence.len(),
            created: self.created.len(),
            parks: self.parks.len(),
        });
    }

    /// The newest savepoint of this name and every later one were
    /// released: their records belong to the enclosing savepoint (or the
    /// transaction) now.
    pub(super) fn released(&mut self, name: &[u8]) {
        if let Some(at) = self.newest(name) {
            self.savepoints.truncate(at);
        }
    }

    /// Everything after the newest savepoint of this name was undone. The
    /// savepoint stays; later ones are gone.
    pub(super) fn rolled_back_to(&mut self, name: &[u8]) -> Result<(), UnknownSavepoint> {
        let at = self.newest(name).ok_or(UnknownSavepoint)?;
        let mark = &self.savepoints[at];
        self.events.truncate(mark.events);
        self.evidence.truncate(mark.evidence);
        self.created.truncate(mark.created);
        self.parks.truncate(mark.parks);
        self.savepoints.truncate(at + 1);
        Ok(())
    }

    fn newest(&self, name: &[u8]) -> Option<usize> {
        self.savepoints.iter().rposition(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::evidence::Evidence;

    fn deleted(thread: &str) -> Evidence {
        Evidence::ThreadDeleted {
            thread_id: thread.into(),
        }
    }

    fn threads(u: &Uncommitted) -> Vec<&str> {
        u.evidence
            .iter()
            .filter_map(Evidence::deleted_thread)
            .collect()
    }

    #[test]
    fn a_rollback_to_keeps_what_came_before_its_savepoint() {
        let mut u = Uncommitted::default();
        u.evidence.push(deleted("before"));
        u.set(b"a");
        u.evidence.push(deleted("inside"));
        u.set(b"b");
        u.evidence.push(deleted("nested"));
        assert_eq!(u.rolled_back_to(b"a"), Ok(()));
        assert_eq!(threads(&u), ["before"]);
        // The savepoint stays: a second rollback to it undoes what came
        // after the first; the later one is gone.
        u.evidence.push(deleted("again"));
        assert_eq!(u.rolled_back_to(b"a"), Ok(()));
        assert_eq!(threads(&u), ["before"]);
        assert_eq!(u.rolled_back_to(b"b"), Err(UnknownSavepoint));
    }

    #[test]
    fn a_released_savepoints_records_stay_with_the_enclosing_one() {
        let mut u = Uncommitted::default();
        u.set(b"outer");
        u.evidence.push(deleted("outer"));
        u.set(b"inner");
        u.evidence.push(deleted("inner"));
        u.released(b"inner");
        assert_eq!(threads(&u), ["outer", "inner"]);
        u.evidence.push(deleted("after"));
        assert_eq!(u.rolled_back_to(b"outer"), Ok(()));
        assert!(threads(&u).is_empty());
    }

    #[test]
    fn the_newest_savepoint_of_a_name_is_the_one_named() {
        let mut u = Uncommitted::default();
        u.set(b"a");
        u.evidence.push(deleted("first"));
        u.set(b"a");
        u.evidence.push(deleted("second"));
        assert_eq!(u.rolled_back_to(b"a"), Ok(()));
        assert_eq!(threads(&u), ["first"]);
        // Releasing the newest `a` uncovers the older one.
        u.released(b"a");
        assert_eq!(u.rolled_back_to(b"a"), Ok(()));
        assert!(threads(&u).is_empty());
    }

    #[test]
    fn clearing_forgets_the_savepoints_too() {
        let mut u = Uncommitted::default();
        u.set(b"a");
        u.clear();
        assert_eq!(u.rolled_back_to(b"a"), Err(UnknownSavepoint));
    }
}
