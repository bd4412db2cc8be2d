//! Whole connections through `serve_client` on loopback sockets, against
//! a scripted server that shows what reached it and when: first packets
//! closed as PostgreSQL closes them, and a client's end-of-file passed on
//! while the server's answers still come back, on an event loop and on
//! threads. Its helpers serve the event loop's own tests too.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;

use super::serve_client;
use crate::wire::event_loop::EventLoops;
use crate::wire::guard::{ClientError, ClientStep, Guard, GuardFactory, ServerStep, SessionInfo};
use crate::wire::proxy::{LoopIo, Proxy, RelayConfig};
use crate::wire::response_queue::{Desync, Route};
use crate::wire::upstream::UpstreamAddr;

pub(in crate::wire) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Lets everything through: these tests are about the relay's edges.
/// Told to, it puts bytes of its own before the first message of a type
/// (which may stream).
#[derive(Default)]
pub(in crate::wire) struct PassThrough {
    pub inject_before: Option<(u8, Vec<u8>)>,
}

impl Guard for PassThrough {
    fn on_client(&mut self, frame: &[u8], _: bool) -> Result<ClientStep, ClientError> {
        match self.inject_before.take() {
            Some((tag, first)) if frame.first() == Some(&tag) => Ok(ClientStep::Inject(first)),
            other => {
                self.inject_before = other;
                Ok(ClientStep::Forward)
            }
        }
    }
    fn on_server(&mut self, _: &[u8]) -> Result<ServerStep, Desync> {
        Ok(ServerStep::default())
    }
    fn client_streams(&mut self, _: &[u8]) -> bool {
        true
    }
    fn unwatched_row(&self, _: u8) -> Option<Route> {
        None
    }
    fn release(&mut self) -> Option<Bytes> {
        None
    }
    fn is_idle(&self) -> bool {
        true
    }
    fn holds_work(&self) -> bool {
        false
    }
    fn settled(&self) -> bool {
        true
    }
    fn started(&self) -> bool {
        true
    }
    fn flush(&mut self) {}
    fn closed(&mut self) {}
}

impl GuardFactory for PassThrough {
    fn guard(&self, _: SessionInfo) -> Box<dyn Guard> {
        Box::new(PassThrough::default())
    }
}

/// A proxy in front of `upstream` whose sessions relay on an event loop.
pub(in crate::wire) fn proxy(upstream: SocketAddr) -> Arc<Proxy> {
    proxy_with(upstream, Relaying::Ring, Arc::new(PassThrough::default()))
}

/// Where a test proxy's sessions relay.
#[derive(Debug, Clone, Copy)]
pub(in crate::wire) enum Relaying {
    /// On two threads of their own.
    Threads,
    /// On an event loop waiting on io_uring.
    Ring,
    /// On an event loop waiting on epoll.
    Epoll,
}

/// Every way a session relays.
pub(in crate::wire) const EVERY_RELAY: [Relaying; 3] =
    [Relaying::Threads, Relaying::Ring, Relaying::Epoll];
/// Both kinds of event loop.
pub(in crate::wire) const EVERY_LOOP: [Relaying; 2] = [Relaying::Ring, Relaying::Epoll];

impl Relaying {
    /// The relay settings of this way (on `RelayConfig`'s defaults).
    pub(in crate::wire) fn config(self) -> RelayConfig {
        let (event_loops, event_loop_io) = match self {
            Relaying::Threads => (0, LoopIo::IoUring),
            Relaying::Ring => (1, LoopIo::IoUring),
            Relaying::Epoll => (1, LoopIo::Epoll),
        };
        RelayConfig {
            event_loops,
            event_loop_io,
            ..RelayConfig::default()
        }
    }
}

/// A proxy in front of `upstream` relaying as `relay` says, with the
/// guards of `guards`.
pub(in crate::wire) fn proxy_with(
    upstream: SocketAddr,
    relay: Relaying,
    guards: Arc<dyn GuardFactory>,
) -> Arc<Proxy> {
    let config = RelayConfig {
        upstream: UpstreamAddr::Tcp(upstream.to_string()),
        connect_timeout: IO_TIMEOUT,
        startup_timeout: IO_TIMEOUT,
        ..relay.config()
    };
    Arc::new(Proxy::new(config, guards))
}

/// An address nothing listens on.
pub(in crate::wire) fn nowhere() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A client connected to a proxy session served on its own thread (and
/// relayed on an event loop when the proxy's configuration has any).
pub(in crate::wire) fn connect_through(proxy: Arc<Proxy>) -> (TcpStream, JoinHandle<()>) {
    let loops = EventLoops::configured(proxy.config.event_loops, proxy.config.event_loop_io);
    connect_through_loops(proxy, loops)
}

/// A client connected to a proxy session served on its own thread and
/// relayed on `loops` (when there are any).
pub(in crate::wire) fn connect_through_loops(
    proxy: Arc<Proxy>,
    loops: Option<Arc<EventLoops>>,
) -> (TcpStream, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let (accepted, peer) = listener.accept().unwrap();
    proxy.sessions.spawning();
    let live = proxy.sessions.adopt();
    let session =
        std::thread::spawn(move || serve_client(proxy, loops, accepted, peer, false, live));
    (client, session)
}

/// A server that runs `script` on its one connection; the thread returns
/// what the script returns.
pub(in crate::wire) fn scripted_server<T: Send + 'static>(
    script: impl FnOnce(TcpStream) -> T + Send + 'static,
) -> (SocketAddr, JoinHandle<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        script(sock)
    });
    (addr, server)
}

