//! Framing: PostgreSQL messages are a type byte and a big-endian i32 length
//! that counts itself but not the type byte. One socket read is not one
//! message, so every direction frames by that header before looking inside.

/// Bytes of the header in front of every typed message.
pub const HEADER_LEN: usize = 5;

/// A complete message at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message type byte (`'P'`, `'B'`, `'D'`, ...).
    pub tag: u8,
    /// Total bytes of the message including the type byte.
    pub total_len: usize,
}

/// Why a buffer cannot be framed: the peer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is below 4 (it counts itself) or negative.
    #[error("invalid message length {declared} for message type {}", printable(*.tag))]
    BadLength { tag: u8, declared: i32 },
    /// The length field exceeds the configured ceiling.
    #[error(
        "message type {} declares {declared} bytes, above the limit of {max}",
        printable(*.tag)
    )]
    TooLarge {
        tag: u8,
        declared: usize,
        max: usize,
    },
}

fn printable(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("'{}'", tag as char)
    } else {
        format!("0x{tag:02x}")
    }
}

/// Looks at the front of `buf`: `Ok(Some)` when a whole message is there,
/// `Ok(None)` when more bytes are needed, `Err` when the header is invalid.
/// The length check happens as soon as the header is in, before any body
/// is buffered, so a 2 GiB header is refused without reading 2 GiB.
pub fn peek_frame(buf: &[u8], max_len: usize) -> Result<Option<FrameHeader>, FrameError> {
    Ok(peek_header(buf, max_len)?.filter(|h| buf.len() >= h.total_len))
}

/// Looks at the header at the front of `buf`: `Ok(Some)` as soon as the
/// header is in, whether or not the body is (a message too large to buffer
/// is streamed from here), `Ok(None)` before, `Err` when it is invalid.
pub fn peek_header(buf: &[u8], max_len: usize) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let tag = buf[0];
    let declared = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if declared < 4 {
        return Err(FrameError::BadLength { tag, declared });
    }
    let body_and_len = declared as usize;
    if body_and_len > max_len {
        return Err(FrameError::TooLarge {
            tag,
            declared: body_and_len,
            max: max_len,
        });
    }
    Ok(Some(FrameHeader {
        tag,
        total_len: body_and_len + 1,
    }))
}

/// A framed message (tag, length, body), for tests.
#[cfg(test)]
pub(crate) fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    crate::wire::messages::write::write_message(&mut out, tag, |out| {
        bytes::BufMut::put_slice(out, body);
        Ok(())
    })
    .expect("a test message fits its length field");
    out.to_vec()
}

/// The complete messages `bytes` holds, one after the other, for tests
/// (panics on anything else).
#[cfg(test)]
pub(crate) fn messages(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(h) = peek_frame(&bytes[at..], 1 << 20).unwrap() {
        out.push(&bytes[at..at + h.total_len]);
        at += h.total_len;
    }
    assert_eq!(at, bytes.len(), "trailing bytes after the last message");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::frame::message as msg;

    #[test]
    fn frames_a_whole_message() {
        let m = msg(b'Q', b"select 1\0");
        let h = peek_frame(&m, 1 << 20).unwrap().unwrap();
        assert_eq!(h.tag, b'Q');
        assert_eq!(h.total_len, m.len());
    }

    #[test]
    fn waits_for_header_and_body() {
        let m = msg(b'Q', b"select 1\0");
        for cut in 0..m.len() {
            assert_eq!(peek_frame(&m[..cut], 1 << 20).unwrap(), None, "cut {cut}");
        }
    }

    #[test]
    fn reads_the_header_before_the_body() {
        let m = msg(b'd', &[7u8; 1000]);
        assert_eq!(peek_header(&m[..4], 1 << 20).unwrap(), None);
        for cut in [5, 6, 500, m.len()] {
            let h = peek_header(&m[..cut], 1 << 20).unwrap().unwrap();
            assert_eq!((h.tag, h.total_len), (b'd', 1005), "cut {cut}");
        }
        assert!(peek_header(&m[..5], 100).is_err(), "the ceiling holds");
    }

    #[test]
    fn frames_only_the_first_of_two() {
        let mut m = msg(b'S', b"");
        m.extend(msg(b'H', b""));
        let h = peek_frame(&m, 1 << 20).unwrap().unwrap();
        assert_eq!((h.tag, h.total_len), (b'S', 5));
    }

    #[test]
    fn refuses_negative_and_short_lengths() {
        let mut m = vec![b'Q'];
        m.extend_from_slice(&(-1i32).to_be_bytes());
        assert!(matches!(
            peek_frame(&m, 1 << 20),
            Err(FrameError::BadLength { declared: -1, .. })
        ));
        let mut m = vec![b'Q'];
        m.extend_from_slice(&3i32.to_be_bytes());
        assert!(peek_frame(&m, 1 << 20).is_err());
    }

    #[test]
    fn refuses_oversized_header_before_the_body_arrives() {
        // 2 GiB: the i32 wraps negative; 1.5 GiB stays positive but is too big.
        let mut m = vec![b'P'];
        m.extend_from_slice(&0x8000_0000u32.to_be_bytes());
        assert!(peek_frame(&m, 1 << 30).is_err());
        let mut m = vec![b'P'];
        m.extend_from_slice(&0x6000_0000u32.to_be_bytes());
        let err = peek_frame(&m, 1 << 30).unwrap_err();
        assert!(err.to_string().contains("above the limit"), "{err}");
    }
}
