//! Client messages, typed: the frontend half of the protocol as the
//! tracker reads it. Each variant borrows from the framed bytes; nothing is
//! copied, and the frame itself is what gets forwarded.
//!
//! A tag means different things in each direction (`D` is Describe here
//! and DataRow from the server), which is why each direction has its own
//! type.

use super::bind::Bind;
use super::read::{cstr, long_cstr, HEADER_LEN};

/// Which object a Describe or Close names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Statement,
    Portal,
}

/// One client message after startup, borrowed from its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frontend<'a> {
    Parse {
        name: &'a [u8],
        sql: &'a [u8],
        /// The parameter-type section, as sent.
        param_types: &'a [u8],
    },
    Bind(Bind<'a>),
    Execute {
        portal: &'a [u8],
    },
    Describe {
        target: Target,
        name: &'a [u8],
    },
    Close {
        target: Target,
        name: &'a [u8],
    },
    Query {
        sql: &'a [u8],
    },
    Sync,
    Flush,
    FunctionCall,
    Terminate,
    /// CopyData: part of a COPY the server drives.
    CopyData,
    /// CopyDone or CopyFail: the client's end of a COPY FROM STDIN.
    CopyEnd,
    /// A message whose body does not read as its tag says (the server
    /// rejects it), or a tag the tracker has no use for.
    Other(u8),
}

impl<'a> Frontend<'a> {
    /// Reads one complete frame (header included).
    pub fn read(frame: &'a [u8]) -> Frontend<'a> {
        let Some(&tag) = frame.first() else {
            return Frontend::Other(0);
        };
        let body = frame.get(HEADER_LEN..).unwrap_or_default();
        Self::read_body(tag, body).unwrap_or(Frontend::Other(tag))
    }

    fn read_body(tag: u8, body: &'a [u8]) -> Option<Frontend<'a>> {
        Some(match tag {
            b'P' => {
                let (name, rest) = cstr(body)?;
                let (sql, param_types) = long_cstr(rest)?;
                Frontend::Parse {
                    name,
                    sql,
                    param_types,
                }
            }
            b'B' => Frontend::Bind(Bind::read_body(body).ok()?),
            b'E' => Frontend::Execute {
                portal: cstr(body)?.0,
            },
            b'D' | b'C' => {
                let (&which, rest) = body.split_first()?;
                let target = match which {
                    b'S' => Target::Statement,
                    b'P' => Target::Portal,
                    _ => return None,
                };
                let name = cstr(rest)?.0;
                if tag == b'D' {
                    Frontend::Describe { target, name }
                } else {
                    Frontend::Close { target, name }
                }
            }
            b'Q' => Frontend::Query {
                sql: long_cstr(body)?.0,
            },
            b'S' => Frontend::Sync,
            b'H' => Frontend::Flush,
            b'F' => Frontend::FunctionCall,
            b'X' => Frontend::Terminate,
            b'd' => Frontend::CopyData,
            b'c' | b'f' => Frontend::CopyEnd,
            other => Frontend::Other(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::connection::message as msg;
    use crate::wire::messages::extended_query::parse_frame;

    #[test]
    fn reads_each_message() {
        let p = msg(b'P', b"s1\0select 1\0\0\0");
        assert_eq!(
            Frontend::read(&p),
            Frontend::Parse {
                name: b"s1",
                sql: b"select 1",
                param_types: b"\0\0"
            }
        );
        let f = parse_frame(b"s1", b"select 1", b"\0\0").unwrap();
        assert_eq!(f, p);
        assert!(matches!(
            Frontend::read(&msg(b'B', b"p\0s1\0\0\0")),
            Frontend::Bind(Bind {
                portal: b"p",
                statement: b"s1",
                ..
            })
        ));
        assert_eq!(
            Frontend::read(&msg(b'C', b"Ss1\0")),
            Frontend::Close {
                target: Target::Statement,
                name: b"s1"
            }
        );
        assert_eq!(
            Frontend::read(&msg(b'D', b"P\0")),
            Frontend::Describe {
                target: Target::Portal,
                name: b""
            }
        );
        assert_eq!(Frontend::read(&msg(b'S', b"")), Frontend::Sync);
        assert_eq!(Frontend::read(&msg(b'X', b"")), Frontend::Terminate);
    }

    #[test]
    fn malformed_bodies_are_other() {
        assert_eq!(Frontend::read(&msg(b'P', b"no-nul")), Frontend::Other(b'P'));
        assert_eq!(Frontend::read(&msg(b'C', b"Xs\0")), Frontend::Other(b'C'));
        assert_eq!(Frontend::read(&[]), Frontend::Other(0));
    }
}