pub(in crate::wire) fn startup(version: u32) -> Vec<u8> {
    let body = b"user\0alice\0database\0db\0\0";
    let mut p = ((8 + body.len()) as i32).to_be_bytes().to_vec();
    p.extend_from_slice(&version.to_be_bytes());
    p.extend_from_slice(body);
    p
}

pub(in crate::wire) fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

pub(in crate::wire) fn read_exact_vec(sock: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    sock.read_exact(&mut buf).unwrap();
    buf
}

/// Reads one length-prefixed first packet, or one typed message.
pub(in crate::wire) fn read_packet(sock: &mut TcpStream) -> Vec<u8> {
    let len = read_exact_vec(sock, 4);
    let n = i32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    [len, read_exact_vec(sock, n - 4)].concat()
}

pub(in crate::wire) fn read_message(sock: &mut TcpStream) -> Vec<u8> {
    let tag = read_exact_vec(sock, 1);
    [tag, read_packet(sock)].concat()
}

pub(in crate::wire) fn read_to_end(sock: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    sock.read_to_end(&mut out).unwrap();
    out
}

#[test]
fn a_half_closed_client_gets_the_answers_sent_after_its_end() {
    for relay in EVERY_RELAY {
        half_closed_client_gets_the_answers_sent_after_its_end(relay);
    }
}

fn half_closed_client_gets_the_answers_sent_after_its_end(relay: Relaying) {
    let login = [message(b'R', &[0, 0, 0, 0]), message(b'Z', b"I")].concat();
    let answer = [message(b'C', b"SELECT 1\0"), message(b'Z', b"I")].concat();
    let (login_sent, answer_sent) = (login.clone(), answer.clone());
    let (addr, server) = scripted_server(move |mut sock| {
        let first = read_packet(&mut sock);
        sock.write_all(&login_sent).unwrap();
        let query = read_message(&mut sock);
        // The client's end reaches the server before it answers: the
        // answer can only arrive if the proxy reads on after that end.
        let after = read_to_end(&mut sock);
        sock.write_all(&answer_sent).unwrap();
        (first, query, after)
    });
    let (mut client, session) =
        connect_through(proxy_with(addr, relay, Arc::new(PassThrough::default())));
    let query = message(b'Q', b"select 1\0");
    client.write_all(&startup(196_608)).unwrap();
    client.write_all(&query).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let got = read_to_end(&mut client);
    let (first, seen_query, after) = server.join().unwrap();
    session.join().unwrap();
    assert_eq!(
        (first, seen_query, after),
        (startup(196_608), query, vec![])
    );
    assert_eq!(got, [login, answer].concat());
}

#[test]
fn a_startup_then_end_of_file_gets_the_whole_login() {
    for relay in EVERY_RELAY {
        startup_then_end_of_file_gets_the_whole_login(relay);
    }
}

fn startup_then_end_of_file_gets_the_whole_login(relay: Relaying) {
    let login = [message(b'R', &[0, 0, 0, 0]), message(b'Z', b"I")].concat();
    let sent = login.clone();
    let (addr, server) = scripted_server(move |mut sock| {
        read_packet(&mut sock);
        let after = read_to_end(&mut sock);
        sock.write_all(&sent).unwrap();
        after
    });
    let (mut client, session) =
        connect_through(proxy_with(addr, relay, Arc::new(PassThrough::default())));
    client.write_all(&startup(196_608)).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut client), login);
    assert_eq!(server.join().unwrap(), Vec::<u8>::new());
    session.join().unwrap();
}

#[test]
fn a_terminate_before_the_startup_is_closed_without_a_word() {
    // The connection never gets as far as the server.
    for first in [
        &message(b'X', b"")[..],
        b"GET / HTTP/1.1\r\n",
        &[0, 0, 0, 12, 4, 210, 22, 46, 0, 0, 0, 7],
    ] {
        let (mut client, session) = connect_through(proxy(nowhere()));
        client.write_all(first).unwrap();
        assert_eq!(read_to_end(&mut client), b"", "{first:?}");
        session.join().unwrap();
    }
}

#[test]
fn a_protocol_two_startup_gets_the_servers_own_answer() {
    let answer = b"EFATAL:  unsupported frontend protocol 2.0: server supports 3.0 to 3.0\n\0";
    let (addr, server) = scripted_server(move |mut sock| {
        let first = read_packet(&mut sock);
        sock.write_all(answer).unwrap();
        first
    });
    let (mut client, session) = connect_through(proxy(addr));
    client.write_all(&startup(2 << 16)).unwrap();
    assert_eq!(read_to_end(&mut client), answer);
    assert_eq!(server.join().unwrap(), startup(2 << 16));
    session.join().unwrap();
}

#[test]
fn a_protocol_two_startup_with_no_server_is_answered_in_its_shape() {
    let (mut client, session) = connect_through(proxy(nowhere()));
    client.write_all(&startup(2 << 16)).unwrap();
    let got = read_to_end(&mut client);
    session.join().unwrap();
    assert!(
        got.starts_with(b"EFATAL:  unsupported frontend protocol 2.0"),
        "{got:?}"
    );
    assert!(got.ends_with(b"\n\0"), "{got:?}");
}
