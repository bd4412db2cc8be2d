//! Splitting a `DataRow` body into its fields.
//!
//! The proxy must look inside checkpoint rows without copying them, so the
//! fields are returned as slices of the message body. The length-prefixed
//! field encoding (int32 length, -1 = NULL) is the same one binary arrays use
//! for their elements, so the readers here are shared with [`super::pg_array`].

use super::decode_error::DecodeError;

/// Splits a `DataRow` body (after the 5-byte message header) into its fields:
/// int16 field count, then per field an int32 length (-1 = NULL) and the bytes.
/// `None` is SQL NULL.
pub fn split_data_row(body: &[u8]) -> Result<Vec<Option<&[u8]>>, DecodeError> {
    let mut buf = body;
    let count = read_i16(&mut buf, "DataRow field count")?;
    let count = usize::try_from(count).map_err(|_| DecodeError::NegativeLength {
        what: "DataRow field count",
        len: i64::from(count),
    })?;
    // Each field needs at least its 4-byte length: never reserve more than
    // the body could describe.
    let mut fields = Vec::with_capacity(count.min(buf.len() / 4));
    for _ in 0..count {
        fields.push(read_nullable(&mut buf, "DataRow field")?);
    }
    if !buf.is_empty() {
        return Err(DecodeError::TrailingBytes {
            what: "DataRow",
            extra: buf.len(),
        });
    }
    Ok(fields)
}

/// Takes `n` bytes off the front of `buf`.
pub(crate) fn take<'a>(
    buf: &mut &'a [u8],
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], DecodeError> {
    if buf.len() < n {
        return Err(DecodeError::Truncated {
            what,
            needed: n,
            remaining: buf.len(),
        });
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// Reads a big-endian int16.
pub(crate) fn read_i16(buf: &mut &[u8], what: &'static str) -> Result<i16, DecodeError> {
    let b = take(buf, 2, what)?;
    Ok(i16::from_be_bytes([b[0], b[1]]))
}

/// Reads a big-endian int32.
pub(crate) fn read_i32(buf: &mut &[u8], what: &'static str) -> Result<i32, DecodeError> {
    let b = take(buf, 4, what)?;
    Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads an int32 length and that many bytes; length -1 is NULL (`None`).
pub(crate) fn read_nullable<'a>(
    buf: &mut &'a [u8],
    what: &'static str,
) -> Result<Option<&'a [u8]>, DecodeError> {
    let len = read_i32(buf, what)?;
    if len == -1 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| DecodeError::NegativeLength {
        what,
        len: i64::from(len),
    })?;
    take(buf, len, what).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a DataRow body from optional field values.
    fn body(fields: &[Option<&[u8]>]) -> Vec<u8> {
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

    #[test]
    fn splits_fields_with_null_and_empty() {
        let b = body(&[Some(b"t1"), Some(b""), None, Some(b"\x01{}")]);
        let f = split_data_row(&b).unwrap();
        assert_eq!(
            f,
            vec![Some(&b"t1"[..]), Some(&b""[..]), None, Some(&b"\x01{}"[..])]
        );
    }

    #[test]
    fn zero_fields() {
        assert!(split_data_row(&[0, 0]).unwrap().is_empty());
    }

    #[test]
    fn rejects_truncated_field() {
        let mut b = body(&[Some(b"hello")]);
        b.pop();
        assert!(matches!(
            split_data_row(&b),
            Err(DecodeError::Truncated {
                needed: 5,
                remaining: 4,
                ..
            })
        ));
    }

    #[test]
    fn rejects_negative_length_other_than_minus_one() {
        let mut b = vec![0, 1];
        b.extend_from_slice(&(-2i32).to_be_bytes());
        assert!(matches!(
            split_data_row(&b),
            Err(DecodeError::NegativeLength { len: -2, .. })
        ));
    }

    #[test]
    fn rejects_negative_count_and_trailing_bytes() {
        assert!(matches!(
            split_data_row(&[0xff, 0xff]),
            Err(DecodeError::NegativeLength { len: -1, .. })
        ));
        let mut b = body(&[Some(b"x")]);
        b.push(0);
        assert!(matches!(
            split_data_row(&b),
            Err(DecodeError::TrailingBytes { extra: 1, .. })
        ));
    }

    #[test]
    fn huge_count_is_an_error_not_an_allocation() {
        // 32767 fields declared, none present.
        assert!(matches!(
            split_data_row(&[0x7f, 0xff]),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(split_data_row(&[]).is_err());
        assert!(split_data_row(&[0]).is_err());
    }

    #[test]
    fn every_truncation_errors_without_panic() {
        let b = body(&[Some(b"thread"), None, Some(b""), Some(b"\x01{\"v\":4}")]);
        for n in 0..b.len() {
            assert!(split_data_row(&b[..n]).is_err(), "prefix of {n} bytes");
        }
        assert_eq!(split_data_row(&b).unwrap().len(), 4);
    }
}
