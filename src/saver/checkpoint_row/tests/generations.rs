//! Rows captured from the other saver generations (JS 1.0.5, Python
//! 2.0.25), decoded by the layout the classifier reads off their SQL, in
//! both result formats, and re-encoded after the fork filter.

use super::captured::*;
use super::*;
use crate::policy::fork::{fork_filter, ForkVerdict};
use crate::saver::classify::tests::other_savers_sql::{
    JS_BY_ID_TAIL, JS_LATEST_TAIL, JS_SELECT_SQL, PY2_SELECT_SQL,
};
use crate::saver::classify::{Classifier, StatementKind};
use crate::saver::profile::SaverProfile;
use crate::saver::typed_blob::blob_to_json;
use crate::wire::messages::data_row::split_data_row;

/// The layout the shipped profiles give a read's SQL.
fn layout_of(sql: &str) -> RowLayout {
    match &Classifier::new(SaverProfile::built_in()).classify(sql).kind {
        StatementKind::Read(r) => r.layout,
        other => panic!("not a read: {other:?}"),
    }
}

fn js_layout() -> RowLayout {
    layout_of(&format!("{JS_SELECT_SQL}{JS_LATEST_TAIL}"))
}

fn py2_layout() -> RowLayout {
    layout_of(&format!(
        "{PY2_SELECT_SQL}WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3"
    ))
}

fn body(hex_body: &str) -> Vec<u8> {
    hex::decode(hex_body).unwrap()
}

fn decode(hex_body: &str, format: i16, layout: &RowLayout) -> CheckpointRow {
    let body = body(hex_body);
    let fields = split_data_row(&body).unwrap();
    decode_checkpoint_row(&fields, &[format], layout).unwrap()
}

#[test]
fn js_parked_row_decodes_in_text_and_binary() {
    let layout = js_layout();
    let row = decode(JS_PARKED_TEXT, 0, &layout);
    assert_eq!(row, decode(JS_PARKED_BINARY, 1, &layout));
    assert_eq!(row.at.thread_id, "t-js");
    assert_eq!(row.at.checkpoint_id, "1f1ecc82-d2a3-6070-8001-bc61bf196fcc");
    assert!(row.has_pending("__interrupt__") && !row.has_pending("__resume__"));
    let [w] = row.pending_writes.as_slice() else {
        panic!("{:?}", row.pending_writes)
    };
    assert_eq!(
        (
            w.task_id.as_str(),
            w.type_tag.as_str(),
            w.task_path.as_str(),
            w.idx
        ),
        ("e5cc5cf6-3d72-5b03-9bdd-9471a033bb96", "json", "", None)
    );
    // The JS blob is JSON text: the interrupt's id and value.
    assert_eq!(
        blob_to_json(&w.type_tag, w.blob.as_deref()).unwrap(),
        Some(serde_json::json!([
            {"id": "74ceddabc39ea961af55cec87adcea6d", "value": {"question": "approve?"}}
        ]))
    );
    // `empty` channel rows carry a NULL blob.
    let empty: Vec<_> = row
        .channel_values
        .iter()
        .filter(|c| c.type_tag == "empty")
        .map(|c| (c.channel.as_str(), c.blob.is_none()))
        .collect();
    assert_eq!(empty, [("__start__", true), ("branch:to:prep", true)]);
}

#[test]
fn python_2_parked_row_decodes_in_text_and_binary() {
    let layout = py2_layout();
    let row = decode(PY2_PARKED_TEXT, 0, &layout);
    assert_eq!(row, decode(PY2_PARKED_BINARY, 1, &layout));
    assert_eq!(row.at.thread_id, "t-py2");
    let [w] = row.pending_writes.as_slice() else {
        panic!("{:?}", row.pending_writes)
    };
    assert_eq!(
        (w.channel.as_str(), w.type_tag.as_str(), w.idx),
        ("__interrupt__", "msgpack", None)
    );
    assert_eq!(row.channel_values.len(), 1);
    assert_eq!(row.channel_values[0].channel, "items");
}

#[test]
fn the_python_3_layout_does_not_read_four_element_rows() {
    // What every JS and Python 2.0.x read met before layouts were data.
    let body = body(JS_PARKED_BINARY);
    let fields = split_data_row(&body).unwrap();
    let err = decode_checkpoint_row(&fields, &[1], &RowLayout::SAVER_SELECT).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pending_writes: pending_writes: expected a 2-D array with rows of 6, got dimensions [1, 4]"
    );
}

