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

use super::messages::bind::write_bind;
use super::messages::extended_query::{write_close, write_execute, write_parse, NO_PARAM_TYPES};
use super::messages::frontend::Target;
use super::messages::write::EncodeError;

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

impl Injection {
    /// Close (statement), Parse, Bind, Execute, Close (portal), Close
    /// (statement): answered as [`ANSWERS`] says.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let name = NAME.as_bytes();
        let mut out = BytesMut::with_capacity(self.sql.len() + 64 * (self.params.len() + 2));
        write_close(&mut out, Target::Statement, name)?;
        write_parse(&mut out, name, self.sql.as_bytes(), NO_PARAM_TYPES)?;
        // Every parameter and result as text.
        write_bind(
            &mut out,
            name,
            name,
            &[0],
            self.params.iter().map(|p| p.as_deref().map(str::as_bytes)),
            &[0],
        )?;
        write_execute(&mut out, name, 0)?;
        write_close(&mut out, Target::Portal, name)?;
        write_close(&mut out, Target::Statement, name)?;
        Ok(Vec::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::connection::messages;
    use crate::wire::messages::frontend::Frontend;

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
