//! What the proxy watches in the response to one checkpoint statement, and
//! the audit events it yields once the statement has completed.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;

use super::row_rewrite;
use crate::claims::evidence::Evidence;
use crate::claims::{interrupt_fingerprint, ClaimKey};
use crate::policy::fork::{fork_filter, ForkVerdict};
use crate::saver::checkpoint_row::PendingWrite;
use crate::saver::profile::TableRole;

use crate::audit::{AuditEvent, BlobDigest, Operation, SessionContext};
use crate::saver::bind::BoundParams;
use crate::saver::checkpoint_row::{decode_checkpoint_row, CheckpointRow, RowLayout};
use crate::saver::classify::{Classified, ReadMode, ReadShape, StatementKind};
use crate::saver::data_row::split_data_row;
use crate::saver::pending_tasks::has_pending_tasks;
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
    /// For a write: its row, decoded once at Bind (or why it did not decode).
    pub record: Option<WriteDecode>,
    /// The statement runs as its fork rewrite: results carry the head
    /// checkpoint id as an extra last column, which the client never sees.
    pub head_column: bool,
    /// The read is marked as inspection: it never claims.
    pub inspect: bool,
    /// When the statement passed the proxy (wall-clock ms), for claim
    /// evidence; only set for writes while consume-once is on.
    pub sent_at_ms: i64,
    pub rows: Vec<CheckpointRow>,
    pub row_errors: usize,
    forks: Vec<ForkServed>,
}

/// A write's row as decoded from its Bind, shared by the validity gate,
/// the audit record and the claim evidence.
pub type WriteDecode = Result<Arc<WriteRecord>, String>;

/// A read that addressed a superseded checkpoint, as served.
#[derive(Debug)]
struct ForkServed {
    checkpoint_ns: String,
    addressed: String,
    head: Option<String>,
    hidden: Vec<(String, String)>,
}

impl Watch {
    pub fn new(class: Arc<Classified>, bound: Option<Arc<BoundParams>>, head_column: bool) -> Self {
        Watch {
            class,
            bound,
            record: None,
            head_column,
            inspect: false,
            sent_at_ms: 0,
            rows: Vec::new(),
            row_errors: 0,
            forks: Vec::new(),
        }
    }

    /// Decodes one DataRow of a checkpoint read and, for a fork rewrite,
    /// returns the row the client gets instead: without the head column
    /// and without what the fork policy hides. A row that does not decode
    /// is counted and logged; a plain read's row is then forwarded as is,
    /// a rewritten read's row loses only the head column.
    pub fn on_data_row(&mut self, frame: &[u8]) -> Option<Bytes> {
        let StatementKind::Read(shape) = &self.class.kind else {
            return None;
        };
        let layout = shape.layout;
        let bound = self.bound.clone();
        let all_formats = bound
            .as_ref()
            .map(|b| b.result_formats.as_slice())
            .unwrap_or_default();
        let fields = match split_data_row(frame.get(5..).unwrap_or_default()) {
            Ok(f) => f,
            Err(e) => {
                self.row_errors += 1;
                self.class.report_undecodable_row(&e);
                return None;
            }
        };
        let (fields, head) = match (self.head_column, fields.split_last()) {
            (true, Some((head, rest))) => (
                rest,
                Some(head.map(|h| String::from_utf8_lossy(h).into_owned())),
            ),
            _ => (fields.as_slice(), None),
        };
        // Per-column result formats include the appended column's.
        let formats = match all_formats {
            many if many.len() > 1 => &many[..fields.len().min(many.len())],
            few => few,
        };
        let row = match decode_checkpoint_row(fields, formats, &layout) {
            Ok(row) => row,
            Err(e) => {
                self.row_errors += 1;
                self.class.report_undecodable_row(&e);
                return head.map(|_| row_rewrite::data_row(fields));
            }
        };
        let replacement =
            head.map(|head| self.serve_fork_filtered(&row, head, fields, formats, &layout));
        self.rows.push(row);
        replacement
    }

