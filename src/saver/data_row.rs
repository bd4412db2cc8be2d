//! The codec's checked readers with the saver's error: a `DataRow` split
//! into its fields (slices of the message body, a checkpoint row looked
//! into without copying), and the int32 and length-prefixed readers that
//! binary arrays share with it for their elements.

use super::decode_error::DecodeError;
use crate::wire::messages::{data_row, read};

/// Splits a `DataRow` body (after the 5-byte message header) into its
/// fields; `None` is SQL NULL.
pub fn split_data_row(body: &[u8]) -> Result<Vec<Option<&[u8]>>, DecodeError> {
    data_row::split_data_row(body).map_err(DecodeError::Read)
}

/// Reads a big-endian int32.
pub(crate) fn read_i32(buf: &mut &[u8], what: &'static str) -> Result<i32, DecodeError> {
    read::read_i32(buf, what).map_err(DecodeError::Read)
}

/// Reads an int32 length and that many bytes; length -1 is NULL (`None`).
pub(crate) fn read_nullable<'a>(
    buf: &mut &'a [u8],
    what: &'static str,
) -> Result<Option<&'a [u8]>, DecodeError> {
    read::read_nullable(buf, what).map_err(DecodeError::Read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::messages::read::ReadError;

    #[test]
    fn the_codecs_errors_arrive_as_the_savers() {
        assert!(matches!(
            split_data_row(&[0, 1, 0xff, 0xff, 0xff, 0xfe]),
            Err(DecodeError::Read(ReadError::NegativeLength { len: -2, .. }))
        ));
        assert!(matches!(
            read_i32(&mut &[0u8, 0][..], "x"),
            Err(DecodeError::Read(ReadError::Truncated {
                needed: 4,
                remaining: 2,
                ..
            }))
        ));
    }
}
