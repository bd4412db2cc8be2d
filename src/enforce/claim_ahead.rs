//! A parked head's claim asked beside the read that returns it. When a
//! session reads the head of a thread this proxy last saw parked (see
//! `parked_heads`), the claim's first step (`claim_first`: taken by a
//! first reader, or read again by its holder; nothing else, nothing
//! changed otherwise) goes to the store on another thread while the read
//! goes to PostgreSQL, so the two round trips overlap instead of
//! following each other.
//!
//! The answer counts only for the head the read returns: same checkpoint,
//! same interrupts. For any other head, for a read that returns no parked
//! head, fails or is refused, a claim taken ahead is withdrawn (deleted if
//! this session still holds it at the generation it took), as if it had
//! never been asked, on a thread of its own while the session goes on. A busy, consumed or lapsed claim is not decided
//! ahead: the gate asks the store as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::claims::{ClaimKey, ClaimOutcome, ClaimStore, Holder, Now, StoreError};
use crate::metrics::claims_store_call;

/// Claims asked ahead at once, process-wide; past this a read's claim is
/// asked after the read, as without this.
const MAX_IN_FLIGHT: usize = 64;

/// How long the gate waits for an answer asked ahead before it asks the
/// store itself: above the store's statement timeout.
const ANSWER_WAIT: Duration = Duration::from_secs(3);

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// What the store answered to `claim_first`, and its clock then.
type Answer = Result<Option<(ClaimOutcome, i64)>, StoreError>;

#[derive(Debug)]
enum State {
    Asking,
    Answered(Box<Answer>),
    /// The gate took the answer, or it was withdrawn.
    Done,
    /// The read ended without the gate: withdrawn once answered.
    Abandoned,
}

#[derive(Debug)]
struct Shared {
    store: Arc<ClaimStore>,
    key: ClaimKey,
    holder: Holder,
    /// When the question was sent (monotonic): the held claim's lapse is
    /// counted from here.
    asked_at: Instant,
    state: Mutex<State>,
    answered: Condvar,
}

/// The claim asked beside one read of a parked head.
#[derive(Debug)]
pub struct AheadClaim {
    shared: Arc<Shared>,
}

impl AheadClaim {
    /// Asks `key`'s claim for `holder` on a thread of its own; `None`
    /// when too many are in flight or no thread can be started.
    pub fn ask(
        store: Arc<ClaimStore>,
        key: ClaimKey,
        holder: Holder,
        lapse_ms: i64,
    ) -> Option<Self> {
        if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(crate::metrics::CLAIMS_AHEAD, "result" => "skipped").increment(1);
            return None;
        }
        let shared = Arc::new(Shared {
            store,
            key,
            holder,
            asked_at: Instant::now(),
            state: Mutex::new(State::Asking),
            answered: Condvar::new(),
        });
        let asking = Arc::clone(&shared);
        let started = std::thread::Builder::new()
            .name("claim-ahead".into())
            .spawn(move || {
                let answer = claims_store_call("claim_ahead", || {
                    asking
                        .store
                        .try_claim_first(&asking.key, &asking.holder, Now::STORE, lapse_ms)
                });
                asking.answer(answer);
                IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = started {
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "claim not asked ahead: no thread");
            return None;
        }
        Some(AheadClaim { shared })
    }

    /// The answer for the head the read returned (`key`), and when it was
    /// asked: `None` if it was asked for another head (a claim taken for
    /// that one is withdrawn), the store would not decide it in its first
    /// step, failed, or has not answered in time.
    pub fn answer_for(self, key: &ClaimKey) -> Option<(ClaimOutcome, i64, Instant)> {
        let s = &self.shared;
        let mut state = s.state.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = Instant::now() + ANSWER_WAIT;
        while matches!(*state, State::Asking) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Drop abandons it: withdrawn when it answers.
                tracing::warn!("claim asked ahead not answered in time: asked again");
                return None;
            }
            state = s
                .answered
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let State::Answered(answer) = std::mem::replace(&mut *state, State::Done) else {
            return None;
        };
        drop(state);
        match *answer {
            Ok(Some((outcome, decided_at))) if s.key == *key => {
                metrics::counter!(crate::metrics::CLAIMS_AHEAD, "result" => "used").increment(1);
                Some((outcome, decided_at, s.asked_at))
            }
            Ok(Some((outcome, _))) => {
                s.withdraw_aside(outcome);
                None
            }
            Ok(None) => {
                metrics::counter!(crate::metrics::CLAIMS_AHEAD, "result" => "undecided")
                    .increment(1);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "claim asked ahead failed: asked again");
                None
            }
        }
    }
}

