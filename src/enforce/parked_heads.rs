//! The parked heads this proxy's sessions last read or parked, by thread
//! and namespace: what the next read of that head is expected to return,
//! so its claim can be asked beside the read (see `claim_ahead`) instead
//! of after it. Only ever a guess: the claim asked ahead counts only for
//! the head the read returns, and is withdrawn otherwise. A committed
//! `__interrupt__` write through this proxy parks its checkpoint (the
//! interrupts written on it make the key); a put of another checkpoint
//! on the namespace, or another pending write on that checkpoint, forgets
//! its entry (the head moves on), and deleting a thread forgets all of
//! its namespaces. A write through another proxy leaves a
//! stale entry, which costs a claim withdrawn, never a decision. Shared by
//! the legs a reload makes.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

use crate::claims::{interrupt_fingerprint, ClaimKey};
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::StatementKind;
use crate::saver::write_record::WriteRecord;

/// Heads remembered at once; past this an arbitrary one is forgotten.
const REMEMBERED: usize = 4096;

/// One `__interrupt__` write: its task and value.
pub type Interrupt = (String, Option<Bytes>);

/// A remembered parked head.
#[derive(Debug)]
struct Head {
    key: ClaimKey,
    /// The interrupts written on it through this proxy, when it was
    /// learned from them (a later one of the same checkpoint joins them);
    /// `None` when it was learned from a read.
    written: Option<Vec<Interrupt>>,
}

/// Parked heads last read or parked, by (thread, namespace).
#[derive(Debug, Default)]
pub struct ParkedHeads {
    heads: Mutex<HashMap<(String, String), Head>>,
}

impl ParkedHeads {
    fn heads(&self) -> MutexGuard<'_, HashMap<(String, String), Head>> {
        self.heads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A read of the head of `thread`/`ns` returned a head parked on
    /// `parked` (its claim key), or one that is not parked (`None`).
    pub fn read(&self, thread: &str, ns: &str, parked: Option<ClaimKey>) {
        let mut heads = self.heads();
        let at = (thread.to_owned(), ns.to_owned());
        match parked {
            Some(key) => remember(&mut heads, at, Head { key, written: None }),
            None => {
                heads.remove(&at);
            }
        }
    }

    /// An `__interrupt__` write of `task_id` on `at` committed: the head
    /// is parked there on the interrupts written on it through this proxy.
    /// A head learned from a read of the same checkpoint is forgotten
    /// instead: its interrupts are not known apart from its key.
    pub fn interrupt_written(&self, at: &CheckpointRef, (task_id, value): Interrupt) {
        let mut heads = self.heads();
        let place = (at.thread_id.clone(), at.checkpoint_ns.clone());
        let mut written = match heads.remove(&place) {
            Some(Head {
                key,
                written: Some(written),
            }) if key.at == *at => written,
            Some(head) if head.key.at == *at => return,
            _ => Vec::new(),
        };
        written.retain(|(task, _)| *task != task_id);
        written.push((task_id, value));
        let pairs: Vec<(&str, Option<&[u8]>)> = written
            .iter()
            .map(|(task, value)| (task.as_str(), value.as_deref()))
            .collect();
        let key = ClaimKey {
            at: at.clone(),
            fingerprint: interrupt_fingerprint(&pairs),
        };
        let written = Some(written);
        remember(&mut heads, place, Head { key, written });
    }

    /// A write other than an `__interrupt__` passed: a put, or a pending
    /// write, may move its namespace's head on (a channel value's blob
    /// moves nothing).
    pub fn write_passed(&self, kind: &StatementKind, rec: &WriteRecord) {
        let (Some(thread), Some(ns), Some(id)) =
            (&rec.thread_id, &rec.checkpoint_ns, &rec.checkpoint_id)
        else {
            return;
        };
        match kind {
            StatementKind::CheckpointUpsert(_) => self.put(thread, ns, id),
            kind if kind.is_pending_write() => self.written_on(thread, ns, id),
            _ => {}
        }
    }

    /// A put of checkpoint `id` on `thread`/`ns` passed: the head moves
    /// on if `id` sorts after the remembered checkpoint (the head is the
    /// greatest id: savers' ids are time-ordered). Putting the remembered
    /// checkpoint itself or an older one moves nothing: a saver may put a
    /// step's checkpoints after the interrupts written on the next one.
    fn put(&self, thread: &str, ns: &str, id: &str) {
        self.forget_where(thread, ns, |head| {
            id.as_bytes() > head.key.at.checkpoint_id.as_bytes()
        });
    }

    /// A pending write other than an interrupt on checkpoint `id` of
    /// `thread`/`ns` passed: a resume or a task's writes, so the head is
    /// about to move on if it is the remembered one. A write on an older
    /// checkpoint (a previous step's writes, which a saver may send after
    /// the next checkpoint's interrupts) moves nothing.
    fn written_on(&self, thread: &str, ns: &str, id: &str) {
        self.forget_where(thread, ns, |head| head.key.at.checkpoint_id == id);
    }

    /// `thread` was deleted: every namespace of it is forgotten.
    pub fn thread_deleted(&self, thread: &str) {
        let mut heads = self.heads();
        if !heads.is_empty() {
            heads.retain(|(t, _), _| t != thread);
        }
    }

