//! The connection to PostgreSQL: TCP, or a Unix-domain socket when the
//! server is on the same host (the kernel's local-socket path is cheaper
//! than loopback TCP, and the relay is bound by system calls).
//!
//! Either may carry TLS (see `upstream_tls.rs`; over TCP only).
//!
//! Both directions of a session use the one socket through `&self`: two
//! relay threads with a blocking socket, or an event loop with a
//! non-blocking one (see `session.rs`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::socket_io;
use super::tls_stream::TlsStream;

/// Where the upstream server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamAddr {
    /// `host:port`.
    Tcp(String),
    /// The socket file, e.g. `/var/run/postgresql/.s.PGSQL.5432`.
    Unix(String),
}

impl UpstreamAddr {
    /// Connects, giving up after `timeout` per resolved TCP address (a
    /// local socket file answers or fails at once).
    pub fn connect(&self, timeout: Duration) -> io::Result<Upstream> {
        match self {
            UpstreamAddr::Tcp(addr) => {
                let mut last = None;
                for a in addr.to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            return Ok(Upstream::Tcp(s));
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{addr} resolves to no address"),
                    )
                }))
            }
            UpstreamAddr::Unix(path) => Ok(Upstream::Unix(UnixStream::connect(path)?)),
        }
    }
}

impl std::fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamAddr::Tcp(a) => f.write_str(a),
            UpstreamAddr::Unix(p) => write!(f, "unix:{p}"),
        }
    }
}

/// One upstream connection, read by one side of a session's relay and
/// written by the other.
pub enum Upstream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream>),
}

/// Read through a shared reference, as `&TcpStream` is.
impl Read for &Upstream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Upstream::Tcp(s) => socket_io::recv(s, buf),
            Upstream::Unix(s) => socket_io::recv(s, buf),
            Upstream::Tls(t) => (&**t).read(buf),
        }
    }
}

/// Written through a shared reference, as `&TcpStream` is.
impl Write for &Upstream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Upstream::Tcp(s) => socket_io::send(s, buf),
            Upstream::Unix(s) => socket_io::send(s, buf),
            Upstream::Tls(t) => (&**t).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Upstream {
    pub fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        Write::write_all(&mut &*self, buf)
    }

    /// Writes what the socket takes now (a non-blocking socket may take
    /// less, or nothing: `WouldBlock`).
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        Write::write(&mut &*self, buf)
    }

    /// The socket of a connection without TLS, for a relay that waits for
    /// its readiness itself.
    pub fn plain_fd(&self) -> Option<RawFd> {
        match self {
            Upstream::Tcp(s) => Some(s.as_raw_fd()),
            Upstream::Unix(s) => Some(s.as_raw_fd()),
            Upstream::Tls(_) => None,
        }
    }

    /// Makes reads and writes return at once (`WouldBlock`) or wait; a
    /// connection without TLS only.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Upstream::Tcp(s) => s.set_nonblocking(on),
            Upstream::Unix(s) => s.set_nonblocking(on),
            Upstream::Tls(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS connection stays blocking",
            )),
        }
    }

    /// Ends a TLS session cleanly before the socket closes.
    pub fn close_notify(&self) {
        if let Upstream::Tls(t) = self {
            t.close_notify();
        }
    }

    /// Tells the server the client sent its last byte, as PostgreSQL would
    /// see a client of its own finish: close_notify on TLS, then the
    /// socket's write side shut. The server still answers what it was sent
    /// and reads the end-of-file next; reads go on until it closes.
    pub fn half_close(&self) {
        self.close_notify();
        self.shutdown(Shutdown::Write);
    }

    /// Whether the server has closed its side (its end-of-file or a reset
    /// waits on the socket, after whatever bytes are still unread). Asks
    /// the kernel without reading, so nothing the relay reads next is
    /// taken; under TLS the same holds for the socket below it.
    pub fn peer_closed(&self) -> bool {
        let fd = match self {
            Upstream::Tcp(s) => s.as_raw_fd(),
            Upstream::Unix(s) => s.as_raw_fd(),
            Upstream::Tls(t) => t.socket().as_raw_fd(),
        };
        let mut probe = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd of an open socket this value owns, and a zero
        // timeout: poll only reads the socket's state.
        let ready = unsafe { libc::poll(&mut probe, 1, 0) };
        ready > 0 && probe.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Bounds each read (`None`: reads block).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Upstream::Tcp(s) => s.set_read_timeout(t),
            Upstream::Unix(s) => s.set_read_timeout(t),
            Upstream::Tls(tls) => tls.set_read_timeout(t),
        }
    }

    /// Shuts one or both directions down; a thread blocked reading the
    /// socket wakes up with end-of-file.
    pub fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Upstream::Tcp(s) => s.shutdown(how),
            Upstream::Unix(s) => s.shutdown(how),
            Upstream::Tls(t) => t.shutdown(how),
        };
    }
}
