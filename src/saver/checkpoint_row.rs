//! One row of the checkpoint SELECT, decoded.
//!
//! Deciding whether a read returns a parked thread (an `__interrupt__` write
//! and no `__resume__`) needs the row's identity and its pending writes; this
//! module turns the raw `DataRow` fields into those typed values. The column
//! positions come from the statement's `RowDescription`, so they are passed
//! in as a [`RowLayout`] rather than assumed.

use bytes::Bytes;

use super::decode_error::DecodeError;
use super::pg_array::ByteaArray;
use super::value::{decode_int_text, decode_value, utf8, ColumnKind, Value};

/// Column indexes of the checkpoint SELECT's fields within a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    pub thread_id: usize,
    pub checkpoint: usize,
    pub checkpoint_ns: usize,
    pub checkpoint_id: usize,
    pub parent_checkpoint_id: usize,
    pub metadata: usize,
    pub channel_values: usize,
    pub pending_writes: usize,
}

impl RowLayout {
    /// The column order of the saver's `SELECT_SQL`.
    pub const SAVER_SELECT: RowLayout = RowLayout {
        thread_id: 0,
        checkpoint: 1,
        checkpoint_ns: 2,
        checkpoint_id: 3,
        parent_checkpoint_id: 4,
        metadata: 5,
        channel_values: 6,
        pending_writes: 7,
    };
}

/// A decoded checkpoint row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    pub thread_id: String,
    /// The checkpoint as JSON text.
    pub checkpoint: String,
    pub checkpoint_ns: String,
    pub checkpoint_id: String,
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
    pub task_path: String,
    /// Position in the task's batch, or the special channel's negative index.
    pub idx: i64,
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
        Value::Array(a) => Ok(a),
        _ => Ok(ByteaArray::default()),
    };

    let parent = match col(
        "parent_checkpoint_id",
        layout.parent_checkpoint_id,
        ColumnKind::Text,
    )? {
        Value::Null => None,
        v => Some(into_string(v)),
    };
    let channel_values = array("channel_values", layout.channel_values)?;
    let pending_writes = array("pending_writes", layout.pending_writes)?;
    Ok(CheckpointRow {
        thread_id: text("thread_id", layout.thread_id)?,
        checkpoint: json("checkpoint", layout.checkpoint)?,
        checkpoint_ns: text("checkpoint_ns", layout.checkpoint_ns)?,
        checkpoint_id: text("checkpoint_id", layout.checkpoint_id)?,
        parent_checkpoint_id: parent,
        metadata: json("metadata", layout.metadata)?,
        channel_values: channel_blobs(&channel_values).map_err(|e| e.in_field("channel_values"))?,
        pending_writes: writes(&pending_writes).map_err(|e| e.in_field("pending_writes"))?,
    })
}

/// The string inside a `Text` or `Json` value (the only kinds asked for).
fn into_string(v: Value) -> String {
    match v {
        Value::Text(s) | Value::Json(s) => s,
        _ => String::new(),
    }
}

/// Checks the array is empty or 2-D with rows of `width`.
fn check_shape(a: &ByteaArray, column: &'static str, width: usize) -> Result<(), DecodeError> {
    match a.dims.as_slice() {
        [] => Ok(()),
        [_, w] if *w == width => Ok(()),
        _ => Err(DecodeError::RowShape {
            column,
            width,
            dims: a.dims.clone(),
        }),
    }
}

/// A non-NULL UTF-8 array element.
fn element_text(e: &Option<Bytes>, what: &'static str) -> Result<String, DecodeError> {
    match e {
        Some(b) => utf8(b, what),
        None => Err(DecodeError::UnexpectedNull { what }),
    }
}

/// `channel_values` rows: `[channel, type, blob]`.
fn channel_blobs(a: &ByteaArray) -> Result<Vec<ChannelBlob>, DecodeError> {
    check_shape(a, "channel_values", 3)?;
    a.rows()
        .map(|row| match row {
            [channel, type_tag, blob] => Ok(ChannelBlob {
                channel: element_text(channel, "channel")?,
                type_tag: element_text(type_tag, "type")?,
                blob: blob.clone(),
            }),
            _ => Err(shape_error(a, "channel_values", 3)),
        })
        .collect()
}

