//! The untyped first packet of a connection: SSLRequest, GSSENCRequest,
//! CancelRequest or StartupMessage. It has no type byte, only a length and
//! a 4-byte code, so it is framed apart from everything that follows. Read
//! from a client; a StartupMessage and a CancelRequest are also written to
//! the server.

use bytes::{BufMut, BytesMut};

use super::read::{cstr, read_i32};
use super::write::{write_counted, write_cstr, EncodeError};

/// Startup packets are small; PostgreSQL itself caps them at 10000 bytes.
pub const MAX_STARTUP_LEN: usize = 10_000;

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
/// Protocol 3.0, the version the proxy itself speaks to the server.
const PROTOCOL_3_0: u32 = 3 << 16;

/// What the client opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstPacket {
    SslRequest,
    GssEncRequest,
    /// Process id and secret key of the backend to cancel (the key is 4
    /// bytes in protocol 3.0, up to 256 in 3.2; kept verbatim).
    Cancel {
        pid: i32,
        key: Vec<u8>,
    },
    /// A protocol 3.x startup with its parameters, and the raw packet so it
    /// can be forwarded byte for byte.
    Startup(StartupMessage),
    /// A startup in a protocol version PostgreSQL does not speak (2.0 and
    /// older, 4.0 and newer), answered in that version's own shape.
    Unsupported(UnsupportedStartup),
}

/// A StartupMessage of an unsupported protocol version, kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedStartup {
    pub major: u16,
    pub minor: u16,
    pub raw: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupMessage {
    pub major: u16,
    pub minor: u16,
    pub params: Vec<(String, String)>,
    pub raw: Vec<u8>,
}

impl StartupMessage {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The role, as PostgreSQL reads it.
    pub fn user(&self) -> &str {
        self.param("user").unwrap_or("")
    }

    /// The database; PostgreSQL defaults it to the user name.
    pub fn database(&self) -> &str {
        self.param("database").unwrap_or_else(|| self.user())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartupError {
    /// The length word is out of range (a client's Terminate sent before
    /// any StartupMessage reads as 1476395008). PostgreSQL only logs this
    /// and closes without a word.
    #[error("invalid length of startup packet: {0}")]
    BadLength(i32),
    /// A CancelRequest too short to hold a process id and key; logged and
    /// closed without a word, as PostgreSQL does.
    #[error("invalid length of cancel request: {0}")]
    BadCancelLength(usize),
    /// A StartupMessage whose parameters do not read; PostgreSQL tells the
    /// client (FATAL 08P01).
    #[error("invalid startup packet layout: {0}")]
    Malformed(&'static str),
}

impl StartupError {
    /// Whether PostgreSQL answers this with an error the client is sent
    /// (otherwise only its own log hears of it).
    pub fn is_told(&self) -> bool {
        matches!(self, StartupError::Malformed(_))
    }
}

/// Frames the first packet: `Ok(None)` until all of it is buffered.
pub fn peek_len(buf: &[u8]) -> Result<Option<usize>, StartupError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if !(8..=MAX_STARTUP_LEN as i32).contains(&len) {
        return Err(StartupError::BadLength(len));
    }
    let len = len as usize;
    Ok((buf.len() >= len).then_some(len))
}

/// Decodes a whole first packet (length prefix included), as
/// [`peek_len`] framed it.
pub fn parse(packet: &[u8]) -> Result<FirstPacket, StartupError> {
    let bad_length = || StartupError::BadLength(i32::try_from(packet.len()).unwrap_or(i32::MAX));
    let mut body = packet.get(4..).ok_or_else(bad_length)?;
    let code = read_i32(&mut body, "startup code").map_err(|_| bad_length())? as u32;
    match code {
        SSL_REQUEST => Ok(FirstPacket::SslRequest),
        GSSENC_REQUEST => Ok(FirstPacket::GssEncRequest),
        CANCEL_REQUEST => {
            let bad_cancel = || StartupError::BadCancelLength(packet.len());
            if body.len() < 8 {
                return Err(bad_cancel());
            }
            let pid = read_i32(&mut body, "cancel pid").map_err(|_| bad_cancel())?;
            Ok(FirstPacket::Cancel {
                pid,
                key: body.to_vec(),
            })
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Ok(FirstPacket::Unsupported(UnsupportedStartup {
                    major,
                    minor,
                    raw: packet.to_vec(),
                }));
            }
            Ok(FirstPacket::Startup(StartupMessage {
                major,
                minor,
                params: parse_params(body)?,
                raw: packet.to_vec(),
            }))
        }
    }
}

/// Appends a protocol 3.0 StartupMessage with `params`.
pub fn write_startup_message<'a>(
    out: &mut BytesMut,
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), EncodeError> {
    write_counted(out, |out| {
        out.put_u32(PROTOCOL_3_0);
        for (name, value) in params {
            write_cstr(out, name.as_bytes(), "a startup parameter name")?;
            write_cstr(out, value.as_bytes(), "a startup parameter value")?;
        }
        out.put_u8(0);
        Ok(())
    })
}

