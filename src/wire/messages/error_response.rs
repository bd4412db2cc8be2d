//! ErrorResponse: how the proxy itself tells a client no, and how it reads
//! the server's errors (FATAL or not, which SQLSTATE). Each field is a code
//! byte and a string; an empty code ends the list.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};

use super::read::{cstr, HEADER_LEN};
use super::write::{write_cstr, write_message};
use crate::wire::client_text;

/// How bad an error is: FATAL ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Fatal,
}

/// An ErrorResponse, encoded. `S` and `V` carry the severity, `C` the
/// SQLSTATE, `M` the message; `H` (hint: what the client can do) when
/// given. A NUL in a text (which would end the field early) is written as
/// U+FFFD. The texts are written in the client's encoding: the proxy's own
/// words are ASCII, and what it quotes of the client's texts (a thread id
/// read by [`client_text::decode`]) goes back as the bytes the client
/// sent, whatever its `client_encoding`.
pub fn error_response(severity: Severity, code: &str, message: &str, hint: Option<&str>) -> Bytes {
    let sev = match severity {
        Severity::Error => "ERROR",
        Severity::Fatal => "FATAL",
    };
    let fields = [
        (b'S', Some(sev)),
        (b'V', Some(sev)),
        (b'C', Some(code)),
        (b'M', Some(message)),
        (b'H', hint),
    ];
    let mut out = BytesMut::with_capacity(64 + message.len() + hint.map_or(0, str::len));
    let written = write_message(&mut out, b'E', |out| {
        for (code, text) in fields {
            let Some(text) = text else { continue };
            out.put_u8(code);
            let text = without_nul(text);
            write_cstr(out, &client_text::encode(&text), "an error field")?;
        }
        out.put_u8(0);
        Ok(())
    });
    // Only a text past the i32 length field fails: the client then gets
    // no message rather than a broken one.
    if written.is_err() {
        out.clear();
    }
    out.freeze()
}

/// A protocol 2.0 error, what a client older than 3.0 reads: `E`, the
/// text, a NUL; no length word.
pub fn protocol_2_error(text: &str) -> Vec<u8> {
    let text = without_nul(text);
    let mut out = Vec::with_capacity(text.len() + 2);
    out.push(b'E');
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    out
}

/// `text` with each NUL as U+FFFD; borrowed when it has none.
fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{fffd}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// The fields of an ErrorResponse body, for reading severity and SQLSTATE
/// of errors the server sends.
pub fn error_fields(frame: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut body = frame.get(HEADER_LEN..).unwrap_or_default();
    std::iter::from_fn(move || {
        let (&code, rest) = body.split_first()?;
        if code == 0 {
            return None;
        }
        let (value, rest) = cstr(rest)?;
        body = rest;
        Some((code, value))
    })
}

/// True for a FATAL or PANIC error: the server closes after it.
pub fn is_fatal(frame: &[u8]) -> bool {
    error_fields(frame).any(|(c, v)| c == b'V' && (v == b"FATAL" || v == b"PANIC"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_reads_back_an_error() {
        let e = error_response(Severity::Fatal, "08P01", "bad", Some("why"));
        assert_eq!(e[0], b'E');
        let len = i32::from_be_bytes([e[1], e[2], e[3], e[4]]) as usize;
        assert_eq!(len + 1, e.len());
        let fields: Vec<_> = error_fields(&e).collect();
        assert!(fields.contains(&(b'C', &b"08P01"[..])));
        assert!(fields.contains(&(b'M', &b"bad"[..])));
        assert!(fields.contains(&(b'H', &b"why"[..])));
        assert!(is_fatal(&e));
        assert!(!is_fatal(&error_response(
            Severity::Error,
            "22012",
            "x",
            None
        )));
    }

    #[test]
    fn a_quoted_client_text_goes_back_as_the_clients_bytes() {
        // 表 in SJIS (0x95 0x5C) and ﾃｩ (0xC3 0xA9, é read as UTF-8), as a
        // client in SJIS sent them.
        let sjis = b"\x95\x5c \xc3\xa9";
        let read = client_text::decode(sjis);
        let e = error_response(
            Severity::Error,
            "0A000",
            &format!("thread \"{read}\""),
            Some(&read),
        );
        let fields: Vec<_> = error_fields(&e).collect();
        assert!(fields.contains(&(b'M', &b"thread \"\x95\x5c \xc3\xa9\""[..])));
        assert!(fields.contains(&(b'H', &sjis[..])));
    }

    #[test]
    fn reading_garbage_fields_stops_cleanly() {
        assert_eq!(error_fields(b"E\0\0\0\x08Sxx").count(), 0);
        assert_eq!(error_fields(b"E").count(), 0);
    }
}
