//! What the proxy watches in the response to one checkpoint statement, and
//! the audit events it yields once the statement has completed.

use std::sync::Arc;

use serde_json::json;

use crate::audit::{AuditEvent, BlobDigest, Operation, SessionContext};
use crate::saver::bind::BoundParams;
use crate::saver::checkpoint_row::{decode_checkpoint_row, CheckpointRow, RowLayout};
use crate::saver::classify::{Classified, ReadMode, ReadShape, StatementKind};
use crate::saver::data_row::split_data_row;
use crate::saver::value::ColumnKind;
use crate::saver::write_record::WriteRecord;

/// Channels LangGraph reserves for interrupts and their answers.
pub const INTERRUPT: &str = "__interrupt__";
pub const RESUME: &str = "__resume__";

/// A checkpoint statement in flight: its classification, its parameters
/// and, for reads, the rows seen so far.
#[derive(Debug)]
pub struct Watch {
    pub class: Arc<Classified>,
    pub bound: Option<Arc<BoundParams>>,
    pub rows: Vec<CheckpointRow>,
    pub row_errors: usize,
}

impl Watch {
    pub fn new(class: Arc<Classified>, bound: Option<Arc<BoundParams>>) -> Self {
        Watch {
            class,
            bound,
            rows: Vec::new(),
            row_errors: 0,
        }
    }

    /// Decodes one DataRow of a checkpoint read. A row that does not decode
    /// is counted, logged and forwarded untouched.
    pub fn on_data_row(&mut self, frame: &[u8]) {
        let StatementKind::Read(shape) = &self.class.kind else {
            return;
        };
        let Some(layout) = layout_of(shape) else {
            return;
        };
        let formats = self
            .bound
            .as_ref()
            .map(|b| b.result_formats.as_slice())
            .unwrap_or_default();
        let decoded = split_data_row(frame.get(5..).unwrap_or_default())
            .and_then(|fields| decode_checkpoint_row(&fields, formats, &layout));
        match decoded {
            Ok(row) => self.rows.push(row),
            Err(e) => {
                self.row_errors += 1;
                tracing::warn!(error = %e, "checkpoint row not decodable; forwarded unchanged");
            }
        }
    }

    /// Audit events for a statement that completed without error.
    pub fn events(&self, ctx: &SessionContext) -> Vec<AuditEvent> {
        match &self.class.kind {
            StatementKind::Read(shape) => self.read_events(ctx, shape),
            StatementKind::BlobUpsert(s)
            | StatementKind::CheckpointUpsert(s)
            | StatementKind::WritesUpsert(s)
            | StatementKind::WritesInsertIgnore(s) => match &self.bound {
                Some(b) => match WriteRecord::decode(s, b) {
                    Ok(rec) => self.write_events(ctx, &rec),
                    Err(e) => vec![AuditEvent::new(ctx, Operation::Unrecognized).with_detail(
                        json!({"statement": self.class.kind.label(), "decode_error": e.to_string()}),
                    )],
                },
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
            StatementKind::Migration => vec![AuditEvent::new(ctx, Operation::Migration)],
            StatementKind::Unrecognized => vec![AuditEvent::new(ctx, Operation::Unrecognized)],
            StatementKind::WritesRead | StatementKind::Other => Vec::new(),
        }
    }

    fn param_text(&self, index: Option<usize>) -> Option<String> {
        let value = self.bound.as_ref()?.value(index?, ColumnKind::Text).ok()?;
        value.as_str().map(str::to_owned)
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
            ev.thread_id.get_or_insert_with(|| row.thread_id.clone());
            ev.checkpoint_ns
                .get_or_insert_with(|| row.checkpoint_ns.clone());
            ev.checkpoint_id
                .get_or_insert_with(|| row.checkpoint_id.clone());
            ev.parent_checkpoint_id = row.parent_checkpoint_id.clone();
        }
        let parked = first.is_some_and(|r| r.has_pending(INTERRUPT) && !r.has_pending(RESUME));
        let mut detail = json!({"rows": self.rows.len(), "parked": parked});
        if self.row_errors > 0 {
            detail["undecodable_rows"] = json!(self.row_errors);
        }
        vec![ev.with_detail(detail)]
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
        ev.task_id = rec.task_id.clone();
        let mut detail = json!({"statement": self.class.kind.label()});
        if let Some(channel) = &rec.channel {
            ev.channels.push(channel.clone());
            if let Some(blob) = &rec.blob {
                ev.blob_sha256.push(BlobDigest::of(channel.clone(), blob));
            }
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
            events.push(story);
        }
        events
    }
}

/// The task id LangGraph uses for a run-level `__resume__` write.
pub const NULL_TASK: &str = "00000000-0000-0000-0000-000000000000";

/// Where the decoded columns sit in a read's result; `None` when the read
/// does not return the columns the proxy decodes.
fn layout_of(shape: &ReadShape) -> Option<RowLayout> {
    Some(RowLayout {
        thread_id: shape.column("thread_id")?,
        checkpoint: shape.column("checkpoint")?,
        checkpoint_ns: shape.column("checkpoint_ns")?,
        checkpoint_id: shape.column("checkpoint_id")?,
        parent_checkpoint_id: shape.column("parent_checkpoint_id")?,
        metadata: shape.column("metadata")?,
        channel_values: shape.column("channel_values")?,
        pending_writes: shape.column("pending_writes")?,
    })
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
