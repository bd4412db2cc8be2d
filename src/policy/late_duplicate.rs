//! Late duplicates: which answer a bare resume repeats when its run-level
//! `__resume__` write lands on a thread's finished head, and what the
//! refused client is told. Pure: the enforcer asks the claim store for the
//! thread's claims and sends the refusal.

use super::claims::who;
use crate::claims::{format_ms, ClaimRecord, ClaimState, Holder, RunLease};
use crate::saver::checkpoint_ref::CheckpointRef;

/// SQLSTATE for a late duplicate resume: the interrupt was already
/// answered (object_not_in_prerequisite_state, as a refused racer gets).
pub const SQLSTATE_LATE_DUPLICATE: &str = super::claims::SQLSTATE_ANSWERED;

/// What the refused client reads in the ErrorResponse's detail.
pub const LATE_DUPLICATE_DETAIL: &str = "Read the thread's state for the first answer's \
    result; resuming a finished thread again has no effect.";

/// The answer a late duplicate repeats, as the claim store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstAnswer {
    /// The parked checkpoint whose interrupt was answered.
    pub answered_checkpoint_id: String,
    pub fingerprint: String,
    /// The session that answered it.
    pub holder: Holder,
    pub answered_at_ms: i64,
}

impl FirstAnswer {
    /// The interrupt's fingerprint, shortened as in claims' messages.
    pub fn short_fingerprint(&self) -> &str {
        self.fingerprint.get(..12).unwrap_or(&self.fingerprint)
    }
}

/// The answer a resume writing onto the finished head `at` repeats, from
/// the thread's run lease row (live or ended: kept until the retention
/// purge, while claims on a superseded checkpoint go after a minute):
/// the lease's answered checkpoint precedes `at` (LangGraph's checkpoint
/// ids are time-ordered UUIDv6).
pub fn answer_of_lease(lease: &RunLease, at: &CheckpointRef) -> Option<FirstAnswer> {
    (lease.thread_id == at.thread_id
        && lease.checkpoint_ns == at.checkpoint_ns
        && lease.answered_checkpoint_id < at.checkpoint_id)
        .then(|| FirstAnswer {
            answered_checkpoint_id: lease.answered_checkpoint_id.clone(),
            fingerprint: lease.fingerprint.clone(),
            holder: lease.holder.clone(),
            answered_at_ms: lease.answered_at_ms,
        })
}

/// The answer a resume writing onto the finished head `at` repeats, from
/// the thread's claims: the consumed claim in the same namespace on the
/// latest checkpoint before `at`, if the store still has one.
pub fn answer_of_claims(claims: &[ClaimRecord], at: &CheckpointRef) -> Option<FirstAnswer> {
    let first = claims
        .iter()
        .filter(|c| {
            c.state == ClaimState::Consumed
                && c.key.at.thread_id == at.thread_id
                && c.key.at.checkpoint_ns == at.checkpoint_ns
                && c.key.at.checkpoint_id < at.checkpoint_id
        })
        .max_by(|a, b| {
            (&a.key.at.checkpoint_id, a.consumed_at_ms)
                .cmp(&(&b.key.at.checkpoint_id, b.consumed_at_ms))
        })?;
    Some(FirstAnswer {
        answered_checkpoint_id: first.key.at.checkpoint_id.clone(),
        fingerprint: first.key.fingerprint.clone(),
        holder: first.holder.clone(),
        answered_at_ms: first.consumed_at_ms.unwrap_or(first.claimed_at_ms),
    })
}

