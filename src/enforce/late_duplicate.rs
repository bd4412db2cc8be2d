//! Late duplicates at the write: a bare resume (`Command(resume=v)`) that
//! read a thread's finished head, whose interrupt was answered before, is
//! refused `55000` at its run-level `__resume__` write, before that write
//! is forwarded: the client learns that the interrupt was answered, when
//! and by whom, instead of being served the finished state in silence.
//!
//! The proxy tells a late duplicate from what the session read: the
//! write's checkpoint is one this session read as a finished head (no
//! interrupt, no tasks left). Only then is the claim store asked (the
//! thread's run lease row; its claims too where run leases are off); a
//! resume of a parked head never pays it. A read of a finished head with no such write after it (a
//! `get_state`, or a map-form resume `Command(resume={id: v})`, which
//! writes no run-level `__resume__`) is served as it always was.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use super::claim_gate::ClaimsLeg;
use super::converted_write::{self, Unchecked};
use super::events::{detail, fenced, record_write, FencedWrite};
use super::evidence::{continuation, Step};
use super::holder_detail::HolderDetail;
use crate::audit::{AuditEvent, Operation, SessionContext};
use crate::claims::{format_ms, StoreError};
use crate::log_text::shown;
use crate::metrics::claims_store_call;
use crate::policy::claims::SQLSTATE_STORE_UNAVAILABLE;
use crate::policy::late_duplicate::{
    answer_of_claims, answer_of_lease, late_duplicate_message, FirstAnswer, LATE_DUPLICATE_DETAIL,
    SQLSTATE_LATE_DUPLICATE,
};
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::StatementKind;
use crate::saver::write_record::WriteRecord;
use crate::wire::tracker::Refusal;

/// How many finished heads a session remembers: a resume writes within
/// milliseconds of its read.
const REMEMBERED: usize = 8;

/// The longest a late-duplicate check waits for this proxy's evidence
/// to reach the store.
const FLUSH_WITHIN: Duration = Duration::from_secs(1);

/// The finished heads one session read, with their metadata (the
/// answering run's, which names its approver).
#[derive(Debug, Default)]
pub struct LateGate {
    finished: VecDeque<(CheckpointRef, String)>,
}

/// A refused late duplicate: what the client gets and the audit record.
pub struct LateDuplicate {
    pub refusal: Refusal,
    pub event: AuditEvent,
}

#[derive(Serialize)]
struct LateDetail<'a> {
    sqlstate: &'a str,
    reason: &'a str,
    /// The answered interrupt, shortened.
    interrupt: &'a str,
    answered_checkpoint: &'a str,
    answered_at: String,
    answered_by: HolderDetail<'a>,
    /// The first answer's approver, as the finished head's metadata names it.
    answer_approver: Option<&'a str>,
}

impl LateGate {
    /// This session read `at` as a finished head.
    pub fn read_finished(&mut self, at: &CheckpointRef, metadata: &str) {
        self.finished.retain(|(c, _)| c != at);
        if self.finished.len() == REMEMBERED {
            self.finished.pop_front();
        }
        self.finished.push_back((at.clone(), metadata.to_owned()));
    }

