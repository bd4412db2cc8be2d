//! The client's connection: plain TCP, or TLS terminated here. Both relay
//! threads use it through `&ClientStream`, as they would a `&TcpStream`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rustls::{Connection, ServerConfig, ServerConnection};

use super::socket_io;
use super::tls_config::{self, TlsConfigError, ALPN_POSTGRESQL};
use super::tls_stream::TlsStream;

/// TLS towards clients: the proxy's certificate, and whether clients
/// must use it. The certificate and key can be read again while the proxy
/// runs ([`ClientTls::reload`]); each handshake uses the latest that
/// loaded, sessions already encrypted keep theirs.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Arc<ArcSwap<ServerConfig>>,
    cert: PathBuf,
    key: PathBuf,
    /// A StartupMessage without TLS is refused.
    pub require: bool,
}

impl ClientTls {
    /// Loads the PEM certificate chain and key now.
    pub fn load(cert: &Path, key: &Path, require: bool) -> Result<ClientTls, TlsConfigError> {
        let config = tls_config::server_config(cert, key)?;
        Ok(ClientTls {
            config: Arc::new(ArcSwap::new(config)),
            cert: cert.to_owned(),
            key: key.to_owned(),
            require,
        })
    }

    /// Reads the certificate and key files again and, when they load as a
    /// matching pair, makes them the ones new handshakes present. On an
    /// error nothing changes.
    pub fn reload(&self) -> Result<(), TlsConfigError> {
        let config = tls_config::server_config(&self.cert, &self.key)?;
        self.config.store(config);
        Ok(())
    }

    /// The certificate file, for messages.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The configuration a handshake starting now uses.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }
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
    /// as PostgreSQL requires of direct TLS. The handshake finishes by
    /// `deadline` or fails with a timeout.
    pub fn accept_tls(
        sock: TcpStream,
        tls: &ClientTls,
        early: &[u8],
        direct: bool,
        deadline: Instant,
    ) -> io::Result<ClientStream> {
        let conn = ServerConnection::new(tls.config())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let stream = TlsStream::handshake_by(sock, Connection::Server(conn), early, deadline)?;
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

    /// The socket of a connection without TLS, for a relay that waits for
    /// its readiness itself (and makes it non-blocking).
    pub fn plain(&self) -> Option<&TcpStream> {
        match self {
            ClientStream::Plain(s) => Some(s),
            ClientStream::Tls(_) => None,
        }
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

    /// Bounds each read in all (a TLS record trickled in counts as one).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.set_read_timeout(t),
            ClientStream::Tls(tls) => tls.set_read_timeout(t),
        }
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
            ClientStream::Plain(s) => socket_io::recv(s, buf),
            ClientStream::Tls(t) => (&**t).read(buf),
        }
    }
}

