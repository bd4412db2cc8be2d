//! What a committed checkpoint write tells the claims store: an interrupt
//! answered (its claim consumed), a run making progress, a thread moved on
//! or deleted.

use super::watch::Watch;
use crate::claims::evidence::Evidence;
use crate::saver::classify::StatementKind;
use crate::saver::profile::TableRole;
use crate::saver::reserved::{ERROR, INTERRUPT, NULL_TASK, RESUME, SCHEDULED};
use crate::saver::write_record::WriteRecord;

impl Watch {
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
                    INTERRUPT | ERROR | SCHEDULED => Vec::new(),
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
}
