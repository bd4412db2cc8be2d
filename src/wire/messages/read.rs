//! Checked readers for message bodies: every read names what it reads and
//! fails with a [`ReadError`] past the end, so a truncated or lying message
//! is a decode error, never a panic. What they return borrows the input.

/// Bytes of the header in front of every typed message: the type byte
/// and the length word.
pub const HEADER_LEN: usize = 5;

/// Why a message body (or a length-prefixed value inside one) does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// A length or header needs more bytes than the buffer still holds.
    #[error("{what}: truncated, needs {needed} bytes but only {remaining} remain")]
    Truncated {
        what: &'static str,
        needed: usize,
        remaining: usize,
    },
    /// A length prefix below -1 (-1 alone means NULL).
    #[error("{what}: invalid length {len} (only -1, meaning NULL, may be negative)")]
    NegativeLength { what: &'static str, len: i64 },
    /// Bytes left over after the last declared element or field.
    #[error("{what}: {extra} unexpected trailing bytes")]
    TrailingBytes { what: &'static str, extra: usize },
}

/// Reads a NUL-terminated string at the front of `buf`, returning it and
/// the rest; `None` without a terminator. For the short strings most
/// messages carry (names, command tags, fields; the unnamed statement
/// and portal are empty), a plain scan ends before a vector search would
/// have set up.
pub fn cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = buf.iter().position(|&b| b == 0)?;
    Some((&buf[..end], &buf[end + 1..]))
}

/// [`cstr`] for a string that is usually long, a statement's text: its
/// end is searched for with vector instructions.
pub fn long_cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = memchr::memchr(0, buf)?;
    Some((&buf[..end], &buf[end + 1..]))
}

/// Takes a NUL-terminated string off the front of `buf`.
pub fn read_cstr<'a>(buf: &mut &'a [u8], what: &'static str) -> Result<&'a [u8], ReadError> {
    let (s, rest) = cstr(buf).ok_or(ReadError::Truncated {
        what,
        needed: buf.len() + 1,
        remaining: buf.len(),
    })?;
    *buf = rest;
    Ok(s)
}

/// Takes `n` bytes off the front of `buf`.
pub fn take<'a>(buf: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], ReadError> {
    if buf.len() < n {
        return Err(ReadError::Truncated {
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
pub fn read_i16(buf: &mut &[u8], what: &'static str) -> Result<i16, ReadError> {
    let b = take(buf, 2, what)?;
    Ok(i16::from_be_bytes([b[0], b[1]]))
}

/// Reads a big-endian int32.
pub fn read_i32(buf: &mut &[u8], what: &'static str) -> Result<i32, ReadError> {
    let b = take(buf, 4, what)?;
    Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads an int16 count; counts are unsigned 16-bit on the wire.
pub fn read_count(buf: &mut &[u8], what: &'static str) -> Result<usize, ReadError> {
    Ok(usize::from(read_i16(buf, what)? as u16))
}

/// Reads an int32 length and that many bytes; length -1 is NULL (`None`).
pub fn read_nullable<'a>(
    buf: &mut &'a [u8],
    what: &'static str,
) -> Result<Option<&'a [u8]>, ReadError> {
    let len = read_i32(buf, what)?;
    if len == -1 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| ReadError::NegativeLength {
        what,
        len: i64::from(len),
    })?;
    take(buf, len, what).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cstrings() {
        let (a, rest) = cstr(b"portal\0stmt\0x").unwrap();
        assert_eq!(a, b"portal");
        let (b, rest) = cstr(rest).unwrap();
        assert_eq!((b, rest), (&b"stmt"[..], &b"x"[..]));
        assert!(cstr(b"no terminator").is_none());
    }

    #[test]
    fn a_string_ends_at_its_first_nul_whatever_its_length() {
        for read in [cstr, long_cstr] {
            for len in [0, 1, 15, 16, 17, 100] {
                let mut buf = vec![b'x'; len];
                buf.extend_from_slice(b"\0rest\0");
                let (s, rest) = read(&buf).unwrap();
                assert_eq!(s.len(), len, "{len}");
                assert_eq!(rest, b"rest\0", "{len}");
                assert!(read(&buf[..len]).is_none(), "{len} unterminated");
            }
        }
    }
}
