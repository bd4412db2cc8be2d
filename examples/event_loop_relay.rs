//! A bound for the relay's design, for the benchmark: bytes copied between
//! client and server by event loops (epoll through `mio`) that each own
//! many connections, as PgBouncer's one loop does, with no framing and
//! nothing decided. Beside `copy_relay` (two blocking threads per
//! connection) it tells how much of a relay's CPU is the threading model's
//! own: the wake-ups and context switches per round trip.
//!
//! `event_loop_relay serve --listen HOST:PORT --upstream HOST:PORT
//! [--loops N] [ignored...]` (the benchmark harness's command line; it
//! prints `DATABASE_URL=` when listening). `--loops` defaults to the
//! machine's cores; connections are dealt to the loops in turn.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

/// Room for one read, per direction.
const BUF: usize = 16 * 1024;
/// The token that wakes a loop for a new connection.
const NEW: Token = Token(usize::MAX);

#[path = "shared/harness_args.rs"]
mod harness_args;

fn main() {
    let (listen, upstream) = harness_args::listen_and_upstream(
        "event_loop_relay serve --listen HOST:PORT --upstream HOST:PORT [--loops N]",
    );
    let loops = harness_args::flag("--loops")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let listener = harness_args::listener("event_loop_relay", &listen);
    let mut workers = Vec::new();
    for _ in 0..loops {
        match Worker::start() {
            Ok(w) => workers.push(w),
            Err(e) => {
                eprintln!("event_loop_relay: starting a loop: {e}");
                std::process::exit(1);
            }
        }
    }
    println!("DATABASE_URL=postgres://{listen}/postgres");
    for (n, client) in listener.incoming().flatten().enumerate() {
        let Ok(server) = std::net::TcpStream::connect(&upstream) else {
            continue;
        };
        let worker = &workers[n % workers.len()];
        let _ = worker.new.send((client, server));
        let _ = worker.waker.wake();
    }
}

/// A loop's inbox: connections handed to it, and the waker that tells it.
struct Worker {
    new: Sender<(std::net::TcpStream, std::net::TcpStream)>,
    waker: Arc<Waker>,
}

impl Worker {
    fn start() -> std::io::Result<Worker> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), NEW)?);
        let (new, inbox) = channel();
        std::thread::spawn(move || run(poll, inbox));
        Ok(Worker { new, waker })
    }
}

/// One direction of a connection: what was read from one socket and not
/// yet written to the other.
struct Pipe {
    buf: Box<[u8; BUF]>,
    start: usize,
    end: usize,
    /// The source said end of file (passed on once the buffer is empty).
    eof: bool,
    /// That end of file was passed on (the destination's write side shut).
    passed_eof: bool,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            buf: Box::new([0; BUF]),
            start: 0,
            end: 0,
            eof: false,
            passed_eof: false,
        }
    }
}

/// A socket and what the loop knows of its readiness (edge-triggered: set
/// by an event, cleared by a would-block or a short read or write).
struct Side {
    sock: TcpStream,
    readable: bool,
    writable: bool,
}

struct Conn {
    sides: [Side; 2],
    /// pipes[0]: client → server; pipes[1]: server → client.
    pipes: [Pipe; 2],
}

fn run(mut poll: Poll, inbox: Receiver<(std::net::TcpStream, std::net::TcpStream)>) {
    let mut events = Events::with_capacity(256);
    let mut conns: Slab<Conn> = Slab::new();
    loop {
        if poll.poll(&mut events, None).is_err() {
            continue;
        }
        for ev in events.iter() {
            if ev.token() == NEW {
                while let Ok((client, server)) = inbox.try_recv() {
                    adopt(&poll, &mut conns, client, server);
                }
                continue;
            }
            let (key, side) = (ev.token().0 / 2, ev.token().0 % 2);
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            let s = &mut conn.sides[side];
            s.readable |= ev.is_readable() || ev.is_read_closed() || ev.is_error();
            s.writable |= ev.is_writable() || ev.is_write_closed() || ev.is_error();
            let open = pump(conn, 0) & pump(conn, 1);
            if !open {
                let conn = conns.remove(key);
                for mut s in conn.sides {
                    let _ = poll.registry().deregister(&mut s.sock);
                    let _ = s.sock.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

fn adopt(
    poll: &Poll,
    conns: &mut Slab<Conn>,
    client: std::net::TcpStream,
    server: std::net::TcpStream,
) {
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        if s.set_nonblocking(true).is_err() {
            return;
        }
    }
    let entry = conns.vacant_entry();
    let key = entry.key();
    let mut sides = [client, server].map(|s| Side {
        sock: TcpStream::from_std(s),
        readable: false,
        writable: false,
    });
    for (i, s) in sides.iter_mut().enumerate() {
        let interest = Interest::READABLE | Interest::WRITABLE;
        if poll
            .registry()
            .register(&mut s.sock, Token(key * 2 + i), interest)
            .is_err()
        {
            return;
        }
    }
    entry.insert(Conn {
        sides,
        pipes: [Pipe::new(), Pipe::new()],
    });
}

/// Moves what it can of direction `dir` (0: client → server) without
/// blocking. False once the connection is done.
fn pump(conn: &mut Conn, dir: usize) -> bool {
    let (src, dst) = (dir, 1 - dir);
    let pipe = &mut conn.pipes[dir];
    loop {
        if pipe.start < pipe.end {
            let d = &mut conn.sides[dst];
            if !d.writable {
                return true;
            }
            match d.sock.write(&pipe.buf[pipe.start..pipe.end]) {
                Ok(0) => return false,
                Ok(n) => {
                    pipe.start += n;
                    if pipe.start < pipe.end {
                        d.writable = false;
                        return true;
                    }
                    pipe.start = 0;
                    pipe.end = 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    d.writable = false;
                    return true;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if pipe.eof {
            if !pipe.passed_eof {
                pipe.passed_eof = true;
                let _ = conn.sides[dst].sock.shutdown(Shutdown::Write);
            }
            return !conn.pipes[dst].eof;
        }
        let s = &mut conn.sides[src];
        if !s.readable {
            return true;
        }
        match s.sock.read(&mut pipe.buf[..]) {
            Ok(0) => pipe.eof = true,
            Ok(n) => {
                pipe.end = n;
                if n < BUF {
                    s.readable = false;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                s.readable = false;
                return true;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}
