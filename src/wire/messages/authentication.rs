//! The SASL exchange's messages the proxy looks into: the server's
//! AuthenticationSASL (its list of mechanisms), rewritten when a mechanism
//! must not reach the client, and the client's SASLInitialResponse.

use bytes::{BufMut, BytesMut};

use super::read::{cstr, read_i32, HEADER_LEN};
use super::write::{write_cstr, write_message, EncodeError};

/// The authentication code of AuthenticationOk.
const OK: i32 = 0;
/// The authentication code of AuthenticationSASL.
const SASL: i32 = 10;

/// The code of an authentication request (`R`) and what follows it;
/// `None` for any other message.
fn authentication(frame: &[u8]) -> Option<(i32, &[u8])> {
    if frame.first() != Some(&b'R') {
        return None;
    }
    let mut body = frame.get(HEADER_LEN..)?;
    let code = read_i32(&mut body, "authentication code").ok()?;
    Some((code, body))
}

/// Whether `frame` is AuthenticationOk: the server accepted the login.
pub fn is_authentication_ok(frame: &[u8]) -> bool {
    authentication(frame).is_some_and(|(code, _)| code == OK)
}

/// The mechanism list of `frame` (NUL-terminated names, ended by an empty
/// one) when it is an AuthenticationSASL; `None` for any other message.
pub fn sasl_mechanism_list(frame: &[u8]) -> Option<&[u8]> {
    authentication(frame).and_then(|(code, list)| (code == SASL).then_some(list))
}

/// Appends an AuthenticationSASL offering `mechanisms`.
pub fn write_authentication_sasl<'a>(
    out: &mut BytesMut,
    mechanisms: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), EncodeError> {
    write_message(out, b'R', |out| {
        out.put_i32(SASL);
        for m in mechanisms {
            write_cstr(out, m, "a SASL mechanism")?;
        }
        out.put_u8(0);
        Ok(())
    })
}

/// A client's SASLInitialResponse: the mechanism it chose and its first
/// message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaslInitialResponse<'a> {
    pub mechanism: &'a [u8],
    pub data: &'a [u8],
}

impl<'a> SaslInitialResponse<'a> {
    /// Reads `frame` (a `p` message) as a SASLInitialResponse; `None` when
    /// it is not one. Exact: a mechanism name, a length and that many
    /// bytes, which no password message (one string) is.
    pub fn read(frame: &'a [u8]) -> Option<Self> {
        if frame.first() != Some(&b'p') {
            return None;
        }
        let (mechanism, mut rest) = cstr(frame.get(HEADER_LEN..)?)?;
        let len = read_i32(&mut rest, "SASL data length").ok()?;
        (usize::try_from(len).ok()? == rest.len()).then_some(SaslInitialResponse {
            mechanism,
            data: rest,
        })
    }
}