/// The ErrorResponse message of a late duplicate resume onto `at`,
/// repeating `first`, whose approver the finished head's metadata names
/// (`approver`, e.g. `user_id=alice`) when it does.
pub fn late_duplicate_message(
    at: &CheckpointRef,
    first: &FirstAnswer,
    approver: Option<&str>,
) -> String {
    let by = match approver {
        Some(approver) => format!("{approver}, {}", who(&first.holder)),
        None => who(&first.holder),
    };
    format!(
        "resumeguard: late duplicate resume: interrupt {} of thread \"{}\", checkpoint_ns \
         \"{}\", checkpoint \"{}\" was answered at {} by {}; this resume reached the \
         thread's finished head (checkpoint \"{}\") and nothing was run",
        first.short_fingerprint(),
        at.thread_id,
        at.checkpoint_ns,
        first.answered_checkpoint_id,
        format_ms(first.answered_at_ms),
        by,
        at.checkpoint_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::ClaimKey;

    fn at(id: &str) -> CheckpointRef {
        CheckpointRef {
            thread_id: "t".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: id.into(),
        }
    }

    fn claim(id: &str, state: ClaimState, consumed_at_ms: Option<i64>) -> ClaimRecord {
        let holder = Holder {
            proxy_id: "proxy-a".into(),
            session_id: 7,
            client_addr: "10.0.0.1:5000".into(),
            application_name: "approver-ui".into(),
        };
        let key = ClaimKey {
            at: at(id),
            fingerprint: "ab".repeat(32),
        };
        ClaimRecord {
            state,
            consumed_at_ms,
            ..ClaimRecord::taken(&key, &holder, 1_000, 2_000, 1)
        }
    }

    #[test]
    fn the_repeated_answer_is_the_latest_consumed_claim_before_the_head() {
        let claims = [
            claim("1ef-01", ClaimState::Consumed, Some(1_500)),
            claim("1ef-03", ClaimState::Consumed, Some(3_500)),
            claim("1ef-04", ClaimState::Held, None),
            claim("1ef-09", ClaimState::Consumed, Some(9_500)),
        ];
        let found = answer_of_claims(&claims, &at("1ef-05")).expect("an answer before the head");
        assert_eq!(found.answered_checkpoint_id, "1ef-03");
        assert_eq!(found.answered_at_ms, 3_500);
    }

    #[test]
    fn a_thread_never_answered_or_another_namespace_repeats_nothing() {
        let held = [claim("1ef-01", ClaimState::Held, None)];
        assert!(answer_of_claims(&held, &at("1ef-05")).is_none());
        let mut sub = claim("1ef-01", ClaimState::Consumed, Some(1_500));
        sub.key.at.checkpoint_ns = "sub".into();
        assert!(answer_of_claims(&[sub], &at("1ef-05")).is_none());
        let released = [claim("1ef-01", ClaimState::Released, Some(1_500))];
        assert!(answer_of_claims(&released, &at("1ef-05")).is_none());
    }

    #[test]
    fn the_message_names_the_approver_the_client_and_the_time() {
        let first = answer_of_claims(
            &[claim(
                "1ef-01",
                ClaimState::Consumed,
                Some(1_700_000_000_123),
            )],
            &at("1ef-05"),
        )
        .expect("answered");
        let msg = late_duplicate_message(&at("1ef-05"), &first, Some("user_id=alice"));
        assert!(
            msg.starts_with("resumeguard: late duplicate resume: interrupt abababababab"),
            "{msg}"
        );
        assert!(msg.contains("answered at 2023-11-14T22:13:20.123Z by user_id=alice, client 10.0.0.1:5000 (application_name \"approver-ui\", proxy proxy-a, session 7)"), "{msg}");
        assert!(
            msg.contains("finished head (checkpoint \"1ef-05\") and nothing was run"),
            "{msg}"
        );
        let anonymous = late_duplicate_message(&at("1ef-05"), &first, None);
        assert!(anonymous.contains("by client 10.0.0.1:5000"), "{anonymous}");
    }

    #[test]
    fn a_run_lease_before_the_head_is_its_answer_live_or_ended() {
        let c = claim("1ef-01", ClaimState::Consumed, Some(1_500));
        let lease = RunLease {
            thread_id: "t".into(),
            checkpoint_ns: String::new(),
            answered_checkpoint_id: "1ef-01".into(),
            fingerprint: c.key.fingerprint.clone(),
            holder: c.holder.clone(),
            answered_at_ms: 1_600,
            last_write_ms: 1_700,
            until_ms: 1_800,
        };
        let found = answer_of_lease(&lease, &at("1ef-05")).expect("answered before the head");
        assert_eq!(found.answered_at_ms, 1_600);
        assert_eq!(found.short_fingerprint(), "abababababab");
        assert!(answer_of_lease(&lease, &at("1ef-00")).is_none());
    }
}
