//! What a Bind of a checkpoint statement may do: its parameters decoded,
//! its write checked by the validity gate, the late-duplicate gate and the
//! fence (or refused when they must read values that do not decode), and
//! refused, guarded by the proxy's own statement, rewritten or forwarded.
//! A Bind of a statement ending the transaction raises a blob refusal
//! still waiting in its place.

use std::sync::Arc;

use super::sync;
use super::unknown_saver::unknown_refusal;
use super::{Binding, Prepared, SessionEnforcer};
use crate::enforce::events::{statement_refused, StatementRefusal};
use crate::enforce::evidence::continuation;
use crate::enforce::fencing::{FenceStep, Fenced};
use crate::enforce::history::history_refusal;
use crate::enforce::late_duplicate::LateDuplicate;
use crate::enforce::transaction_end::TransactionEnd;
use crate::enforce::validity::Rejection;
use crate::enforce::watch::{parked_on, Watch, WriteDecode};
use crate::log_text::shown;
use crate::saver::bind::BoundParams;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::StatementKind;
use crate::saver::decode_error::DecodeError;
use crate::saver::write_record::WriteRecord;
use crate::wire::guard::ClientError;
use crate::wire::messages::bind::Bind;
use crate::wire::tracker::{Bound, Guarded};

pub(super) fn handle(
    session: &mut SessionEnforcer,
    statement: &Prepared,
    bind: &Bind<'_>,
) -> Result<Bound<Binding, Watch>, ClientError> {
    match statement.ends_transaction {
        // It commits the transaction: a blob refusal still waiting is
        // raised in its place, as at a Sync, before the blob can commit.
        Some(TransactionEnd::Commit) => {
            return Ok(match sync::handle(session) {
                Some(refusal) => Bound::Refuse(refusal),
                None => Bound::Forward(None),
            })
        }
        // It discards the blob with everything else: nothing to refuse.
        // The writes after it run in another transaction: fenced again.
        Some(TransactionEnd::Rollback) => {
            session.validity.rolled_back();
            session.fencing.end_transaction();
            return Ok(Bound::Forward(None));
        }
        None => {}
    }
    if !statement.class.kind.is_checkpoint_traffic() {
        return Ok(Bound::Forward(None));
    }
    // [enforce] unknown_saver = "refuse": a checkpoint statement no
    // profile recognizes (classified unrecognized, and only then refused)
    // fails here, before anything of it runs.
    if matches!(statement.class.kind, StatementKind::Unrecognized) {
        if let Some(refusal) = unknown_refusal(session, &statement.class) {
            return Ok(Bound::Refuse(refusal));
        }
    }
    // A checkpoint Bind that does not decode would leave enforcement
    // blind: the session fails closed.
    let mut bound = BoundParams::keep(bind)
        .map_err(|e| ClientError(format!("malformed Bind for a checkpoint statement: {e}")))?;
    let record: Option<WriteDecode> = match &statement.class.kind {
        // Only a channel-history read names channels a Bind could ask for.
        history @ StatementKind::ChannelHistoryRead { .. } => {
            if let Some(refusal) = history_refusal(history, &bound) {
                tracing::warn!(statement = history.label(), "{}", shown(&refusal.message));
                let event = statement_refused(
                    &session.ctx,
                    StatementRefusal::ChannelHistory,
                    Some(history.label()),
                    &refusal,
                );
                session.ready_events.push(event);
                return Ok(Bound::Refuse(refusal));
            }
            None
        }
        kind => kind
            .insert_shape()
            .map(|shape| WriteRecord::decode(shape, &bound).map(Arc::new)),
    };
    if let Some(decoded) = &record {
        let rejection = match decoded {
            Err(error) => session.undecodable(&statement.class.kind, &bound, error),
            Ok(rec) => {
                let rules = Arc::clone(&session.shared.legs.validity);
                session.validity.check(&rules, &statement.class.kind, rec)
            }
        };
        if let Some(rejection) = rejection {
            let (refusal, event) = rejection.refuse(&session.ctx);
            session.ready_events.push(event);
            return Ok(Bound::Refuse(refusal));
        }
    }
    if let Some(late) = session.late_duplicate(&statement.class.kind, record.as_ref()) {
        let LateDuplicate { refusal, event } = late;
        session.ready_events.push(event);
        return Ok(Bound::Refuse(refusal));
    }
    let guard = match session.fence(&statement.class.kind, record.as_ref()) {
        FenceStep::Pass => None,
        FenceStep::Refuse(fenced) => {
            let Fenced { refusal, event } = *fenced;
            session.ready_events.push(event);
            return Ok(Bound::Refuse(refusal));
        }
        FenceStep::InTransaction(guarded) => Some(*guarded),
    };
    let mut replacement = None;
    if statement.rewritten && bound.result_formats.len() > 1 {
        // Per-column formats must cover the head column too.
        bound.result_formats.push(0);
        replacement = Some(bound.encode().map_err(|e| {
            ClientError(format!("the Bind with the head column cannot be sent: {e}"))
        })?);
    }
    let binding = Binding {
        class: Arc::clone(&statement.class),
        bound: Arc::new(bound),
        record,
        rewritten: statement.rewritten,
        inspect_hint: statement.inspect_hint,
    };
    Ok(match (guard, replacement) {
        (Some((injection, check)), _) => {
            // Writes are never rewritten: only reads by id are.
            let mut watch = Watch::new(session.shared.classifier.other(), None, false);
            watch.fence = Some(check);
            Bound::Guarded(Box::new(Guarded {
                injection,
                watch,
                portal: Some(binding),
            }))
        }
        (None, Some(bytes)) => Bound::Replace(bytes, Some(binding)),
        (None, None) => Bound::Forward(Some(binding)),
    })
}

