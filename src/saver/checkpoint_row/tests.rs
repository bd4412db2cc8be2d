//! Checkpoint rows of every saver generation, in both wire formats.

use super::*;
use crate::wire::messages::data_row::split_data_row;

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
        at: CheckpointRef::new("thread-1", "", "1f0-cp2"),
        checkpoint: "{\"v\": 4}".into(),
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
                idx: Some(-3),
            },
            PendingWrite {
                task_id: "00000000-0000-0000-0000-000000000000".into(),
                channel: "__resume__".into(),
                type_tag: "null".into(),
                blob: None,
                task_path: String::new(),
                idx: Some(-4),
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
fn python_3_pending_writes_re_encode_to_the_same_bytes() {
    let row = decode_binary_body(&binary_row()).unwrap();
    let all: Vec<&PendingWrite> = row.pending_writes.iter().collect();
    let array = RowLayout::SAVER_SELECT.write_rows.encode(&all);
    assert_eq!(array.encode_binary(), pending_writes());
    // Without the run-level answer: one row of six, idx as decimal text.
    let kept = RowLayout::SAVER_SELECT.write_rows.encode(&all[..1]);
    assert_eq!(kept.dims, [1, 6]);
    assert_eq!(kept.elements[5].as_deref(), Some(&b"-3"[..]));
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
        checkpoint_id: Some(6),
        parent_checkpoint_id: Some(7),
        metadata: 2,
        channel_values: 0,
        pending_writes: 1,
        ..RowLayout::SAVER_SELECT
    };
    let row = decode_checkpoint_row(&fields, &[1, 1, 0, 0, 1, 1, 0, 1], &layout).unwrap();
    assert_eq!(row.at.thread_id, "thread-1");
    assert_eq!(row.at.checkpoint_ns, "sub");
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

mod captured;
mod generations;
