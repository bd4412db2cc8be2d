//! A watched statement's end: its audit events and claim evidence, kept
//! until the transaction commits, the error of a write the server fenced
//! in its transaction, and a blob write the server did not make.

use super::SessionEnforcer;
use crate::claims::evidence::Evidence;
use crate::enforce::fence_check::{CheckError, FenceCheck};
use crate::enforce::watch::Watch;
use crate::log_text::shown;
use crate::saver::classify::StatementKind;
use crate::saver::write_record::WriteRecord;
use crate::wire::messages::error_response::error_fields;

/// A CommandComplete: a blob write that inserted no row (the savers'
/// `ON CONFLICT … DO NOTHING`) left the blob already stored under its key.
pub(super) fn command_complete(watch: &mut Watch, tag: &[u8]) {
    if matches!(watch.class.kind, StatementKind::BlobUpsert(_)) {
        watch.blob_kept = inserted_rows(tag) == Some(0);
    }
}

/// The row count of an `INSERT <oid> <rows>` tag.
fn inserted_rows(tag: &[u8]) -> Option<u64> {
    let rest = tag.strip_prefix(b"INSERT ")?;
    let rows = rest.rsplit(|&b| b == b' ').next()?;
    std::str::from_utf8(rows).ok()?.parse().ok()
}

/// Says that a blob write kept the blob already stored under its key: the
/// checkpoint that names the version reads that one. Harmless when it is
/// the same value written again; another run's value where a saver numbers
/// channel versions per thread, not per run (LangGraph.js: a fork's blobs
/// take the versions the first branch's already have).
fn say_blob_kept(watch: &Watch) {
    crate::metrics::blob_kept();
    let rec = watch.record.as_ref().and_then(|r| r.as_ref().ok());
    let field = |f: fn(&WriteRecord) -> &Option<String>| {
        shown(rec.and_then(|r| f(r).as_deref()).unwrap_or_default())
    };
    tracing::warn!(
        thread = %field(|r| &r.thread_id),
        checkpoint_ns = %field(|r| &r.checkpoint_ns),
        channel = %field(|r| &r.channel),
        version = %field(|r| &r.version),
        "checkpoint blob not written: a blob with its key is stored already (ON CONFLICT DO \
         NOTHING), and the checkpoint naming this version reads that one; where the saver \
         numbers channel versions per thread (LangGraph.js), a fork's checkpoint then holds \
         the first branch's value"
    );
}

pub(super) fn handle(session: &mut SessionEnforcer, watch: Watch, ok: bool) {
    let refused = std::mem::take(&mut session.row_refused);
    if let Some(check) = &watch.fence {
        if !ok {
            session.fenced_in_transaction(check);
        }
        return;
    }
    crate::metrics::statement_completed(watch.class.kind.label(), watch.executed_at);
    if !ok {
        return;
    }
    if let Some(leg) = &session.shared.legs.claims {
        if let Some(row) = watch.finished_head() {
            session.late.read_finished(&row.at, &row.metadata);
        }
        if let Some((thread, ns, parked)) = watch.head_seen() {
            leg.parked.read(&thread, &ns, parked);
        }
    }
    if refused {
        // The client got the refusal, not the rows: the refusal's record
        // is the read's.
        return;
    }
    if watch.blob_kept {
        say_blob_kept(&watch);
    }
    crate::metrics::forks_served(watch.forks.len());
    let events = watch.events(&session.ctx);
    if matches!(watch.class.kind, StatementKind::Read(_)) {
        session.ready_events.extend(events);
    } else {
        session.uncommitted.events.extend(events);
        if let Some(leg) = &session.shared.legs.claims {
            let evidence = watch.evidence();
            for gone in evidence.iter().filter_map(Evidence::deleted_thread) {
                leg.parked.thread_deleted(gone);
            }
            session.uncommitted.evidence.extend(evidence);
            if let Some(at) = watch.created_checkpoint() {
                session.uncommitted.created.push(at);
            }
            if let Some(parks) = watch.interrupt_written() {
                session.uncommitted.parks.push(parks);
            }
        }
    }
}

pub(super) fn answer_error(_session: &mut SessionEnforcer, watch: &mut Watch, frame: &[u8]) {
    let Some(check) = watch.fence.as_mut() else {
        return;
    };
    let mut raised = CheckError::default();
    for (code, value) in error_fields(frame) {
        let text = String::from_utf8_lossy(value).into_owned();
        match code {
            b'C' => raised.sqlstate = text,
            b'M' => raised.message = text,
            b'D' => raised.detail = text,
            b'H' => raised.hint = text,
            _ => {}
        }
    }
    check.raised = Some(raised);
}

impl SessionEnforcer {
    /// The audit record of a write the server fenced in its transaction.
    fn fenced_in_transaction(&mut self, check: &FenceCheck) {
        let CheckError {
            sqlstate,
            message,
            detail,
            hint: reason,
        } = check.raised.clone().unwrap_or_default();
        if sqlstate != crate::policy::claims::SQLSTATE_WRITE_FENCED {
            // The check itself failed (a lock or statement timeout, a
            // deadlock): the write's transaction fails with that error,
            // which the client gets; nothing was fenced.
            tracing::warn!(thread = %shown(&check.continues.thread_id),
                checkpoint = %shown(&check.continues.checkpoint_id), sqlstate = %shown(&sqlstate),
                "the fence check before a write failed, and the write with it: {}", shown(&message));
            return;
        }
        tracing::warn!(thread = %shown(&check.continues.thread_id),
            checkpoint = %shown(&check.continues.checkpoint_id), "{}", shown(&message));
        crate::metrics::fenced_in_transaction(&reason);
        let fence = match reason.as_str() {
            "superseded_holder" | "other_proxy" | "other_client" => reason.as_str(),
            _ => "in_transaction",
        };
        // The audit names the holder the server found: asked of the store
        // only now, on this rare path.
        let at = &check.continues;
        let current = self.shared.legs.claims.as_ref().and_then(|leg| {
            leg.store
                .current_holder(&at.thread_id, &at.checkpoint_ns, &at.checkpoint_id)
                .ok()
                .flatten()
        });
        if current.is_none() {
            tracing::debug!(detail = %shown(&detail), "fenced write's holder not found again for the audit");
        }
        let event = super::super::events::fenced(
            &self.ctx,
            &super::super::events::FencedWrite {
                record: &check.record,
                continues: at,
                statement: check.statement,
                sqlstate: crate::policy::claims::SQLSTATE_WRITE_FENCED,
                message: &message,
                fence,
                current: current.as_ref(),
            },
        );
        self.ready_events.push(event);
    }
}
