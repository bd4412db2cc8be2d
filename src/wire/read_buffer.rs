//! The buffer a relay thread reads a socket into. It offers the socket as
//! much room as recent reads used: a little for an idle or OLTP session
//! (little resident memory per connection), doubling while reads fill it
//! (a large result streams in few system calls), halving when they stop.

use std::io::Read;

use bytes::BytesMut;

/// Smallest and largest room offered to one read.
const MIN_READ: usize = 2 * 1024;
const MAX_READ: usize = 256 * 1024;
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

/// Bytes read and not yet consumed, in `bytes`.
pub struct ReadBuffer {
    pub bytes: BytesMut,
    want: usize,
}

impl Default for ReadBuffer {
    fn default() -> Self {
        ReadBuffer {
            bytes: BytesMut::new(),
            want: MIN_READ,
        }
    }
}

impl ReadBuffer {
    /// Reads once from `from`, appending what arrived: the byte count, 0
    /// at end of file.
    pub fn fill(&mut self, mut from: impl Read) -> std::io::Result<usize> {
        let start = self.bytes.len();
        // Zeroed room (safe code cannot read into uninitialized memory);
        // only what this read may use.
        self.bytes.resize(start + self.want, 0);
        let read = from.read(&mut self.bytes[start..]);
        let n = *read.as_ref().unwrap_or(&0);
        self.bytes.truncate(start + n);
        if n == self.want {
            self.want = (self.want * 2).min(MAX_READ);
        } else if n < self.want / 4 {
            self.want = (self.want / 2).max(MIN_READ);
        }
        read
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
        let _ = self.bytes.split_to(n);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out `chunks` one per call.
    struct Chunks(Vec<Vec<u8>>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some(mut chunk) = (!self.0.is_empty()).then(|| self.0.remove(0)) else {
                return Ok(0);
            };
            let n = chunk.len().min(buf.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            if n < chunk.len() {
                self.0.insert(0, chunk.split_off(n));
            }
            Ok(n)
        }
    }

    #[test]
    fn appends_what_arrives_and_grows_while_reads_fill_it() {
        let mut rb = ReadBuffer::default();
        let mut src = Chunks(vec![b"abc".to_vec(), vec![7u8; 100_000]]);
        assert_eq!(rb.fill(&mut src).unwrap(), 3);
        assert_eq!(&rb.bytes[..], b"abc");
        let mut sizes = Vec::new();
        while rb.bytes.len() < 100_003 {
            sizes.push(rb.fill(&mut src).unwrap());
        }
        assert_eq!(sizes[..4], [2048, 4096, 8192, 16384]);
        assert_eq!(rb.bytes.len(), 100_003);
        assert_eq!(rb.fill(&mut src).unwrap(), 0);
        assert_eq!(rb.bytes.len(), 100_003, "end of file appends nothing");
    }

    #[test]
    fn passes_a_message_in_chunks_and_keeps_what_follows() {
        let mut rb = ReadBuffer::default();
        let mut passing = Passing {
            left: 10,
            forward: true,
        };
        let mut sent = Vec::new();
        rb.bytes.extend_from_slice(b"0123");
        rb.pass(&mut passing, |b| {
            sent.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!((passing.left, rb.bytes.len()), (6, 0));
        rb.bytes.extend_from_slice(b"456789next");
        rb.pass(&mut passing, |b| {
            sent.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(passing.left, 0);
        assert_eq!(&sent[..], b"0123456789");
        assert_eq!(&rb.bytes[..], b"next");
    }

    #[test]
    fn a_replaced_message_is_dropped_not_sent() {
        let mut rb = ReadBuffer::default();
        let mut passing = Passing {
            left: 3,
            forward: false,
        };
        rb.bytes.extend_from_slice(b"abcS");
        rb.pass(&mut passing, |_| panic!("dropped bytes are not sent"))
            .unwrap();
        assert_eq!((passing.left, &rb.bytes[..]), (0, &b"S"[..]));
    }

    #[test]
    fn small_reads_shrink_the_room_again() {
        let mut rb = ReadBuffer::default();
        let mut big = Chunks(vec![vec![1u8; 64 * 1024]]);
        while rb.fill(&mut big).unwrap() > 0 {}
        assert!(rb.want > MIN_READ);
        let _ = rb.bytes.split_to(rb.bytes.len());
        for _ in 0..10 {
            rb.fill(Chunks(vec![b"x".to_vec()])).unwrap();
        }
        assert_eq!(rb.want, MIN_READ);
        assert_eq!(rb.bytes.len(), 10);
    }
}
