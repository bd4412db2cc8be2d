//! A socket whose reads and writes all end by one deadline, however
//! slowly the peer's bytes come: each call waits at most the time left,
//! and once it is gone every call fails with `TimedOut`. A socket's own
//! timeouts bound one wait each, which a peer sending a byte just inside
//! every wait never meets.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `sock`, read and written until `deadline`. Each call leaves the socket's
/// read or write timeout at what was left then.
pub struct DeadlineSocket<'a> {
    sock: &'a TcpStream,
    deadline: Instant,
}

impl<'a> DeadlineSocket<'a> {
    pub fn new(sock: &'a TcpStream, deadline: Instant) -> DeadlineSocket<'a> {
        DeadlineSocket { sock, deadline }
    }

    fn time_left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the deadline has passed",
            ));
        }
        Ok(left)
    }
}

impl Read for DeadlineSocket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.sock.set_read_timeout(Some(self.time_left()?))?;
        (&*self.sock).read(buf)
    }
}

impl Write for DeadlineSocket<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.set_write_timeout(Some(self.time_left()?))?;
        (&*self.sock).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