impl Write for &ClientStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => socket_io::send(s, buf),
            ClientStream::Tls(t) => (&**t).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use rustls::pki_types::{CertificateDer, ServerName};
    use rustls::{ClientConfig, ClientConnection};

    use super::*;

    /// A self-signed certificate for localhost and its key, as PEM text.
    pub(crate) fn self_signed() -> (String, String) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        (ck.cert.pem(), ck.signing_key.serialize_pem())
    }

    /// A fresh directory for one test's files.
    pub(crate) fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rg-reload-{}-{tag}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A proxy certificate as `ClientTls`, its files in `tag`'s directory.
    pub(crate) fn proxy_tls(tag: &str) -> ClientTls {
        let dir = scratch(tag);
        let (cert, key) = self_signed();
        let (cert_path, key_path) = (dir.join("proxy.crt"), dir.join("proxy.key"));
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        ClientTls::load(&cert_path, &key_path, false).unwrap()
    }

    /// Runs a handshake in memory; the server's certificate, or why the
    /// client refused it.
    pub(crate) fn handshake(
        client: Arc<ClientConfig>,
        server: Arc<ServerConfig>,
    ) -> Result<CertificateDer<'static>, rustls::Error> {
        let name = ServerName::try_from("localhost").unwrap();
        let mut c = ClientConnection::new(client, name)?;
        let mut s = ServerConnection::new(server)?;
        for _ in 0..10 {
            if !c.is_handshaking() && !s.is_handshaking() {
                let chain = c.peer_certificates().unwrap_or_default();
                return Ok(chain[0].clone().into_owned());
            }
            let mut wire = Vec::new();
            c.write_tls(&mut wire).unwrap();
            s.read_tls(&mut &wire[..]).unwrap();
            s.process_new_packets()?;
            wire.clear();
            s.write_tls(&mut wire).unwrap();
            c.read_tls(&mut &wire[..]).unwrap();
            c.process_new_packets()?;
        }
        panic!("the handshake did not finish");
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn a_reload_presents_the_new_certificate_and_a_bad_one_keeps_the_old() {
        let dir = scratch("client-tls");
        let (cert, key) = (dir.join("proxy.crt"), dir.join("proxy.key"));
        let (first, first_key) = self_signed();
        std::fs::write(&cert, &first).unwrap();
        std::fs::write(&key, &first_key).unwrap();
        let tls = ClientTls::load(&cert, &key, false).unwrap();
        let shared = tls.clone(); // what the relay holds
        let anyone =
            tls_config::client_config(tls_config::Verify::Nothing, None, None, true).unwrap();
        let presented = || handshake(Arc::clone(&anyone), shared.config()).unwrap();
        assert_eq!(presented(), der(&first));

        let (second, second_key) = self_signed();
        std::fs::write(&cert, &second).unwrap();
        std::fs::write(&key, &second_key).unwrap();
        assert_eq!(presented(), der(&first), "files alone change nothing");
        tls.reload().unwrap();
        assert_eq!(presented(), der(&second));

        // A certificate whose key is not its own: refused, the last good
        // pair stays.
        let (third, _) = self_signed();
        std::fs::write(&cert, &third).unwrap();
        let err = format!("{:#}", tls.reload().unwrap_err());
        assert!(err.contains("proxy.crt"), "{err}");
        std::fs::write(&key, "not a key").unwrap();
        let err = format!("{:#}", tls.reload().unwrap_err());
        assert!(err.contains("proxy.key"), "{err}");
        assert_eq!(presented(), der(&second));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A TLS client connection to the proxy whose client, after the
    /// handshake, sends a record of `payload` a byte per 50 ms until the
    /// proxy closes; the proxy's side.
    fn trickled_record(payload: &'static [u8]) -> (ClientStream, std::thread::JoinHandle<()>) {
        let tls = proxy_tls("trickled-record");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut sock = TcpStream::connect(addr).unwrap();
            let anyone =
                tls_config::client_config(tls_config::Verify::Nothing, None, None, true).unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let mut conn = ClientConnection::new(anyone, name).unwrap();
            while conn.is_handshaking() {
                conn.complete_io(&mut sock).unwrap();
            }
            conn.writer().write_all(payload).unwrap();
            let mut record = Vec::new();
            conn.write_tls(&mut record).unwrap();
            for byte in record {
                if sock.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (sock, _) = listener.accept().unwrap();
        let by = std::time::Instant::now() + Duration::from_secs(10);
        let proxy_side = ClientStream::accept_tls(sock, &tls, &[], false, by).unwrap();
        (proxy_side, client)
    }

    #[test]
    fn a_read_timeout_bounds_a_tls_record_trickled_in() {
        // About 130 bytes of record: over 6 s at a byte per 50 ms, each
        // byte far inside the timeout.
        let (proxy_side, client) = trickled_record(&[b'x'; 100]);
        let timeout = Duration::from_millis(300);
        proxy_side.set_read_timeout(Some(timeout)).unwrap();
        let started = std::time::Instant::now();
        let read = (&proxy_side).read(&mut [0u8; 200]);
        let took = started.elapsed();
        let e = read.expect_err("the record came in within the timeout");
        assert!(crate::wire::first_packet::is_timeout(&e), "{e}");
        assert!(took >= timeout, "gave up before the timeout: {took:?}");
        assert!(
            took < Duration::from_secs(5),
            "gave up long after: {took:?}"
        );
        proxy_side.shutdown(Shutdown::Both).unwrap();
        client.join().unwrap();
    }
}
