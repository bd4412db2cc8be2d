//! The audit events a completed checkpoint statement yields: reads with
//! what they returned, writes with digests of their values, and the story
//! records (an interrupt parked, an answer recorded, a fork served).

use serde::Serialize;
use serde_json::json;

use super::holder_detail::HolderDetail;
use super::watch::Watch;
use crate::audit::{AuditEvent, BlobDigest, Operation, SessionContext};
use crate::claims::ClaimRecord;
use crate::policy::Violation;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::{ReadMode, ReadShape, RowsDeleted, StatementKind};
use crate::saver::reserved::{INTERRUPT, NULL_TASK, RESUME};
use crate::saver::typed_blob::blob_to_json;
use crate::saver::write_record::WriteRecord;
use crate::wire::tracker::Refusal;

impl Watch {
    /// Audit events for a statement that completed without error.
    pub fn events(&self, ctx: &SessionContext) -> Vec<AuditEvent> {
        match &self.class.kind {
            StatementKind::Read(shape) => self.read_events(ctx, shape),
            StatementKind::BlobUpsert(_)
            | StatementKind::CheckpointUpsert(_)
            | StatementKind::WritesUpsert(_)
            | StatementKind::WritesInsertIgnore(_) => match &self.record {
                Some(Ok(rec)) => self.write_events(ctx, rec),
                Some(Err(e)) => vec![AuditEvent::new(ctx, Operation::Unrecognized).with_detail(
                    json!({"statement": self.class.kind.label(), "decode_error": e.to_string()}),
                )],
                None => Vec::new(),
            },
            StatementKind::DeleteThread {
                table,
                thread_param,
            } => {
                let mut ev = AuditEvent::new(ctx, Operation::DeleteThread)
                    .with_detail(json!({"table": format!("{table:?}").to_lowercase()}));
                ev.thread_id = self.param_text(*thread_param);
                vec![ev]
            }
            // prune's `delete`: every row of the threads in its array
            // parameter (not decoded; the statement is recorded).
            StatementKind::DeleteRows {
                table,
                rows: RowsDeleted::Threads { .. },
            } => vec![AuditEvent::new(ctx, Operation::DeleteThread).with_detail(
                json!({"table": format!("{table:?}").to_lowercase(), "threads": "array parameter"}),
            )],
            // Housekeeping of rows no run reads again (see docs/savers.md)
            // and reads without pending writes: no story.
            StatementKind::DeleteRows { .. }
            | StatementKind::Unparent
            | StatementKind::ReadWithoutWrites
            | StatementKind::ChannelHistoryRead { .. } => Vec::new(),
            StatementKind::Migration => vec![AuditEvent::new(ctx, Operation::Migration)],
            StatementKind::Unrecognized => vec![AuditEvent::new(ctx, Operation::Unrecognized)],
            StatementKind::WritesRead | StatementKind::Other => Vec::new(),
        }
    }

