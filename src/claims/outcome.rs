//! What a reader's claim came to. The store decides it on the server, in
//! one statement: the rule is written once, in the schema's `claim`
//! function (`claims::postgres::db_clock`); the model check restates it
//! and `claims::postgres::tests::claiming` holds the restatement to the SQL.

use super::model::ClaimRecord;

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
    /// answering run was abandoned (its holder gone, the thread never
    /// moved on, no live run lease; `previous.state` is then `Consumed`).
    /// `now` has `takeovers` incremented.
    TakenOver {
        previous: ClaimRecord,
        now: ClaimRecord,
    },
    /// The interrupt was already answered (by whichever session).
    Consumed(ClaimRecord),
}
