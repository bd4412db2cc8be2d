//! A stored `(type, blob)` pair read as JSON: the saver's type tag says
//! which serialization wrote the blob (msgpack, JSON, raw bytes).

use serde_json::Value;

use super::json_blob;
use super::msgpack::{self, bytes_to_string, MsgpackError};

/// Decodes a stored `(type, blob)` pair by the saver's type tag.
/// `Ok(None)` means the row holds no value (`empty`); `null` is JSON null.
pub fn blob_to_json(type_tag: &str, blob: Option<&[u8]>) -> Result<Option<Value>, MsgpackError> {
    let missing = || MsgpackError::MissingBlob(type_tag.into());
    match type_tag {
        "msgpack" => msgpack::to_json(blob.ok_or_else(missing)?).map(Some),
        "null" => Ok(Some(Value::Null)),
        "empty" => Ok(None),
        "json" => json_blob::to_json(blob.ok_or_else(missing)?).map(Some),
        "bytes" | "bytearray" => Ok(Some(Value::String(bytes_to_string(
            blob.ok_or_else(missing)?,
        )))),
        other => Err(MsgpackError::Undecodable(other.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn type_tags() {
        assert_eq!(
            blob_to_json("msgpack", Some(&[0x91, 0xc0])).unwrap(),
            Some(json!([null]))
        );
        // `None` is stored as type "null" with an empty blob.
        assert_eq!(blob_to_json("null", Some(b"")).unwrap(), Some(json!(null)));
        assert_eq!(blob_to_json("empty", None).unwrap(), None);
        assert_eq!(
            blob_to_json("json", Some(br#"{"a": [1]}"#)).unwrap(),
            Some(json!({"a": [1]}))
        );
        // b"\x00\x01" is stored as type "bytes"
        assert_eq!(
            blob_to_json("bytes", Some(&[0x00, 0x01])).unwrap(),
            Some(json!("\u{0}\u{1}"))
        );
        assert_eq!(
            blob_to_json("bytearray", Some(&[0xff])).unwrap(),
            Some(json!("/w=="))
        );
        assert_eq!(
            blob_to_json("pickle", Some(b"\x80\x04")),
            Err(MsgpackError::Undecodable("pickle".into()))
        );
        assert!(matches!(
            blob_to_json("cbor", Some(b"")),
            Err(MsgpackError::Undecodable(_))
        ));
        assert_eq!(
            blob_to_json("msgpack", None),
            Err(MsgpackError::MissingBlob("msgpack".into()))
        );
        assert!(matches!(
            blob_to_json("json", Some(b"{")),
            Err(MsgpackError::Json(_))
        ));
    }
}
