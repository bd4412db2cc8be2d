//! The side of a connection a relay thread reads: the socket, the bytes
//! read from it and not yet routed, the message streaming through, and
//! the framing that splits those bytes into messages. One read and the
//! framing of what it brought happen here and in the socket's own file.
//!
//! A session has two of them, one per direction, each owned by whatever
//! reads it (a relay thread, or the event loop serving the session).
//! Writes to a socket come from the other direction (a client's answers
//! are relayed by the server side), so a connection holds its socket by a
//! shared handle and never writes to it.
//!
//! The read buffer offers the socket as much room as recent reads used: a
//! little for an idle or OLTP session (little resident memory per
//! connection), doubling while reads fill it (a large result streams in
//! few system calls), halving when they stop.
//!
//! PostgreSQL messages are a type byte and a big-endian i32 length that
//! counts itself but not the type byte. One socket read is not one
//! message, so every direction frames by that header before looking
//! inside.

use std::cell::RefCell;
use std::io::Read;
use std::ops::Deref;
use std::time::Instant;

use bytes::{Buf, BytesMut};

use super::client_stream::ClientStream;
use super::messages::read::HEADER_LEN;

/// Smallest and largest room offered to one read.
const MIN_READ: usize = 2 * 1024;
const MAX_READ: usize = 256 * 1024;
/// Reads offered at most this much room go through the reading thread's
/// scratch room (grown to the largest such read, zeroed once).
const SCRATCH_MAX: usize = 16 * 1024;
/// A drained buffer whose allocation grew past this is dropped.
const SHRINK_ABOVE: usize = 1024 * 1024;

/// A message larger than this whose body the guard does not read streams
/// through in chunks (at most one read each) instead of being buffered
/// whole: a session's buffers stay near this size, whatever the traffic.
pub const STREAM_ABOVE: usize = MAX_READ;

/// The rest of a message streaming past the guard: its bytes go on to the
/// peer as they arrive (or are dropped, when the guard replaced the
/// message), none of them buffered beyond one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passing {
    /// Bytes of the message still to come.
    pub left: usize,
    /// They go to the peer (else they are dropped).
    pub forward: bool,
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Bytes read and not yet consumed, in `bytes`.
pub struct ReadBuffer {
    pub bytes: BytesMut,
    want: usize,
    /// The last read filled all the room it was offered: more may wait.
    filled: bool,
}

impl Default for ReadBuffer {
    fn default() -> Self {
        ReadBuffer {
            bytes: BytesMut::new(),
            want: MIN_READ,
            filled: false,
        }
    }
}

impl ReadBuffer {
    /// Reads once from `from`, appending what arrived: the byte count, 0
    /// at end of file.
    pub fn fill(&mut self, from: impl Read) -> std::io::Result<usize> {
        let read = if self.want <= SCRATCH_MAX {
            SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
                Ok(mut room) => self.fill_through(&mut room, from),
                Err(_) => self.fill_in_place(from),
            })
        } else {
            self.fill_in_place(from)
        };
        let Ok(n) = read else {
            // Nothing arrived (a timeout, a non-blocking socket with
            // nothing to read): the room stays as recent reads sized it.
            self.filled = false;
            return read;
        };
        self.filled = n == self.want;
        if n == self.want {
            self.want = (self.want * 2).min(MAX_READ);
        } else if n < self.want / 4 {
            self.want = (self.want / 2).max(MIN_READ);
        }
        read
    }

    /// Reads into the thread's scratch room and appends what arrived: a
    /// copy of the bytes read, where zeroing room in `bytes` would write
    /// every byte offered.
    fn fill_through(&mut self, room: &mut Vec<u8>, mut from: impl Read) -> std::io::Result<usize> {
        if room.len() < self.want {
            room.resize(self.want, 0);
        }
        let n = from.read(&mut room[..self.want])?;
        let got = room[..self.want]
            .get(..n)
            .ok_or(std::io::ErrorKind::InvalidData)?;
        self.bytes.extend_from_slice(got);
        Ok(n)
    }

    /// Reads into zeroed room at the end of `bytes` (safe code cannot
    /// read into uninitialized memory): a large read, written once.
    fn fill_in_place(&mut self, mut from: impl Read) -> std::io::Result<usize> {
        let start = self.bytes.len();
        self.bytes.resize(start + self.want, 0);
        let read = from.read(&mut self.bytes[start..]);
        let n = *read.as_ref().unwrap_or(&0);
        self.bytes.truncate(start + n.min(self.want));
        read
    }

    /// Reads `client` once, given up at `deadline` (startup and
    /// authentication).
    pub fn fill_before(
        &mut self,
        client: &ClientStream,
        deadline: Instant,
    ) -> std::io::Result<usize> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        client.set_read_timeout(Some(left))?;
        self.fill(client)
    }

    /// Hands the buffered bytes of `passing`'s message to `send` (when
    /// they are forwarded) and consumes them; what follows the message
    /// stays. The message is through when `passing.left` is 0.
    pub fn pass(
        &mut self,
        passing: &mut Passing,
        send: impl FnOnce(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let n = passing.left.min(self.bytes.len());
        if passing.forward && n > 0 {
            send(&self.bytes[..n])?;
        }
        self.bytes.advance(n);
        passing.left -= n;
        Ok(())
    }

    /// Gives a large allocation back once everything in it was consumed.
    pub fn shrink_if_drained(&mut self) {
        if self.bytes.is_empty() && self.bytes.capacity() > SHRINK_ABOVE {
            self.bytes = BytesMut::new();
        }
    }
}

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

    /// The last read filled all the room it was offered, so more may be
    /// waiting; a shorter one emptied what the kernel held.
    pub fn read_filled(&self) -> bool {
        self.buffer.filled
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
        self.buffer.bytes.advance(n);
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
        self.buffer.fill_before(&self.socket, deadline)
    }
}

