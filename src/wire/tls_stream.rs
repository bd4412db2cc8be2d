//! One TLS connection over a blocking TCP socket, shared by the session's
//! two relay threads: one reads through `&TlsStream`, the other writes.
//!
//! The rustls state sits under a mutex that is never held while a thread
//! blocks on the socket: the reader reads raw bytes unlocked, then locks
//! to decrypt; a writer locks to encrypt into a buffer, unlocks, and
//! sends. A second mutex, held from encryption through the socket write,
//! keeps records on the wire in the order they were sealed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustls::Connection;

use super::deadline_socket::DeadlineSocket;

/// Raw bytes read from the socket per system call.
const READ_CHUNK: usize = 32 * 1024;

/// A TLS session whose handshake is done, usable from two threads.
pub struct TlsStream {
    sock: TcpStream,
    conn: Mutex<Connection>,
    /// The reader's side: ciphertext read and not yet given to rustls.
    read_side: Mutex<ReadSide>,
    /// The writers' side: held from sealing until the socket took it.
    write_side: Mutex<Vec<u8>>,
    /// How long one read may wait in all. The socket's own timeout bounds
    /// one system call, and a record sent a byte at a time takes many.
    read_timeout: Mutex<Option<Duration>>,
}

#[derive(Default)]
struct ReadSide {
    pending: Vec<u8>,
    scratch: Vec<u8>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> io::Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| io::Error::other("TLS state poisoned by a panicked thread"))
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsStream {
    /// Runs the handshake of `conn` on `sock` to completion. `early` is
    /// ciphertext already read from the socket (a ClientHello that came
    /// first). The socket's timeouts bound each wait.
    pub fn handshake(sock: TcpStream, mut conn: Connection, early: &[u8]) -> io::Result<TlsStream> {
        complete_handshake(&mut conn, &mut &sock, early)?;
        Ok(TlsStream::established(sock, conn))
    }

    /// [`TlsStream::handshake`], finished by `deadline` however slowly the
    /// peer sends its part, or failed with `TimedOut` (or the socket's
    /// `WouldBlock`). The socket is left without timeouts.
    pub fn handshake_by(
        sock: TcpStream,
        mut conn: Connection,
        early: &[u8],
        deadline: Instant,
    ) -> io::Result<TlsStream> {
        complete_handshake(&mut conn, &mut DeadlineSocket::new(&sock, deadline), early)?;
        sock.set_read_timeout(None)?;
        sock.set_write_timeout(None)?;
        Ok(TlsStream::established(sock, conn))
    }

    fn established(sock: TcpStream, mut conn: Connection) -> TlsStream {
        // Each write is sealed and sent whole: no limit on what it seals.
        conn.set_buffer_limit(None);
        TlsStream {
            sock,
            conn: Mutex::new(conn),
            read_side: Mutex::new(ReadSide::default()),
            write_side: Mutex::new(Vec::new()),
            read_timeout: Mutex::new(None),
        }
    }

    /// The negotiated ALPN protocol.
    pub fn alpn_protocol(&self) -> Option<Vec<u8>> {
        lock(&self.conn)
            .ok()
            .and_then(|c| c.alpn_protocol().map(<[u8]>::to_vec))
    }

    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Bounds each read in all, however slowly the peer's records come;
    /// `None` waits for ever. A read that runs out fails as a socket's does.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)?;
        *lock(&self.read_timeout)? = t;
        Ok(())
    }

    /// Closes the socket in one or both directions; a thread blocked
    /// reading it wakes with end-of-file.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock.shutdown(how)
    }

    /// Ends the TLS session with close_notify (a peer such as libpq with
    /// OpenSSL 3 treats a bare end-of-file as an error). Errors are
    /// ignored: the connection is being closed anyway.
    pub fn close_notify(&self) {
        if let Ok(mut conn) = lock(&self.conn) {
            conn.send_close_notify();
        }
        let _ = self.flush_queued();
    }

    /// Sends whatever rustls has queued (alerts, key updates).
    fn flush_queued(&self) -> io::Result<()> {
        let mut out = lock(&self.write_side)?;
        {
            let mut conn = lock(&self.conn)?;
            while conn.wants_write() {
                conn.write_tls(&mut *out)?;
            }
        }
        let sent = (&self.sock).write_all(&out);
        out.clear();
        sent
    }

    fn read_plain(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut side = lock(&self.read_side)?;
        let until = lock(&self.read_timeout)?.map(|t| Instant::now() + t);
        loop {
            let mut wants_write = false;
            let got = {
                let mut conn = lock(&self.conn)?;
                loop {
                    match conn.reader().read(buf) {
                        Ok(n) => break Some(Ok(n)),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => break Some(Err(e)),
                    }
                    if side.pending.is_empty() {
                        break None;
                    }
                    let mut rest = &side.pending[..];
                    let fed = conn.read_tls(&mut rest);
                    let consumed = side.pending.len() - rest.len();
                    side.pending.drain(..consumed);
                    if let Err(e) = fed {
                        break Some(Err(e));
                    }
                    if let Err(e) = conn.process_new_packets() {
                        // The alert describing the error goes out below.
                        wants_write = true;
                        break Some(Err(tls_error(e)));
                    }
                    wants_write |= conn.wants_write();
                }
            };
            if wants_write {
                // Behind a writer blocked on the socket this waits too. What
                // rustls queues on reading is an alert (a fatal one, or TLS
                // 1.2's refused renegotiation; its answer to a KeyUpdate
                // waits for the next write), and a writer stays blocked only
                // while this same peer reads nothing: the wait holds the
                // session no longer than that peer's silence already does.
                let _ = self.flush_queued();
            }
            if let Some(result) = got {
                return result;
            }
            // Nothing decrypted and nothing pending: wait for the socket,
            // holding only the reader's own lock.
            let side = &mut *side;
            side.scratch.resize(READ_CHUNK, 0);
            let n = match until {
                Some(until) => DeadlineSocket::new(&self.sock, until).read(&mut side.scratch)?,
                None => (&self.sock).read(&mut side.scratch)?,
            };
            if n == 0 {
                return Ok(0);
            }
            side.pending.extend_from_slice(&side.scratch[..n]);
        }
    }

    fn write_plain(&self, buf: &[u8]) -> io::Result<usize> {
        let mut out = lock(&self.write_side)?;
        {
            let mut conn = lock(&self.conn)?;
            conn.writer().write_all(buf)?;
            while conn.wants_write() {
                conn.write_tls(&mut *out)?;
            }
        }
        let sent = (&self.sock).write_all(&out);
        out.clear();
        if out.capacity() > 4 * READ_CHUNK {
            out.shrink_to(READ_CHUNK);
        }
        sent.map(|()| buf.len())
    }
}

