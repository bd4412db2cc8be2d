//! RowDescription, edited: a rewritten read's answer without the column
//! the proxy appended. Every other byte is kept.

use bytes::{BufMut, Bytes, BytesMut};

use super::read::{cstr, HEADER_LEN};
use super::write::write_message;

/// Bytes of a field description after its name: table oid, attnum, type
/// oid, typlen, typmod, format.
const FIELD_TAIL: usize = 18;

/// A RowDescription without its last field; `None` if it does not parse.
pub fn drop_last_column_description(frame: &[u8]) -> Option<Bytes> {
    let body = frame.get(HEADER_LEN..)?;
    let count = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
    if count < 1 {
        return None;
    }
    let mut offset = 2;
    for _ in 0..count - 1 {
        let (name, _) = cstr(body.get(offset..)?)?;
        offset += name.len() + 1 + FIELD_TAIL;
    }
    let kept = body.get(2..offset)?;
    let mut out = BytesMut::with_capacity(offset + HEADER_LEN);
    write_message(&mut out, b'T', |out| {
        out.put_i16(count - 1);
        out.put_slice(kept);
        Ok(())
    })
    .ok()?;
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, type_oid: u32) -> Vec<u8> {
        let mut f = name.as_bytes().to_vec();
        f.push(0);
        f.extend_from_slice(&0u32.to_be_bytes());
        f.extend_from_slice(&0i16.to_be_bytes());
        f.extend_from_slice(&type_oid.to_be_bytes());
        f.extend_from_slice(&(-1i16).to_be_bytes());
        f.extend_from_slice(&(-1i32).to_be_bytes());
        f.extend_from_slice(&1i16.to_be_bytes());
        f
    }

    fn row_description(fields: &[Vec<u8>]) -> Vec<u8> {
        let mut body = (fields.len() as i16).to_be_bytes().to_vec();
        for f in fields {
            body.extend_from_slice(f);
        }
        let mut m = vec![b'T'];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend(body);
        m
    }

    #[test]
    fn drops_the_appended_column() {
        let full = row_description(&[
            field("thread_id", 25),
            field("pending_writes", 1001),
            field("__resumeguard_head", 25),
        ]);
        let expected = row_description(&[field("thread_id", 25), field("pending_writes", 1001)]);
        assert_eq!(drop_last_column_description(&full).unwrap(), expected);
        assert!(drop_last_column_description(&full[..full.len() - 3]).is_some());
        assert!(drop_last_column_description(&full[..10]).is_none());
        assert!(drop_last_column_description(&row_description(&[])).is_none());
    }
}
