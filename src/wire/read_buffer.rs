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