/// A complete message at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message type byte (`'P'`, `'B'`, `'D'`, ...).
    pub tag: u8,
    /// Total bytes of the message including the type byte.
    pub total_len: usize,
}

/// Why a buffer cannot be framed: the peer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is below 4 (it counts itself) or negative.
    #[error("invalid message length {declared} for message type {}", printable(*.tag))]
    BadLength { tag: u8, declared: i32 },
    /// The length field exceeds the configured ceiling.
    #[error(
        "message type {} declares {declared} bytes, above the limit of {max}",
        printable(*.tag)
    )]
    TooLarge {
        tag: u8,
        declared: usize,
        max: usize,
    },
}

fn printable(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("'{}'", tag as char)
    } else {
        format!("0x{tag:02x}")
    }
}

/// Looks at the front of `buf`: `Ok(Some)` when a whole message is there,
/// `Ok(None)` when more bytes are needed, `Err` when the header is invalid.
/// The length check happens as soon as the header is in, before any body
/// is buffered, so a 2 GiB header is refused without reading 2 GiB.
pub fn peek_frame(buf: &[u8], max_len: usize) -> Result<Option<FrameHeader>, FrameError> {
    Ok(peek_header(buf, max_len)?.filter(|h| buf.len() >= h.total_len))
}

/// Looks at the header at the front of `buf`: `Ok(Some)` as soon as the
/// header is in, whether or not the body is (a message too large to buffer
/// is streamed from here), `Ok(None)` before, `Err` when it is invalid.
pub fn peek_header(buf: &[u8], max_len: usize) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let tag = buf[0];
    let declared = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if declared < 4 {
        return Err(FrameError::BadLength { tag, declared });
    }
    let body_and_len = declared as usize;
    if body_and_len > max_len {
        return Err(FrameError::TooLarge {
            tag,
            declared: body_and_len,
            max: max_len,
        });
    }
    Ok(Some(FrameHeader {
        tag,
        total_len: body_and_len + 1,
    }))
}

/// A framed message (tag, length, body), for tests.
#[cfg(test)]
pub(crate) fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    crate::wire::messages::write::write_message(&mut out, tag, |out| {
        bytes::BufMut::put_slice(out, body);
        Ok(())
    })
    .expect("a test message fits its length field");
    out.to_vec()
}

/// The complete messages `bytes` holds, one after the other, for tests
/// (panics on anything else).
#[cfg(test)]
pub(crate) fn messages(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(h) = peek_frame(&bytes[at..], 1 << 20).unwrap() {
        out.push(&bytes[at..at + h.total_len]);
        at += h.total_len;
    }
    assert_eq!(at, bytes.len(), "trailing bytes after the last message");
    out
}

#[cfg(test)]
mod tests;
