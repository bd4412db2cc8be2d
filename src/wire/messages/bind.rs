//! Bind, both ways: read once with bounds checks, its names, formats and
//! parameter values borrowed from the frame, and written (a rewritten
//! client Bind, or the proxy's own).

use bytes::{BufMut, BytesMut};
use smallvec::SmallVec;

use super::read::{read_count, read_cstr, read_nullable, take, ReadError};
use super::write::{write_count, write_cstr, write_message, write_nullable, EncodeError};

/// How many formats or values a Bind may carry before their lists leave
/// the stack; the saver's statements bind at most nine.
const INLINE: usize = 16;

/// One Bind as read: its names, and the rest of its body, read into
/// [`Parameters`] only by whoever needs them (most Binds are forwarded on
/// their names alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    /// The body past the names: may be a prefix of it, for a Bind nobody
    /// reads past its names (see
    /// [`crate::wire::guard::Guard::client_streams`]).
    rest: &'a [u8],
}

/// A Bind's parameter formats and values (slices of the frame, `None`:
/// NULL), and the result formats it asks for. Nothing is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameters<'a> {
    pub formats: SmallVec<[i16; INLINE]>,
    pub values: SmallVec<[Option<&'a [u8]>; INLINE]>,
    pub result_formats: SmallVec<[i16; INLINE]>,
}

impl<'a> Bind<'a> {
    /// Reads a Bind's body (the frame past its header) as far as its
    /// names.
    pub fn read_body(mut body: &'a [u8]) -> Result<Self, ReadError> {
        let portal = read_cstr(&mut body, "bind portal name")?;
        let statement = read_cstr(&mut body, "bind statement name")?;
        Ok(Bind {
            portal,
            statement,
            rest: body,
        })
    }

    /// Its formats and values, or why they do not read.
    pub fn parameters(&self) -> Result<Parameters<'a>, ReadError> {
        Parameters::read(self.rest)
    }
}

impl<'a> Parameters<'a> {
    fn read(mut buf: &'a [u8]) -> Result<Self, ReadError> {
        let formats = read_i16_list(&mut buf, "bind parameter formats")?;
        let count = read_count(&mut buf, "bind parameter count")?;
        let values = (0..count)
            .map(|_| read_nullable(&mut buf, "bind parameter"))
            .collect::<Result<_, _>>()?;
        let result_formats = read_i16_list(&mut buf, "bind result formats")?;
        Ok(Parameters {
            formats,
            values,
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

fn read_i16_list(
    buf: &mut &[u8],
    what: &'static str,
) -> Result<SmallVec<[i16; INLINE]>, ReadError> {
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
    use crate::wire::messages::read::HEADER_LEN;

    /// A whole Bind frame read, its parameters included.
    fn read(frame: &[u8]) -> Result<(Bind<'_>, Parameters<'_>), ReadError> {
        let body = frame.get(HEADER_LEN..).ok_or(ReadError::Truncated {
            what: "bind header",
            needed: HEADER_LEN,
            remaining: frame.len(),
        })?;
        let bind = Bind::read_body(body)?;
        let parameters = bind.parameters()?;
        Ok((bind, parameters))
    }

    #[test]
    fn reads_values_as_slices_and_writes_them_back() {
        let mut frame = BytesMut::new();
        let values: [Option<&[u8]>; 3] = [Some(b"t1"), None, Some(b"")];
        write_bind(&mut frame, b"p", b"s", &[1], values.into_iter(), &[0, 1]).unwrap();
        let (bind, params) = read(&frame).unwrap();
        assert_eq!((bind.portal, bind.statement), (&b"p"[..], &b"s"[..]));
        assert_eq!(params.values.iter().copied().collect::<Vec<_>>(), values);
        let mut again = BytesMut::new();
        write_bind(
            &mut again,
            bind.portal,
            bind.statement,
            &params.formats,
            params.values.iter().copied(),
            &params.result_formats,
        )
        .unwrap();
        assert_eq!(again, frame);
        for cut in 0..frame.len() {
            assert!(read(&frame[..cut]).is_err(), "cut at {cut}");
        }
    }
}
