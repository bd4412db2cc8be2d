//! What a checkpoint write tells the claims store: an interrupt answered
//! (its claim consumed), a run making progress, a thread moved on or
//! deleted. The same recognition says which checkpoint a write continues,
//! for the fencing of writes from sessions other than its holder.

use super::watch::Watch;
use crate::claims::evidence::Evidence;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::StatementKind;
use crate::saver::profile::TableRole;
use crate::saver::reserved::{ERROR, INTERRUPT, NULL_TASK, RESUME, SCHEDULED};
use crate::saver::write_record::WriteRecord;

/// A write that continues a checkpoint: a run answering or going on from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// The checkpoint continued (for a new checkpoint: its parent).
    pub at: CheckpointRef,
    pub step: Step,
}

/// How a write continues its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A run-level `__resume__` write: a resume is running.
    Progress,
    /// A task's pending write (its results): the interrupt is answered.
    TaskWrote(String),
    /// A new checkpoint whose parent it is.
    Child,
}

/// The checkpoint a decoded write of `kind` continues, if it continues
/// one. Parking (`__interrupt__`), failing (`__error__`) and scheduling
/// writes do not: they are no answer.
pub fn continuation(kind: &StatementKind, rec: &WriteRecord) -> Option<Continuation> {
    let (thread_id, checkpoint_ns) = (rec.thread_id.clone()?, rec.checkpoint_ns.clone()?);
    let at = |checkpoint_id| CheckpointRef {
        thread_id,
        checkpoint_ns,
        checkpoint_id,
    };
    match kind {
        StatementKind::WritesUpsert(_) | StatementKind::WritesInsertIgnore(_) => {
            let checkpoint_id = rec.checkpoint_id.clone()?;
            let channel = rec.channel.as_deref()?;
            let task = rec.task_id.as_deref().unwrap_or_default();
            let step = match channel {
                RESUME if task == NULL_TASK => Step::Progress,
                INTERRUPT | ERROR | SCHEDULED => return None,
                _ => Step::TaskWrote(format!("task {task} wrote {channel}")),
            };
            Some(Continuation {
                at: at(checkpoint_id),
                step,
            })
        }
        StatementKind::CheckpointUpsert(_) => Some(Continuation {
            at: at(rec.parent_checkpoint_id.clone()?),
            step: Step::Child,
        }),
        _ => None,
    }
}

impl Continuation {
    /// The claim evidence of this write, once it committed.
    fn evidence(self, written_at_ms: i64) -> Evidence {
        let Continuation { at, step } = self;
        match step {
            Step::Progress => Evidence::Progress { at, written_at_ms },
            Step::TaskWrote(what) => Evidence::Consumed {
                at,
                what,
                written_at_ms,
            },
            Step::Child => Evidence::MovedOn { parent: at },
        }
    }
}

impl Watch {
    /// What a completed write means for consume-once claims.
    pub fn evidence(&self) -> Vec<Evidence> {
        if let StatementKind::DeleteThread {
            table: TableRole::Checkpoints,
            thread_param,
        } = &self.class.kind
        {
            return self
                .param_text(*thread_param)
                .map(|thread_id| vec![Evidence::ThreadDeleted { thread_id }])
                .unwrap_or_default();
        }
        match &self.record {
            Some(Ok(rec)) => continuation(&self.class.kind, rec)
                .map(|c| c.evidence(self.sent_at_ms))
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }
}
