//! Reads and writes of a socket without TLS, as direct system calls
//! (rustix). glibc's `recv` and `send` are cancellation points: in a
//! process with more than one thread, each call first and last updates
//! the calling thread's cancellation state with an atomic instruction,
//! and the relay makes four such calls per transaction. The proxy never
//! cancels a thread, so it has no use for that bookkeeping.

use std::io;
use std::os::fd::AsFd;

use rustix::net::{RecvFlags, SendFlags};

/// Reads what the socket holds, up to `buf`'s length: 0 at end of file.
pub fn recv(socket: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    let (got, _) = rustix::net::recv(socket, buf, RecvFlags::empty())?;
    Ok(got)
}

/// Writes what the socket takes of `buf` now (a peer that closed its end
/// is an error, never a SIGPIPE).
pub fn send(socket: impl AsFd, buf: &[u8]) -> io::Result<usize> {
    Ok(rustix::net::send(socket, buf, SendFlags::NOSIGNAL)?)
}

#[cfg(test)]
mod tests {
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn bytes_go_both_ways_and_end_of_file_reads_as_zero() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert_eq!(send(&client, b"hello").unwrap(), 5);
        let mut buf = [0u8; 16];
        assert_eq!(recv(&server, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
        client.shutdown(Shutdown::Write).unwrap();
        assert_eq!(recv(&server, &mut buf).unwrap(), 0);
    }

    #[test]
    fn a_socket_with_nothing_to_read_would_block() {
        let (a, _b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let err = recv(&a, &mut [0u8; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn writing_to_a_closed_peer_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let err = send(&a, b"x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