    /// The refusal of a write of `kind` if it is a run-level `__resume__`
    /// onto a finished head this session read, of a thread whose
    /// interrupt was answered; `None` lets it through.
    pub fn check(
        &self,
        leg: &ClaimsLeg,
        ctx: &SessionContext,
        approver_in: impl Fn(&str) -> Option<String>,
        converted: impl Fn(&CheckpointRef) -> Option<String>,
        (kind, rec): (&StatementKind, &WriteRecord),
    ) -> Option<LateDuplicate> {
        let cont = continuation(kind, rec)?;
        if cont.step != Step::Progress {
            return None;
        }
        let at = &cont.at;
        let (_, metadata) = self.finished.iter().find(|(c, _)| c == at)?;
        if let Some(encoding) = converted(at) {
            crate::metrics::late_duplicate("client_encoding");
            let (refusal, event) = converted_write::refused(
                ctx,
                (at, kind.label(), rec),
                &encoding,
                Unchecked::Answered,
            );
            return Some(LateDuplicate { refusal, event });
        }
        // The answering run's evidence may still be gathering in this
        // proxy's worker: the store is read after it.
        if let Some(evidence) = &leg.evidence {
            evidence.flush(FLUSH_WITHIN);
        }
        let first = match first_answer(leg, at) {
            Ok(first) => first?,
            Err(why) => return Some(store_unavailable(ctx, at, kind, rec, &why)),
        };
        let approver = approver_in(metadata);
        let message = late_duplicate_message(at, &first, approver.as_deref());
        tracing::info!(thread = %shown(&at.thread_id), checkpoint = %shown(&at.checkpoint_id), "{}", shown(&message));
        crate::metrics::late_duplicate("refused");
        Some(LateDuplicate {
            event: event(ctx, at, rec, &first, approver.as_deref(), &message),
            refusal: Refusal {
                sqlstate: SQLSTATE_LATE_DUPLICATE,
                message,
                detail: LATE_DUPLICATE_DETAIL.to_owned(),
            },
        })
    }
}

/// The answer the thread's finished head `at` follows, if the store
/// knows one: its run lease row first (live or ended), which outlives the
/// claims of a superseded checkpoint; the thread's claims where run
/// leases are off.
fn first_answer(leg: &ClaimsLeg, at: &CheckpointRef) -> Result<Option<FirstAnswer>, StoreError> {
    let lease = claims_store_call("late_duplicate", || {
        leg.store.last_answer(&at.thread_id, &at.checkpoint_ns)
    })?;
    if let Some(first) = lease.as_ref().and_then(|l| answer_of_lease(l, at)) {
        return Ok(Some(first));
    }
    let claims = claims_store_call("late_duplicate", || leg.store.list(Some(&at.thread_id)))?;
    Ok(answer_of_claims(&claims, at))
}

/// The `late_duplicate` record of a refused resume write.
fn event(
    ctx: &SessionContext,
    at: &CheckpointRef,
    rec: &WriteRecord,
    first: &FirstAnswer,
    approver: Option<&str>,
    message: &str,
) -> AuditEvent {
    let mut ev = AuditEvent::new(ctx, Operation::LateDuplicate)
        .with_thread(at.thread_id.clone())
        .with_checkpoint(at.checkpoint_ns.clone(), at.checkpoint_id.clone());
    record_write(&mut ev, rec);
    ev.with_detail(detail(&LateDetail {
        sqlstate: SQLSTATE_LATE_DUPLICATE,
        reason: message,
        interrupt: first.short_fingerprint(),
        answered_checkpoint: &first.answered_checkpoint_id,
        answered_at: format_ms(first.answered_at_ms),
        answered_by: HolderDetail::of(&first.holder),
        answer_approver: approver,
    }))
}

/// Fail closed: the store cannot say whether the thread's interrupt was
/// answered, so the resume write is refused `58000` and audited as fenced.
fn store_unavailable(
    ctx: &SessionContext,
    at: &CheckpointRef,
    kind: &StatementKind,
    rec: &WriteRecord,
    why: &StoreError,
) -> LateDuplicate {
    let message = format!(
        "resumeguard: resume onto the finished head of thread \"{}\", checkpoint_ns \"{}\", \
         checkpoint \"{}\" refused (fail closed): claim store unavailable, whether its \
         interrupt was answered cannot be checked: {why}",
        at.thread_id, at.checkpoint_ns, at.checkpoint_id
    );
    tracing::error!(thread = %shown(&at.thread_id), checkpoint = %shown(&at.checkpoint_id), "{}", shown(&message));
    crate::metrics::late_duplicate("store_unavailable");
    let event = fenced(
        ctx,
        &FencedWrite {
            record: rec,
            continues: at,
            statement: kind.label(),
            sqlstate: SQLSTATE_STORE_UNAVAILABLE,
            message: &message,
            fence: "store_unavailable",
            current: None,
        },
    );
    LateDuplicate {
        refusal: Refusal {
            sqlstate: SQLSTATE_STORE_UNAVAILABLE,
            message,
            detail: String::new(),
        },
        event,
    }
}
