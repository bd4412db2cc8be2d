//! What the enforcer watches in the answer to one checkpoint statement:
//! the rows of a read (decoded, fork-filtered, checked for a parked or
//! running head) and the parameters of a write.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::fence_check::FenceCheck;
use super::parked_heads::Interrupt;
use crate::claims::{interrupt_fingerprint, ClaimKey};
use crate::policy::fork::{fork_filter, ForkVerdict};
use crate::saver::bind::BoundParams;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::checkpoint_row::PendingWrite;
use crate::saver::checkpoint_row::{decode_checkpoint_row, CheckpointRow, RowLayout};
use crate::saver::classify::{Classified, ReadMode, StatementKind};
use crate::saver::decode_error::DecodeError;
use crate::saver::pending_tasks::has_pending_tasks;
use crate::saver::reserved::INTERRUPT;
use crate::saver::value::{ColumnKind, Value};
use crate::saver::write_record::WriteRecord;
use crate::wire::client_text;
use crate::wire::messages::data_row::{data_row, split_data_row};

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
    /// When the statement passed the proxy (monotonic), for claim
    /// evidence; only set for writes while consume-once is on.
    pub sent_at: Option<Instant>,
    /// When the client's Execute (or simple Query) passed the proxy; unset
    /// for Describe watches. Timed for the latency metrics.
    pub executed_at: Option<Instant>,
    pub rows: Vec<CheckpointRow>,
    pub row_errors: usize,
    /// Why the last row did not decode, if it did not.
    pub(super) undecodable: Option<String>,
    pub(super) forks: Vec<ForkServed>,
    /// The answer is the proxy's own fence check ahead of this write.
    pub fence: Option<FenceCheck>,
    /// For a read of a head expected parked: its claim, asked beside it.
    pub ahead: Option<super::claim_ahead::AheadClaim>,
    /// A blob write the server answered `INSERT 0 0`: a blob with its key
    /// was there already, and is what the checkpoint naming it reads.
    pub blob_kept: bool,
}

/// A write's row as decoded from its Bind, shared by the validity gate,
/// the audit record and the claim evidence.
pub type WriteDecode = Result<Arc<WriteRecord>, DecodeError>;

/// A read that addressed a superseded checkpoint, as served.
#[derive(Debug)]
pub(super) struct ForkServed {
    pub addressed: CheckpointRef,
    pub head: Option<String>,
    pub hidden: Vec<(String, String)>,
}

impl Watch {
    pub fn new(class: Arc<Classified>, bound: Option<Arc<BoundParams>>, head_column: bool) -> Self {
        Watch {
            class,
            bound,
            record: None,
            head_column,
            inspect: false,
            sent_at: None,
            executed_at: None,
            rows: Vec::new(),
            row_errors: 0,
            undecodable: None,
            forks: Vec::new(),
            fence: None,
            ahead: None,
            blob_kept: false,
        }
    }

    /// For a completed `__interrupt__` write: the checkpoint it parks and
    /// the interrupt (its task and value).
    pub fn interrupt_written(&self) -> Option<(CheckpointRef, Interrupt)> {
        if !self.class.kind.is_pending_write() {
            return None;
        }
        let Some(Ok(rec)) = &self.record else {
            return None;
        };
        let at = parked_on(rec)?;
        Some((at, (rec.task_id.clone()?, rec.blob.clone())))
    }

