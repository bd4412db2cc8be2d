//! Bind, both ways: read with bounds checks, borrowing names and parameter
//! values from the frame, and written (a rewritten client Bind, or the
//! proxy's own).

use bytes::{BufMut, BytesMut};

use super::read::{read_count, read_cstr, read_nullable, take, ReadError, HEADER_LEN};
use super::write::{write_count, write_cstr, write_message, write_nullable, EncodeError};

/// One Bind as read: names, parameter formats and values, result formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    pub param_formats: Vec<i16>,
    pub params: Values<'a>,
    pub result_formats: Vec<i16>,
}

/// The parameter values of a Bind: checked when the Bind is read, then
/// iterated as slices of the frame (`None`: NULL), never collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values<'a> {
    count: usize,
    raw: &'a [u8],
}

impl<'a> Values<'a> {
    /// How many values there are.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The values in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Option<&'a [u8]>> {
        let mut raw = self.raw;
        // Every value was read once already: rereading cannot fail.
        (0..self.count).map(move |_| read_nullable(&mut raw, "bind parameter").unwrap_or(None))
    }
}

impl<'a> Bind<'a> {
    /// Reads a whole Bind frame (type byte and length included).
    pub fn read(frame: &'a [u8]) -> Result<Self, ReadError> {
        let mut buf = frame.get(HEADER_LEN..).ok_or(ReadError::Truncated {
            what: "bind header",
            needed: HEADER_LEN,
            remaining: frame.len(),
        })?;
        let portal = read_cstr(&mut buf, "bind portal name")?;
        let statement = read_cstr(&mut buf, "bind statement name")?;
        let param_formats = read_i16_list(&mut buf, "bind parameter formats")?;
        let count = read_count(&mut buf, "bind parameter count")?;
        let values = buf;
        for _ in 0..count {
            read_nullable(&mut buf, "bind parameter")?;
        }
        let params = Values {
            count,
            raw: &values[..values.len() - buf.len()],
        };
        let result_formats = read_i16_list(&mut buf, "bind result formats")?;
        Ok(Bind {
            portal,
            statement,
            param_formats,
            params,
            result_formats,
        })
    }
}

/// Appends a Bind of `statement` to `portal` with `params` (`None`: NULL)
/// in `param_formats`, asking for `result_formats`.
pub fn write_bind<'v>(
    out: &mut BytesMut,
    portal: &[u8],
    statement: &[u8],
    param_formats: &[i16],
    params: impl ExactSizeIterator<Item = Option<&'v [u8]>>,
    result_formats: &[i16],
) -> Result<(), EncodeError> {
    write_message(out, b'B', |out| {
        write_cstr(out, portal, "the portal name")?;
        write_cstr(out, statement, "the statement name")?;
        write_i16_list(out, param_formats, "the parameter formats")?;
        write_count(out, params.len(), "the parameters")?;
        for p in params {
            write_nullable(out, p, "a parameter")?;
        }
        write_i16_list(out, result_formats, "the result formats")
    })
}

fn read_i16_list(buf: &mut &[u8], what: &'static str) -> Result<Vec<i16>, ReadError> {
    let n = read_count(buf, what)?;
    let raw = take(buf, n * 2, what)?;
    Ok(raw
        .chunks_exact(2)
        .map(|c| i16::from_be_bytes([c[0], c[1]]))
        .collect())
}

fn write_i16_list(out: &mut BytesMut, list: &[i16], what: &'static str) -> Result<(), EncodeError> {
    write_count(out, list.len(), what)?;
    for f in list {
        out.put_i16(*f);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_values_as_slices_and_writes_them_back() {
        let mut frame = BytesMut::new();
        let values: [Option<&[u8]>; 3] = [Some(b"t1"), None, Some(b"")];
        write_bind(&mut frame, b"p", b"s", &[1], values.into_iter(), &[0, 1]).unwrap();
        let bind = Bind::read(&frame).unwrap();
        assert_eq!((bind.portal, bind.statement), (&b"p"[..], &b"s"[..]));
        assert_eq!(bind.params.iter().collect::<Vec<_>>(), values);
        let mut again = BytesMut::new();
        write_bind(
            &mut again,
            bind.portal,
            bind.statement,
            &bind.param_formats,
            bind.params.iter(),
            &bind.result_formats,
        )
        .unwrap();
        assert_eq!(again, frame);
        for cut in 0..frame.len() {
            assert!(Bind::read(&frame[..cut]).is_err(), "cut at {cut}");
        }
    }
}
