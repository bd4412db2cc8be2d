//! What a checkpoint write tells the claims store: an interrupt answered
//! (its claim consumed), a run making progress, a thread moved on or
//! deleted. The same recognition says which checkpoint a write continues,
//! for the fencing of writes from sessions other than its holder.

use std::time::Instant;

use super::watch::Watch;
use crate::claims::evidence::Evidence;
use crate::claims::WrittenAt;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::classify::{RowsDeleted, StatementKind};
use crate::saver::decode_error::DecodeError;
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
    fn evidence(self, written_at: WrittenAt) -> Evidence {
        let Continuation { at, step } = self;
        match step {
            Step::Progress => Evidence::Progress { at, written_at },
            Step::TaskWrote(what) => Evidence::Consumed {
                at,
                what,
                written_at,
            },
            Step::Child => Evidence::MovedOn { parent: at },
        }
    }
}

impl Watch {
    /// What a completed write means for consume-once claims.
    pub fn evidence(&self) -> Vec<Evidence> {
        match &self.class.kind {
            StatementKind::DeleteThread {
                table: TableRole::Checkpoints,
                thread_param,
            } => {
                return thread_param
                    .and_then(|index| self.evidence_param(index, THREAD_NOT_FORGOTTEN))
                    .map(|thread_id| vec![Evidence::ThreadDeleted { thread_id }])
                    .unwrap_or_default();
            }
            StatementKind::DeleteRows {
                table: TableRole::Checkpoints,
                rows: RowsDeleted::Threads { threads_param },
            } => return self.threads_deleted(*threads_param),
            StatementKind::DeleteRows {
                table: TableRole::Writes,
                rows:
                    RowsDeleted::AllBut {
                        thread_param,
                        ns_param,
                        kept_params,
                    },
            } => {
                return self
                    .shallow_put_moved_on([*thread_param, *ns_param], kept_params)
                    .into_iter()
                    .collect()
            }
            _ => {}
        }
        match &self.record {
            Some(Ok(rec)) => continuation(&self.class.kind, rec)
                .map(|c| c.evidence(WrittenAt::Sent(self.sent_at.unwrap_or_else(Instant::now))))
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Watch {
    /// prune's `DELETE FROM checkpoints WHERE thread_id = ANY($n)`: every
    /// listed thread is gone, so are its claims. A list that does not
    /// decode leaves those claims to lapse: said at ERROR.
    fn threads_deleted(&self, threads_param: usize) -> Vec<Evidence> {
        match self.param_texts(threads_param) {
            Ok(threads) => threads
                .into_iter()
                .flatten()
                .map(|thread_id| Evidence::ThreadDeleted { thread_id })
                .collect(),
            Err(error) => {
                not_decoded(&error, THREAD_NOT_FORGOTTEN);
                Vec::new()
            }
        }
    }

    /// The shallow saver's `put` deletes the writes of every checkpoint of
    /// the namespace but the new one (its `$3`) and the one it continues
    /// (its `$4`, empty on a thread's first put): that continued checkpoint
    /// is moved on, as a new checkpoint naming it as its parent moves it
    /// on for the other savers. Only that two-id form keeps a continued
    /// checkpoint; prune's `<> ALL($3)` keeps heads, which it continues
    /// nothing from.
    fn shallow_put_moved_on(
        &self,
        [thread_param, ns_param]: [usize; 2],
        kept_params: &[usize],
    ) -> Option<Evidence> {
        let [new, continued] = kept_params else {
            return None;
        };
        let param = |index| self.evidence_param(index, NOT_MOVED_ON);
        let thread_id = param(thread_param)?;
        let checkpoint_ns = param(ns_param)?;
        let continued = param(*continued)?;
        if continued.is_empty() || param(*new).as_ref() == Some(&continued) {
            return None;
        }
        Some(Evidence::MovedOn {
            parent: CheckpointRef {
                thread_id,
                checkpoint_ns,
                checkpoint_id: continued,
            },
        })
    }

    /// Text parameter `index` of a statement whose claim evidence it
    /// names; `None` for NULL. One that does not decode is said at ERROR
    /// with what the claims miss (`consequence`).
    fn evidence_param(&self, index: usize, consequence: &str) -> Option<String> {
        match self.param_decoded(index) {
            Ok(text) => text,
            Err(error) => {
                not_decoded(&error, consequence);
                None
            }
        }
    }
}

/// What the claims miss when a deletion's thread ids do not decode.
const THREAD_NOT_FORGOTTEN: &str =
    "the deleted threads' claims are not forgotten (they lapse or stay consumed)";
/// What the claims miss when the shallow put's ids do not decode.
const NOT_MOVED_ON: &str =
    "the checkpoint the shallow put continues is not moved on (its claim lapses)";

/// A claim evidence parameter that does not decode: the guard goes on
/// without that evidence, and says so.
fn not_decoded(error: &DecodeError, consequence: &str) {
    tracing::error!(%error, "claim evidence parameter does not decode: {consequence}");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::saver::bind::tests::bind_frame;
    use crate::saver::bind::tests::decode;
    use crate::saver::classify::tests::housekeeping_sql::{
        PRUNE_DELETE_THREADS, SHALLOW_DELETE_WRITES,
    };
    use crate::saver::classify::Classifier;
    use crate::saver::profile::SaverProfile;

    /// A completed statement of `sql` with these text parameters.
    fn watch(sql: &str, params: &[Option<&str>]) -> Watch {
        let params: Vec<Option<&[u8]>> = params.iter().map(|p| p.map(str::as_bytes)).collect();
        watch_of_bytes(sql, &params)
    }

    /// A completed statement of `sql` with these parameters, in the text
    /// format whether or not they are UTF-8.
    fn watch_of_bytes(sql: &str, params: &[Option<&[u8]>]) -> Watch {
        let classifier = Classifier::new(vec![SaverProfile::langgraph_python()]);
        let frame = bind_frame("", &[], params, &[]);
        let bound = decode(&frame).expect("a Bind psycopg sends");
        Watch::new(classifier.classify(sql), Some(Arc::new(bound)), false)
    }

    fn deleted(thread_id: &str) -> Evidence {
        Evidence::ThreadDeleted {
            thread_id: thread_id.into(),
        }
    }

    #[test]
    fn prunes_delete_of_several_threads_forgets_each_ones_claims() {
        let [checkpoints, blobs, writes] = PRUNE_DELETE_THREADS;
        let w = watch(checkpoints, &[Some(r#"{t1,"t 2",NULL}"#)]);
        assert_eq!(w.evidence(), vec![deleted("t1"), deleted("t 2")]);
        // Its blob and write deletes say nothing more.
        for sql in [blobs, writes] {
            assert_eq!(watch(sql, &[Some("{t1}")]).evidence(), vec![]);
        }
        // A list that does not decode forgets nothing (and says so).
        assert_eq!(watch(checkpoints, &[Some("{t1")]).evidence(), vec![]);
        assert_eq!(watch(checkpoints, &[None]).evidence(), vec![]);
    }

    #[test]
    fn a_deletion_or_shallow_put_whose_ids_do_not_decode_says_so_at_error() {
        let not_utf8: &[u8] = b"t\xff";
        let deletion = watch_of_bytes(
            "DELETE FROM checkpoints WHERE thread_id = $1",
            &[Some(not_utf8)],
        );
        let put = watch_of_bytes(
            SHALLOW_DELETE_WRITES,
            &[Some(not_utf8), Some(b"ns"), Some(b"new"), Some(b"parked")],
        );
        for (w, consequence) in [(deletion, THREAD_NOT_FORGOTTEN), (put, NOT_MOVED_ON)] {
            let (evidence, log) = crate::test_log::captured(|| w.evidence());
            assert_eq!(evidence, vec![]);
            assert!(
                log.lines()
                    .any(|l| l.contains("ERROR") && l.contains(consequence)),
                "{log}"
            );
        }
    }

    #[test]
    fn the_shallow_puts_delete_moves_the_checkpoint_it_continues_on() {
        let w = watch(
            SHALLOW_DELETE_WRITES,
            &[Some("t"), Some("ns"), Some("new"), Some("parked")],
        );
        assert_eq!(
            w.evidence(),
            vec![Evidence::MovedOn {
                parent: CheckpointRef {
                    thread_id: "t".into(),
                    checkpoint_ns: "ns".into(),
                    checkpoint_id: "parked".into(),
                }
            }]
        );
        // A thread's first put continues nothing.
        let first = watch(
            SHALLOW_DELETE_WRITES,
            &[Some("t"), Some(""), Some("new"), Some("")],
        );
        assert_eq!(first.evidence(), vec![]);
    }
}
