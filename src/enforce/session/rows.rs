//! The rows of a watched answer: a head row's rewrite and the claim it is
//! held for (refused at once where the server converts the session's
//! encoding and the head's key is not ASCII, or the row does not decode),
//! a read by id refused where its row does not decode, and the
//! RowDescription that loses the head column.

use std::sync::Arc;

use bytes::Bytes;

use super::SessionEnforcer;
use crate::enforce::claim_gate::{ClaimRequest, ClaimTicket, Head};
use crate::enforce::events::{statement_refused, StatementRefusal};
use crate::enforce::watch::Watch;
use crate::log_text::shown;
use crate::policy::claims::Refusal;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::wire::guard::{HeldTicket, ServerStep};
use crate::wire::messages::error_response::{error_response, Severity};
use crate::wire::messages::row_description::drop_last_column_description;
use crate::wire::refusal::FEATURE_NOT_SUPPORTED;

pub(super) fn row(
    session: &mut SessionEnforcer,
    watch: &mut Watch,
    frame: &[u8],
    step: &mut ServerStep,
) {
    if watch.fence.is_some() {
        return;
    }
    step.set_replace(watch.on_data_row(frame));
    if let Some((at, why)) = watch.undecodable_fork() {
        let label = watch.class.kind.label();
        step.set_answer(refused_fork_read(session, label, at, why));
        return;
    }
    let Some(leg) = session.shared.legs.claims.as_ref() else {
        return;
    };
    let (request, refusal) = if let Some(request) = session.claim_request(watch) {
        let converted = session.encodings.converts_at(&request.key.at);
        let refusal = converted.map(|encoding| Refusal::ClientEncoding(encoding.to_owned()));
        (request, refusal)
    } else if let Some((key, why)) = watch.undecodable_head() {
        let request = ClaimRequest {
            key,
            holder: leg.holder(&session.ctx),
            head: Head::Undecodable,
        };
        (request, Some(Refusal::Undecodable(why.to_owned())))
    } else {
        return;
    };
    let leg = Arc::clone(leg);
    let ticket = match refusal {
        Some(reason) => ClaimTicket::refused(leg, request, reason),
        None => ClaimTicket::new(leg, request, watch.ahead.take()),
    };
    let ticket = Arc::new(ticket);
    step.set_hold(HeldTicket(Arc::clone(&ticket) as _));
    session.held = Some(ticket);
}

/// What a client reading by id is told to do about a row that does not
/// decode.
const UNDECODABLE_FORK_HINT: &str = "The proxy reads checkpoint rows whose texts are UTF-8: \
    read with client_encoding UTF8 (PGCLIENTENCODING, or options=-c client_encoding=UTF8), \
    whatever the database's encoding.";

/// The error that answers a read by id whose row does not decode: served,
/// the row would hand a fork the writes the policy hides (the stock
/// defect). Logged and audited `statement_refused`.
fn refused_fork_read(
    session: &mut SessionEnforcer,
    statement: &str,
    at: CheckpointRef,
    why: &str,
) -> Bytes {
    let refusal = crate::wire::refusal::Refusal {
        sqlstate: FEATURE_NOT_SUPPORTED,
        message: format!(
            "resumeguard: read of checkpoint \"{}\" of thread \"{}\", checkpoint_ns \"{}\" by \
             id refused (fail closed): its row does not decode ({why}), so the writes a fork of \
             it must not be served cannot be hidden",
            at.checkpoint_id, at.thread_id, at.checkpoint_ns
        ),
        detail: String::new(),
    };
    tracing::warn!(statement, "{}", shown(&refusal.message));
    let ctx = &session.ctx;
    let event = statement_refused(
        ctx,
        StatementRefusal::UndecodableRow,
        Some(statement),
        &refusal,
    );
    session.ready_events.push(event.at(&at));
    session.row_refused = true;
    let hint = Some(UNDECODABLE_FORK_HINT);
    error_response(Severity::Error, refusal.sqlstate, &refusal.message, hint)
}

pub(super) fn description(
    _session: &mut SessionEnforcer,
    watch: &Watch,
    frame: &[u8],
) -> Option<Bytes> {
    if watch.head_column {
        drop_last_column_description(frame)
    } else {
        None
    }
}

impl SessionEnforcer {
    /// The claim request a decoded head row asks for, if any.
    fn claim_request(&self, watch: &Watch) -> Option<ClaimRequest> {
        let leg = self.shared.legs.claims.as_ref()?;
        let (key, head) = match watch.parked_claim_key() {
            Some(key) => (key, Head::Parked),
            None if leg.run_lease() => (watch.running_head_key()?, Head::Running),
            None => return None,
        };
        Some(ClaimRequest {
            key,
            holder: leg.holder(&self.ctx),
            head,
        })
    }
}
