//! What one checkpoint INSERT writes, read from its bound parameters by the
//! column each parameter feeds (the statement's shape says which).

use bytes::Bytes;

use super::bind::BoundParams;
use super::classify::InsertShape;
use super::decode_error::DecodeError;
use super::value::{ColumnKind, Value};

/// The saver's columns and how their values are encoded.
pub fn column_kind(column: &str) -> ColumnKind {
    match column {
        "blob" => ColumnKind::Bytea,
        "checkpoint" | "metadata" => ColumnKind::Jsonb,
        "idx" => ColumnKind::Int,
        _ => ColumnKind::Text,
    }
}

/// One row a blob, checkpoint or pending-write INSERT carries. Columns the
/// statement does not set are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteRecord {
    pub thread_id: Option<String>,
    pub checkpoint_ns: Option<String>,
    pub checkpoint_id: Option<String>,
    pub parent_checkpoint_id: Option<String>,
    pub task_id: Option<String>,
    pub task_path: Option<String>,
    pub channel: Option<String>,
    pub version: Option<String>,
    pub type_tag: Option<String>,
    pub idx: Option<i64>,
    pub blob: Option<Bytes>,
    /// JSON text of the checkpoint and metadata columns.
    pub checkpoint: Option<String>,
    pub metadata: Option<String>,
}

impl WriteRecord {
    pub fn decode(shape: &InsertShape, bound: &BoundParams) -> Result<Self, DecodeError> {
        let mut rec = WriteRecord::default();
        for (column, param) in &shape.columns {
            let value = bound
                .value(*param, column_kind(column))
                .map_err(|e| e.in_field(static_name(column)))?;
            rec.set(column, value);
        }
        rec.id_from_document();
        Ok(rec)
    }

    /// The columns that decode, those that do not left `None`: what the
    /// audit record of a write refused as undecodable can still say of it
    /// (usually its thread and checkpoint).
    pub fn decode_readable(shape: &InsertShape, bound: &BoundParams) -> Self {
        let mut rec = WriteRecord::default();
        for (column, param) in &shape.columns {
            if let Ok(value) = bound.value(*param, column_kind(column)) {
                rec.set(column, value);
            }
        }
        rec.id_from_document();
        rec
    }

    fn set(&mut self, column: &str, value: Value) {
        match (column, value) {
            (_, Value::Null) => {}
            ("thread_id", v) => self.thread_id = text(v),
            ("checkpoint_ns", v) => self.checkpoint_ns = text(v),
            ("checkpoint_id", v) => self.checkpoint_id = text(v),
            ("parent_checkpoint_id", v) => self.parent_checkpoint_id = text(v),
            ("task_id", v) => self.task_id = text(v),
            ("task_path", v) => self.task_path = text(v),
            ("channel", v) => self.channel = text(v),
            ("version", v) => self.version = text(v),
            ("type", v) => self.type_tag = text(v),
            ("idx", v) => self.idx = v.as_int(),
            ("blob", Value::Bytes(b)) => self.blob = Some(b),
            ("checkpoint", v) => self.checkpoint = text(v),
            ("metadata", v) => self.metadata = text(v),
            _ => {}
        }
    }

    /// The shallow saver's checkpoint INSERT has no checkpoint_id column:
    /// the id is the document's.
    fn id_from_document(&mut self) {
        if self.checkpoint_id.is_none() {
            self.checkpoint_id = self
                .checkpoint
                .as_deref()
                .and_then(|doc| super::checkpoint_row::document_id(doc).ok());
        }
    }
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::Text(s) | Value::Json(s) => Some(s),
        _ => None,
    }
}