/// Only the Binds of checkpoint statements (their parameters decoded)
/// and of statements ending the transaction are read (see `handle`).
pub(super) fn reads(_session: &SessionEnforcer, statement: &Prepared) -> bool {
    statement.class.kind.is_checkpoint_traffic() || statement.ends_transaction.is_some()
}

impl SessionEnforcer {
    /// A write whose values do not decode cannot be guarded by a leg that
    /// must read them (channel rules, consume-once): it is refused then.
    /// With no such leg it passes as it would without the proxy, said at
    /// WARN.
    fn undecodable(
        &self,
        kind: &StatementKind,
        bound: &BoundParams,
        error: &DecodeError,
    ) -> Option<Rejection> {
        let legs = &self.shared.legs;
        if !legs.validity.is_empty() || legs.claims.is_some() {
            let readable = kind
                .insert_shape()
                .map(|shape| WriteRecord::decode_readable(shape, bound))
                .unwrap_or_default();
            return Some(Rejection::undecodable(readable, error));
        }
        tracing::warn!(
            statement = kind.label(),
            "checkpoint write passes unread: its parameters do not decode: {}",
            shown(&error.to_string())
        );
        None
    }

    /// With consume-once on: a write continuing a claimed checkpoint from
    /// a session other than its holder is refused (see `fencing`).
    fn fence(&mut self, kind: &StatementKind, record: Option<&WriteDecode>) -> FenceStep {
        let Some(leg) = self.shared.legs.claims.as_ref().map(Arc::clone) else {
            return FenceStep::Pass;
        };
        let Some(Ok(rec)) = record else {
            return FenceStep::Pass;
        };
        match parked_on(rec) {
            // From now on a reader may claim this checkpoint.
            Some(at) if kind.is_pending_write() => self.fencing.parks(&at),
            _ => leg.parked.write_passed(kind, rec),
        }
        let Some(cont) = continuation(kind, rec) else {
            return FenceStep::Pass;
        };
        // Claims on it may change with this write: asked of the store again.
        leg.held.forget(&cont.at);
        let session = leg.holder(&self.ctx);
        let converted = self.encodings.converts_at(&cont.at);
        self.fencing.check(
            &leg,
            &self.ctx,
            &session,
            converted,
            (&cont, kind.label(), rec),
        )
    }

    /// With consume-once on: a bare resume's `__resume__` write onto a
    /// finished head this session read, of an answered interrupt, is
    /// refused (see `late_duplicate`).
    fn late_duplicate(
        &self,
        kind: &StatementKind,
        record: Option<&WriteDecode>,
    ) -> Option<LateDuplicate> {
        let leg = self.shared.legs.claims.as_ref()?;
        let Some(Ok(rec)) = record else {
            return None;
        };
        let audit = &self.shared.audit;
        let converted = |at: &CheckpointRef| self.encodings.converts_at(at).map(str::to_owned);
        self.late.check(
            leg,
            &self.ctx,
            |m| audit.approver_in(m),
            converted,
            (kind, rec),
        )
    }
}
