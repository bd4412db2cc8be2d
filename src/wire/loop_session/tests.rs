//! Sessions on an event loop, whole connections on loopback sockets: a
//! session moves to threads before a message that may block is tracked,
//! a held row's decision waits off the loop while the loop's other
//! sessions go on, and authentication still ends at its deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::wire::event_loop::EventLoops;
use crate::wire::guard::{
    ClientError, ClientStep, Guard, GuardFactory, HeldTicket, ServerStep, SessionInfo, Ticket,
    WaitEnd,
};
use crate::wire::proxy::{Proxy, RelayConfig};
use crate::wire::response_queue::{Desync, Route};
use crate::wire::session::tests::{
    connect_through, connect_through_loops, message, proxy_with, read_message, read_packet,
    read_to_end, scripted_server, startup, Relaying, EVERY_LOOP, EVERY_RELAY, IO_TIMEOUT,
};
use crate::wire::upstream::UpstreamAddr;

/// A ticket decided when the test opens its gate.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Ticket for Gate {
    fn decide(&self, _ends: &dyn Fn() -> Option<WaitEnd>) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }
}

/// Where each Query was tracked, by thread name.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Forwards everything; a Query whose text has `blocks_on` in it may
/// block, the first DataRow is held on `gate` (when there is one), and
/// authentication never ends unless `starts`.
#[derive(Clone)]
struct Watching {
    blocks_on: Option<&'static str>,
    gate: Option<Arc<Gate>>,
    starts: bool,
    seen: Seen,
}

impl Watching {
    fn new() -> Self {
        Watching {
            blocks_on: None,
            gate: None,
            starts: true,
            seen: Seen::default(),
        }
    }
}

impl Guard for Watching {
    fn on_client(&mut self, frame: &[u8], on_loop: bool) -> Result<ClientStep, ClientError> {
        if frame[0] != b'Q' {
            return Ok(ClientStep::Forward);
        }
        let text = String::from_utf8_lossy(&frame[5..frame.len() - 1]).into_owned();
        if on_loop && self.blocks_on.is_some_and(|b| text.contains(b)) {
            return Ok(ClientStep::Blocks);
        }
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        self.seen.lock().unwrap().push((text, thread));
        Ok(ClientStep::Forward)
    }
    fn on_server(&mut self, frame: &[u8]) -> Result<ServerStep, Desync> {
        let mut step = ServerStep::default();
        if frame[0] == b'D' {
            if let Some(gate) = self.gate.take() {
                step.set_hold(HeldTicket(gate));
            }
        }
        Ok(step)
    }
    fn client_streams(&mut self, _: &[u8]) -> bool {
        false
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
        self.starts
    }
    fn flush(&mut self) {}
    fn closed(&mut self) {}
}

/// Hands out clones of one guard (sharing its record and gate), or of
/// several, one per session in turn.
struct Guards(Mutex<Vec<Watching>>);

impl GuardFactory for Guards {
    fn guard(&self, _: SessionInfo) -> Box<dyn Guard> {
        let mut guards = self.0.lock().unwrap();
        let next = if guards.len() > 1 {
            guards.remove(0)
        } else {
            guards[0].clone()
        };
        Box::new(next)
    }
}

fn guards(list: Vec<Watching>) -> Arc<dyn GuardFactory> {
    Arc::new(Guards(Mutex::new(list)))
}

/// A server answering every Query with one row and its completion, on
/// each of `sessions` connections.
fn answering_server(sessions: usize) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut served = Vec::new();
        for _ in 0..sessions {
            let (mut sock, _) = listener.accept().unwrap();
            sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            served.push(std::thread::spawn(move || {
                read_packet(&mut sock);
                sock.write_all(&login()).unwrap();
                loop {
                    let mut tag = [0];
                    if sock.read(&mut tag).unwrap_or(0) == 0 {
                        return;
                    }
                    let rest = read_packet(&mut sock);
                    if tag[0] == b'X' {
                        return;
                    }
                    let _ = rest;
                    sock.write_all(&answer()).unwrap();
                }
            }));
        }
        for s in served {
            s.join().unwrap();
        }
    });
    (addr, server)
}

fn login() -> Vec<u8> {
    [message(b'R', &[0, 0, 0, 0]), message(b'Z', b"I")].concat()
}

fn answer() -> Vec<u8> {
    [
        message(b'D', &[0, 1, 0, 0, 0, 1, b'1']),
        message(b'C', b"SELECT 1\0"),
        message(b'Z', b"I"),
    ]
    .concat()
}

/// Logs in through the proxy: the client socket, past the login.
fn logged_in(proxy: Arc<Proxy>) -> (TcpStream, JoinHandle<()>) {
    let loops = EventLoops::configured(proxy.config.event_loops, proxy.config.event_loop_io);
    logged_in_on(proxy, loops)
}

/// Logs in through the proxy, relayed on `loops`.
fn logged_in_on(proxy: Arc<Proxy>, loops: Option<Arc<EventLoops>>) -> (TcpStream, JoinHandle<()>) {
    let (mut client, session) = connect_through_loops(proxy, loops);
    client.write_all(&startup(196_608)).unwrap();
    for expected in [b'R', b'Z'] {
        assert_eq!(read_message(&mut client)[0], expected);
    }
    (client, session)
}

/// Sends a Query and reads its whole answer.
fn query(client: &mut TcpStream, sql: &str) -> Vec<u8> {
    client
        .write_all(&message(b'Q', format!("{sql}\0").as_bytes()))
        .unwrap();
    let mut got = Vec::new();
    loop {
        let m = read_message(client);
        let last = m[0] == b'Z';
        got.extend_from_slice(&m);
        if last {
            return got;
        }
    }
}

