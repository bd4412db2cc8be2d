//! Why a value from the wire could not be decoded.
//!
//! Every decoder in the saver layer reports through this one type so a
//! caller can log a single, precise reason (which field, what was wrong)
//! and fall back to relaying the bytes untouched.

use crate::wire::messages::read::ReadError;

/// A decoding failure. Messages name the field and the defect.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DecodeError {
    /// A length, header or body that does not read (truncated, a
    /// negative length, bytes left over): the codec's checked readers'
    /// error, which the saver's own binary readers share.
    #[error(transparent)]
    Read(#[from] ReadError),

    /// A format code that is neither 0 (text) nor 1 (binary).
    #[error("unknown format code {0} (expected 0 = text or 1 = binary)")]
    FormatCode(i16),

    /// Result-format code list whose length fits neither 0, 1 nor the column count.
    #[error("{formats} result format codes for {columns} columns (expected 0, 1 or {columns})")]
    FormatCount { columns: usize, formats: usize },

    /// Text that is not UTF-8.
    #[error("{what}: not valid UTF-8")]
    Utf8 { what: &'static str },

    /// A bytea text value in neither valid hex (`\x..`) nor escape format.
    #[error("bytea text: {0}")]
    Bytea(String),

    /// An integer that does not parse or has an unexpected width.
    #[error("integer: {0}")]
    Int(String),

    /// Binary jsonb with no version byte.
    #[error("jsonb: empty binary value (missing version byte)")]
    JsonbEmpty,

    /// Binary jsonb with a version byte other than 1.
    #[error("jsonb: unsupported binary version {0} (expected 1)")]
    JsonbVersion(u8),

    /// A binary array whose element type is not the one expected.
    #[error("array: element type oid {0} is not the expected element type")]
    ElementOid(u32),

    /// A binary array header that is structurally invalid.
    #[error("bytea[]: {0}")]
    ArrayHeader(String),

    /// A declared element count the buffer cannot possibly hold.
    #[error("bytea[]: dimensions declare {declared} elements but only {remaining} bytes remain (at least 4 per element)")]
    ArrayCount { declared: u64, remaining: usize },

    /// A text array literal that does not parse.
    #[error("array text: {reason} at byte {pos}")]
    ArraySyntax { pos: usize, reason: &'static str },

    /// An array whose shape is not the rows-of-N the statement produces.
    #[error("{column}: expected a 2-D array with rows of {width}, got dimensions {dims:?}")]
    RowShape {
        column: &'static str,
        width: usize,
        dims: Vec<usize>,
    },

    /// NULL where the statement never produces one.
    #[error("{what}: unexpected NULL")]
    UnexpectedNull { what: &'static str },

    /// A row with fewer columns than the layout refers to.
    #[error("column {column} at index {index}, but the row has only {count} fields")]
    MissingColumn {
        column: &'static str,
        index: usize,
        count: usize,
    },

    /// Context: the error occurred while decoding the named field.
    #[error("{field}: {source}")]
    Field {
        field: &'static str,
        #[source]
        source: Box<DecodeError>,
    },
}

impl DecodeError {
    /// Wraps `self` with the name of the field being decoded.
    pub fn in_field(self, field: &'static str) -> DecodeError {
        DecodeError::Field {
            field,
            source: Box::new(self),
        }
    }
}

/// Copies `raw` into a `String`, rejecting invalid UTF-8.
pub(crate) fn utf8(raw: &[u8], what: &'static str) -> Result<String, DecodeError> {
    std::str::from_utf8(raw)
        .map(str::to_owned)
        .map_err(|_| DecodeError::Utf8 { what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_field_and_defect() {
        let e = DecodeError::from(ReadError::Truncated {
            what: "field length",
            needed: 4,
            remaining: 1,
        })
        .in_field("metadata");
        assert_eq!(
            e.to_string(),
            "metadata: field length: truncated, needs 4 bytes but only 1 remain"
        );
        assert_eq!(
            DecodeError::JsonbVersion(2).to_string(),
            "jsonb: unsupported binary version 2 (expected 1)"
        );
    }

    #[test]
    fn field_context_exposes_source() {
        use std::error::Error;
        let e = DecodeError::FormatCode(7).in_field("checkpoint");
        let src = e.source().map(|s| s.to_string());
        assert_eq!(
            src.as_deref(),
            Some("unknown format code 7 (expected 0 = text or 1 = binary)")
        );
    }

    #[test]
    fn the_codecs_errors_arrive_as_the_savers() {
        use crate::wire::messages::{data_row::split_data_row, read::read_i32};
        assert!(matches!(
            split_data_row(&[0, 1, 0xff, 0xff, 0xff, 0xfe]).map_err(DecodeError::from),
            Err(DecodeError::Read(ReadError::NegativeLength { len: -2, .. }))
        ));
        assert!(matches!(
            read_i32(&mut &[0u8, 0][..], "x").map_err(DecodeError::from),
            Err(DecodeError::Read(ReadError::Truncated {
                needed: 4,
                remaining: 2,
                ..
            }))
        ));
    }
}
