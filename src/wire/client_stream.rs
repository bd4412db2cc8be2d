//! The client's connection: plain TCP, or TLS terminated here. Both relay
//! threads use it through `&ClientStream`, as they would a `&TcpStream`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::{Connection, ServerConfig, ServerConnection};

use super::sasl_plus::StripPlus;
use super::tls_stream::TlsStream;

/// The ALPN name of the PostgreSQL protocol (direct TLS, PostgreSQL 17).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// TLS towards clients: the proxy's certificate, and whether clients
/// must use it.
#[derive(Debug, Clone)]
pub struct ClientTls {
    pub config: Arc<ServerConfig>,
    /// A StartupMessage without TLS is refused.
    pub require: bool,
}

/// One client connection.
pub enum ClientStream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

impl ClientStream {
    /// Runs the server side of the TLS handshake on `sock`; `early` is
    /// what the client already sent of it (a direct-TLS ClientHello).
    /// With `direct`, the client must have negotiated ALPN "postgresql",
    /// as PostgreSQL requires of direct TLS. The socket's read timeout
    /// bounds the wait.
    pub fn accept_tls(
        sock: TcpStream,
        tls: &ClientTls,
        early: &[u8],
        direct: bool,
    ) -> io::Result<ClientStream> {
        let conn = ServerConnection::new(Arc::clone(&tls.config))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let stream = TlsStream::handshake(sock, Connection::Server(conn), early)?
            .with_outgoing_filter(Box::new(StripPlus::default()));
        if direct && stream.alpn_protocol().as_deref() != Some(ALPN_POSTGRESQL) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "direct TLS connection without ALPN \"postgresql\"",
            ));
        }
        Ok(ClientStream::Tls(Box::new(stream)))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    fn socket(&self) -> &TcpStream {
        match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(t) => t.socket(),
        }
    }

    /// Ends a TLS session cleanly before the socket closes.
    pub fn close_notify(&self) {
        if let ClientStream::Tls(t) = self {
            t.close_notify();
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(t)
    }

    /// Closes the socket in one or both directions; a thread blocked
    /// reading it wakes with end-of-file.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket().shutdown(how)
    }
}

impl Read for &ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => (&*s).read(buf),
            ClientStream::Tls(t) => (&**t).read(buf),
        }
    }
}

impl Write for &ClientStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => (&*s).write(buf),
            ClientStream::Tls(t) => (&**t).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
