//! What a reader's claim comes to when its key already has a current row.
//! The SQLite store applies [`decide_existing`] inside its transaction;
//! the PostgreSQL store decides on the server, in one statement, with the
//! same rule written in its `claim` function (`claims::postgres::schema`).
//! The conformance suite (`claims::tests`, every case run against both
//! backends) holds the two to the same outcomes.

use super::model::{ClaimRecord, ClaimState, Holder};

/// What a reader of a parked head got from `try_claim`.
// Built once per parked read and moved, never stored in bulk: boxing the
// takeover's two records would buy nothing and complicate matching.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// No live claim existed (none, or released): this reader holds it now.
    Taken(ClaimRecord),
    /// The same session (proxy_id + session_id) already holds it: pass.
    /// The lapse time is not extended: a session that keeps re-reading
    /// without answering (a polling `get_state`) must not hold the
    /// interrupt forever.
    AlreadyHeld(ClaimRecord),
    /// Another session holds it and it has not lapsed.
    Busy(ClaimRecord),
    /// Another session's claim could be taken and this reader took it:
    /// a held claim that lapsed with no evidence, or a consumed claim whose
    /// answering run was abandoned ([`ClaimRecord::is_abandoned`];
    /// `previous.state` is then `Consumed`). `now` has `takeovers`
    /// incremented.
    TakenOver {
        previous: ClaimRecord,
        now: ClaimRecord,
    },
    /// The interrupt was already answered (by whichever session).
    Consumed(ClaimRecord),
}

/// Decides the outcome for `holder` reading the key of `prev`, a row that
/// is not stale (its checkpoint was not superseded longer than the grace
/// ago). `writing` says whether the answering run of a consumed row still
/// holds a live run lease; `retake(prev, takeovers)` is the store handing
/// the row to `holder` as the next generation, adding `takeovers` to its
/// takeover count.
pub fn decide_existing<E>(
    prev: ClaimRecord,
    holder: &Holder,
    now_ms: i64,
    writing: bool,
    retake: impl FnOnce(&ClaimRecord, i64) -> Result<ClaimRecord, E>,
) -> Result<ClaimOutcome, E> {
    Ok(match prev.state {
        ClaimState::Consumed if prev.is_abandoned(now_ms, writing) => {
            let now = retake(&prev, 1)?;
            ClaimOutcome::TakenOver {
                previous: prev,
                now,
            }
        }
        ClaimState::Consumed => ClaimOutcome::Consumed(prev),
        ClaimState::Held if prev.holder.same_session(holder) => ClaimOutcome::AlreadyHeld(prev),
        ClaimState::Held if now_ms < prev.lapse_at_ms => ClaimOutcome::Busy(prev),
        ClaimState::Held => {
            let now = retake(&prev, 1)?;
            ClaimOutcome::TakenOver {
                previous: prev,
                now,
            }
        }
        ClaimState::Released => ClaimOutcome::Taken(retake(&prev, 0)?),
    })
}