    /// Applies the fork policy to one row of a rewritten read by id.
    fn serve_fork_filtered(
        &mut self,
        row: &CheckpointRow,
        head: Option<String>,
        fields: &[Option<&[u8]>],
        formats: &[i16],
        layout: &RowLayout,
    ) -> Bytes {
        match fork_filter(&row.checkpoint_id, head.as_deref(), &row.pending_writes) {
            ForkVerdict::Untouched => row_rewrite::data_row(fields),
            ForkVerdict::Fork { hide } => {
                let kept: Vec<&PendingWrite> = row
                    .pending_writes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !hide.contains(i))
                    .map(|(_, w)| w)
                    .collect();
                self.forks.push(ForkServed {
                    checkpoint_ns: row.checkpoint_ns.clone(),
                    addressed: row.checkpoint_id.clone(),
                    head,
                    hidden: hide
                        .iter()
                        .filter_map(|i| row.pending_writes.get(*i))
                        .map(|w| (w.task_id.clone(), w.channel.clone()))
                        .collect(),
                });
                if hide.is_empty() {
                    return row_rewrite::data_row(fields);
                }
                let column = layout.pending_writes;
                let format = match formats {
                    [] => 0,
                    [one] => *one,
                    many => many.get(column).copied().unwrap_or(0),
                };
                let encoded: Option<Vec<u8>> = if kept.is_empty() {
                    None
                } else {
                    let array = layout.write_rows.encode(&kept);
                    Some(if format == 1 {
                        array.encode_binary()
                    } else {
                        array.encode_text().into_bytes()
                    })
                };
                let mut out: Vec<Option<&[u8]>> = fields.to_vec();
                if let Some(slot) = out.get_mut(column) {
                    *slot = encoded.as_deref();
                }
                row_rewrite::data_row(&out)
            }
        }
    }

    /// Audit events for a statement that completed without error.
    pub fn events(&self, ctx: &SessionContext) -> Vec<AuditEvent> {
        match &self.class.kind {
            StatementKind::Read(shape) => self.read_events(ctx, shape),
            StatementKind::BlobUpsert(_)
            | StatementKind::CheckpointUpsert(_)
            | StatementKind::WritesUpsert(_)
            | StatementKind::WritesInsertIgnore(_) => match &self.record {
                Some(Ok(rec)) => self.write_events(ctx, rec),
                Some(Err(e)) => vec![AuditEvent::new(ctx, Operation::Unrecognized)
                    .with_detail(json!({"statement": self.class.kind.label(), "decode_error": e}))],
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

    /// The row of a read of a namespace's head that the consume-once gate
    /// looks at: the last one, unless the read is inspection.
    fn gated_head(&self) -> Option<&CheckpointRow> {
        let StatementKind::Read(shape) = &self.class.kind else {
            return None;
        };
        if shape.mode != ReadMode::Latest || self.inspect {
            return None;
        }
        self.rows.last()
    }

    /// For a read of a namespace's head whose last row is parked (carries
    /// an `__interrupt__` write): the claim key of that interrupt.
    pub fn parked_claim_key(&self) -> Option<ClaimKey> {
        let row = self.gated_head()?;
        let interrupts: Vec<(&str, Option<&[u8]>)> = row
            .pending_writes
            .iter()
            .filter(|w| w.channel == INTERRUPT)
            .map(|w| (w.task_id.as_str(), w.blob.as_deref()))
            .collect();
        if interrupts.is_empty() {
            return None;
        }
        Some(ClaimKey {
            thread_id: row.thread_id.clone(),
            checkpoint_ns: row.checkpoint_ns.clone(),
            checkpoint_id: row.checkpoint_id.clone(),
            fingerprint: interrupt_fingerprint(&interrupts),
        })
    }

    /// For a read of a namespace's head that is not parked but has tasks
    /// still to run: the key the run lease is checked under (its
    /// fingerprint is empty; the lease names the interrupt).
    pub fn running_head_key(&self) -> Option<ClaimKey> {
        let row = self.gated_head()?;
        if row.has_pending(INTERRUPT) || has_pending_tasks(&row.checkpoint) != Some(true) {
            return None;
        }
        Some(ClaimKey {
            thread_id: row.thread_id.clone(),
            checkpoint_ns: row.checkpoint_ns.clone(),
            checkpoint_id: row.checkpoint_id.clone(),
            fingerprint: String::new(),
        })
    }

    /// What a completed write means for consume-once claims.
    pub fn evidence(&self) -> Vec<Evidence> {
        let record = match &self.record {
            Some(Ok(rec)) => Some(rec.as_ref()),
            _ => None,
        };
        match &self.class.kind {
            StatementKind::WritesUpsert(_) | StatementKind::WritesInsertIgnore(_) => {
                let Some(rec) = record else {
                    return Vec::new();
                };
                let (Some(thread_id), Some(checkpoint_ns), Some(checkpoint_id), Some(channel)) = (
                    rec.thread_id.clone(),
                    rec.checkpoint_ns.clone(),
                    rec.checkpoint_id.clone(),
                    rec.channel.as_deref(),
                ) else {
                    return Vec::new();
                };
                let task = rec.task_id.as_deref().unwrap_or_default();
                match channel {
                    RESUME if task == NULL_TASK => vec![Evidence::Progress {
                        thread_id,
                        checkpoint_ns,
                        checkpoint_id,
                        written_at_ms: self.sent_at_ms,
                    }],
                    // Parking, failing or scheduling is not an answer.
                    INTERRUPT | "__error__" | "__scheduled__" => Vec::new(),
                    _ => vec![Evidence::Consumed {
                        thread_id,
                        checkpoint_ns,
                        checkpoint_id,
                        what: format!("task {task} wrote {channel}"),
                        written_at_ms: self.sent_at_ms,
                    }],
                }
            }
            StatementKind::CheckpointUpsert(_) => match record {
                Some(WriteRecord {
                    thread_id: Some(thread_id),
                    checkpoint_ns: Some(checkpoint_ns),
                    parent_checkpoint_id: Some(parent_checkpoint_id),
                    ..
                }) => vec![Evidence::MovedOn {
                    thread_id: thread_id.clone(),
                    checkpoint_ns: checkpoint_ns.clone(),
                    parent_checkpoint_id: parent_checkpoint_id.clone(),
                }],
                _ => Vec::new(),
            },
            StatementKind::DeleteThread {
                table: TableRole::Checkpoints,
                thread_param,
            } => self
                .param_text(*thread_param)
                .map(|thread_id| vec![Evidence::ThreadDeleted { thread_id }])
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn param_text(&self, index: Option<usize>) -> Option<String> {
        let value = self.bound.as_ref()?.value(index?, ColumnKind::Text).ok()?;
        value.as_str().map(str::to_owned)
    }

    fn fork_events(&self, ctx: &SessionContext) -> impl Iterator<Item = AuditEvent> + '_ {
        let thread = self.rows.first().map(|r| r.thread_id.clone());
        let ctx = ctx.clone();
        self.forks.iter().map(move |f| {
            let mut ev = AuditEvent::new(&ctx, Operation::ForkServed)
                .with_checkpoint(f.checkpoint_ns.clone(), f.addressed.clone());
            ev.thread_id = thread.clone();
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
            ev.thread_id.get_or_insert_with(|| row.thread_id.clone());
            ev.checkpoint_ns
                .get_or_insert_with(|| row.checkpoint_ns.clone());
            ev.checkpoint_id
                .get_or_insert_with(|| row.checkpoint_id.clone());
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
