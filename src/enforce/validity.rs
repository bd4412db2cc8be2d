//! The validity gate of one session: a checkpoint write whose payload
//! breaks a channel rule is refused inside the server's transaction, so
//! nothing of it commits.
//!
//! A blob carries only a channel and version, not its checkpoint: its
//! refusal waits for the checkpoint row of the same `put` (which names the
//! checkpoint), or for whatever ends the segment or the transaction first
//! (a Sync, a simple Query, a COMMIT, ROLLBACK or PREPARE TRANSACTION).
//! The blob's own INSERT runs meanwhile, in the transaction the refusal
//! then aborts.

use super::events::rejected;
use crate::audit::{AuditEvent, SessionContext};
use crate::log_text::shown;
use crate::policy::write_check::{check_write, rejection_message, WriteKind};
use crate::policy::{ChannelRules, Violation};
use crate::saver::classify::StatementKind;
use crate::saver::decode_error::DecodeError;
use crate::saver::write_record::WriteRecord;
use crate::wire::tracker::Refusal;

/// SQLSTATE of a refused write: check_violation, what a CHECK constraint
/// on the column would have raised.
pub const CHECK_VIOLATION: &str = "23514";

/// A write the gate refuses, with what the client and the audit get.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub record: WriteRecord,
    pub message: String,
    pub violation: Option<Violation>,
}

impl Rejection {
    /// The refusal the server raises in the write's place (logged at WARN
    /// and counted) and its `write_rejected` audit event.
    pub fn refuse(self, ctx: &SessionContext) -> (Refusal, AuditEvent) {
        tracing::warn!(
            thread = ?self.record.thread_id.as_deref().map(shown),
            checkpoint = ?self.record.checkpoint_id.as_deref().map(shown),
            "{}",
            shown(&self.message)
        );
        let event = rejected(ctx, &self.record, &self.message, self.violation.as_ref());
        metrics::counter!(crate::metrics::WRITES_REJECTED).increment(1);
        let refusal = Refusal {
            sqlstate: CHECK_VIOLATION,
            detail: self.detail(),
            message: self.message,
        };
        (refusal, event)
    }

    /// The refusal of a checkpoint write whose values the proxy cannot
    /// decode, where a leg must read them to guard it; `readable` holds
    /// the columns that do decode, for the audit record.
    pub fn undecodable(readable: WriteRecord, error: &DecodeError) -> Self {
        Rejection {
            record: readable,
            message: format!(
                "resumeguard: checkpoint write rejected: its parameters do not decode: {error}"
            ),
            violation: None,
        }
    }

    /// The error's DETAIL: which rule failed where.
    fn detail(&self) -> String {
        self.violation.as_ref().map_or(String::new(), |v| {
            format!(
                "rule {} failed at {} (value path {})",
                v.rule_name(),
                v.schema_path,
                v.instance_path
            )
        })
    }
}

/// A rejected blob waiting for the row that names its checkpoint.
#[derive(Debug)]
struct DoomedBlob {
    record: WriteRecord,
    violation: Violation,
}

/// The gate's state within one Sync segment.
#[derive(Debug)]
pub struct ValidityGate {
    doomed: Option<DoomedBlob>,
    /// Refusals quote the failing value (`[audit] log_values`); otherwise
    /// they name the failing keyword only, in the client's error, the
    /// server's log and the proxy's.
    show_values: bool,
}

impl ValidityGate {
    pub fn new(show_values: bool) -> Self {
        ValidityGate {
            doomed: None,
            show_values,
        }
    }

    /// Checks one write by its decoded row. `Some` is the refusal the
    /// server raises in its place.
    pub fn check(
        &mut self,
        rules: &ChannelRules,
        kind: &StatementKind,
        record: &WriteRecord,
    ) -> Option<Rejection> {
        if rules.is_empty() {
            return None;
        }
        let kind = match kind {
            StatementKind::BlobUpsert(_) => WriteKind::Blob,
            StatementKind::CheckpointUpsert(_) => WriteKind::Checkpoint,
            StatementKind::WritesUpsert(_) | StatementKind::WritesInsertIgnore(_) => {
                WriteKind::PendingWrite
            }
            _ => return None,
        };
        let record = record.clone();
        let violation = check_write(rules, kind, &record);
        match (kind, violation, self.doomed.take()) {
            (WriteKind::Blob, Some(violation), None) => {
                self.doomed = Some(DoomedBlob { record, violation });
                None
            }
            (WriteKind::Blob, _, doomed) => {
                self.doomed = doomed;
                None
            }
            (_, _, Some(doomed)) => {
                let mut named = doomed.record;
                named.checkpoint_id = record.checkpoint_id.or(named.checkpoint_id);
                named.metadata = record.metadata;
                Some(Rejection {
                    message: rejection_message(
                        WriteKind::Blob,
                        &doomed.violation,
                        &named,
                        self.show_values,
                    ),
                    record: named,
                    violation: Some(doomed.violation),
                })
            }
            (kind, Some(violation), None) => Some(Rejection {
                message: rejection_message(kind, &violation, &record, self.show_values),
                record,
                violation: Some(violation),
            }),
            (_, None, None) => None,
        }
    }

    /// Whether a blob refusal waits for the row naming its checkpoint.
    pub fn waiting(&self) -> bool {
        self.doomed.is_some()
    }

    /// The transaction is rolled back: a blob refusal still waiting goes
    /// with the blob it refuses.
    pub fn rolled_back(&mut self) {
        self.doomed = None;
    }

    /// The segment or the transaction ends (a Sync, a simple Query, a
    /// statement ending the transaction): a blob refusal still waiting for
    /// its checkpoint row is raised before it.
    pub fn at_end(&mut self) -> Option<Rejection> {
        let doomed = self.doomed.take()?;
        Some(Rejection {
            message: rejection_message(
                WriteKind::Blob,
                &doomed.violation,
                &doomed.record,
                self.show_values,
            ),
            record: doomed.record,
            violation: Some(doomed.violation),
        })
    }
}