    fn fork_events(&self, ctx: &SessionContext) -> impl Iterator<Item = AuditEvent> + '_ {
        let ctx = ctx.clone();
        self.forks.iter().map(move |f| {
            let mut ev = AuditEvent::new(&ctx, Operation::ForkServed).at(&f.addressed);
            ev.channels = f.hidden.iter().map(|(_, c)| c.clone()).collect();
            ev.with_detail(json!({
                "head": f.head,
                "hidden": f.hidden.iter().map(|(task, channel)| json!({"task_id": task, "channel": channel})).collect::<Vec<_>>(),
            }))
        })
    }

    fn read_events(&self, ctx: &SessionContext, shape: &ReadShape) -> Vec<AuditEvent> {
        let op = match shape.mode {
            ReadMode::Latest => Operation::ReadLatest,
            ReadMode::ById => Operation::ReadById,
            ReadMode::List => Operation::ReadList,
        };
        let mut ev = AuditEvent::new(ctx, op);
        ev.thread_id = self.param_text(shape.thread_param);
        ev.checkpoint_ns = self.param_text(shape.ns_param);
        ev.checkpoint_id = self.param_text(shape.id_param);
        let first = self.rows.first();
        if let Some(row) = first {
            ev.thread_id.get_or_insert_with(|| row.at.thread_id.clone());
            ev.checkpoint_ns
                .get_or_insert_with(|| row.at.checkpoint_ns.clone());
            ev.checkpoint_id
                .get_or_insert_with(|| row.at.checkpoint_id.clone());
            ev.parent_checkpoint_id = row.parent_checkpoint_id.clone();
        }
        let parked = first.is_some_and(|r| r.has_pending(INTERRUPT));
        let mut detail = json!({"rows": self.rows.len(), "parked": parked});
        if self.row_errors > 0 {
            detail["undecodable_rows"] = json!(self.row_errors);
        }
        let mut events = vec![ev.with_detail(detail)];
        events.extend(self.fork_events(ctx));
        events
    }

    fn write_events(&self, ctx: &SessionContext, rec: &WriteRecord) -> Vec<AuditEvent> {
        let op = match &self.class.kind {
            StatementKind::BlobUpsert(_) => Operation::BlobPut,
            StatementKind::CheckpointUpsert(_) => Operation::CheckpointPut,
            _ => Operation::WritesPut,
        };
        let mut ev = AuditEvent::new(ctx, op);
        ev.thread_id = rec.thread_id.clone();
        ev.checkpoint_ns = rec.checkpoint_ns.clone();
        ev.checkpoint_id = rec.checkpoint_id.clone();
        ev.parent_checkpoint_id = rec.parent_checkpoint_id.clone();
        record_write(&mut ev, rec);
        let mut detail = json!({"statement": self.class.kind.label()});
        if self.blob_kept {
            // The server kept the blob stored under this key, not this one.
            detail["written"] = json!(false);
        }
        if let Some(idx) = rec.idx {
            detail["idx"] = json!(idx);
        }
        if let Some(t) = &rec.type_tag {
            detail["type"] = json!(t);
        }
        if let Some(cp) = &rec.checkpoint {
            ev.channels = inline_channels(cp);
        }
        if let Some(metadata) = rec.metadata.as_deref().and_then(run_metadata) {
            // `update` marks a `update_state` write; the sink keeps only
            // the approver keys of the rest.
            if let Some(source) = metadata.get("source").and_then(|s| s.as_str()) {
                detail["source"] = json!(source);
            }
            ev.run_metadata = Some(metadata);
        }
        let mut events = vec![ev.with_detail(detail)];
        let implied = match rec.channel.as_deref() {
            Some(INTERRUPT) => Some(Operation::InterruptParked),
            Some(RESUME) => Some(Operation::ResumeRecorded),
            _ => None,
        };
        if let Some(op) = implied {
            let mut story = events[0].clone();
            story.operation = op;
            story.detail = json!({
                "run_level": rec.task_id.as_deref() == Some(NULL_TASK),
                "task_path": rec.task_path,
            });
            // The answer (its approver) or the question (kept only where
            // `[audit] log_values` allows); undecodable (pickle): neither.
            story.answer = rec
                .type_tag
                .as_deref()
                .and_then(|t| blob_to_json(t, rec.blob.as_deref()).ok().flatten());
            events.push(story);
        }
        events
    }
}

/// Channel names stored inline in a checkpoint's `channel_values`.
fn inline_channels(checkpoint_json: &str) -> Vec<String> {
    serde_json::from_str::<serde_json::Value>(checkpoint_json)
        .ok()
        .and_then(|v| {
            v.get("channel_values")
                .and_then(|c| c.as_object())
                .map(|o| o.keys().cloned().collect())
        })
        .unwrap_or_default()
}

/// A checkpoint's metadata column as a JSON object, if it is one.
fn run_metadata(metadata_json: &str) -> Option<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(metadata_json)
        .ok()
        .filter(|v| v.is_object())
}

/// Why a write was refused, as the audit records it.
#[derive(Debug, Serialize)]
struct RejectedDetail<'a> {
    reason: &'a str,
    rule: Option<&'a str>,
    schema_path: Option<&'a str>,
    instance_path: Option<&'a str>,
}

/// Records on `ev` what `rec` writes: its task, its channel and its
/// blob's digest.
pub fn record_write(ev: &mut AuditEvent, rec: &WriteRecord) {
    ev.task_id = rec.task_id.clone();
    ev.channels = rec.channel.iter().cloned().collect();
    if let (Some(c), Some(b)) = (&rec.channel, &rec.blob) {
        ev.blob_sha256.push(BlobDigest::of(c.clone(), b));
    }
}

