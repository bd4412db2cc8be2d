//! One column value, decoded from either wire format.
//!
//! The saver sends parameters in a mix of text and binary formats and reads
//! results in binary, while other clients (or a future psycopg) may use text.
//! Callers know what SQL type a column has; this module turns the raw bytes
//! plus the format code into a typed [`Value`] so the rest of the proxy never
//! has to care which format was on the wire.

use bytes::Bytes;

use super::bytea::decode_bytea_text;
use super::decode_error::{utf8, DecodeError};
use super::int_text::decode_int_text;
use super::pg_array::{decode_text_array, ByteaArray};

/// The SQL type a column is expected to carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// `text` / `varchar` / unspecified (OID 0) parameters.
    Text,
    /// `bytea` (OID 17).
    Bytea,
    /// `jsonb` (OID 3802).
    Jsonb,
    /// `int2` / `int4` / `int8`.
    Int,
    /// `bytea[]` (OID 1001).
    ByteaArray,
    /// `text[]` (OID 1009) and the other string arrays.
    TextArray,
}

/// A decoded column value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL, whatever the column kind.
    Null,
    Text(String),
    Bytes(Bytes),
    Int(i64),
    /// JSON text; the binary jsonb version byte is already stripped.
    Json(String),
    Array(ByteaArray),
    /// A string array's elements, flattened; `None` is a NULL element.
    Texts(Vec<Option<String>>),
}

impl Value {
    /// The text of a `Text` or `Json` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) | Value::Json(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of a `Bytes` value.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The number of an `Int` value.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }
}

/// Text format code.
const TEXT: i16 = 0;
/// Binary format code.
const BINARY: i16 = 1;
/// The only binary jsonb version PostgreSQL has defined.
const JSONB_VERSION: u8 = 1;

/// Decodes one column value. `raw` is `None` for SQL NULL; `format` is the
/// wire format code (0 text, 1 binary).
pub fn decode_value(
    raw: Option<&[u8]>,
    format: i16,
    kind: ColumnKind,
) -> Result<Value, DecodeError> {
    if format != TEXT && format != BINARY {
        return Err(DecodeError::FormatCode(format));
    }
    let Some(raw) = raw else {
        return Ok(Value::Null);
    };
    let binary = format == BINARY;
    match kind {
        ColumnKind::Text => utf8(raw, "text").map(Value::Text),
        ColumnKind::Bytea if binary => Ok(Value::Bytes(Bytes::copy_from_slice(raw))),
        ColumnKind::Bytea => decode_bytea_text(raw).map(Value::Bytes),
        ColumnKind::Jsonb if binary => match raw.split_first() {
            None => Err(DecodeError::JsonbEmpty),
            Some((&JSONB_VERSION, json)) => utf8(json, "jsonb").map(Value::Json),
            Some((&v, _)) => Err(DecodeError::JsonbVersion(v)),
        },
        ColumnKind::Jsonb => utf8(raw, "jsonb").map(Value::Json),
        ColumnKind::Int if binary => decode_int_binary(raw).map(Value::Int),
        ColumnKind::Int => decode_int_text(raw).map(Value::Int),
        ColumnKind::ByteaArray if binary => ByteaArray::decode_binary(raw).map(Value::Array),
        ColumnKind::ByteaArray => {
            ByteaArray::decode_text(&utf8(raw, "bytea[] text")?).map(Value::Array)
        }
        ColumnKind::TextArray => decode_text_array(raw, binary).map(Value::Texts),
    }
}

