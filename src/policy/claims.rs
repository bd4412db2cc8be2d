//! Consume-once decision (issue 4): what a read of a parked head gets,
//! given what the claim store answered.
//!
//! Pure: the wire layer asks the store, calls [`decide_at`], and serves,
//! sleeps and asks again, or sends the [`Refusal`] as an ErrorResponse
//! before the result reaches the client, so a loser's node never runs.
//! A store that cannot answer refuses (fail closed): serving would let
//! every racer fire.
//!
//! SQLSTATEs (stable; clients may match on them):
//! - `55000` object_not_in_prerequisite_state, [`Refusal::Answered`]: the
//!   interrupt was already answered; retrying the same resume never helps.
//!   Also [`Refusal::RunInProgress`]: the interrupt was answered and the
//!   answering run is still writing; this read would run its tasks again.
//! - `55006` object_in_use, [`Refusal::InFlight`]: another session is
//!   answering it right now; a resume may succeed after that claim lapses.
//! - `58000` system_error, [`Refusal::StoreUnavailable`]: the claim store
//!   (outside PostgreSQL) failed; nothing about the thread is known.
//!
//! None is in class 40 or 08, so drivers and pools do not retry or drop
//! the connection on their own.

use regex::Regex;

use crate::claims::{format_ms, now_ms, ClaimKey, ClaimOutcome, Holder, RunLease, StoreError};

/// SQLSTATE for a resume of an interrupt already answered.
pub const SQLSTATE_ANSWERED: &str = "55000";
/// SQLSTATE for a resume while another session is answering.
pub const SQLSTATE_IN_FLIGHT: &str = "55006";
/// SQLSTATE for a read refused because the claim store failed.
pub const SQLSTATE_STORE_UNAVAILABLE: &str = "58000";

/// The SQL comment that marks a statement as inspection:
/// `/* resumeguard:inspect */` (or `-- resumeguard:inspect`).
pub const INSPECTION_HINT: &str = "resumeguard:inspect";

/// What a reader does when another session holds the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Poll until the claim is consumed (then refuse) or lapses (then take
    /// it over), for at most `max_wait_ms`.
    Wait { max_wait_ms: i64, poll_ms: i64 },
    /// Refuse at once.
    Refuse,
}

/// Why a read of a parked head is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Evidence of another run consumed the claim.
    Answered { by: Holder, at_ms: i64 },
    /// Another session holds a live claim (under [`WaitPolicy::Refuse`],
    /// or still after the maximum wait).
    InFlight { by: Holder, since_ms: i64 },
    /// The store failed; the text says why.
    StoreUnavailable(String),
    /// The head is past the parked checkpoint and still has tasks to run,
    /// and another session's run that answered the interrupt holds the
    /// thread's run lease: serving the head would run those tasks twice.
    RunInProgress { lease: RunLease },
}

/// What the wire layer does with the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Pass the result through; `takeover` when a lapsed claim was taken
    /// (audited as a takeover).
    Serve { takeover: bool },
    /// Send the refusal instead of the result.
    Refuse { reason: Refusal },
    /// Hold the result, wait `ms`, and ask the store again.
    RetryAfter { ms: i64 },
}

/// [`decide_at`] with the wall clock as `now`. Store times are wall-clock
/// ms, so this is right in the proxy; tests with made-up times call
/// [`decide_at`].
pub fn decide(
    outcome: &Result<ClaimOutcome, StoreError>,
    policy: &WaitPolicy,
    waited_ms: i64,
) -> ClaimDecision {
    decide_at(outcome, policy, waited_ms, now_ms())
}