impl Shared {
    /// The store answered: kept for the gate, or withdrawn if the read
    /// ended without it.
    fn answer(&self, answer: Answer) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*state, State::Abandoned) {
            *state = State::Done;
            drop(state);
            if let Ok(Some((outcome, _))) = &answer {
                self.withdraw(outcome);
            }
            return;
        }
        *state = State::Answered(Box::new(answer));
        self.answered.notify_all();
    }

    /// [`Shared::withdraw`] on a thread of its own: the session that read
    /// the head goes on meanwhile (its claim on another head, if any, is
    /// asked at once).
    fn withdraw_aside(self: &Arc<Self>, outcome: ClaimOutcome) {
        let withdrawing = Arc::clone(self);
        let outcome = Arc::new(outcome);
        let aside = Arc::clone(&outcome);
        let spawned = std::thread::Builder::new()
            .name("claim-withdraw".into())
            .spawn(move || withdrawing.withdraw(&aside));
        if spawned.is_err() {
            self.withdraw(&outcome);
        }
    }

    /// Undoes a claim taken ahead for a head the read did not serve; one
    /// this session already held is left as it was.
    fn withdraw(&self, outcome: &ClaimOutcome) {
        metrics::counter!(crate::metrics::CLAIMS_AHEAD, "result" => "unused").increment(1);
        let ClaimOutcome::Taken(record) = outcome else {
            return;
        };
        match claims_store_call("withdraw", || {
            self.store.withdraw(&self.key, &self.holder, record.epoch)
        }) {
            Ok(_) => {
                metrics::counter!(crate::metrics::CLAIMS_AHEAD, "result" => "withdrawn")
                    .increment(1);
            }
            // It lapses like any claim its holder left unused, and goes
            // when this session closes (holder gone).
            Err(e) => {
                tracing::error!(error = %e, thread = %crate::log_text::shown(&self.key.at.thread_id),
                "a claim taken ahead for a head not served could not be withdrawn")
            }
        }
    }
}

impl Drop for AheadClaim {
    fn drop(&mut self) {
        let s = &self.shared;
        let mut state = s.state.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *state, State::Done) {
            State::Asking => *state = State::Abandoned,
            State::Answered(answer) => {
                drop(state);
                if let Ok(Some((outcome, _))) = *answer {
                    s.withdraw_aside(outcome);
                }
            }
            State::Done | State::Abandoned => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::postgres::tests::{holder, key};
    use crate::test_pg_server::PgSchema;

    const LAPSE: i64 = 60_000;

    /// Waits (at most 10 s) until `key` has no claim row.
    fn until_withdrawn(store: &ClaimStore, key: &ClaimKey) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.get(key).expect("get").is_some() {
            assert!(Instant::now() < deadline, "the claim taken ahead stayed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_claim_asked_ahead_counts_for_its_own_head_only_and_is_withdrawn_otherwise() {
        let db = PgSchema::new("ahead");
        let store = Arc::new(db.open());
        let (k1, k2, me) = (key("c1"), key("c2"), holder("p1", 1));
        // The head read is the one expected: the answer decides.
        let ahead = AheadClaim::ask(Arc::clone(&store), k1.clone(), me.clone(), LAPSE);
        match ahead.expect("asked").answer_for(&k1) {
            Some((ClaimOutcome::Taken(r), _, _)) => assert_eq!(r.holder, me),
            other => panic!("{other:?}"),
        }
        assert!(store.get(&k1).expect("get").is_some(), "kept");
        // Another head came back: the claim taken for c2 goes, c1's stays.
        let ahead = AheadClaim::ask(Arc::clone(&store), k2.clone(), me.clone(), LAPSE);
        assert!(ahead.expect("asked").answer_for(&k1).is_none());
        until_withdrawn(&store, &k2);
        assert!(store.get(&k1).expect("get").is_some());
        // The read ended without the gate: withdrawn too.
        drop(AheadClaim::ask(
            Arc::clone(&store),
            k2.clone(),
            me.clone(),
            LAPSE,
        ));
        until_withdrawn(&store, &k2);
    }

    #[test]
    fn a_claim_another_session_holds_is_left_to_the_gate() {
        let db = PgSchema::new("ahead_held");
        let store = Arc::new(db.open());
        let k1 = key("c1");
        store
            .try_claim(&k1, &holder("p1", 1), Now::STORE, LAPSE)
            .expect("claim");
        let before = store.get(&k1).expect("get");
        let ahead = AheadClaim::ask(Arc::clone(&store), k1.clone(), holder("p1", 2), LAPSE);
        assert!(ahead.expect("asked").answer_for(&k1).is_none());
        assert_eq!(store.get(&k1).expect("get"), before, "nothing changed");
    }
}