/// Decodes a binary integer; the width (2, 4 or 8 bytes) says which type.
fn decode_int_binary(raw: &[u8]) -> Result<i64, DecodeError> {
    match *raw {
        [a, b] => Ok(i64::from(i16::from_be_bytes([a, b]))),
        [a, b, c, d] => Ok(i64::from(i32::from_be_bytes([a, b, c, d]))),
        [a, b, c, d, e, f, g, h] => Ok(i64::from_be_bytes([a, b, c, d, e, f, g, h])),
        _ => Err(DecodeError::Int(format!(
            "binary value of {} bytes (expected 2, 4 or 8)",
            raw.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ColumnKind; 6] = [
        ColumnKind::Text,
        ColumnKind::Bytea,
        ColumnKind::Jsonb,
        ColumnKind::Int,
        ColumnKind::ByteaArray,
        ColumnKind::TextArray,
    ];

    #[test]
    fn null_is_null_for_every_kind_and_format() {
        for kind in KINDS {
            for format in [0, 1] {
                assert_eq!(decode_value(None, format, kind).unwrap(), Value::Null);
            }
        }
    }

    #[test]
    fn bad_format_code_is_rejected() {
        assert!(matches!(
            decode_value(Some(b"x"), 2, ColumnKind::Text),
            Err(DecodeError::FormatCode(2))
        ));
        assert!(matches!(
            decode_value(None, -1, ColumnKind::Text),
            Err(DecodeError::FormatCode(-1))
        ));
    }

    #[test]
    fn text_in_both_formats() {
        for format in [0, 1] {
            let v = decode_value(Some("thread-ü".as_bytes()), format, ColumnKind::Text).unwrap();
            assert_eq!(v.as_str(), Some("thread-ü"));
        }
        // Root namespace: empty text, not NULL.
        let v = decode_value(Some(b""), 1, ColumnKind::Text).unwrap();
        assert_eq!(v, Value::Text(String::new()));
        assert!(matches!(
            decode_value(Some(&[0xff, 0xfe]), 1, ColumnKind::Text),
            Err(DecodeError::Utf8 { .. })
        ));
    }

    #[test]
    fn jsonb_binary_strips_version_byte() {
        let v = decode_value(Some(b"\x01{\"v\": 4}"), 1, ColumnKind::Jsonb).unwrap();
        assert_eq!(v, Value::Json("{\"v\": 4}".into()));
        assert_eq!(v.as_str(), Some("{\"v\": 4}"));
        assert_eq!(v.as_bytes(), None);
    }

    #[test]
    fn jsonb_binary_rejects_other_versions_and_empty() {
        assert!(matches!(
            decode_value(Some(b"\x02{}"), 1, ColumnKind::Jsonb),
            Err(DecodeError::JsonbVersion(2))
        ));
        assert!(matches!(
            decode_value(Some(b"{}"), 1, ColumnKind::Jsonb),
            Err(DecodeError::JsonbVersion(b'{'))
        ));
        assert!(matches!(
            decode_value(Some(b""), 1, ColumnKind::Jsonb),
            Err(DecodeError::JsonbEmpty)
        ));
    }

    #[test]
    fn jsonb_text_is_verbatim() {
        let v = decode_value(Some(b"{\"source\": \"loop\"}"), 0, ColumnKind::Jsonb).unwrap();
        assert_eq!(v, Value::Json("{\"source\": \"loop\"}".into()));
    }

    #[test]
    fn int2_binary_fffc_is_minus_four() {
        let v = decode_value(Some(&[0xff, 0xfc]), 1, ColumnKind::Int).unwrap();
        assert_eq!(v.as_int(), Some(-4));
    }

    #[test]
    fn int_binary_widths() {
        let int4 = (-3i32).to_be_bytes();
        let int8 = (1i64 << 40).to_be_bytes();
        assert_eq!(
            decode_value(Some(&int4), 1, ColumnKind::Int).unwrap(),
            Value::Int(-3)
        );
        assert_eq!(
            decode_value(Some(&int8), 1, ColumnKind::Int).unwrap(),
            Value::Int(1 << 40)
        );
        for bad in [&b""[..], &[1], &[1, 2, 3], &[0; 5], &[0; 9]] {
            assert!(matches!(
                decode_value(Some(bad), 1, ColumnKind::Int),
                Err(DecodeError::Int(_))
            ));
        }
    }

    #[test]
    fn int_text() {
        assert_eq!(
            decode_value(Some(b"-4"), 0, ColumnKind::Int).unwrap(),
            Value::Int(-4)
        );
        assert_eq!(
            decode_value(Some(b"12"), 0, ColumnKind::Int)
                .unwrap()
                .as_int(),
            Some(12)
        );
        // PostgreSQL's input skips surrounding whitespace.
        assert_eq!(
            decode_value(Some(b" 4"), 0, ColumnKind::Int).unwrap(),
            Value::Int(4)
        );
        for bad in [&b""[..], b"4.0", b"x", b"99999999999999999999"] {
            assert!(decode_value(Some(bad), 0, ColumnKind::Int).is_err());
        }
    }

    #[test]
    fn bytea_binary_is_raw() {
        let v = decode_value(Some(&[0x91, 0xc3]), 1, ColumnKind::Bytea).unwrap();
        assert_eq!(v.as_bytes(), Some(&[0x91, 0xc3][..]));
        assert_eq!(v.as_str(), None);
        assert_eq!(v.as_int(), None);
    }

    #[test]
    fn bytea_text_hex() {
        let v = decode_value(Some(b"\\x91a470726570"), 0, ColumnKind::Bytea).unwrap();
        assert_eq!(v, Value::Bytes(Bytes::from_static(b"\x91\xa4prep")));
        let v = decode_value(Some(b"\\x"), 0, ColumnKind::Bytea).unwrap();
        assert_eq!(v, Value::Bytes(Bytes::new()));
        assert!(matches!(
            decode_value(Some(b"\\x9"), 0, ColumnKind::Bytea),
            Err(DecodeError::Bytea(_))
        ));
        assert!(decode_value(Some(b"\\xzz"), 0, ColumnKind::Bytea).is_err());
    }

    #[test]
    fn bytea_text_escape_format() {
        let v = decode_value(Some(b"ab\\000\\\\\\377c"), 0, ColumnKind::Bytea).unwrap();
        assert_eq!(v, Value::Bytes(Bytes::from_static(b"ab\x00\\\xffc")));
        for bad in [&b"\\"[..], b"\\4", b"\\400", b"\\08", b"a\\q"] {
            assert!(
                matches!(
                    decode_value(Some(bad), 0, ColumnKind::Bytea),
                    Err(DecodeError::Bytea(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bytea_array_in_both_formats() {
        let text = br#"{{"\\x6974656d73","\\x6d73677061636b",NULL}}"#;
        let v = decode_value(Some(text), 0, ColumnKind::ByteaArray).unwrap();
        let Value::Array(a) = v else {
            panic!("expected an array, got {v:?}");
        };
        assert_eq!(a.dims, vec![1, 3]);
        assert_eq!(
            a.elements,
            vec![
                Some(Bytes::from_static(b"items")),
                Some(Bytes::from_static(b"msgpack")),
                None
            ]
        );
        // The binary form of an empty array.
        let empty = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17];
        let v = decode_value(Some(&empty), 1, ColumnKind::ByteaArray).unwrap();
        assert!(matches!(v, Value::Array(a) if a.dims.is_empty() && a.elements.is_empty()));
        assert!(decode_value(Some(&empty[..11]), 1, ColumnKind::ByteaArray).is_err());
    }
}
