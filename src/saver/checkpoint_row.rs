//! One row of the checkpoint SELECT, decoded.
//!
//! Deciding whether a read returns a parked thread (an `__interrupt__` write
//! and no `__resume__`) needs the row's identity and its pending writes; this
//! module turns the raw `DataRow` fields into those typed values. The column
//! positions and the layout of each array row come from the statement's
//! SQL (see `classify`), so they are passed in as a [`RowLayout`] rather
//! than assumed.

use bytes::Bytes;

use super::checkpoint_ref::CheckpointRef;
use super::decode_error::utf8;
use super::decode_error::DecodeError;
use super::int_text::decode_int_text;
use super::layout::{ChannelValuesLayout, PendingWritesLayout};
use super::pg_array::ByteaArray;
use super::value::{decode_value, ColumnKind, Value};

/// Column indexes of the checkpoint SELECT's fields within a row, and the
/// layout of the rows of its two arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    pub thread_id: usize,
    pub checkpoint: usize,
    pub checkpoint_ns: usize,
    /// `None` for the shallow saver's read, which has no such column: the
    /// id is the checkpoint document's `id`.
    pub checkpoint_id: Option<usize>,
    /// `None` for the shallow saver's read (it keeps no parent).
    pub parent_checkpoint_id: Option<usize>,
    pub metadata: usize,
    pub channel_values: usize,
    pub pending_writes: usize,
    pub value_rows: ChannelValuesLayout,
    pub write_rows: PendingWritesLayout,
}

impl RowLayout {
    /// The column order of the saver's `SELECT_SQL`, with Python 3.x rows.
    pub const SAVER_SELECT: RowLayout = RowLayout {
        thread_id: 0,
        checkpoint: 1,
        checkpoint_ns: 2,
        checkpoint_id: Some(3),
        parent_checkpoint_id: Some(4),
        metadata: 5,
        channel_values: 6,
        pending_writes: 7,
        value_rows: ChannelValuesLayout::STANDARD,
        write_rows: PendingWritesLayout::PYTHON_3,
    };
}

/// A decoded checkpoint row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    /// Which checkpoint the row is.
    pub at: CheckpointRef,
    /// The checkpoint as JSON text.
    pub checkpoint: String,
    /// `None` for a thread's first checkpoint.
    pub parent_checkpoint_id: Option<String>,
    /// The metadata as JSON text.
    pub metadata: String,
    pub channel_values: Vec<ChannelBlob>,
    /// In the order the server returned them (unordered).
    pub pending_writes: Vec<PendingWrite>,
}

/// One `channel_values` row: a channel's serialized value at its current version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelBlob {
    pub channel: String,
    pub type_tag: String,
    /// `None` for type `empty`.
    pub blob: Option<Bytes>,
}

/// One `pending_writes` row: a write recorded against the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingWrite {
    pub task_id: String,
    pub channel: String,
    pub type_tag: String,
    pub blob: Option<Bytes>,
    /// Empty when the layout does not carry it (the column's default).
    pub task_path: String,
    /// Position in the task's batch, or the special channel's negative
    /// index; `None` when the layout does not carry it.
    pub idx: Option<i64>,
}

impl CheckpointRow {
    /// Whether any pending write targets `channel` (e.g. `__interrupt__`).
    pub fn has_pending(&self, channel: &str) -> bool {
        self.pending_writes.iter().any(|w| w.channel == channel)
    }
}

/// Decodes one checkpoint row. `formats` are the result-format codes as in
/// `Bind`: empty = all text, one = for every column, else one per column.
pub fn decode_checkpoint_row(
    fields: &[Option<&[u8]>],
    formats: &[i16],
    layout: &RowLayout,
) -> Result<CheckpointRow, DecodeError> {
    if formats.len() > 1 && formats.len() != fields.len() {
        return Err(DecodeError::FormatCount {
            columns: fields.len(),
            formats: formats.len(),
        });
    }
    let col = |name: &'static str, index: usize, kind: ColumnKind| -> Result<Value, DecodeError> {
        let raw = fields.get(index).ok_or(DecodeError::MissingColumn {
            column: name,
            index,
            count: fields.len(),
        })?;
        let format = match formats {
            [] => 0,
            [one] => *one,
            many => many.get(index).copied().unwrap_or(0),
        };
        decode_value(*raw, format, kind).map_err(|e| e.in_field(name))
    };
    let text = |name, index| match col(name, index, ColumnKind::Text)? {
        Value::Null => Err(DecodeError::UnexpectedNull { what: name }),
        v => Ok(into_string(v)),
    };
    let json = |name, index| match col(name, index, ColumnKind::Jsonb)? {
        Value::Null => Err(DecodeError::UnexpectedNull { what: name }),
        v => Ok(into_string(v)),
    };
    let array = |name, index| match col(name, index, ColumnKind::ByteaArray)? {
        Value::Array(a) => Ok::<_, DecodeError>(a),
        _ => Ok(ByteaArray::default()),
    };

    let parent = match layout.parent_checkpoint_id {
        None => None,
        Some(index) => match col("parent_checkpoint_id", index, ColumnKind::Text)? {
            Value::Null => None,
            v => Some(into_string(v)),
        },
    };
    let channel_values = array("channel_values", layout.channel_values)?;
    let pending_writes = array("pending_writes", layout.pending_writes)?;
    let checkpoint = json("checkpoint", layout.checkpoint)?;
    let checkpoint_id = match layout.checkpoint_id {
        Some(index) => text("checkpoint_id", index)?,
        None => document_id(&checkpoint)?,
    };
    Ok(CheckpointRow {
        at: CheckpointRef {
            thread_id: text("thread_id", layout.thread_id)?,
            checkpoint_ns: text("checkpoint_ns", layout.checkpoint_ns)?,
            checkpoint_id,
        },
        checkpoint,
        parent_checkpoint_id: parent,
        metadata: json("metadata", layout.metadata)?,
        channel_values: channel_blobs(&channel_values, &layout.value_rows)
            .map_err(|e| e.in_field("channel_values"))?,
        pending_writes: writes(&pending_writes, &layout.write_rows)
            .map_err(|e| e.in_field("pending_writes"))?,
    })
}