/// Appends a CancelRequest for the backend `pid` with its secret `key`.
pub fn write_cancel_request(out: &mut BytesMut, pid: i32, key: &[u8]) -> Result<(), EncodeError> {
    write_counted(out, |out| {
        out.put_u32(CANCEL_REQUEST);
        out.put_i32(pid);
        out.put_slice(key);
        Ok(())
    })
}

fn parse_params(mut body: &[u8]) -> Result<Vec<(String, String)>, StartupError> {
    let mut params = Vec::new();
    loop {
        let (key, rest) = cstr(body).ok_or(StartupError::Malformed("unterminated name"))?;
        if key.is_empty() {
            return Ok(params);
        }
        let (value, rest) = cstr(rest).ok_or(StartupError::Malformed("unterminated value"))?;
        params.push((
            String::from_utf8_lossy(key).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
        body = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: u32, body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 8) as i32).to_be_bytes().to_vec();
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn decodes_startup_parameters() {
        let p = packet(
            196_608,
            b"user\0alice\0database\0db1\0application_name\0app\0\0",
        );
        assert_eq!(peek_len(&p).unwrap(), Some(p.len()));
        let FirstPacket::Startup(s) = parse(&p).unwrap() else {
            panic!("not a startup")
        };
        assert_eq!((s.user(), s.database()), ("alice", "db1"));
        assert_eq!(s.param("application_name"), Some("app"));
        assert_eq!(s.raw, p);
    }

    #[test]
    fn database_defaults_to_user() {
        let p = packet(196_608, b"user\0bob\0\0");
        let FirstPacket::Startup(s) = parse(&p).unwrap() else {
            panic!("not a startup")
        };
        assert_eq!(s.database(), "bob");
    }

    #[test]
    fn recognizes_negotiation_and_cancel() {
        assert_eq!(
            parse(&packet(SSL_REQUEST, b"")).unwrap(),
            FirstPacket::SslRequest
        );
        assert_eq!(
            parse(&packet(GSSENC_REQUEST, b"")).unwrap(),
            FirstPacket::GssEncRequest
        );
        let c = parse(&packet(CANCEL_REQUEST, &[0, 0, 0, 7, 1, 2, 3, 4])).unwrap();
        assert_eq!(
            c,
            FirstPacket::Cancel {
                pid: 7,
                key: vec![1, 2, 3, 4]
            }
        );
    }

    #[test]
    fn other_protocol_versions_are_kept_to_be_answered_in_their_shape() {
        for (major, minor) in [(2, 0), (1, 0), (9, 9)] {
            let p = packet((major << 16) | minor, b"user\0x\0\0");
            let parsed = parse(&p).unwrap();
            let expected = UnsupportedStartup {
                major: major as u16,
                minor: minor as u16,
                raw: p,
            };
            assert_eq!(parsed, FirstPacket::Unsupported(expected));
        }
    }

    #[test]
    fn garbage_is_refused_and_only_a_bad_layout_is_told() {
        // A Terminate sent before any StartupMessage.
        let terminate = peek_len(b"X\0\0\0\x04").unwrap_err();
        assert_eq!(terminate, StartupError::BadLength(1_476_395_008));
        assert!(!terminate.is_told());
        assert!(peek_len(b"GET / HTTP/1.1\r\n").is_err());
        assert!(peek_len(&[0, 0, 0, 2]).is_err());
        assert_eq!(peek_len(&[0, 0]).unwrap(), None);
        let short_cancel = parse(&packet(CANCEL_REQUEST, &[0, 0, 0, 7])).unwrap_err();
        assert_eq!(short_cancel, StartupError::BadCancelLength(12));
        assert!(!short_cancel.is_told());
        let layout = parse(&packet(196_608, b"user\0x")).unwrap_err();
        assert!(layout.is_told(), "{layout}");
    }

    #[test]
    fn written_startup_and_cancel_packets_read_back() {
        let mut out = BytesMut::new();
        write_startup_message(&mut out, [("user", "u"), ("database", "d")]).unwrap();
        assert_eq!(peek_len(&out).unwrap(), Some(out.len()));
        let FirstPacket::Startup(s) = parse(&out).unwrap() else {
            panic!("not a startup")
        };
        assert_eq!((s.major, s.minor, s.user(), s.database()), (3, 0, "u", "d"));
        let mut out = BytesMut::new();
        write_cancel_request(&mut out, 7, &[1, 2, 3, 4]).unwrap();
        assert_eq!(
            parse(&out).unwrap(),
            FirstPacket::Cancel {
                pid: 7,
                key: vec![1, 2, 3, 4]
            }
        );
        assert!(write_startup_message(&mut out, [("user", "a\0b")]).is_err());
    }
}