/// The decision for one answer of the store. `waited_ms` is how long this
/// read has already waited; `now_ms` is used only to stop a wait at the
/// holder's lapse time, when the next ask takes the claim over.
pub fn decide_at(
    outcome: &Result<ClaimOutcome, StoreError>,
    policy: &WaitPolicy,
    waited_ms: i64,
    now_ms: i64,
) -> ClaimDecision {
    let record = match outcome {
        Err(e) => {
            return ClaimDecision::Refuse {
                reason: Refusal::StoreUnavailable(e.to_string()),
            }
        }
        Ok(ClaimOutcome::Taken(_)) | Ok(ClaimOutcome::AlreadyHeld(_)) => {
            return ClaimDecision::Serve { takeover: false }
        }
        Ok(ClaimOutcome::TakenOver { .. }) => return ClaimDecision::Serve { takeover: true },
        Ok(ClaimOutcome::Consumed(r)) => {
            return ClaimDecision::Refuse {
                reason: Refusal::Answered {
                    by: r.holder.clone(),
                    at_ms: r.consumed_at_ms.unwrap_or(r.claimed_at_ms),
                },
            }
        }
        Ok(ClaimOutcome::Busy(r)) => r,
    };
    let in_flight = ClaimDecision::Refuse {
        reason: Refusal::InFlight {
            by: record.holder.clone(),
            since_ms: record.claimed_at_ms,
        },
    };
    match *policy {
        WaitPolicy::Refuse => in_flight,
        WaitPolicy::Wait {
            max_wait_ms,
            poll_ms,
        } => {
            if waited_ms >= max_wait_ms {
                return in_flight;
            }
            // A zero poll would spin; the lapse bound may be zero (the
            // claim lapsed between the store's clock and ours: ask now).
            let until_lapse = record.lapse_at_ms.saturating_sub(now_ms).max(0);
            let wait_left = max_wait_ms - waited_ms;
            ClaimDecision::RetryAfter {
                ms: poll_ms.max(1).min(wait_left).min(until_lapse),
            }
        }
    }
}

/// The decision for a read of a thread's head that is not parked but has
/// tasks still to run: refused while another session's answering run holds
/// the lease (a late resume would otherwise continue that run and repeat
/// its next tasks); served otherwise — including when the store cannot
/// answer, because only reads of parked heads fail closed.
pub fn decide_running_head(
    lease: &Result<Option<RunLease>, StoreError>,
    reader: &Holder,
) -> ClaimDecision {
    match lease {
        Ok(Some(lease)) if !lease.holder.same_session(reader) => ClaimDecision::Refuse {
            reason: Refusal::RunInProgress {
                lease: lease.clone(),
            },
        },
        _ => ClaimDecision::Serve { takeover: false },
    }
}

impl Refusal {
    /// The SQLSTATE of the ErrorResponse (see the module docs).
    pub fn sqlstate(&self) -> &'static str {
        match self {
            Refusal::Answered { .. } | Refusal::RunInProgress { .. } => SQLSTATE_ANSWERED,
            Refusal::InFlight { .. } => SQLSTATE_IN_FLIGHT,
            Refusal::StoreUnavailable(_) => SQLSTATE_STORE_UNAVAILABLE,
        }
    }

    /// The ErrorResponse message: what happened to which interrupt, by
    /// whom and when.
    pub fn message(&self, key: &ClaimKey) -> String {
        let what = format!(
            "thread \"{}\", checkpoint_ns \"{}\", checkpoint \"{}\", interrupt {}",
            key.thread_id,
            key.checkpoint_ns,
            key.checkpoint_id,
            key.short_fingerprint()
        );
        match self {
            Refusal::Answered { by, at_ms } => format!(
                "resumeguard: interrupt already answered: {what} was answered by {} at {}; \
                 this read of the parked checkpoint was refused before its node ran",
                who(by),
                format_ms(*at_ms)
            ),
            Refusal::InFlight { by, since_ms } => format!(
                "resumeguard: interrupt is being answered: {what} was claimed by {} at {} \
                 and that run has not finished; this read of the parked checkpoint was refused before its node ran",
                who(by),
                format_ms(*since_ms)
            ),
            Refusal::StoreUnavailable(detail) => {
                format!("resumeguard: read of parked {what} refused (fail closed): {detail}")
            }
            Refusal::RunInProgress { lease } => format!(
                "resumeguard: interrupt already answered and its run is in progress: \
                 thread \"{}\", checkpoint_ns \"{}\": interrupt {} of checkpoint \"{}\" was \
                 answered by {} at {}, and that run last wrote at {}; this read of the \
                 thread's head (checkpoint \"{}\", tasks still to run) was refused before \
                 any node ran",
                lease.thread_id,
                lease.checkpoint_ns,
                lease.short_fingerprint(),
                lease.answered_checkpoint_id,
                who(&lease.holder),
                format_ms(lease.answered_at_ms),
                format_ms(lease.last_write_ms),
                key.checkpoint_id
            ),
        }
    }

    /// The ErrorResponse hint: what the client can do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            Refusal::Answered { .. } => {
                "Read the thread's state to see the answer; resuming it again has no effect."
            }
            Refusal::InFlight { .. } => {
                "If the other session died, a resume succeeds once its claim lapses. \
                 Inspection reads marked by application_name, the inspection listener \
                 or a /* resumeguard:inspect */ comment are never refused."
            }
            Refusal::StoreUnavailable(_) => {
                "Check the claim store file and its directory; other traffic still flows."
            }
            Refusal::RunInProgress { .. } => {
                "Resuming again has no effect on an answered interrupt. To watch a running \
                 thread, mark the read as inspection (application_name, the inspection \
                 listener or a /* resumeguard:inspect */ comment); claims.run_lease_ms \
                 sets how long after the run's last write this applies."
            }
        }
    }
}