/// The `pending_writes` field of a captured body, raw.
fn pending_field(hex_body: &str, layout: &RowLayout) -> Vec<u8> {
    let body = body(hex_body);
    let fields = split_data_row(&body).unwrap();
    fields[layout.pending_writes].unwrap().to_vec()
}

fn encoded(array: &ByteaArray, format: i16) -> Vec<u8> {
    if format == 1 {
        array.encode_binary()
    } else {
        array.encode_text().into_bytes()
    }
}

#[test]
fn pending_writes_re_encode_to_the_servers_bytes() {
    for (hex_body, format, layout) in [
        (JS_FORK_POINT_TEXT, 0, js_layout()),
        (JS_FORK_POINT_BINARY, 1, js_layout()),
        (PY2_RESUMED_BINARY, 1, py2_layout()),
        (PY2_PARKED_TEXT, 0, py2_layout()),
    ] {
        let row = decode(hex_body, format, &layout);
        let all: Vec<&PendingWrite> = row.pending_writes.iter().collect();
        assert_eq!(
            encoded(&layout.write_rows.encode(&all), format),
            pending_field(hex_body, &layout),
            "{}",
            row.at.thread_id
        );
    }
}

#[test]
fn a_js_fork_is_served_without_its_recorded_answers() {
    let by_id = layout_of(&format!("{JS_SELECT_SQL}{JS_BY_ID_TAIL}"));
    for (hex_body, format) in [(JS_FORK_POINT_TEXT, 0), (JS_FORK_POINT_BINARY, 1)] {
        let row = decode(hex_body, format, &by_id);
        let channels: Vec<&str> = row
            .pending_writes
            .iter()
            .map(|w| w.channel.as_str())
            .collect();
        assert_eq!(
            channels,
            [
                "__resume__",
                "__resume__",
                "__interrupt__",
                "approved",
                "items",
                "branch:to:after"
            ]
        );
        // Not the head any more: the fork policy hides both answers.
        let ForkVerdict::Fork { hide } = fork_filter(
            &row.at.checkpoint_id,
            Some("1f1ecc82-e048"),
            &row.pending_writes,
        ) else {
            panic!()
        };
        let kept: Vec<&PendingWrite> = row
            .pending_writes
            .iter()
            .enumerate()
            .filter(|(i, _)| !hide.contains(i))
            .map(|(_, w)| w)
            .collect();
        let served = encoded(&by_id.write_rows.encode(&kept), format);
        // The client's copy decodes by the same layout, without the answers.
        let body = body(hex_body);
        let mut fields = split_data_row(&body).unwrap();
        fields[by_id.pending_writes] = Some(&served);
        let row = decode_checkpoint_row(&fields, &[format], &by_id).unwrap();
        let channels: Vec<&str> = row
            .pending_writes
            .iter()
            .map(|w| w.channel.as_str())
            .collect();
        assert_eq!(
            channels,
            ["__interrupt__", "approved", "items", "branch:to:after"]
        );
        assert_eq!(
            blob_to_json("json", row.pending_writes[2].blob.as_deref()).unwrap(),
            Some(serde_json::json!(["gate:true"]))
        );
    }
}

#[test]
fn encoding_no_writes_is_the_empty_array_and_missing_slots_stay_null() {
    assert_eq!(PendingWritesLayout::FOUR.encode(&[]), ByteaArray::default());
    let w = PendingWrite {
        task_id: "t".into(),
        channel: "__resume__".into(),
        type_tag: "msgpack".into(),
        blob: None,
        task_path: "~p".into(),
        idx: None,
    };
    let a = PendingWritesLayout::PYTHON_3.encode(&[&w]);
    assert_eq!(a.dims, [1, 6]);
    assert_eq!(a.elements[4].as_deref(), Some(&b"~p"[..]));
    assert_eq!(a.elements[5], None);
    let a = PendingWritesLayout::FOUR.encode(&[&w, &w]);
    assert_eq!(a.dims, [2, 4]);
    assert_eq!(a.elements[4].as_deref(), Some(&b"t"[..]));
}