fn terminate(mut client: TcpStream, session: JoinHandle<()>) {
    client.write_all(&message(b'X', b"")).unwrap();
    assert_eq!(read_to_end(&mut client), b"");
    session.join().unwrap();
}

#[test]
fn a_message_that_may_block_is_tracked_on_threads_and_the_session_goes_on() {
    for relay in EVERY_LOOP {
        a_message_that_may_block_goes_to_threads(relay);
    }
}

fn a_message_that_may_block_goes_to_threads(relay: Relaying) {
    let (addr, server) = answering_server(1);
    let guard = Watching {
        blocks_on: Some("checkpoints"),
        ..Watching::new()
    };
    let seen = Arc::clone(&guard.seen);
    let (mut client, session) = logged_in(proxy_with(addr, relay, guards(vec![guard])));
    for sql in ["select 1", "select * from checkpoints", "select 2"] {
        assert_eq!(query(&mut client, sql), answer(), "{relay:?}: {sql}");
    }
    terminate(client, session);
    server.join().unwrap();
    let seen = seen.lock().unwrap().clone();
    let threads: Vec<(&str, &str)> = seen
        .iter()
        .map(|(sql, thread)| (sql.as_str(), thread.split('-').nth(1).unwrap_or("")))
        .collect();
    assert_eq!(
        threads,
        [
            ("select 1", "loop"),
            ("select * from checkpoints", "client"),
            ("select 2", "client")
        ],
        "{relay:?}"
    );
}

#[test]
fn a_held_row_waits_off_the_loop_while_its_other_sessions_go_on() {
    for relay in EVERY_LOOP {
        a_held_row_waits_off_the_loop(relay);
    }
}

fn a_held_row_waits_off_the_loop(relay: Relaying) {
    let (addr, server) = answering_server(2);
    let gate = Arc::new(Gate::default());
    let holding = Watching {
        gate: Some(Arc::clone(&gate)),
        ..Watching::new()
    };
    // One loop serves both sessions.
    let proxy = proxy_with(addr, relay, guards(vec![holding, Watching::new()]));
    let one_loop = EventLoops::configured(1, proxy.config.event_loop_io);
    let (mut held, held_session) = logged_in_on(Arc::clone(&proxy), one_loop.clone());
    let (mut other, other_session) = logged_in_on(proxy, one_loop);
    held.write_all(&message(b'Q', b"select 1\0")).unwrap();
    // The other session is answered while the first one's row waits.
    for _ in 0..3 {
        assert_eq!(query(&mut other, "select 2"), answer());
    }
    held.set_nonblocking(true).unwrap();
    let mut nothing = [0; 1];
    assert!(
        held.read(&mut nothing).is_err(),
        "{relay:?}: the held row reached its client before its decision"
    );
    held.set_nonblocking(false).unwrap();
    gate.open();
    let mut got = Vec::new();
    while got.len() < answer().len() {
        got.extend_from_slice(&read_message(&mut held));
    }
    assert_eq!(got, answer());
    terminate(held, held_session);
    terminate(other, other_session);
    server.join().unwrap();
}

#[test]
fn authentication_on_a_loop_ends_at_its_deadline() {
    for relay in EVERY_RELAY {
        let (addr, server) = scripted_server(|mut sock| {
            read_packet(&mut sock);
            // Asks for a password, and waits.
            sock.write_all(&message(b'R', &[0, 0, 0, 3])).unwrap();
            read_to_end(&mut sock)
        });
        let config = RelayConfig {
            upstream: UpstreamAddr::Tcp(addr.to_string()),
            connect_timeout: IO_TIMEOUT,
            startup_timeout: Duration::from_millis(300),
            ..relay.config()
        };
        let silent = Watching {
            starts: false,
            ..Watching::new()
        };
        let proxy = Arc::new(Proxy::new(config, guards(vec![silent])));
        let began = Instant::now();
        let (mut client, session) = connect_through(proxy);
        client.write_all(&startup(196_608)).unwrap();
        assert_eq!(read_message(&mut client)[0], b'R');
        let fatal = read_to_end(&mut client);
        let text = String::from_utf8_lossy(&fatal);
        assert!(
            text.contains("authentication timed out"),
            "{relay:?}: {text}"
        );
        assert!(began.elapsed() < IO_TIMEOUT, "{relay:?}");
        session.join().unwrap();
        assert_eq!(server.join().unwrap(), b"", "{relay:?}");
    }
}

#[test]
fn a_client_that_does_not_read_stops_its_loop_reading_the_server() {
    for relay in EVERY_LOOP {
        a_client_that_does_not_read_stops_the_server_read(relay);
    }
}

fn a_client_that_does_not_read_stops_the_server_read(relay: Relaying) {
    const FLOOD: usize = 128 << 20;
    let (addr, server) = scripted_server(|mut sock| {
        read_packet(&mut sock);
        sock.write_all(&login()).unwrap();
        read_message(&mut sock);
        // Rows until the proxy stops taking them: how much went.
        sock.set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let row = message(b'D', &[0u8; 65_536]);
        let mut sent = 0;
        while sent < FLOOD {
            if sock.write_all(&row).is_err() {
                break;
            }
            sent += row.len();
        }
        sent
    });
    let (mut client, session) = logged_in(proxy_with(addr, relay, guards(vec![Watching::new()])));
    client.write_all(&message(b'Q', b"select rows\0")).unwrap();
    let sent = server.join().unwrap();
    // What the sockets' buffers hold, and one read of the proxy's.
    assert!(
        sent < FLOOD / 4,
        "{relay:?}: {sent} bytes went to a client that reads nothing"
    );
    drop(client);
    session.join().unwrap();
}
