//! Server messages, typed: the backend half of the protocol as the tracker
//! reads it, each variant borrowing from the framed bytes.

use super::error_response::is_fatal;
use super::read::{cstr, HEADER_LEN};

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
        let body = frame.get(HEADER_LEN..).unwrap_or_default();
        let typed = match tag {
            b'1' => Some(Backend::ParseComplete),
            b'2' => Some(Backend::BindComplete),
            b'3' => Some(Backend::CloseComplete),
            b'T' => Some(Backend::RowDescription),
            b'D' => Some(Backend::DataRow),
            b'C' => cstr(body).map(|(tag, _)| Backend::CommandComplete { tag }),
            b'E' => Some(Backend::ErrorResponse {
                fatal: is_fatal(frame),
            }),
            b'Z' => body
                .first()
                .map(|&status| Backend::ReadyForQuery { status }),
            b'S' => cstr(body).and_then(|(name, rest)| {
                let (value, _) = cstr(rest)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::connection::message as msg;
    use crate::wire::messages::error_response::{error_response, Severity};

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
}