/// Feeds `early` to `conn`, then reads and writes `io` until the handshake
/// is done and its last flight sent.
fn complete_handshake(
    conn: &mut Connection,
    io: &mut (impl Read + Write),
    mut early: &[u8],
) -> io::Result<()> {
    while !early.is_empty() {
        conn.read_tls(&mut early)?;
        if let Err(e) = conn.process_new_packets() {
            let _ = conn.write_tls(io);
            return Err(tls_error(e));
        }
    }
    while conn.is_handshaking() {
        let (read, written) = conn.complete_io(io)?;
        if read == 0 && written == 0 && conn.is_handshaking() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection during the TLS handshake",
            ));
        }
    }
    while conn.wants_write() {
        conn.write_tls(io)?;
    }
    Ok(())
}

impl Read for &TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_plain(buf)
    }
}

impl Write for &TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_plain(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use rustls::{ClientConnection, ServerConnection};

    use super::*;
    use crate::wire::tls_config::{client_config, server_config, Verify};

    /// A self-signed certificate for `names`, written as PEM files.
    fn cert_files(tag: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("rg-tls-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let ck = rcgen::generate_simple_self_signed(names).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    /// Both ends of one handshake: (server, client).
    fn handshake_pair(
        server: Arc<rustls::ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        name: &str,
    ) -> (io::Result<TlsStream>, io::Result<TlsStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        let client_side = std::thread::spawn(move || {
            let sock = TcpStream::connect(addr).unwrap();
            let conn = ClientConnection::new(client, name).unwrap();
            TlsStream::handshake(sock, Connection::Client(conn), &[])
        });
        let (sock, _) = listener.accept().unwrap();
        let conn = ServerConnection::new(server).unwrap();
        let server_side = TlsStream::handshake(sock, Connection::Server(conn), &[]);
        if server_side.is_err() {
            // Wake a client still waiting for the server's flight.
            drop(listener);
        }
        (server_side, client_side.join().unwrap())
    }

    #[test]
    fn both_threads_share_one_tls_session() {
        let (cert, key) = cert_files("share", &["localhost"]);
        let client_cfg = client_config(Verify::Full, Some(&cert), None, true).unwrap();
        let (server, client) =
            handshake_pair(server_config(&cert, &key).unwrap(), client_cfg, "localhost");
        let (server, client) = (Arc::new(server.unwrap()), Arc::new(client.unwrap()));
        // The server echoes: one thread reads, another writes what it read.
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let reader = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 7000];
                loop {
                    match (&*server).read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => tx.send(buf[..n].to_vec()).unwrap(),
                    }
                }
            })
        };
        let writer = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                for chunk in rx {
                    (&*server).write_all(&chunk).unwrap();
                }
            })
        };
        let sent: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let echo = {
            let (client, len) = (Arc::clone(&client), sent.len());
            std::thread::spawn(move || {
                let mut got = vec![0u8; len];
                (&*client).read_exact(&mut got).unwrap();
                got
            })
        };
        for part in sent.chunks(10_000) {
            (&*client).write_all(part).unwrap();
        }
        assert!(echo.join().unwrap() == sent, "echo differs");
        client.shutdown(Shutdown::Both).unwrap();
        reader.join().unwrap();
        writer.join().unwrap();
    }

    #[test]
    fn a_key_update_is_read_past_a_writer_blocked_on_the_peer() {
        let (cert, key) = cert_files("key-update", &["localhost"]);
        let client_cfg = client_config(Verify::Full, Some(&cert), None, true).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (send_now, when_to_send) = std::sync::mpsc::channel::<()>();
        let (done, until_done) = std::sync::mpsc::channel::<()>();
        // The peer: after the handshake it reads nothing, and once told,
        // asks for a key update and sends "ping".
        let peer = std::thread::spawn(move || {
            let mut sock = TcpStream::connect(addr).unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let mut conn = ClientConnection::new(client_cfg, name).unwrap();
            while conn.is_handshaking() {
                conn.complete_io(&mut sock).unwrap();
            }
            when_to_send.recv().unwrap();
            conn.refresh_traffic_keys().unwrap();
            conn.writer().write_all(b"ping").unwrap();
            while conn.wants_write() {
                conn.write_tls(&mut sock).unwrap();
            }
            until_done.recv().unwrap();
        });
        let (sock, _) = listener.accept().unwrap();
        let conn = ServerConnection::new(server_config(&cert, &key).unwrap()).unwrap();
        let server = Arc::new(TlsStream::handshake(sock, Connection::Server(conn), &[]).unwrap());
        // Far more than the socket buffers hold: the writer blocks holding
        // the writers' side until the socket is shut down.
        let writer = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || (&*server).write_all(&vec![0u8; 64 << 20]).is_err())
        };
        std::thread::sleep(Duration::from_millis(500));
        send_now.send(()).unwrap();
        // Read on a thread of its own: a reader waiting for the writers'
        // side would wait until the shutdown below.
        let (read_tx, read_rx) = std::sync::mpsc::channel();
        let reader = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                let mut got = [0u8; 4];
                let read = (&*server).read_exact(&mut got).map(|()| got);
                let _ = read_tx.send(read.map_err(|e| e.to_string()));
            })
        };
        let read = read_rx.recv_timeout(Duration::from_secs(5));
        server.shutdown(Shutdown::Both).unwrap();
        assert!(writer.join().unwrap(), "the writer was never blocked");
        reader.join().unwrap();
        done.send(()).unwrap();
        peer.join().unwrap();
        assert_eq!(read, Ok(Ok(*b"ping")));
    }

    #[test]
    fn verification_follows_the_mode() {
        let (cert, key) = cert_files("verify", &["db.example"]);
        let (other, _) = cert_files("other-ca", &["db.example"]);
        let server = server_config(&cert, &key).unwrap();
        let connect = |verify, roots: &PathBuf, name| {
            let cfg = client_config(verify, Some(roots), None, true).unwrap();
            handshake_pair(Arc::clone(&server), cfg, name).1
        };
        assert!(connect(Verify::Full, &cert, "db.example").is_ok());
        let wrong_name = connect(Verify::Full, &cert, "elsewhere.example")
            .err()
            .expect("a wrong name is refused");
        assert!(
            wrong_name.to_string().contains("not valid for name"),
            "{wrong_name}"
        );
        assert!(connect(Verify::Chain, &cert, "elsewhere.example").is_ok());
        let wrong_ca = connect(Verify::Chain, &other, "db.example")
            .err()
            .expect("a wrong CA is refused");
        assert!(
            wrong_ca.to_string().contains("UnknownIssuer")
                || wrong_ca.to_string().contains("BadSignature"),
            "{wrong_ca}"
        );
        assert!(connect(Verify::Nothing, &other, "elsewhere.example").is_ok());
    }
}