/// The `id` of a checkpoint document (JSON text), where the shallow saver
/// keeps a checkpoint's id.
pub fn document_id(checkpoint: &str) -> Result<String, DecodeError> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_str::<Id>(checkpoint)
        .map(|d| d.id)
        .map_err(|_| DecodeError::UnexpectedNull {
            what: "checkpoint document id",
        })
}

/// The string inside a `Text` or `Json` value (the only kinds asked for).
fn into_string(v: Value) -> String {
    match v {
        Value::Text(s) | Value::Json(s) => s,
        _ => String::new(),
    }
}

/// The rows of a `bytea[]` column laid out `width` wide, each decoded by
/// `decode` from its element getter. The array must be empty or 2-D with
/// rows of `width`; a row shorter than the layout (only a hand-built array
/// whose elements disagree with its dims) is the same shape error.
fn layout_rows<'a, T>(
    a: &'a ByteaArray,
    column: &'static str,
    width: usize,
    decode: impl Fn(&dyn Fn(usize) -> Result<&'a Option<Bytes>, DecodeError>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let shape_error = || DecodeError::RowShape {
        column,
        width,
        dims: a.dims.clone(),
    };
    match a.dims.as_slice() {
        [] => {}
        [_, w] if *w == width => {}
        _ => return Err(shape_error()),
    }
    a.rows()
        .map(|row| decode(&|i| row.get(i).ok_or_else(shape_error)))
        .collect()
}

/// A non-NULL UTF-8 array element.
fn element_text(e: &Option<Bytes>, what: &'static str) -> Result<String, DecodeError> {
    match e {
        Some(b) => utf8(b, what),
        None => Err(DecodeError::UnexpectedNull { what }),
    }
}

/// `channel_values` rows, by their layout.
fn channel_blobs(
    a: &ByteaArray,
    layout: &ChannelValuesLayout,
) -> Result<Vec<ChannelBlob>, DecodeError> {
    layout_rows(a, "channel_values", layout.width, |at| {
        Ok(ChannelBlob {
            channel: element_text(at(layout.channel)?, "channel")?,
            type_tag: element_text(at(layout.type_tag)?, "type")?,
            blob: at(layout.blob)?.clone(),
        })
    })
}

/// `pending_writes` rows, by their layout.
fn writes(a: &ByteaArray, layout: &PendingWritesLayout) -> Result<Vec<PendingWrite>, DecodeError> {
    layout_rows(a, "pending_writes", layout.width, |at| {
        Ok(PendingWrite {
            task_id: element_text(at(layout.task_id)?, "task_id")?,
            channel: element_text(at(layout.channel)?, "channel")?,
            type_tag: element_text(at(layout.type_tag)?, "type")?,
            blob: at(layout.blob)?.clone(),
            task_path: match layout.task_path {
                Some(i) => element_text(at(i)?, "task_path")?,
                None => String::new(),
            },
            idx: match layout.idx {
                Some(i) => match at(i)? {
                    Some(b) => Some(decode_int_text(b).map_err(|e| e.in_field("idx"))?),
                    None => return Err(DecodeError::UnexpectedNull { what: "idx" }),
                },
                None => None,
            },
        })
    })
}

impl PendingWritesLayout {
    /// Re-encodes pending writes as rows of this layout, each element as
    /// the saver's SQL produces it (`idx` as decimal text), so a row
    /// decoded by the layout encodes back to the same bytes. No writes
    /// make the empty array.
    pub fn encode(&self, writes: &[&PendingWrite]) -> ByteaArray {
        if writes.is_empty() {
            return ByteaArray::default();
        }
        let mut elements = Vec::with_capacity(writes.len() * self.width);
        for w in writes {
            let mut row: Vec<Option<Bytes>> = vec![None; self.width];
            let text = |s: &str| Some(Bytes::copy_from_slice(s.as_bytes()));
            let mut put = |i: usize, v: Option<Bytes>| {
                if let Some(slot) = row.get_mut(i) {
                    *slot = v;
                }
            };
            put(self.task_id, text(&w.task_id));
            put(self.channel, text(&w.channel));
            put(self.type_tag, text(&w.type_tag));
            put(self.blob, w.blob.clone());
            if let Some(i) = self.task_path {
                put(i, text(&w.task_path));
            }
            if let Some(i) = self.idx {
                put(i, w.idx.map(|n| Bytes::from(n.to_string())));
            }
            elements.extend(row);
        }
        ByteaArray {
            dims: vec![writes.len(), self.width],
            elements,
        }
    }
}

#[cfg(test)]
mod tests;