    /// The checkpoint a completed put created.
    pub fn created_checkpoint(&self) -> Option<CheckpointRef> {
        if !matches!(self.class.kind, StatementKind::CheckpointUpsert(_)) {
            return None;
        }
        let Some(Ok(rec)) = &self.record else {
            return None;
        };
        Some(CheckpointRef {
            thread_id: rec.thread_id.clone()?,
            checkpoint_ns: rec.checkpoint_ns.clone()?,
            checkpoint_id: rec.checkpoint_id.clone()?,
        })
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
                let e = DecodeError::from(e);
                self.row_errors += 1;
                self.class.report_undecodable_row(&e);
                self.undecodable = Some(e.to_string());
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
                self.undecodable = Some(e.to_string());
                return head.map(|_| data_row(fields));
            }
        };
        self.undecodable = None;
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
        match fork_filter(&row.at.checkpoint_id, head.as_deref(), &row.pending_writes) {
            ForkVerdict::Untouched => data_row(fields),
            ForkVerdict::Fork { hide } => {
                let kept: Vec<&PendingWrite> = row
                    .pending_writes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !hide.contains(i))
                    .map(|(_, w)| w)
                    .collect();
                self.forks.push(ForkServed {
                    addressed: row.at.clone(),
                    head,
                    hidden: hide
                        .iter()
                        .filter_map(|i| row.pending_writes.get(*i))
                        .map(|w| (w.task_id.clone(), w.channel.clone()))
                        .collect(),
                });
                if hide.is_empty() {
                    return data_row(fields);
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
                data_row(&out)
            }
        }
    }

    /// A read of a namespace's head that the consume-once gate looks at:
    /// not an inspection.
    pub fn is_gated(&self) -> bool {
        matches!(&self.class.kind, StatementKind::Read(shape) if shape.mode == ReadMode::Latest)
            && !self.inspect
    }

    /// The row of a read the consume-once gate looks at: the last one.
    fn gated_head(&self) -> Option<&CheckpointRow> {
        self.is_gated().then(|| self.rows.last()).flatten()
    }

    /// For a read of a namespace's head that the consume-once gate looks
    /// at, whose row did not decode: the key it is refused under (the
    /// thread and namespace as the client sent them, no checkpoint or
    /// interrupt) and why.
    pub fn undecodable_head(&self) -> Option<(ClaimKey, &str)> {
        let why = self.undecodable.as_deref()?;
        if !self.is_gated() {
            return None;
        }
        let key = ClaimKey {
            at: self.addressed()?,
            fingerprint: String::new(),
        };
        Some((key, why))
    }

    /// For a read by id rewritten for the fork policy, whose row did not
    /// decode: the checkpoint it addresses and why. What the policy hides
    /// from a fork cannot be found in such a row.
    pub fn undecodable_fork(&self) -> Option<(CheckpointRef, &str)> {
        let why = self.undecodable.as_deref()?;
        if !self.head_column {
            return None;
        }
        Some((self.addressed()?, why))
    }

    /// The checkpoint a read addresses, from its parameters as the client
    /// sent them (each byte outside UTF-8 a character of its own; the id
    /// empty where the read names none).
    fn addressed(&self) -> Option<CheckpointRef> {
        let StatementKind::Read(shape) = &self.class.kind else {
            return None;
        };
        let bound = self.bound.as_ref()?;
        let text = |param: Option<usize>| {
            param
                .and_then(|i| bound.params.get(i))
                .and_then(Option::as_ref)
                .map(|raw| client_text::decode(raw).into_owned())
                .unwrap_or_default()
        };
        Some(CheckpointRef {
            thread_id: text(shape.thread_param),
            checkpoint_ns: text(shape.ns_param),
            checkpoint_id: text(shape.id_param),
        })
    }

    /// For a read of a namespace's head whose last row is parked (carries
    /// an `__interrupt__` write): the claim key of that interrupt.
    pub fn parked_claim_key(&self) -> Option<ClaimKey> {
        parked_key(self.gated_head()?)
    }

    /// The thread and namespace a read of a namespace's head addresses,
    /// from its parameters.
    pub fn head_address(&self) -> Option<(String, String)> {
        let StatementKind::Read(shape) = &self.class.kind else {
            return None;
        };
        if shape.mode != ReadMode::Latest {
            return None;
        }
        let bound = self.bound.as_ref()?;
        let text = |param: Option<usize>| -> Option<String> {
            let value = bound.value(param?, ColumnKind::Text).ok()?;
            value.as_str().map(str::to_owned)
        };
        Some((text(shape.thread_param)?, text(shape.ns_param)?))
    }

    /// For a completed read of a namespace's head, inspection or not: its
    /// thread and namespace, and the head's claim key if it is parked
    /// (`None` if it is not or there was none; `None` altogether for any
    /// other statement).
    pub fn head_seen(&self) -> Option<(String, String, Option<ClaimKey>)> {
        let (thread, ns) = self.head_address()?;
        Some((thread, ns, self.rows.last().and_then(parked_key)))
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
            at: row.at.clone(),
            fingerprint: String::new(),
        })
    }

    /// For a read of a namespace's head that is finished (not parked, no
    /// tasks left to run): that row, for the late duplicate check.
    pub fn finished_head(&self) -> Option<&CheckpointRow> {
        let row = self.gated_head()?;
        if row.has_pending(INTERRUPT) || has_pending_tasks(&row.checkpoint) != Some(false) {
            return None;
        }
        Some(row)
    }

    pub(super) fn param_text(&self, index: Option<usize>) -> Option<String> {
        self.param_decoded(index?).ok().flatten()
    }

    /// A text parameter (NULL as `None`), or why it does not decode.
    pub(super) fn param_decoded(&self, index: usize) -> Result<Option<String>, DecodeError> {
        Ok(self
            .param_value(index, ColumnKind::Text)?
            .as_str()
            .map(str::to_owned))
    }

    /// A `text[]` parameter's elements (NULL elements as `None`).
    pub(super) fn param_texts(&self, index: usize) -> Result<Vec<Option<String>>, DecodeError> {
        match self.param_value(index, ColumnKind::TextArray)? {
            Value::Texts(texts) => Ok(texts),
            _ => Ok(Vec::new()),
        }
    }

    /// Parameter `index` decoded as `kind`.
    fn param_value(&self, index: usize, kind: ColumnKind) -> Result<Value, DecodeError> {
        let bound = self.bound.as_ref().ok_or(DecodeError::MissingColumn {
            column: "bind parameter",
            index,
            count: 0,
        })?;
        bound.value(index, kind)
    }
}

/// The checkpoint a pending write parks on (an `__interrupt__` write).
pub(super) fn parked_on(rec: &WriteRecord) -> Option<CheckpointRef> {
    (rec.channel.as_deref() == Some(INTERRUPT)).then_some(())?;
    Some(CheckpointRef {
        thread_id: rec.thread_id.clone()?,
        checkpoint_ns: rec.checkpoint_ns.clone()?,
        checkpoint_id: rec.checkpoint_id.clone()?,
    })
}

/// The claim key of a head row parked on its `__interrupt__` writes.
fn parked_key(row: &CheckpointRow) -> Option<ClaimKey> {
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
        at: row.at.clone(),
        fingerprint: interrupt_fingerprint(&interrupts),
    })
}
