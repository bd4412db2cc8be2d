//! The one way a message is written: its tag, a 4-byte length reserved and
//! patched once the body is in (the length counts itself and the body),
//! and strings that refuse an embedded NUL, which would end them early on
//! the other side.

use bytes::{BufMut, BytesMut};

/// Why a message cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string would end at its NUL on the other side.
    #[error("{0} holds a NUL byte")]
    Nul(&'static str),
    /// The message or a value is longer than its length field can count.
    #[error("{0} is longer than its length field can count")]
    TooLong(&'static str),
}

/// Appends one typed message to `out`: `tag`, the length, and what `body`
/// writes. On an error nothing of the message stays in `out`.
pub fn write_message(
    out: &mut BytesMut,
    tag: u8,
    body: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.put_u8(tag);
    write_counted(out, body).inspect_err(|_| out.truncate(start))
}

/// Appends a length-counted packet without a tag (the startup phase's
/// StartupMessage and CancelRequest): the length, then what `body` writes.
/// On an error nothing of the packet stays in `out`.
pub fn write_counted(
    out: &mut BytesMut,
    body: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.put_i32(0);
    let written = body(out).and_then(|()| {
        i32::try_from(out.len() - start).map_err(|_| EncodeError::TooLong("the message"))
    });
    match written {
        Ok(len) => {
            out[start..start + 4].copy_from_slice(&len.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Appends `s` and its terminating NUL; `what` names it in the error when
/// it holds a NUL of its own.
pub fn write_cstr(out: &mut BytesMut, s: &[u8], what: &'static str) -> Result<(), EncodeError> {
    if s.contains(&0) {
        return Err(EncodeError::Nul(what));
    }
    out.put_slice(s);
    out.put_u8(0);
    Ok(())
}

/// Appends an int32 length and the bytes, or -1 for NULL.
pub fn write_nullable(
    out: &mut BytesMut,
    value: Option<&[u8]>,
    what: &'static str,
) -> Result<(), EncodeError> {
    match value {
        Some(v) => {
            out.put_i32(i32::try_from(v.len()).map_err(|_| EncodeError::TooLong(what))?);
            out.put_slice(v);
        }
        None => out.put_i32(-1),
    }
    Ok(())
}

/// Appends an int16 count: unsigned 16-bit on the wire.
pub fn write_count(out: &mut BytesMut, n: usize, what: &'static str) -> Result<(), EncodeError> {
    out.put_u16(u16::try_from(n).map_err(|_| EncodeError::TooLong(what))?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::connection::message;

    #[test]
    fn the_length_counts_itself_and_the_body() {
        assert_eq!(message(b'Q', b"x\0"), b"Q\0\0\0\x06x\0");
        assert_eq!(message(b'S', b""), b"S\0\0\0\x04");
    }

    #[test]
    fn a_refused_string_leaves_nothing_behind() {
        let mut out = BytesMut::from(&b"kept"[..]);
        let err = write_message(&mut out, b'Q', |out| write_cstr(out, b"a\0b", "the query"));
        assert_eq!(err, Err(EncodeError::Nul("the query")));
        assert_eq!(&out[..], b"kept");
    }
}
