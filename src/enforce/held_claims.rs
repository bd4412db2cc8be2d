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
//! That time is on the store's clock: it is remembered as a deadline on
//! this process's monotonic clock, the time the store said was left
//! counted from before the question was sent (so never later than the
//! store's own).
//! An operator's `claims release` is not seen: the holder is served on
//! its old generation, as it would have been a moment before the release.
//! Shared by the legs a reload makes, like the store.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::claims::{ClaimKey, ClaimRecord, ClaimState, Holder};
use crate::saver::checkpoint_ref::CheckpointRef;

/// Claims remembered at once: a session holds one at a time; beyond this
/// the oldest is asked of the store again.
const REMEMBERED: usize = 1024;

/// How long before its lapse a remembered claim is asked of the store
/// again: a margin for the monotonic clocks' drift and the time between
/// this check and the read's answer reaching the holder.
pub const LAPSE_MARGIN_MS: i64 = 250;

/// A remembered claim and the instant (monotonic) it lapses by.
#[derive(Debug)]
struct Remembered {
    record: ClaimRecord,
    lapses_by: Instant,
}

/// Claims held by this proxy's sessions, as the store last answered them.
#[derive(Debug, Default)]
pub struct HeldClaims {
    held: Mutex<VecDeque<Remembered>>,
}

impl HeldClaims {
    /// The store answered `record` (a claim just taken or read by its
    /// holder) at `decided_at_ms` of its clock, to a question sent at
    /// `asked_at`: the holder's next read of it needs no round trip.
    pub fn remember(&self, record: &ClaimRecord, decided_at_ms: i64, asked_at: Instant) {
        let left = u64::try_from(record.lapse_at_ms.saturating_sub(decided_at_ms)).unwrap_or(0);
        let lapses_by = asked_at
            .checked_add(Duration::from_millis(left))
            .unwrap_or(asked_at);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|r| r.record.key != record.key);
        if held.len() == REMEMBERED {
            held.pop_front();
        }
        held.push_back(Remembered {
            record: record.clone(),
            lapses_by,
        });
    }

    /// The store answered `key` otherwise (busy, consumed, an error), or a
    /// write continues its checkpoint: asked of the store from now on.
    pub fn forget_key(&self, key: &ClaimKey) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|r| r.record.key != *key);
    }

    /// A write continuing `at` passed: every claim on it is asked again.
    pub fn forget(&self, at: &CheckpointRef) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|r| r.record.key.at != *at);
    }

    /// `holder`'s own claim on `key`, if it holds it and it cannot have
    /// lapsed by `now` (this process's monotonic clock) plus the margin.
    pub fn answer(&self, key: &ClaimKey, holder: &Holder, now: Instant) -> Option<ClaimRecord> {
        let margin = Duration::from_millis(LAPSE_MARGIN_MS as u64);
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter()
            .find(|r| {
                r.record.key == *key
                    && r.record.state == ClaimState::Held
                    && r.record.holder.same_session(holder)
                    && now.checked_add(margin).is_some_and(|t| t < r.lapses_by)
            })
            .map(|r| r.record.clone())
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

    /// A claim taken at 1 000 on the store's clock, lapsing at `lapse`,
    /// asked at `asked`.
    fn remember(held: &HeldClaims, k: &ClaimKey, h: u64, lapse: i64, epoch: i64, asked: Instant) {
        held.remember(
            &ClaimRecord::taken(k, &holder(h), 1_000, lapse, epoch),
            1_000,
            asked,
        );
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn only_the_holder_is_answered_and_only_well_before_the_lapse() {
        let held = HeldClaims::default();
        let k = key("c1");
        let t = Instant::now();
        remember(&held, &k, 1, 3_000, 1, t);
        assert_eq!(
            held.answer(&k, &holder(1), t + ms(500)).map(|r| r.epoch),
            Some(1)
        );
        assert_eq!(held.answer(&k, &holder(2), t + ms(500)), None);
        assert_eq!(held.answer(&key("c2"), &holder(1), t + ms(500)), None);
        let at_margin = ms(2_000 - LAPSE_MARGIN_MS as u64);
        assert_eq!(held.answer(&k, &holder(1), t + at_margin), None);
    }

    #[test]
    fn a_write_continuing_the_checkpoint_or_another_answer_forgets_it() {
        let held = HeldClaims::default();
        let (k1, k2) = (key("c1"), key("c2"));
        let t = Instant::now();
        remember(&held, &k1, 1, 9_000, 1, t);
        remember(&held, &k2, 1, 9_000, 1, t);
        held.forget(&k1.at);
        assert_eq!(held.answer(&k1, &holder(1), t + ms(500)), None);
        assert!(held.answer(&k2, &holder(1), t + ms(500)).is_some());
        held.forget_key(&k2);
        assert_eq!(held.answer(&k2, &holder(1), t + ms(500)), None);
    }

    #[test]
    fn a_newer_generation_replaces_the_remembered_one() {
        let held = HeldClaims::default();
        let k = key("c1");
        let t = Instant::now();
        remember(&held, &k, 1, 9_000, 1, t);
        remember(&held, &k, 2, 9_000, 2, t);
        assert_eq!(held.answer(&k, &holder(1), t + ms(500)), None);
        assert_eq!(
            held.answer(&k, &holder(2), t + ms(500)).map(|r| r.epoch),
            Some(2)
        );
    }
}
