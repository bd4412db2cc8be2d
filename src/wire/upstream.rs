//! The connection to PostgreSQL: TCP, or a Unix-domain socket when the
//! server is on the same host (the kernel's local-socket path is cheaper
//! than loopback TCP, and the relay is bound by system calls).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix, TcpStream, UnixStream};

/// Where the upstream server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamAddr {
    /// `host:port`.
    Tcp(String),
    /// The socket file, e.g. `/var/run/postgresql/.s.PGSQL.5432`.
    Unix(String),
}

impl UpstreamAddr {
    pub async fn connect(&self) -> io::Result<(UpRead, UpWrite)> {
        Ok(match self {
            UpstreamAddr::Tcp(addr) => {
                let s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                (UpRead::Tcp(r), UpWrite::Tcp(w))
            }
            UpstreamAddr::Unix(path) => {
                let (r, w) = UnixStream::connect(path).await?.into_split();
                (UpRead::Unix(r), UpWrite::Unix(w))
            }
        })
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

/// The read half of an upstream connection.
pub enum UpRead {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

/// The write half of an upstream connection.
pub enum UpWrite {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl AsyncRead for UpRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpRead::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            UpRead::Unix(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpWrite::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            UpWrite::Unix(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpWrite::Tcp(w) => Pin::new(w).poll_flush(cx),
            UpWrite::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpWrite::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            UpWrite::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