/// Field names for error messages (DecodeError carries `&'static str`).
fn static_name(column: &str) -> &'static str {
    match column {
        "thread_id" => "thread_id",
        "checkpoint_ns" => "checkpoint_ns",
        "checkpoint_id" => "checkpoint_id",
        "parent_checkpoint_id" => "parent_checkpoint_id",
        "task_id" => "task_id",
        "task_path" => "task_path",
        "channel" => "channel",
        "version" => "version",
        "type" => "type",
        "idx" => "idx",
        "blob" => "blob",
        "checkpoint" => "checkpoint",
        "metadata" => "metadata",
        _ => "column",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saver::bind::tests::{bind_frame, decode};

    fn writes_shape() -> InsertShape {
        let cols = [
            "thread_id",
            "checkpoint_ns",
            "checkpoint_id",
            "task_id",
            "task_path",
            "idx",
            "channel",
            "type",
            "blob",
        ];
        InsertShape {
            columns: cols
                .iter()
                .enumerate()
                .map(|(i, c)| (c.to_string(), i))
                .collect(),
        }
    }

    #[test]
    fn decodes_an_interrupt_write() {
        let frame = bind_frame(
            "",
            &[0, 0, 0, 0, 0, 1, 0, 0, 1],
            &[
                Some(b"t1"),
                Some(b""),
                Some(b"ck1"),
                Some(b"task-9"),
                Some(b"~__pregel_pull, gate"),
                Some(&[0xff, 0xfd]),
                Some(b"__interrupt__"),
                Some(b"msgpack"),
                Some(&[0x90]),
            ],
            &[],
        );
        let rec = WriteRecord::decode(&writes_shape(), &decode(&frame).unwrap()).unwrap();
        assert_eq!(rec.thread_id.as_deref(), Some("t1"));
        assert_eq!(rec.checkpoint_ns.as_deref(), Some(""));
        assert_eq!(rec.channel.as_deref(), Some("__interrupt__"));
        assert_eq!(rec.idx, Some(-3));
        assert_eq!(rec.blob.as_deref(), Some(&[0x90][..]));
        assert_eq!(rec.checkpoint, None);
    }

    #[test]
    fn decodes_a_checkpoint_put_with_null_parent() {
        let shape = InsertShape {
            columns: [
                "thread_id",
                "checkpoint_ns",
                "checkpoint_id",
                "parent_checkpoint_id",
                "checkpoint",
                "metadata",
            ]
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i))
            .collect(),
        };
        let frame = bind_frame(
            "",
            &[],
            &[
                Some(b"t1"),
                Some(b""),
                Some(b"ck2"),
                None,
                Some(br#"{"v": 4}"#),
                Some(b"{}"),
            ],
            &[],
        );
        let rec = WriteRecord::decode(&shape, &decode(&frame).unwrap()).unwrap();
        assert_eq!(rec.parent_checkpoint_id, None);
        assert_eq!(rec.checkpoint.as_deref(), Some(r#"{"v": 4}"#));
    }

    #[test]
    fn a_bad_value_names_its_column() {
        // idx in binary with 3 bytes is no integer.
        let frame = bind_frame(
            "",
            &[0, 0, 0, 0, 0, 1, 0, 0, 1],
            &[
                Some(b"t"),
                Some(b""),
                Some(b"c"),
                Some(b"k"),
                Some(b""),
                Some(&[1, 2, 3]),
                Some(b"x"),
                Some(b"msgpack"),
                Some(b""),
            ],
            &[],
        );
        let err = WriteRecord::decode(&writes_shape(), &decode(&frame).unwrap()).unwrap_err();
        assert!(err.to_string().contains("idx"), "{err}");
    }

    #[test]
    fn decodes_a_js_resume_write_as_node_postgres_binds_it() {
        use crate::saver::classify::tests::other_savers_sql::JS_UPSERT_WRITES;
        use crate::saver::classify::Classifier;
        use crate::saver::profile::SaverProfile;
        let class = Classifier::new(SaverProfile::built_in()).classify(JS_UPSERT_WRITES);
        let shape = class.kind.insert_shape().expect("a JS write");
        // node-postgres: numbers and strings as text, Buffers binary.
        let frame = bind_frame(
            "",
            &[0, 0, 0, 0, 0, 0, 0, 1],
            &[
                Some(b"t-js"),
                Some(b""),
                Some(b"1f1ecc82-de78-6d00-8001-5184633430f7"),
                Some(b"00000000-0000-0000-0000-000000000000"),
                Some(b"-4"),
                Some(b"__resume__"),
                Some(b"json"),
                Some(b"false"),
            ],
            &[],
        );
        let rec = WriteRecord::decode(shape, &decode(&frame).unwrap()).unwrap();
        assert_eq!(rec.idx, Some(-4));
        assert_eq!(rec.task_path, None);
        assert_eq!(rec.channel.as_deref(), Some("__resume__"));
        let value = crate::saver::typed_blob::blob_to_json(
            rec.type_tag.as_deref().unwrap(),
            rec.blob.as_deref(),
        );
        assert_eq!(value.unwrap(), Some(serde_json::json!(false)));
    }
}
