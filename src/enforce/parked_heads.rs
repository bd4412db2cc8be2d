//! The parked heads this proxy's sessions last read, by thread and
//! namespace: what the next read of that head is expected to return, so
//! its claim can be asked beside the read (see `claim_ahead`) instead of
//! after it. Only ever a guess: the claim asked ahead counts only for the
//! head the read returns, and is withdrawn otherwise. A write on the
//! namespace through this proxy forgets its entry (the head moves); a
//! write through another proxy leaves a stale one, which costs a claim
//! withdrawn, never a decision. Shared by the legs a reload makes.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::claims::ClaimKey;

/// Heads remembered at once; past this an arbitrary one is forgotten.
const REMEMBERED: usize = 4096;

/// Parked heads last read, by (thread, namespace).
#[derive(Debug, Default)]
pub struct ParkedHeads {
    heads: Mutex<HashMap<(String, String), ClaimKey>>,
}

impl ParkedHeads {
    /// A read of the head of `thread`/`ns` returned a head parked on
    /// `parked` (its claim key), or one that is not parked (`None`).
    pub fn read(&self, thread: &str, ns: &str, parked: Option<ClaimKey>) {
        let mut heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
        let at = (thread.to_owned(), ns.to_owned());
        match parked {
            Some(key) => {
                if heads.len() >= REMEMBERED && !heads.contains_key(&at) {
                    if let Some(any) = heads.keys().next().cloned() {
                        heads.remove(&any);
                    }
                }
                heads.insert(at, key);
            }
            None => {
                heads.remove(&at);
            }
        }
    }

    /// A write on `thread`/`ns` passed: its head is about to move.
    pub fn forget(&self, thread: &str, ns: &str) {
        let mut heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
        if !heads.is_empty() {
            heads.remove(&(thread.to_owned(), ns.to_owned()));
        }
    }

    /// The claim key of the parked head last read at `thread`/`ns`.
    pub fn expected(&self, thread: &str, ns: &str) -> Option<ClaimKey> {
        let heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
        if heads.is_empty() {
            return None;
        }
        heads.get(&(thread.to_owned(), ns.to_owned())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saver::checkpoint_ref::CheckpointRef;

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
    fn a_parked_head_read_is_expected_until_a_write_or_a_read_past_it() {
        let heads = ParkedHeads::default();
        assert_eq!(heads.expected("t", ""), None);
        heads.read("t", "", Some(key("t", "c1")));
        assert_eq!(heads.expected("t", ""), Some(key("t", "c1")));
        assert_eq!(heads.expected("t", "sub"), None, "namespaces apart");
        heads.forget("t", "");
        assert_eq!(heads.expected("t", ""), None, "a write moves the head");
        heads.read("t", "", Some(key("t", "c2")));
        heads.read("t", "", None);
        assert_eq!(heads.expected("t", ""), None, "read past it");
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