    fn forget_where(&self, thread: &str, ns: &str, moved: impl Fn(&Head) -> bool) {
        let mut heads = self.heads();
        if heads.is_empty() {
            return;
        }
        let at = (thread.to_owned(), ns.to_owned());
        if heads.get(&at).is_some_and(moved) {
            heads.remove(&at);
        }
    }

    /// The claim key of the parked head last read or parked at
    /// `thread`/`ns`.
    pub fn expected(&self, thread: &str, ns: &str) -> Option<ClaimKey> {
        let heads = self.heads();
        if heads.is_empty() {
            return None;
        }
        heads
            .get(&(thread.to_owned(), ns.to_owned()))
            .map(|head| head.key.clone())
    }
}

/// Keeps `head` at `at`, forgetting an arbitrary other one at the bound.
fn remember(heads: &mut HashMap<(String, String), Head>, at: (String, String), head: Head) {
    if heads.len() >= REMEMBERED && !heads.contains_key(&at) {
        if let Some(any) = heads.keys().next().cloned() {
            heads.remove(&any);
        }
    }
    heads.insert(at, head);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(thread: &str, checkpoint_id: &str) -> ClaimKey {
        ClaimKey {
            at: CheckpointRef {
                thread_id: thread.into(),
                checkpoint_ns: String::new(),
                checkpoint_id: checkpoint_id.into(),
            },
            fingerprint: "f".into(),
        }
    }

    #[test]
    fn a_parked_head_read_is_expected_until_it_moves_on_or_a_read_past_it() {
        let heads = ParkedHeads::default();
        assert_eq!(heads.expected("t", ""), None);
        heads.read("t", "", Some(key("t", "c1")));
        assert_eq!(heads.expected("t", ""), Some(key("t", "c1")));
        assert_eq!(heads.expected("t", "sub"), None, "namespaces apart");
        heads.put("t", "", "c1");
        heads.put("t", "", "c0");
        heads.written_on("t", "", "c0");
        assert!(
            heads.expected("t", "").is_some(),
            "its own put, an older step's put and writes"
        );
        heads.written_on("t", "", "c1");
        assert_eq!(heads.expected("t", ""), None, "a resume on it moves it on");
        heads.read("t", "", Some(key("t", "c2")));
        heads.put("t", "", "c3");
        assert_eq!(heads.expected("t", ""), None, "a put of another checkpoint");
        heads.read("t", "", Some(key("t", "c2")));
        heads.read("t", "", None);
        assert_eq!(heads.expected("t", ""), None, "read past it");
    }

    fn interrupt(task: &str, value: &'static [u8]) -> Interrupt {
        (task.to_owned(), Some(Bytes::from_static(value)))
    }

    #[test]
    fn committed_interrupts_park_their_checkpoint_under_the_key_a_read_computes() {
        let heads = ParkedHeads::default();
        let at = key("t", "c1").at;
        heads.interrupt_written(&at, interrupt("b", b"vb"));
        heads.interrupt_written(&at, interrupt("a", b"va"));
        heads.interrupt_written(&at, interrupt("b", b"vb"));
        let read_key = interrupt_fingerprint(&[("a", Some(&b"va"[..])), ("b", Some(&b"vb"[..]))]);
        let expected = heads.expected("t", "").map(|k| (k.at, k.fingerprint));
        assert_eq!(
            expected,
            Some((at.clone(), read_key)),
            "both tasks, once each"
        );

        let next = key("t", "c2").at;
        heads.interrupt_written(&next, interrupt("a", b"va"));
        let only_a = interrupt_fingerprint(&[("a", Some(&b"va"[..]))]);
        let expected = heads.expected("t", "").map(|k| (k.at, k.fingerprint));
        assert_eq!(
            expected,
            Some((next, only_a)),
            "a later checkpoint starts afresh"
        );
    }

    #[test]
    fn an_interrupt_written_on_a_head_known_only_from_a_read_forgets_it() {
        let heads = ParkedHeads::default();
        heads.read("t", "", Some(key("t", "c1")));
        heads.interrupt_written(&key("t", "c1").at, interrupt("a", b"va"));
        assert_eq!(
            heads.expected("t", ""),
            None,
            "its other interrupts are unknown"
        );
    }

    #[test]
    fn deleting_a_thread_forgets_every_namespace_of_it_only() {
        let heads = ParkedHeads::default();
        heads.read("t", "", Some(key("t", "c1")));
        heads.read("t", "sub", Some(key("t", "c2")));
        heads.read("u", "", Some(key("u", "c3")));
        heads.thread_deleted("t");
        assert_eq!(heads.expected("t", ""), None);
        assert_eq!(heads.expected("t", "sub"), None);
        assert_eq!(heads.expected("u", ""), Some(key("u", "c3")));
    }

    #[test]
    fn at_most_the_bound_is_remembered() {
        let heads = ParkedHeads::default();
        for i in 0..REMEMBERED + 10 {
            let thread = format!("t{i}");
            heads.read(&thread, "", Some(key(&thread, "c")));
        }
        let held = heads.heads.lock().map(|h| h.len()).unwrap_or_default();
        assert_eq!(held, REMEMBERED);
        let last = format!("t{}", REMEMBERED + 9);
        assert!(heads.expected(&last, "").is_some(), "the newest is kept");
    }
}
