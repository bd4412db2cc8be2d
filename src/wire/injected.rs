//! A statement of the proxy's own, run by the server just ahead of a
//! client's Bind, inside the client's transaction and in the same round
//! trip: the check that must hold when the client's statement commits is
//! made by the server, where it commits.
//!
//! The statement and its portal have names of their own (never the
//! unnamed ones the client may be using), closed before and after, so the
//! client's prepared statements and portals are untouched and nothing
//! outlives the check (a transaction pooler behind the proxy sees one
//! self-contained group of messages). Parameters travel as text values,
//! never as SQL. Every answer is the proxy's and never reaches the
//! client, but for an error: the server then skips the client's Bind and
//! whatever follows up to Sync, so that error is the client's answer.

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use postgres_protocol::IsNull;

/// The name of the proxy's statement and portal.
const NAME: &str = "resumeguard_injected";

/// A statement to run ahead of a Bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// The statement: fixed text, every value a `$n` parameter.
    pub sql: String,
    /// The parameters, as text (`None`: NULL).
    pub params: Vec<Option<String>>,
}

/// The server answers to [`Injection::encode`]'s messages, in order.
pub const ANSWERS: [Answer; 6] = [
    Answer::Close,
    Answer::Parse,
    Answer::Bind,
    Answer::Execute,
    Answer::Close,
    Answer::Close,
];

/// What one of the injected messages gets back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Close,
    Parse,
    Bind,
    Execute,
}

/// A parameter or the statement could not be encoded (a NUL byte).
#[derive(Debug, thiserror::Error)]
#[error("the proxy's statement cannot be sent: {0}")]
pub struct EncodeError(String);

impl Injection {
    /// Close (statement), Parse, Bind, Execute, Close (portal), Close
    /// (statement): answered as [`ANSWERS`] says.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = BytesMut::with_capacity(self.sql.len() + 64 * (self.params.len() + 2));
        let io = |e: std::io::Error| EncodeError(e.to_string());
        frontend::close(b'S', NAME, &mut out).map_err(io)?;
        frontend::parse(NAME, &self.sql, std::iter::empty(), &mut out).map_err(io)?;
        frontend::bind(
            NAME,
            NAME,
            std::iter::once(0i16),
            self.params.iter(),
            |value, buf| match value {
                Some(text) => {
                    buf.extend_from_slice(text.as_bytes());
                    Ok(IsNull::No)
                }
                None => Ok(IsNull::Yes),
            },
            std::iter::once(0i16),
            &mut out,
        )
        .map_err(|e| match e {
            frontend::BindError::Conversion(e) => EncodeError(e.to_string()),
            frontend::BindError::Serialization(e) => EncodeError(e.to_string()),
        })?;
        frontend::execute(NAME, 0, &mut out).map_err(io)?;
        frontend::close(b'P', NAME, &mut out).map_err(io)?;
        frontend::close(b'S', NAME, &mut out).map_err(io)?;
        Ok(out.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::messages;
    use crate::wire::frontend::Frontend;

    #[test]
    fn encodes_six_framed_messages_with_the_values_as_parameters() {
        let hostile = "t'); DROP TABLE x; --\u{1b}[31m";
        let inj = Injection {
            sql: "SELECT f($1, $2)".into(),
            params: vec![Some(hostile.into()), None],
        };
        let bytes = inj.encode().unwrap();
        let frames = messages(&bytes);
        for frame in &frames {
            if let Frontend::Parse { name, sql, .. } = Frontend::read(frame) {
                assert_eq!(name, NAME.as_bytes());
                assert_eq!(sql, b"SELECT f($1, $2)");
            }
        }
        let tags: Vec<u8> = frames.iter().map(|m| m[0]).collect();
        assert_eq!(tags, b"CPBECC");
        assert_eq!(tags.len(), ANSWERS.len());
        // The value is in the Bind, as bytes, not in any SQL text.
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(text.matches("DROP TABLE").count(), 1);
    }

    #[test]
    fn a_nul_in_the_statement_is_refused() {
        let inj = Injection {
            sql: "SELECT 1\0".into(),
            params: vec![],
        };
        assert!(inj.encode().is_err());
    }
}
