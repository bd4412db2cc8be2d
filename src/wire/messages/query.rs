//! Query: a simple-query text, what the server gets in place of a refused
//! one.

use bytes::BytesMut;

use super::write::{write_cstr, write_message, EncodeError};

/// Appends a Query of `sql`.
pub fn write_query(out: &mut BytesMut, sql: &[u8]) -> Result<(), EncodeError> {
    write_message(out, b'Q', |out| write_cstr(out, sql, "the query"))
}
