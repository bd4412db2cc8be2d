//! The side of a connection a relay thread reads: the socket, the bytes
//! read from it and not yet routed, and the message streaming through.
//!
//! A session has two of them, one per direction, each owned by the thread
//! that reads it. Writes to a socket come from the other direction's
//! thread (a client's answers are relayed by the server-side thread), so a
//! connection holds its socket by a shared handle and never writes to it.

use std::io::Read;
use std::ops::Deref;
use std::time::Instant;

use bytes::BytesMut;

use super::client_stream::ClientStream;
use super::first_packet::fill_before;
use super::read_buffer::{Passing, ReadBuffer};

/// One direction of a session as its relay reads it.
pub struct Connection<S> {
    socket: S,
    buffer: ReadBuffer,
    /// A large message whose body is still arriving and goes on (or is
    /// dropped) as it does, never buffered whole.
    passing: Option<Passing>,
}

impl<S> Connection<S>
where
    S: Deref,
    for<'a> &'a S::Target: Read,
{
    /// Reads `socket`, starting with the bytes that arrived before the
    /// relay began (`early`).
    pub fn new(socket: S, early: &[u8]) -> Self {
        let mut buffer = ReadBuffer::default();
        buffer.bytes.extend_from_slice(early);
        Connection {
            socket,
            buffer,
            passing: None,
        }
    }

    /// Reads once: the byte count, 0 when the peer closed.
    pub fn read(&mut self) -> std::io::Result<usize> {
        self.buffer.fill(&*self.socket)
    }

    /// Bytes read and not yet routed.
    pub fn buffered(&self) -> &[u8] {
        &self.buffer.bytes
    }

    /// The buffered bytes, for a relay that splits messages off them.
    pub fn buffered_mut(&mut self) -> &mut BytesMut {
        &mut self.buffer.bytes
    }

    /// Drops the first `n` buffered bytes (routed).
    pub fn consume(&mut self, n: usize) {
        let _ = self.buffer.bytes.split_to(n);
    }

    /// The last message routed continues past the buffer: its remaining
    /// bytes stream on as they are read (or are dropped).
    pub fn stream_on(&mut self, passing: Option<Passing>) {
        self.passing = passing;
    }

    /// Hands the buffered part of a streaming message to `send` (unless it
    /// is dropped). True while more of it is still to come: nothing else
    /// can be framed until it has passed.
    pub fn pass_streaming(
        &mut self,
        send: impl FnOnce(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        let Some(passing) = self.passing.as_mut() else {
            return Ok(false);
        };
        self.buffer.pass(passing, send)?;
        if passing.left > 0 {
            return Ok(true);
        }
        self.passing = None;
        Ok(false)
    }

    /// Gives a large allocation back once everything in it was routed.
    pub fn shrink_if_drained(&mut self) {
        self.buffer.shrink_if_drained();
    }

    pub fn socket(&self) -> &S::Target {
        &self.socket
    }
}

impl<S: Deref<Target = ClientStream>> Connection<S> {
    /// Reads once, given up at `deadline` (startup and authentication).
    pub fn read_before(&mut self, deadline: Instant) -> std::io::Result<usize> {
        fill_before(&mut self.buffer, &self.socket, deadline)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::sync::Mutex;

    use super::*;

    /// A socket handle whose reads come from a byte string.
    struct Script(Mutex<Cursor<Vec<u8>>>);

    impl Read for &Script {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.lock() {
                Ok(mut c) => c.read(buf),
                Err(_) => Err(std::io::ErrorKind::Other.into()),
            }
        }
    }

    fn connection(bytes: &[u8]) -> Connection<Box<Script>> {
        Connection::new(
            Box::new(Script(Mutex::new(Cursor::new(bytes.to_vec())))),
            b"early",
        )
    }

    #[test]
    fn early_bytes_come_first_and_reads_append() {
        let mut c = connection(b"-read");
        assert_eq!(c.buffered(), b"early");
        assert_eq!(c.read().unwrap(), 5);
        assert_eq!(c.buffered(), b"early-read");
        c.consume(6);
        assert_eq!(c.buffered(), b"read");
        assert_eq!(c.read().unwrap(), 0, "end of file");
    }

    #[test]
    fn a_streaming_message_passes_before_anything_else_is_framed() {
        let mut c = connection(b"6789next");
        c.consume(3);
        c.stream_on(Some(Passing {
            left: 6,
            forward: true,
        }));
        let mut sent = Vec::new();
        assert!(c
            .pass_streaming(|b| {
                sent.extend_from_slice(b);
                Ok(())
            })
            .unwrap());
        assert_eq!((&sent[..], c.buffered()), (&b"ly"[..], &b""[..]));
        c.read().unwrap();
        assert!(!c
            .pass_streaming(|b| {
                sent.extend_from_slice(b);
                Ok(())
            })
            .unwrap());
        assert_eq!((&sent[..], c.buffered()), (&b"ly6789"[..], &b"next"[..]));
        assert!(
            !c.pass_streaming(|_| panic!("nothing streams")).unwrap(),
            "the message is through"
        );
    }
}
