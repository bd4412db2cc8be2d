//! A held head row's claim, decided: what the session now holds, the
//! audit of the decision, and the refusal the client gets instead of the
//! row.

use bytes::Bytes;
use regex::Regex;
use serde::Serialize;

use super::SessionEnforcer;
use crate::audit::{AuditEvent, Operation, SessionContext};
use crate::enforce::claim_gate::{ClaimRequest, ClaimsLeg, Head, Resolution};
use crate::enforce::events::detail;
use crate::enforce::holder_detail::HolderDetail;
use crate::log_text::shown;
use crate::policy::claims::{inspection_remedy, ClaimDecision, Refusal as ClaimRefusal};
use crate::wire::messages::error_response::{error_response, Severity};

pub(super) fn handle(session: &mut SessionEnforcer) -> Option<Bytes> {
    let ticket = session.held.take()?;
    let resolution = ticket.resolution.get()?;
    session.claim_resolved(&ticket.request, resolution)
}

impl SessionEnforcer {
    /// A held head row's claim was decided: what this session now holds
    /// is remembered for fencing, the decision audited; returns the
    /// refusal the client gets instead of the row, if any (the answer's
    /// completion then records no read).
    pub fn claim_resolved(&mut self, req: &ClaimRequest, res: &Resolution) -> Option<Bytes> {
        if req.head == Head::Parked {
            match res.epoch {
                Some(epoch) => self.fencing.took(&req.key, epoch),
                None => self.fencing.read_parked(&req.key),
            }
            if matches!(res.decision, ClaimDecision::Serve { .. }) {
                self.run_open = true;
            }
        }
        let remedy = match (&res.decision, self.shared.legs.claims.as_deref()) {
            (
                ClaimDecision::Refuse {
                    reason: ClaimRefusal::RunInProgress { .. },
                },
                Some(leg),
            ) => Some(inspection_remedy_of(leg)),
            _ => None,
        };
        let refusal = apply_claim(
            &self.ctx,
            req,
            res,
            remedy.as_deref(),
            &mut self.ready_events,
        );
        self.row_refused |= refusal.is_some();
        refusal
    }
}

/// How a read is marked as inspection under `leg` (see
/// [`crate::policy::claims::inspection_remedy`]).
fn inspection_remedy_of(leg: &ClaimsLeg) -> String {
    let patterns: Vec<&str> = leg.inspection_patterns.iter().map(Regex::as_str).collect();
    inspection_remedy(&patterns, leg.inspection_sql_hint)
}

#[derive(Serialize)]
struct WaitedDetail<'a> {
    interrupt: &'a str,
    waited_ms: i64,
}

#[derive(Serialize)]
struct RefusedDetail<'a> {
    interrupt: &'a str,
    sqlstate: &'a str,
    reason: &'a str,
    head: &'a str,
}

#[derive(Serialize)]
struct UncheckedDetail<'a> {
    head: &'a str,
    reason: &'a str,
}

#[derive(Serialize)]
struct TakenDetail<'a> {
    interrupt: &'a str,
    displaced: Option<HolderDetail<'a>>,
    /// Why the previous holder lost the claim, for a takeover.
    takeover: Option<&'a str>,
}

/// What a decided claim means for the held row: `None` lets it through;
/// `Some` is the refusal the client gets instead. The audit records go to
/// `events`. `inspection` says how to mark a read as inspection, told to
/// a read refused while a run is in progress.
fn apply_claim(
    ctx: &SessionContext,
    req: &ClaimRequest,
    res: &Resolution,
    inspection: Option<&str>,
    events: &mut Vec<AuditEvent>,
) -> Option<Bytes> {
    let key = &req.key;
    let event = |op| {
        AuditEvent::new(ctx, op)
            .with_thread(key.at.thread_id.clone())
            .with_checkpoint(key.at.checkpoint_ns.clone(), key.at.checkpoint_id.clone())
    };
    if res.waited_ms > 0 {
        events.push(
            event(Operation::ClaimWaited).with_detail(detail(&WaitedDetail {
                interrupt: key.short_fingerprint(),
                waited_ms: res.waited_ms,
            })),
        );
    }
    match &res.decision {
        ClaimDecision::Refuse { reason } => {
            let (message, hint) = match (reason, inspection) {
                (ClaimRefusal::RunInProgress { .. }, Some(remedy)) => (
                    format!(
                        "{}; if this is a status read (get_state), {remedy}",
                        reason.message(key)
                    ),
                    format!(
                        "Resuming again has no effect on an answered interrupt. To watch a \
                         running thread, {remedy}. claims.run_lease_ms sets how long after \
                         the run's last write this applies."
                    ),
                ),
                _ => (reason.message(key), reason.hint().to_owned()),
            };
            tracing::info!(thread = %shown(&key.at.thread_id), "{}", shown(&message));
            let interrupt = match reason {
                ClaimRefusal::RunInProgress { lease } => lease.short_fingerprint(),
                _ => key.short_fingerprint(),
            };
            events.push(
                event(Operation::ClaimRefused).with_detail(detail(&RefusedDetail {
                    interrupt,
                    sqlstate: reason.sqlstate(),
                    reason: &message,
                    head: match req.head {
                        Head::Parked => "parked",
                        Head::Running => "running",
                        Head::Undecodable => "undecodable",
                    },
                })),
            );
            Some(error_response(
                Severity::Error,
                reason.sqlstate(),
                &message,
                Some(&hint),
            ))
        }
        // A running head: nothing was claimed. Outside any lease it records
        // nothing more; when the store could not say its lease, the trail
        // says it was served unchecked.
        ClaimDecision::Serve { .. } if req.head == Head::Running => {
            if let Some(error) = &res.lease_unknown {
                events.push(event(Operation::LeaseUnchecked).with_detail(detail(
                    &UncheckedDetail {
                        head: "running",
                        reason: &format!(
                            "run lease unknown (claim store failed: {error}); a late resume may \
                             repeat another session's run"
                        ),
                    },
                )));
            }
            None
        }
        // A holder reading its head again: its claim_taken already says who
        // holds the claim since when, and the read is recorded as one.
        ClaimDecision::Serve { .. } if res.held_already => None,
        ClaimDecision::Serve { takeover } => {
            let op = if *takeover {
                Operation::ClaimTakeover
            } else {
                Operation::ClaimTaken
            };
            events.push(event(op).with_detail(detail(&TakenDetail {
                interrupt: key.short_fingerprint(),
                displaced: res.displaced.as_ref().map(HolderDetail::of),
                takeover: res.takeover,
            })));
            None
        }
        ClaimDecision::RetryAfter { .. } => None,
    }
}