/// `pending_writes` rows: `[task_id, channel, type, blob, task_path, idx]`.
fn writes(a: &ByteaArray) -> Result<Vec<PendingWrite>, DecodeError> {
    check_shape(a, "pending_writes", 6)?;
    a.rows()
        .map(|row| match row {
            [task_id, channel, type_tag, blob, task_path, idx] => Ok(PendingWrite {
                task_id: element_text(task_id, "task_id")?,
                channel: element_text(channel, "channel")?,
                type_tag: element_text(type_tag, "type")?,
                blob: blob.clone(),
                task_path: element_text(task_path, "task_path")?,
                idx: match idx {
                    Some(b) => decode_int_text(b).map_err(|e| e.in_field("idx"))?,
                    None => return Err(DecodeError::UnexpectedNull { what: "idx" }),
                },
            }),
            _ => Err(shape_error(a, "pending_writes", 6)),
        })
        .collect()
}

/// The error for a row that is not `width` wide (only reachable for a
/// hand-built array whose elements disagree with its dims).
fn shape_error(a: &ByteaArray, column: &'static str, width: usize) -> DecodeError {
    DecodeError::RowShape {
        column,
        width,
        dims: a.dims.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::data_row::split_data_row;
    use super::*;

    /// Builds a binary `bytea[]` with lower bounds 1.
    fn array(dims: &[i32], elements: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(dims.len() as i32).to_be_bytes());
        out.extend_from_slice(&(elements.iter().any(Option::is_none) as i32).to_be_bytes());
        out.extend_from_slice(&17u32.to_be_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
        }
        for e in elements {
            match e {
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(b) => {
                    out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    out.extend_from_slice(b);
                }
            }
        }
        out
    }

    /// Builds a DataRow body.
    fn data_row(fields: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = (fields.len() as i16).to_be_bytes().to_vec();
        for f in fields {
            match f {
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(b) => {
                    out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    out.extend_from_slice(b);
                }
            }
        }
        out
    }

    /// The documented `channel_values` bytes (langgraph-wire.md section 4).
    fn channel_values() -> Vec<u8> {
        let mut v = hex::decode(
            "00000002000000000000001100000001000000010000000300000001\
             00000005",
        )
        .unwrap();
        v.extend_from_slice(b"items");
        v.extend_from_slice(&7i32.to_be_bytes());
        v.extend_from_slice(b"msgpack");
        v.extend_from_slice(&hex::decode("0000000691a470726570").unwrap());
        v
    }

    /// A parked checkpoint's pending writes: `__interrupt__` from the gate
    /// and a bare-form `__resume__` with a NULL blob.
    fn pending_writes() -> Vec<u8> {
        array(
            &[2, 6],
            &[
                Some(b"task-gate"),
                Some(b"__interrupt__"),
                Some(b"msgpack"),
                Some(b"\x91\xc7\x00"),
                Some(b"~__pregel_pull, gate"),
                Some(b"-3"),
                Some(b"00000000-0000-0000-0000-000000000000"),
                Some(b"__resume__"),
                Some(b"null"),
                None,
                Some(b""),
                Some(b"-4"),
            ],
        )
    }

    fn binary_row() -> Vec<u8> {
        let cv = channel_values();
        let pw = pending_writes();
        data_row(&[
            Some(b"thread-1"),
            Some(b"\x01{\"v\": 4}"),
            Some(b""),
            Some(b"1f0-cp2"),
            Some(b"1f0-cp1"),
            Some(b"\x01{\"step\": 1}"),
            Some(&cv),
            Some(&pw),
        ])
    }

    fn decode_binary_body(body: &[u8]) -> Result<CheckpointRow, DecodeError> {
        let fields = split_data_row(body)?;
        decode_checkpoint_row(&fields, &[1], &RowLayout::SAVER_SELECT)
    }

    fn expected() -> CheckpointRow {
        CheckpointRow {
            thread_id: "thread-1".into(),
            checkpoint: "{\"v\": 4}".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "1f0-cp2".into(),
            parent_checkpoint_id: Some("1f0-cp1".into()),
            metadata: "{\"step\": 1}".into(),
            channel_values: vec![ChannelBlob {
                channel: "items".into(),
                type_tag: "msgpack".into(),
                blob: Some(Bytes::from_static(b"\x91\xa4prep")),
            }],
            pending_writes: vec![
                PendingWrite {
                    task_id: "task-gate".into(),
                    channel: "__interrupt__".into(),
                    type_tag: "msgpack".into(),
                    blob: Some(Bytes::from_static(b"\x91\xc7\x00")),
                    task_path: "~__pregel_pull, gate".into(),
                    idx: -3,
                },
                PendingWrite {
                    task_id: "00000000-0000-0000-0000-000000000000".into(),
                    channel: "__resume__".into(),
                    type_tag: "null".into(),
                    blob: None,
                    task_path: String::new(),
                    idx: -4,
                },
            ],
        }
    }

    #[test]
    fn decodes_a_binary_row() {
        let row = decode_binary_body(&binary_row()).unwrap();
        assert_eq!(row, expected());
        assert!(row.has_pending("__interrupt__"));
        assert!(row.has_pending("__resume__"));
        assert!(!row.has_pending("__error__"));
    }

    #[test]
    fn decodes_the_same_row_in_text_format() {
        let fields: [Option<&[u8]>; 8] = [
            Some(b"thread-1"),
            Some(b"{\"v\": 4}"),
            Some(b""),
            Some(b"1f0-cp2"),
            Some(b"1f0-cp1"),
            Some(b"{\"step\": 1}"),
            Some(br#"{{"\\x6974656d73","\\x6d73677061636b","\\x91a470726570"}}"#),
            Some(
                br#"{{"\\x7461736b2d67617465","\\x5f5f696e746572727570745f5f","\\x6d73677061636b","\\x91c700","\\x7e5f5f70726567656c5f70756c6c2c2067617465","\\x2d33"},{"\\x30303030303030302d303030302d303030302d303030302d303030303030303030303030","\\x5f5f726573756d655f5f","\\x6e756c6c",NULL,"\\x","\\x2d34"}}"#,
            ),
        ];
        let row = decode_checkpoint_row(&fields, &[], &RowLayout::SAVER_SELECT).unwrap();
        assert_eq!(row, expected());
        // An explicit all-zero list means the same.
        let row = decode_checkpoint_row(&fields, &[0; 8], &RowLayout::SAVER_SELECT).unwrap();
        assert_eq!(row, expected());
    }

    #[test]
    fn per_column_formats_and_custom_layout() {
        let cv = channel_values();
        // Columns reordered, mixed formats: text-format JSON, binary arrays.
        let fields: [Option<&[u8]>; 8] = [
            Some(&cv),
            None,
            Some(b"{\"step\": 1}"),
            Some(b"{\"v\": 4}"),
            Some(b"thread-1"),
            Some(b"sub"),
            Some(b"1f0-cp1"),
            None,
        ];
        let layout = RowLayout {
            thread_id: 4,
            checkpoint: 3,
            checkpoint_ns: 5,
            checkpoint_id: 6,
            parent_checkpoint_id: 7,
            metadata: 2,
            channel_values: 0,
            pending_writes: 1,
        };
        let row = decode_checkpoint_row(&fields, &[1, 1, 0, 0, 1, 1, 0, 1], &layout).unwrap();
        assert_eq!(row.thread_id, "thread-1");
        assert_eq!(row.checkpoint_ns, "sub");
        assert_eq!(row.checkpoint, "{\"v\": 4}");
        assert_eq!(row.parent_checkpoint_id, None);
        assert_eq!(row.channel_values.len(), 1);
        assert!(row.pending_writes.is_empty());
        assert!(!row.has_pending("__interrupt__"));
    }

    #[test]
    fn null_and_empty_arrays_are_empty_vecs() {
        let empty = array(&[], &[]);
        let body = data_row(&[
            Some(b"t"),
            Some(b"\x01{}"),
            Some(b""),
            Some(b"c"),
            None,
            Some(b"\x01{}"),
            None,
            Some(&empty),
        ]);
        let row = decode_binary_body(&body).unwrap();
        assert!(row.channel_values.is_empty());
        assert!(row.pending_writes.is_empty());
        assert_eq!(row.parent_checkpoint_id, None);
    }

    /// The binary row with field `i` replaced.
    fn with_field(i: usize, value: Option<&[u8]>) -> Vec<u8> {
        let body = binary_row();
        let mut fields = split_data_row(&body).unwrap();
        fields[i] = value;
        data_row(&fields)
    }

    #[test]
    fn rejects_null_in_required_columns() {
        for (i, name) in [
            (0, "thread_id"),
            (1, "checkpoint"),
            (3, "checkpoint_id"),
            (5, "metadata"),
        ] {
            let err = decode_binary_body(&with_field(i, None)).unwrap_err();
            assert!(
                matches!(err, DecodeError::UnexpectedNull { what } if what == name),
                "{name}: {err}"
            );
        }
    }

    #[test]
    fn errors_name_the_field() {
        let err = decode_binary_body(&with_field(1, Some(b"\x02{}"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "checkpoint: jsonb: unsupported binary version 2 (expected 1)"
        );

        let bad_idx = array(
            &[1, 6],
            &[
                Some(b"t"),
                Some(b"c"),
                Some(b"msgpack"),
                None,
                Some(b""),
                Some(b"x"),
            ],
        );
        let err = decode_binary_body(&with_field(7, Some(&bad_idx))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pending_writes: idx: integer: "),
            "{err}"
        );

        let null_channel = array(&[1, 3], &[None, Some(b"msgpack"), None]);
        let err = decode_binary_body(&with_field(6, Some(&null_channel))).unwrap_err();
        assert_eq!(err.to_string(), "channel_values: channel: unexpected NULL");
    }

    #[test]
    fn rejects_wrong_row_width() {
        let narrow = array(&[1, 2], &[Some(b"items"), Some(b"msgpack")]);
        let err = decode_binary_body(&with_field(6, Some(&narrow))).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Field { field: "channel_values", ref source }
                    if matches!(**source, DecodeError::RowShape { width: 3, .. })
            ),
            "{err}"
        );
        let flat = array(
            &[6],
            &[
                Some(b"a"),
                Some(b"b"),
                Some(b"c"),
                None,
                Some(b""),
                Some(b"1"),
            ],
        );
        assert!(decode_binary_body(&with_field(7, Some(&flat))).is_err());
    }

    #[test]
    fn rejects_bad_format_lists_and_missing_columns() {
        let body = binary_row();
        let fields = split_data_row(&body).unwrap();
        assert!(matches!(
            decode_checkpoint_row(&fields, &[1, 1, 1], &RowLayout::SAVER_SELECT),
            Err(DecodeError::FormatCount {
                columns: 8,
                formats: 3
            })
        ));
        assert!(matches!(
            decode_checkpoint_row(&fields[..7], &[1], &RowLayout::SAVER_SELECT),
            Err(DecodeError::MissingColumn {
                column: "pending_writes",
                index: 7,
                count: 7
            })
        ));
        let err = decode_checkpoint_row(&fields, &[3], &RowLayout::SAVER_SELECT).unwrap_err();
        assert!(matches!(err, DecodeError::Field { .. }), "{err}");
    }

    #[test]
    fn truncated_or_corrupted_rows_never_panic() {
        let body = binary_row();
        for n in 0..body.len() {
            assert!(decode_binary_body(&body[..n]).is_err(), "prefix {n}");
        }
        for i in 0..body.len() {
            for v in [0x00, 0x01, 0x7f, 0xff] {
                let mut c = body.clone();
                c[i] = v;
                let _ = decode_binary_body(&c);
            }
        }
    }
}
