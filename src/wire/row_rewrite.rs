//! Editing result messages of a rewritten read: dropping the column the
//! proxy appended and replacing a field. Lengths are recomputed; every
//! other byte is kept.

use bytes::{BufMut, Bytes, BytesMut};

use super::frame::cstr;

/// A RowDescription without its last field; `None` if it does not parse.
pub fn drop_last_column_description(frame: &[u8]) -> Option<Bytes> {
    let body = frame.get(5..)?;
    let count = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
    if count < 1 {
        return None;
    }
    // Each field: name, then 18 bytes (table oid, attnum, type oid,
    // typlen, typmod, format).
    let mut offset = 2;
    for _ in 0..count - 1 {
        let (name, _) = cstr(body.get(offset..)?)?;
        offset += name.len() + 1 + 18;
    }
    let kept = body.get(2..offset)?;
    let mut out = BytesMut::with_capacity(offset + 5);
    out.put_u8(b'T');
    out.put_i32((offset + 4) as i32);
    out.put_i16(count - 1);
    out.put_slice(kept);
    Some(out.freeze())
}

/// Encodes a DataRow from its fields.
pub fn data_row(fields: &[Option<&[u8]>]) -> Bytes {
    let size: usize = fields.iter().map(|f| 4 + f.map_or(0, <[u8]>::len)).sum();
    let mut out = BytesMut::with_capacity(size + 7);
    out.put_u8(b'D');
    out.put_i32((size + 6) as i32);
    out.put_i16(fields.len() as i16);
    for f in fields {
        match f {
            Some(v) => {
                out.put_i32(v.len() as i32);
                out.put_slice(v);
            }
            None => out.put_i32(-1),
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saver::data_row::split_data_row;

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

    #[test]
    fn builds_data_rows_that_split_back() {
        let row = data_row(&[Some(b"t1"), None, Some(b"")]);
        let fields = split_data_row(&row[5..]).unwrap();
        assert_eq!(fields, vec![Some(&b"t1"[..]), None, Some(&b""[..])]);
        let len = i32::from_be_bytes([row[1], row[2], row[3], row[4]]) as usize;
        assert_eq!(len + 1, row.len());
    }
}
