//! Ext 6: numpy arrays of numbers, rebuilt as nested JSON arrays from the
//! raw buffer, its dtype, shape and memory order.

use rmpv::decode::read_value_ref_with_max_depth;
use rmpv::ValueRef;
use serde_json::Value;

use super::{as_str, float, MsgpackError};

/// Ext 6: `(dtype.str, shape, order, buffer)` → nested arrays.
pub(super) fn numpy(payload: &[u8], depth: usize) -> Result<Value, MsgpackError> {
    let np = |why: &str| MsgpackError::Numpy(why.into());
    let mut rd = payload;
    let tup = read_value_ref_with_max_depth(&mut rd, 16)
        .map_err(|e| MsgpackError::Numpy(e.to_string()))?;
    let ValueRef::Array(parts) = &tup else {
        return Err(np("meta is not an array"));
    };
    let (Some(dtype), Some(ValueRef::Array(shape)), Some(order), Some(ValueRef::Binary(buf))) = (
        parts.first().and_then(as_str),
        parts.get(1),
        parts.get(2).and_then(as_str),
        parts.get(3),
    ) else {
        return Err(np("expected (dtype, shape, order, buffer)"));
    };
    let shape = shape
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| np("shape is not a list of sizes"))?;
    if shape.len() >= depth {
        return Err(MsgpackError::TooDeep);
    }
    let elem = Elem::parse(dtype).ok_or_else(|| MsgpackError::Numpy(format!("dtype {dtype}")))?;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| np("shape overflows"))?;
    // Zero-size arrays carry no bytes, so bound the nested arrays a shape
    // like (2**60, 0) would otherwise have us build.
    let limit = buf.len().max(1024);
    let mut prefix = 1usize;
    for &d in &shape {
        prefix = prefix.saturating_mul(d);
        if prefix > limit && count == 0 {
            return Err(np("empty array with too many rows"));
        }
    }
    if count.checked_mul(elem.size) != Some(buf.len()) {
        return Err(np("buffer size does not match shape and dtype"));
    }
    // Element strides (in elements) for C (row-major) or F (column-major) order.
    let mut strides = vec![0usize; shape.len()];
    let mut acc = 1usize;
    let dims: Vec<usize> = match order {
        "C" => (0..shape.len()).rev().collect(),
        "F" => (0..shape.len()).collect(),
        _ => return Err(np("order is neither C nor F")),
    };
    for d in dims {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d]);
    }
    Ok(build(&shape, &strides, 0, buf, &elem))
}

fn build(shape: &[usize], strides: &[usize], offset: usize, buf: &[u8], elem: &Elem) -> Value {
    match (shape.split_first(), strides.split_first()) {
        (Some((&n, shape)), Some((&stride, strides))) => Value::Array(
            (0..n)
                .map(|i| build(shape, strides, offset + i * stride, buf, elem))
                .collect(),
        ),
        _ => elem.read(buf, offset),
    }
}

/// A numeric numpy element type: kind, width, byte order.
struct Elem {
    kind: u8,
    size: usize,
    big_endian: bool,
}

impl Elem {
    fn parse(dtype: &str) -> Option<Elem> {
        let b = dtype.as_bytes();
        let (order, kind, size) = (b.first()?, b.get(1)?, dtype.get(2..)?.parse().ok()?);
        let big_endian = match order {
            b'>' => true,
            b'<' | b'|' => false,
            b'=' => cfg!(target_endian = "big"),
            _ => return None,
        };
        let ok = matches!(
            (kind, size),
            (b'b', 1) | (b'i' | b'u', 1 | 2 | 4 | 8) | (b'f', 4 | 8)
        );
        ok.then_some(Elem {
            kind: *kind,
            size,
            big_endian,
        })
    }

    fn read(&self, buf: &[u8], index: usize) -> Value {
        let start = index * self.size;
        let mut raw = [0u8; 8];
        if let Some(src) = buf.get(start..start + self.size) {
            raw[..self.size].copy_from_slice(src);
        }
        if self.big_endian {
            raw[..self.size].reverse();
        }
        let unsigned = u64::from_le_bytes(raw);
        let bits = (self.size * 8) as u32;
        match self.kind {
            b'b' => Value::Bool(unsigned != 0),
            b'u' => Value::from(unsigned),
            b'i' => {
                // Sign-extend from the element width.
                let shift = 64 - bits;
                Value::from(((unsigned << shift) as i64) >> shift)
            }
            _ if self.size == 4 => float(f64::from(f32::from_bits(unsigned as u32))),
            _ => float(f64::from_bits(unsigned)),
        }
    }
}
