//! The claim rule of the schema's `claim` function
//! (`src/claims/postgres/db_clock.rs`), restated in Rust for the model
//! check (`tests/claims_model.rs`). The store's own unit tests
//! (`src/claims/postgres/tests/claiming.rs`) include this same file and
//! hold it to the SQL: each state the model reaches, set up in a real
//! PostgreSQL, claimed there and decided here, must come out the same.
//!
//! The includer brings `ClaimOutcome`, `ClaimRecord`, `ClaimState` and
//! `Holder` into scope (`resumeguard::claims` or `crate::claims`).

use super::{ClaimOutcome, ClaimRecord, ClaimState, Holder};

/// The outcome for `holder` reading the key of `prev`, a row that is not
/// stale (its checkpoint was not superseded longer than the grace ago),
/// at `now_ms` on the database's clock. `writing`: the answering run of a
/// consumed row still holds a live run lease. A row handed over is
/// [`retaken`] with a lapse at `lapse_at_ms`.
pub fn decide_existing(
    prev: ClaimRecord,
    holder: &Holder,
    now_ms: i64,
    lapse_at_ms: i64,
    writing: bool,
) -> ClaimOutcome {
    let retake =
        |prev: &ClaimRecord, takeovers| retaken(prev, holder, now_ms, lapse_at_ms, takeovers);
    match prev.state {
        ClaimState::Consumed if is_abandoned(&prev, now_ms, writing) => ClaimOutcome::TakenOver {
            now: retake(&prev, 1),
            previous: prev,
        },
        ClaimState::Consumed => ClaimOutcome::Consumed(prev),
        ClaimState::Held if prev.holder.same_session(holder) => ClaimOutcome::AlreadyHeld(prev),
        ClaimState::Held if now_ms < prev.lapse_at_ms => ClaimOutcome::Busy(prev),
        ClaimState::Held => ClaimOutcome::TakenOver {
            now: retake(&prev, 1),
            previous: prev,
        },
        ClaimState::Released => ClaimOutcome::Taken(retake(&prev, 0)),
    }
}

/// `prev` handed to `holder` at `now_ms` as its next generation, with
/// `takeover` added to its takeover count (1 for a takeover, 0 for a take
/// after a release).
pub fn retaken(
    prev: &ClaimRecord,
    holder: &Holder,
    now_ms: i64,
    lapse_at_ms: i64,
    takeover: i64,
) -> ClaimRecord {
    ClaimRecord {
        takeovers: prev.takeovers + takeover,
        refusals: prev.refusals,
        superseded_at_ms: prev.superseded_at_ms,
        ..ClaimRecord::taken(
            &prev.key,
            holder,
            now_ms,
            lapse_at_ms,
            prev.epoch.saturating_add(1),
        )
    }
}

/// A consumed claim whose answering run was abandoned: the holder is gone
/// (its connection closed and the grace passed), the thread never moved
/// on from the claim's checkpoint and the run no longer writes (no live
/// run lease).
pub fn is_abandoned(c: &ClaimRecord, now_ms: i64, run_writing: bool) -> bool {
    c.state == ClaimState::Consumed
        && c.superseded_at_ms.is_none()
        && c.abandon_at_ms.is_some_and(|at| now_ms >= at)
        && !run_writing
}