fn who(by: &Holder) -> String {
    format!(
        "client {} (application_name \"{}\", proxy {}, session {})",
        by.client_addr, by.application_name, by.proxy_id, by.session_id
    )
}

/// Inspection reads never claim and are never refused: marked by an
/// application_name pattern, by the SQL comment hint, or by arriving on
/// the listener dedicated to inspection.
pub fn is_inspection(
    application_name: &str,
    patterns: &[Regex],
    sql_hint: bool,
    inspection_listener: bool,
) -> bool {
    inspection_listener || sql_hint || patterns.iter().any(|p| p.is_match(application_name))
}

/// Whether `sql` carries [`INSPECTION_HINT`] in a `/* */` or `--` comment.
pub fn has_inspection_hint(sql: &str) -> bool {
    let mut rest = sql;
    while let Some(start) = rest.find(['/', '-']) {
        let tail = &rest[start..];
        let (body, next) = if let Some(after) = tail.strip_prefix("/*") {
            match after.find("*/") {
                Some(end) => (&after[..end], &after[end + 2..]),
                None => (after, ""),
            }
        } else if let Some(after) = tail.strip_prefix("--") {
            match after.find('\n') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        } else {
            rest = &tail[1..];
            continue;
        };
        if body.contains(INSPECTION_HINT) {
            return true;
        }
        rest = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::{ClaimRecord, ClaimState};

    const T0: i64 = 1_700_000_000_000;
    const WAIT: WaitPolicy = WaitPolicy::Wait {
        max_wait_ms: 5_000,
        poll_ms: 50,
    };

    fn holder() -> Holder {
        Holder {
            proxy_id: "proxy-a".into(),
            session_id: 42,
            client_addr: "10.1.2.3:50123".into(),
            application_name: "approver".into(),
        }
    }

    fn key() -> ClaimKey {
        ClaimKey {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "1f0-c5".into(),
            fingerprint: "abcdef0123456789".repeat(4),
        }
    }

    fn rec(state: ClaimState, lapse_at_ms: i64) -> ClaimRecord {
        ClaimRecord {
            key: key(),
            holder: holder(),
            state,
            claimed_at_ms: T0,
            lapse_at_ms,
            consumed_at_ms: (state == ClaimState::Consumed).then_some(T0 + 7),
            evidence: None,
            refusals: 0,
            takeovers: 0,
        }
    }

    fn busy(lapse_at_ms: i64) -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Busy(rec(ClaimState::Held, lapse_at_ms)))
    }

    fn in_flight() -> ClaimDecision {
        ClaimDecision::Refuse {
            reason: Refusal::InFlight {
                by: holder(),
                since_ms: T0,
            },
        }
    }

    #[test]
    fn taken_and_already_held_are_served_under_both_policies() {
        for policy in [WAIT, WaitPolicy::Refuse] {
            for o in [
                ClaimOutcome::Taken(rec(ClaimState::Held, T0 + 1)),
                ClaimOutcome::AlreadyHeld(rec(ClaimState::Held, T0 + 1)),
            ] {
                assert_eq!(
                    decide_at(&Ok(o), &policy, 0, T0),
                    ClaimDecision::Serve { takeover: false }
                );
            }
        }
    }

    #[test]
    fn a_takeover_is_served_and_flagged() {
        let o = Ok(ClaimOutcome::TakenOver {
            previous: rec(ClaimState::Held, T0),
            now: rec(ClaimState::Held, T0 + 30_000),
        });
        for policy in [WAIT, WaitPolicy::Refuse] {
            assert_eq!(
                decide_at(&o, &policy, 1_000, T0),
                ClaimDecision::Serve { takeover: true }
            );
        }
    }

    #[test]
    fn consumed_is_refused_as_answered_under_both_policies() {
        let o = Ok(ClaimOutcome::Consumed(rec(ClaimState::Consumed, T0 + 1)));
        for policy in [WAIT, WaitPolicy::Refuse] {
            assert_eq!(
                decide_at(&o, &policy, 0, T0),
                ClaimDecision::Refuse {
                    reason: Refusal::Answered {
                        by: holder(),
                        at_ms: T0 + 7
                    }
                }
            );
        }
    }

    #[test]
    fn busy_under_refuse_is_in_flight_at_once() {
        assert_eq!(
            decide_at(&busy(T0 + 30_000), &WaitPolicy::Refuse, 0, T0),
            in_flight()
        );
    }

    #[test]
    fn busy_under_wait_polls() {
        assert_eq!(
            decide_at(&busy(T0 + 30_000), &WAIT, 0, T0 + 10),
            ClaimDecision::RetryAfter { ms: 50 }
        );
    }

    #[test]
    fn a_retry_never_outlasts_the_lapse_or_the_maximum_wait() {
        // Lapse in 20 ms: ask again then, to take it over.
        assert_eq!(
            decide_at(&busy(T0 + 20), &WAIT, 0, T0),
            ClaimDecision::RetryAfter { ms: 20 }
        );
        // 30 ms of waiting left.
        assert_eq!(
            decide_at(&busy(T0 + 30_000), &WAIT, 4_970, T0),
            ClaimDecision::RetryAfter { ms: 30 }
        );
        // Lapsed by our clock but not the store's: ask right away.
        assert_eq!(
            decide_at(&busy(T0 - 5), &WAIT, 0, T0),
            ClaimDecision::RetryAfter { ms: 0 }
        );
        // Exhaustive: every retry fits both bounds.
        for waited in (0..5_000).step_by(37) {
            for lapse_in in (1..200).step_by(13) {
                match decide_at(&busy(T0 + lapse_in), &WAIT, waited, T0) {
                    ClaimDecision::RetryAfter { ms } => {
                        assert!((0..=50).contains(&ms));
                        assert!(ms <= lapse_in);
                        assert!(waited + ms <= 5_000);
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn busy_after_the_maximum_wait_is_in_flight() {
        assert_eq!(decide_at(&busy(T0 + 30_000), &WAIT, 5_000, T0), in_flight());
        assert_eq!(decide_at(&busy(T0 + 30_000), &WAIT, 9_999, T0), in_flight());
    }

    #[test]
    fn a_zero_poll_does_not_spin() {
        let policy = WaitPolicy::Wait {
            max_wait_ms: 100,
            poll_ms: 0,
        };
        assert_eq!(
            decide_at(&busy(T0 + 30_000), &policy, 0, T0),
            ClaimDecision::RetryAfter { ms: 1 }
        );
    }

    #[test]
    fn a_store_error_fails_closed() {
        let err = StoreError::Open {
            path: "/var/lib/rg/claims.db".into(),
            reason: "directory /var/lib/rg does not exist".into(),
        };
        for policy in [WAIT, WaitPolicy::Refuse] {
            let d = decide_at(&Err(err.clone()), &policy, 0, T0);
            let ClaimDecision::Refuse { reason } = d else {
                panic!("{d:?}")
            };
            assert_eq!(reason.sqlstate(), "58000");
            let msg = reason.message(&key());
            assert!(msg.contains("claim store unavailable"), "{msg}");
            assert!(msg.contains("/var/lib/rg/claims.db"), "{msg}");
            assert!(msg.contains("fail closed"), "{msg}");
        }
    }

    #[test]
    fn decide_uses_the_wall_clock() {
        let lapse = now_ms() + 60_000;
        assert_eq!(
            decide(&busy(lapse), &WAIT, 0),
            ClaimDecision::RetryAfter { ms: 50 }
        );
    }

    #[test]
    fn refusal_messages_say_who_when_and_which_interrupt() {
        let answered = Refusal::Answered {
            by: holder(),
            at_ms: T0 + 7,
        };
        assert_eq!(answered.sqlstate(), "55000");
        assert_eq!(
            answered.message(&key()),
            "resumeguard: interrupt already answered: thread \"t-1\", checkpoint_ns \"\", \
             checkpoint \"1f0-c5\", interrupt abcdef012345 was answered by client \
             10.1.2.3:50123 (application_name \"approver\", proxy proxy-a, session 42) at \
             2023-11-14T22:13:20.007Z; this read of the parked checkpoint was refused before its node ran"
        );
        let flying = Refusal::InFlight {
            by: holder(),
            since_ms: T0,
        };
        assert_eq!(flying.sqlstate(), "55006");
        let msg = flying.message(&key());
        assert!(
            msg.starts_with("resumeguard: interrupt is being answered"),
            "{msg}"
        );
        assert!(msg.contains("application_name \"approver\""), "{msg}");
        assert!(msg.contains("2023-11-14T22:13:20.000Z"), "{msg}");
        assert!(!flying.hint().is_empty() && !answered.hint().is_empty());
    }

    fn lease() -> RunLease {
        RunLease {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            answered_checkpoint_id: "1f0-c5".into(),
            fingerprint: "abcdef0123456789".repeat(4),
            holder: holder(),
            answered_at_ms: T0 + 7,
            last_write_ms: T0 + 900,
            until_ms: T0 + 10_900,
        }
    }

    #[test]
    fn a_running_head_under_another_sessions_lease_is_refused() {
        let other = Holder {
            session_id: 43,
            ..holder()
        };
        let decision = decide_running_head(&Ok(Some(lease())), &other);
        let ClaimDecision::Refuse { reason } = &decision else {
            panic!("{decision:?}");
        };
        assert_eq!(reason.sqlstate(), SQLSTATE_ANSWERED);
        let head = ClaimKey {
            checkpoint_id: "1f0-c6".into(),
            fingerprint: String::new(),
            ..key()
        };
        assert_eq!(
            reason.message(&head),
            "resumeguard: interrupt already answered and its run is in progress: thread \"t-1\", \
             checkpoint_ns \"\": interrupt abcdef012345 of checkpoint \"1f0-c5\" was answered by \
             client 10.1.2.3:50123 (application_name \"approver\", proxy proxy-a, session 42) at \
             2023-11-14T22:13:20.007Z, and that run last wrote at 2023-11-14T22:13:20.900Z; this \
             read of the thread's head (checkpoint \"1f0-c6\", tasks still to run) was refused \
             before any node ran"
        );
        assert!(reason.hint().contains("run_lease_ms"));
    }

    #[test]
    fn a_running_head_is_served_to_its_run_without_a_lease_or_store() {
        let served = ClaimDecision::Serve { takeover: false };
        assert_eq!(decide_running_head(&Ok(Some(lease())), &holder()), served);
        assert_eq!(decide_running_head(&Ok(None), &holder()), served);
        // Only reads of parked heads fail closed.
        let down = Err(StoreError::Open {
            path: "/nowhere/claims.db".into(),
            reason: "unable to open database file".into(),
        });
        assert_eq!(decide_running_head(&down, &holder()), served);
    }

    #[test]
    fn inspection_marks() {
        let patterns = vec![
            Regex::new("^langgraph-studio").expect("regex"),
            Regex::new("(?i)inspect").expect("regex"),
        ];
        assert!(is_inspection(
            "langgraph-studio/1.2",
            &patterns,
            false,
            false
        ));
        assert!(is_inspection("ops-INSPECTOR", &patterns, false, false));
        assert!(!is_inspection("worker", &patterns, false, false));
        assert!(is_inspection("worker", &patterns, true, false));
        assert!(is_inspection("worker", &patterns, false, true));
        assert!(!is_inspection("anything", &[], false, false));
    }

    #[test]
    fn the_sql_hint_must_be_in_a_comment() {
        assert!(has_inspection_hint(
            "/* resumeguard:inspect */ select * from checkpoints"
        ));
        assert!(has_inspection_hint(
            "select 1 - 2 -- resumeguard:inspect\nfrom checkpoints"
        ));
        assert!(has_inspection_hint("select 1 /* resumeguard:inspect"));
        assert!(!has_inspection_hint("select 'resumeguard:inspect'"));
        assert!(!has_inspection_hint("select a/b - c from t"));
        assert!(!has_inspection_hint("/* other */ select 1"));
    }
}