/// The `write_rejected` record of a refused write.
pub fn rejected(
    ctx: &SessionContext,
    rec: &WriteRecord,
    reason: &str,
    violation: Option<&Violation>,
) -> AuditEvent {
    let mut ev = AuditEvent::new(ctx, Operation::WriteRejected);
    ev.thread_id = rec.thread_id.clone();
    ev.checkpoint_ns = rec.checkpoint_ns.clone();
    ev.checkpoint_id = rec.checkpoint_id.clone();
    record_write(&mut ev, rec);
    ev.with_detail(detail(&RejectedDetail {
        reason,
        rule: violation.map(|v| v.rule.as_str()),
        schema_path: violation.map(|v| v.schema_path.as_str()),
        instance_path: violation.map(|v| v.instance_path.as_str()),
    }))
}

/// A write the fencing refused: what the audit records of it.
pub struct FencedWrite<'a> {
    pub record: &'a WriteRecord,
    /// The claimed checkpoint the write continues.
    pub continues: &'a CheckpointRef,
    /// The statement's classification label.
    pub statement: &'a str,
    pub sqlstate: &'a str,
    /// The error message the client got.
    pub message: &'a str,
    /// superseded_holder, other_proxy, other_client, store_unavailable
    pub fence: &'a str,
    /// The checkpoint's current claim (none when the store failed).
    pub current: Option<&'a ClaimRecord>,
}

#[derive(Debug, Serialize)]
struct FencedDetail<'a> {
    sqlstate: &'a str,
    reason: &'a str,
    fence: &'a str,
    statement: &'a str,
    continues: &'a str,
    holder: Option<HolderDetail<'a>>,
    epoch: Option<i64>,
    interrupt: Option<&'a str>,
}

/// The `write_fenced` record of a fenced write.
pub fn fenced(ctx: &SessionContext, w: &FencedWrite<'_>) -> AuditEvent {
    let rec = w.record;
    let mut ev = AuditEvent::new(ctx, Operation::WriteFenced);
    ev.thread_id = Some(w.continues.thread_id.clone());
    ev.checkpoint_ns = Some(w.continues.checkpoint_ns.clone());
    ev.checkpoint_id = rec.checkpoint_id.clone();
    ev.parent_checkpoint_id = rec.parent_checkpoint_id.clone();
    record_write(&mut ev, rec);
    ev.with_detail(detail(&FencedDetail {
        sqlstate: w.sqlstate,
        reason: w.message,
        fence: w.fence,
        statement: w.statement,
        continues: &w.continues.checkpoint_id,
        holder: w.current.map(|c| HolderDetail::of(&c.holder)),
        epoch: w.current.map(|c| c.epoch),
        interrupt: w.current.map(|c| c.key.short_fingerprint()),
    }))
}

/// Which of the proxy's refusals of a client statement a
/// `statement_refused` record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatementRefusal {
    /// A statement on the proxy's own schema (claims, audit trail).
    OwnSchema,
    /// A checkpoint statement no saver profile recognizes, under
    /// `[enforce] unknown_saver = "refuse"`.
    UnknownSaver,
    /// A channel-history read naming a channel only the checkpoint read
    /// may return.
    ChannelHistory,
    /// A checkpoint statement in SQL PREPARE, EXECUTE or DECLARE.
    SqlForm,
    /// A read by id whose row does not decode: what the fork policy hides
    /// cannot be found in it (refused once it ran, in place of the row).
    UndecodableRow,
}

#[derive(Debug, Serialize)]
struct StatementRefusedDetail<'a> {
    refusal: StatementRefusal,
    sqlstate: &'a str,
    reason: &'a str,
    why: Option<&'a str>,
    statement: Option<&'a str>,
}

/// The `statement_refused` record of a client statement refused before it
/// ran: which refusal, the error the client got (its SQLSTATE, message
/// and DETAIL) and the statement's classification label, never its text.
pub fn statement_refused(
    ctx: &SessionContext,
    refusal: StatementRefusal,
    statement: Option<&str>,
    refused: &Refusal,
) -> AuditEvent {
    AuditEvent::new(ctx, Operation::StatementRefused).with_detail(detail(&StatementRefusedDetail {
        refusal,
        sqlstate: refused.sqlstate,
        reason: &refused.message,
        why: Some(refused.detail.as_str()).filter(|d| !d.is_empty()),
        statement,
    }))
}

/// A typed detail as the JSON the audit stores.
pub fn detail(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}
