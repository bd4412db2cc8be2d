//! The backend half of the protocol: server messages, typed as the
//! tracker reads them (borrowing from the framed bytes), and the messages
//! the proxy itself sends a client, encoded by pgwire's codec so their
//! layout is the protocol's, not ours.

use bytes::{Bytes, BytesMut};
use pgwire::messages::response::ErrorResponse;
use pgwire::messages::Message;

/// One server message, as the tracker reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend<'a> {
    ParseComplete,
    BindComplete,
    CloseComplete,
    RowDescription,
    DataRow,
    CommandComplete {
        /// The command tag without its NUL (`INSERT 0 1`, `PREPARE`).
        tag: &'a [u8],
    },
    ErrorResponse {
        /// FATAL or PANIC: the server closes next.
        fatal: bool,
    },
    ReadyForQuery {
        /// `I` idle, `T` in a transaction block, `E` failed.
        status: u8,
    },
    ParameterStatus {
        name: &'a [u8],
        value: &'a [u8],
    },
    BackendKeyData {
        pid: i32,
        key: &'a [u8],
    },
    /// Any other message, or one whose body does not read as its tag says.
    Other(u8),
}

impl<'a> Backend<'a> {
    /// Reads one complete frame (header included).
    pub fn read(frame: &'a [u8]) -> Backend<'a> {
        let tag = frame.first().copied().unwrap_or(0);
        let body = frame.get(5..).unwrap_or_default();
        let typed = match tag {
            b'1' => Some(Backend::ParseComplete),
            b'2' => Some(Backend::BindComplete),
            b'3' => Some(Backend::CloseComplete),
            b'T' => Some(Backend::RowDescription),
            b'D' => Some(Backend::DataRow),
            b'C' => super::frame::cstr(body).map(|(tag, _)| Backend::CommandComplete { tag }),
            b'E' => Some(Backend::ErrorResponse {
                fatal: is_fatal(frame),
            }),
            b'Z' => body
                .first()
                .map(|&status| Backend::ReadyForQuery { status }),
            b'S' => super::frame::cstr(body).and_then(|(name, rest)| {
                let (value, _) = super::frame::cstr(rest)?;
                Some(Backend::ParameterStatus { name, value })
            }),
            b'K' => body.get(..4).and_then(|pid| {
                Some(Backend::BackendKeyData {
                    pid: i32::from_be_bytes(pid.try_into().ok()?),
                    key: body.get(4..)?,
                })
            }),
            _ => None,
        };
        typed.unwrap_or(Backend::Other(tag))
    }
}

/// SQLSTATEs the proxy answers with.
pub mod sqlstate {
    /// A client or server broke the protocol.
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    /// The proxy refuses the connection (sqlserver rejected establishment
    /// of sqlconnection): what the client asks for cannot pass it.
    pub const REJECTED_CONNECTION: &str = "08004";
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

    use crate::wire::frame::message as msg;

    #[test]
    fn reads_server_messages() {
        assert_eq!(Backend::read(&msg(b'1', b"")), Backend::ParseComplete);
        assert_eq!(
            Backend::read(&msg(b'C', b"INSERT 0 1\0")),
            Backend::CommandComplete { tag: b"INSERT 0 1" }
        );
        assert_eq!(
            Backend::read(&msg(b'Z', b"T")),
            Backend::ReadyForQuery { status: b'T' }
        );
        assert_eq!(
            Backend::read(&msg(b'S', b"application_name\0a\0")),
            Backend::ParameterStatus {
                name: b"application_name",
                value: b"a"
            }
        );
        assert_eq!(
            Backend::read(&msg(b'K', &[0, 0, 0, 42, 9, 9])),
            Backend::BackendKeyData {
                pid: 42,
                key: &[9, 9]
            }
        );
        let fatal = error_response(Severity::Fatal, "57P01", "bye", None);
        assert_eq!(
            Backend::read(&fatal),
            Backend::ErrorResponse { fatal: true }
        );
        // Bodies that do not read as their tag says are Other.
        assert_eq!(Backend::read(&msg(b'C', b"no nul")), Backend::Other(b'C'));
        assert_eq!(Backend::read(&msg(b'Z', b"")), Backend::Other(b'Z'));
        assert_eq!(Backend::read(&[]), Backend::Other(0));
    }

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
