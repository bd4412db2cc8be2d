//! The claims this proxy's sessions hold that no write has continued
//! yet, so a holder re-reading its own parked head (a `get_state`, then
//! its resume on the same connection) is answered without a round trip
//! to the claims store.
//!
//! Only this proxy's sessions can change such a claim without being
//! fenced or waiting out its lapse: a write continuing the checkpoint
//! comes from the holder or its pool, both through this proxy, and is
//! seen here at its Bind (the claim is forgotten then, before it can
//! commit); another proxy takes it over only after `lapse_at_ms`, and a
//! remembered claim is not answered within [`LAPSE_MARGIN_MS`] of that.
//! An operator's `claims release` is not seen: the holder is served on
//! its old generation, as it would have been a moment before the release.
//! Shared by the legs a reload makes, like the store.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use crate::claims::{ClaimKey, ClaimRecord, ClaimState, Holder};
use crate::saver::checkpoint_ref::CheckpointRef;

/// Claims remembered at once: a session holds one at a time; beyond this
/// the oldest is asked of the store again.
const REMEMBERED: usize = 1024;

/// How long before its lapse a remembered claim is asked of the store
/// again: more than the error of this process's estimate of the claims
/// database's clock (half a round trip to it, see `claims::clock`).
pub const LAPSE_MARGIN_MS: i64 = 250;

/// Claims held by this proxy's sessions, as the store last answered them.
#[derive(Debug, Default)]
pub struct HeldClaims {
    held: Mutex<VecDeque<ClaimRecord>>,
}

impl HeldClaims {
    /// The store answered `record` (a claim just taken or read by its
    /// holder): the holder's next read of it needs no round trip.
    pub fn remember(&self, record: &ClaimRecord) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|r| r.key != record.key);
        if held.len() == REMEMBERED {
            held.pop_front();
        }
        held.push_back(record.clone());
    }

    /// The store answered `key` otherwise (busy, consumed, an error), or a
    /// write continues its checkpoint: asked of the store from now on.
    pub fn forget_key(&self, key: &ClaimKey) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|r| r.key != *key);
    }

    /// A write continuing `at` passed: every claim on it is asked again.
    pub fn forget(&self, at: &CheckpointRef) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|r| r.key.at != *at);
    }

    /// `holder`'s own claim on `key`, if it holds it and it cannot have
    /// lapsed by `now_ms` (the claims database's clock) plus the margin.
    pub fn answer(&self, key: &ClaimKey, holder: &Holder, now_ms: i64) -> Option<ClaimRecord> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter()
            .find(|r| {
                r.key == *key
                    && r.state == ClaimState::Held
                    && r.holder.same_session(holder)
                    && now_ms.saturating_add(LAPSE_MARGIN_MS) < r.lapse_at_ms
            })
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(checkpoint_id: &str) -> ClaimKey {
        ClaimKey {
            at: CheckpointRef {
                thread_id: "t".into(),
                checkpoint_ns: String::new(),
                checkpoint_id: checkpoint_id.into(),
            },
            fingerprint: "f".into(),
        }
    }

    fn holder(session_id: u64) -> Holder {
        Holder {
            proxy_id: "p".into(),
            session_id,
            client_addr: "10.0.0.1:5000".into(),
            application_name: "app".into(),
        }
    }

    #[test]
    fn only_the_holder_is_answered_and_only_well_before_the_lapse() {
        let held = HeldClaims::default();
        let k = key("c1");
        held.remember(&ClaimRecord::taken(&k, &holder(1), 1_000, 3_000, 1));
        assert_eq!(held.answer(&k, &holder(1), 1_500).map(|r| r.epoch), Some(1));
        assert_eq!(held.answer(&k, &holder(2), 1_500), None);
        assert_eq!(held.answer(&key("c2"), &holder(1), 1_500), None);
        assert_eq!(held.answer(&k, &holder(1), 3_000 - LAPSE_MARGIN_MS), None);
    }

    #[test]
    fn a_write_continuing_the_checkpoint_or_another_answer_forgets_it() {
        let held = HeldClaims::default();
        let (k1, k2) = (key("c1"), key("c2"));
        held.remember(&ClaimRecord::taken(&k1, &holder(1), 1_000, 9_000, 1));
        held.remember(&ClaimRecord::taken(&k2, &holder(1), 1_000, 9_000, 1));
        held.forget(&k1.at);
        assert_eq!(held.answer(&k1, &holder(1), 1_500), None);
        assert!(held.answer(&k2, &holder(1), 1_500).is_some());
        held.forget_key(&k2);
        assert_eq!(held.answer(&k2, &holder(1), 1_500), None);
    }

    #[test]
    fn a_newer_generation_replaces_the_remembered_one() {
        let held = HeldClaims::default();
        let k = key("c1");
        held.remember(&ClaimRecord::taken(&k, &holder(1), 1_000, 9_000, 1));
        held.remember(&ClaimRecord::taken(&k, &holder(2), 1_000, 9_000, 2));
        assert_eq!(held.answer(&k, &holder(1), 1_500), None);
        assert_eq!(held.answer(&k, &holder(2), 1_500).map(|r| r.epoch), Some(2));
    }
}
