//! Messages the proxy itself sends to a client. pgwire's codec encodes
//! them, so their layout is the protocol's, not ours.

use bytes::{Bytes, BytesMut};
use pgwire::messages::response::ErrorResponse;
use pgwire::messages::Message;

/// SQLSTATEs the proxy answers with.
pub mod sqlstate {
    /// A client or server broke the protocol.
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    /// The upstream server could not be reached.
    pub const CONNECTION_FAILURE: &str = "08006";
    /// The proxy is shutting down.
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    /// The proxy cannot follow the session's protocol state any more.
    pub const INTERNAL_ERROR: &str = "XX000";
    /// The proxy cannot start another session (threads or memory).
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
}

/// How bad an error is: FATAL ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Fatal,
}

/// An ErrorResponse, encoded. `S` and `V` carry the severity, `C` the
/// SQLSTATE, `M` the message; `H` (hint: what the client can do) when
/// given.
pub fn error_response(severity: Severity, code: &str, message: &str, hint: Option<&str>) -> Bytes {
    let sev = match severity {
        Severity::Error => "ERROR",
        Severity::Fatal => "FATAL",
    };
    let mut fields = vec![
        (b'S', sev.to_owned()),
        (b'V', sev.to_owned()),
        (b'C', code.to_owned()),
        (b'M', message.to_owned()),
    ];
    if let Some(h) = hint {
        fields.push((b'H', h.to_owned()));
    }
    let mut buf = BytesMut::new();
    // Encoding into a growable buffer fails only above the i32 length cap,
    // which a message built from these strings cannot reach.
    if ErrorResponse::new(fields).encode(&mut buf).is_err() {
        buf.clear();
    }
    buf.freeze()
}

/// The fields of an ErrorResponse body, for reading severity and SQLSTATE
/// of errors the server sends.
pub fn error_fields(frame: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut body = frame.get(5..).unwrap_or_default();
    std::iter::from_fn(move || {
        let (&code, rest) = body.split_first()?;
        if code == 0 {
            return None;
        }
        let (value, rest) = super::frame::cstr(rest)?;
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
    fn reading_garbage_fields_stops_cleanly() {
        assert_eq!(error_fields(b"E\0\0\0\x08Sxx").count(), 0);
        assert_eq!(error_fields(b"E").count(), 0);
    }
}
