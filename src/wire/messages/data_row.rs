//! DataRow, both ways: its fields split as slices of the message body
//! (a checkpoint row is looked into without copying it), and a row written
//! from fields (a row of a rewritten read, edited).

use bytes::{Bytes, BytesMut};

use super::read::{read_i16, read_nullable, ReadError};
use super::write::{write_count, write_message, write_nullable};

/// Splits a `DataRow` body (after the 5-byte message header) into its fields:
/// int16 field count, then per field an int32 length (-1 = NULL) and the bytes.
/// `None` is SQL NULL.
pub fn split_data_row(body: &[u8]) -> Result<Vec<Option<&[u8]>>, ReadError> {
    let mut buf = body;
    let count = read_i16(&mut buf, "DataRow field count")?;
    let count = usize::try_from(count).map_err(|_| ReadError::NegativeLength {
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
        return Err(ReadError::TrailingBytes {
            what: "DataRow",
            extra: buf.len(),
        });
    }
    Ok(fields)
}

/// Encodes a DataRow from its fields. The fields come from a row the
/// server sent (one edited at most), so they fit the length fields; a row
/// that did not would be written empty, never with a wrapped length.
pub fn data_row(fields: &[Option<&[u8]>]) -> Bytes {
    let size: usize = fields.iter().map(|f| 4 + f.map_or(0, <[u8]>::len)).sum();
    let mut out = BytesMut::with_capacity(size + 7);
    let written = write_message(&mut out, b'D', |out| {
        write_count(out, fields.len(), "the row's fields")?;
        for f in fields {
            write_nullable(out, *f, "a field")?;
        }
        Ok(())
    });
    if let Err(e) = written {
        tracing::error!(error = %e, "a rewritten row cannot be encoded");
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DataRow body (the message without its header) of `fields`.
    fn body(fields: &[Option<&[u8]>]) -> Vec<u8> {
        data_row(fields)[5..].to_vec()
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
            Err(ReadError::Truncated {
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
            Err(ReadError::NegativeLength { len: -2, .. })
        ));
    }

    #[test]
    fn rejects_negative_count_and_trailing_bytes() {
        assert!(matches!(
            split_data_row(&[0xff, 0xff]),
            Err(ReadError::NegativeLength { len: -1, .. })
        ));
        let mut b = body(&[Some(b"x")]);
        b.push(0);
        assert!(matches!(
            split_data_row(&b),
            Err(ReadError::TrailingBytes { extra: 1, .. })
        ));
    }

    #[test]
    fn huge_count_is_an_error_not_an_allocation() {
        // 32767 fields declared, none present.
        assert!(matches!(
            split_data_row(&[0x7f, 0xff]),
            Err(ReadError::Truncated { .. })
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

    #[test]
    fn builds_data_rows_that_split_back() {
        let row = data_row(&[Some(b"t1"), None, Some(b"")]);
        let fields = split_data_row(&row[5..]).unwrap();
        assert_eq!(fields, vec![Some(&b"t1"[..]), None, Some(&b""[..])]);
        let len = i32::from_be_bytes([row[1], row[2], row[3], row[4]]) as usize;
        assert_eq!(len + 1, row.len());
    }
}
