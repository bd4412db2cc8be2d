//! A bound for the relay's system calls, for the benchmark: bytes copied
//! between client and server by loops that each own many connections, as
//! `event_loop_relay` does, but through io_uring: every read and write is
//! a queued request, and one `io_uring_enter` per turn of a loop submits
//! what the turn queued and waits for what completed. Beside
//! `event_loop_relay` (epoll readiness, then one `recvfrom` or `sendto`
//! per read or write) it prices the readiness model and its system calls:
//! the bytes, sockets and segments are the same in both.
//!
//! `uring_relay serve --listen HOST:PORT --upstream HOST:PORT [--loops N]
//! [--plain-ring] [--poll-reads] [ignored...]` (the benchmark harness's command line; it
//! prints `DATABASE_URL=` when listening). `--loops` defaults to the
//! machine's cores; each loop accepts from the one listener.
//! `--plain-ring` makes each ring without the flags of [`ring`], to price
//! them. `--poll-reads` reads as resumeguard's ring loops do: a watch on
//! the ring says a socket is readable, and the loop's own `recv` reads it
//! (writes stay requests).

use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use io_uring::{opcode, squeue, types, IoUring};
use rustix::event::PollFlags;
use slab::Slab;

/// Room for one read, per direction.
const BUF: usize = 16 * 1024;
/// Requests a ring holds before a turn must submit them.
const RING: u32 = 1024;
/// The request that accepts the next connection.
const ACCEPT: u64 = u64::MAX;
/// A cancellation's own completion.
const CANCEL: u64 = u64::MAX - 1;

#[path = "shared/harness_args.rs"]
mod harness_args;

fn main() {
    let (listen, upstream) = harness_args::listen_and_upstream(
        "uring_relay serve --listen HOST:PORT --upstream HOST:PORT [--loops N] [--plain-ring] \
         [--poll-reads]",
    );
    let loops = harness_args::flag("--loops")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let plain = std::env::args().any(|a| a == "--plain-ring");
    let listener = harness_args::listener("uring_relay", &listen);
    println!("DATABASE_URL=postgres://{listen}/postgres");
    let listener_fd = listener.as_raw_fd();
    let threads: Vec<_> = (0..loops)
        .map(|_| {
            let upstream = upstream.clone();
            // Made on its loop's thread: only that thread submits to it.
            std::thread::spawn(move || match ring(plain) {
                Ok(ring) => Loop::new(ring, listener_fd, upstream).run(),
                Err(e) => {
                    eprintln!("uring_relay: io_uring: {e}");
                    std::process::exit(1);
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// A loop's ring, with the flags liburing recommends for a networking
/// loop (unless `plain`): the work of completions runs when the loop asks
/// for them, never by interrupting it, and only the thread that made the
/// ring submits.
fn ring(plain: bool) -> std::io::Result<IoUring> {
    if plain {
        return IoUring::new(RING);
    }
    IoUring::builder()
        .setup_coop_taskrun()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING)
}

/// One direction of a connection: what was read from one socket and not
/// yet written to the other.
struct Pipe {
    buf: Box<[u8; BUF]>,
    len: usize,
    sent: usize,
    /// The source said end of file (passed on as a half-close).
    eof: bool,
}

struct Conn {
    /// [client, server]; pipe 0 reads the client and writes the server.
    socks: [TcpStream; 2],
    pipes: [Pipe; 2],
    /// Requests the kernel holds for this connection: it (and the buffers
    /// they point into) lives until they complete.
    in_flight: usize,
    closing: bool,
}

/// What a completed request was: its connection, what it was (`RECV`,
/// `SEND`, `WATCH`), direction.
fn tag(key: usize, kind: u64, dir: usize) -> u64 {
    ((key as u64) << 3) | (kind << 1) | dir as u64
}
const RECV: u64 = 0;
const SEND: u64 = 1;
/// A readiness watch (`--poll-reads`).
const WATCH: u64 = 2;

struct Loop {
    ring: IoUring,
    listener: RawFd,
    upstream: String,
    conns: Slab<Conn>,
    /// Requests made while completions were read, queued after them.
    queued: Vec<squeue::Entry>,
    /// The completions of a turn, read off the ring before they are acted on.
    done: Vec<(u64, i32, u32)>,
    /// Reads are a watch's readiness, then a `recv` of the loop's own.
    poll_reads: bool,
}

impl Loop {
    fn new(ring: IoUring, listener: RawFd, upstream: String) -> Loop {
        Loop {
            ring,
            listener,
            upstream,
            conns: Slab::new(),
            queued: Vec::new(),
            done: Vec::new(),
            poll_reads: std::env::args().any(|a| a == "--poll-reads"),
        }
    }

    fn run(mut self) {
        self.queued.push(self.accept());
        loop {
            for entry in self.queued.drain(..) {
                // Safety: every request points into a connection's boxed
                // buffer, which lives until the request completes (see
                // `Conn::in_flight`), or at nothing (accept).
                while unsafe { self.ring.submission().push(&entry) }.is_err() {
                    if self.ring.submit().is_err() {
                        return;
                    }
                }
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("uring_relay: {e}");
                return;
            }
            let mut done = std::mem::take(&mut self.done);
            done.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for &(what, result, flags) in &done {
                if what == CANCEL {
                    continue;
                }
                if what == ACCEPT {
                    self.queued.push(self.accept());
                    if result >= 0 {
                        // Safety: a completed accept's result is a new
                        // descriptor, owned by nobody else.
                        let client = unsafe { TcpStream::from_raw_fd(result) };
                        self.adopt(client);
                    }
                } else if (what >> 1) & 3 == WATCH {
                    self.readable(what, result, flags);
                } else {
                    self.completed(what, result);
                }
            }
            done.clear();
            self.done = done;
        }
    }

    fn accept(&self) -> squeue::Entry {
        opcode::Accept::new(
            types::Fd(self.listener),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build()
        .user_data(ACCEPT)
    }

    fn adopt(&mut self, client: TcpStream) {
        let Ok(server) = TcpStream::connect(&self.upstream) else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let pipe = || Pipe {
            buf: Box::new([0; BUF]),
            len: 0,
            sent: 0,
            eof: false,
        };
        let key = self.conns.insert(Conn {
            socks: [client, server],
            pipes: [pipe(), pipe()],
            in_flight: 0,
            closing: false,
        });
        if self.poll_reads {
            for dir in 0..2 {
                let _ = self.conns[key].socks[dir].set_nonblocking(true);
                self.watch(key, dir);
                self.recv_now(key, dir);
            }
            return;
        }
        for dir in 0..2 {
            self.read(key, dir);
        }
    }

    /// Watches direction `dir`'s source for bytes or its end: a
    /// completion each time, until cancelled (see [`Loop::close`]).
    fn watch(&mut self, key: usize, dir: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.in_flight += 1;
        let fd = conn.socks[dir].as_raw_fd();
        let readable = PollFlags::IN | PollFlags::RDHUP;
        self.queued.push(
            opcode::PollAdd::new(types::Fd(fd), u32::from(readable.bits()))
                .multi(true)
                .build()
                .user_data(tag(key, WATCH, dir)),
        );
    }

    /// A watch's completion: read now (and watch again if the watch
    /// ended).
    fn readable(&mut self, what: u64, result: i32, flags: u32) {
        let key = (what >> 3) as usize;
        let dir = (what & 1) as usize;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let more = io_uring::cqueue::more(flags);
        if !more {
            conn.in_flight -= 1;
        }
        if conn.closing || result < 0 {
            return self.close(key);
        }
        if !more {
            self.watch(key, dir);
        }
        self.recv_now(key, dir);
    }

    /// Reads direction `dir` now, unless what it read last is still
    /// being written.
    fn recv_now(&mut self, key: usize, dir: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let pipe = &mut conn.pipes[dir];
        if pipe.len > 0 || pipe.eof || conn.closing {
            return;
        }
        match (&conn.socks[dir]).read(&mut pipe.buf[..]) {
            Ok(n) => self.got(key, dir, n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => self.close(key),
        }
    }

    /// Asks for the next bytes of direction `dir` into its empty buffer.
    fn read(&mut self, key: usize, dir: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.in_flight += 1;
        let fd = conn.socks[dir].as_raw_fd();
        let buf = conn.pipes[dir].buf.as_mut_ptr();
        self.queued.push(
            opcode::Recv::new(types::Fd(fd), buf, BUF as u32)
                .build()
                .user_data(tag(key, RECV, dir)),
        );
    }

    /// Asks for what direction `dir` read and has not written yet to be
    /// written.
    fn write(&mut self, key: usize, dir: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.in_flight += 1;
        let fd = conn.socks[1 - dir].as_raw_fd();
        let pipe = &conn.pipes[dir];
        let rest = &pipe.buf[pipe.sent..pipe.len];
        self.queued.push(
            opcode::Send::new(types::Fd(fd), rest.as_ptr(), rest.len() as u32)
                .build()
                .user_data(tag(key, SEND, dir)),
        );
    }

    fn completed(&mut self, what: u64, result: i32) {
        let key = (what >> 3) as usize;
        let (write, dir) = ((what >> 1) & 3 == SEND, (what & 1) as usize);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.in_flight -= 1;
        let Ok(n) = usize::try_from(result) else {
            return self.close(key);
        };
        if conn.closing || (write && n == 0) {
            return self.close(key);
        }
        let pipe = &mut conn.pipes[dir];
        if write {
            pipe.sent += n;
            if pipe.sent < pipe.len {
                return self.write(key, dir);
            }
            (pipe.sent, pipe.len) = (0, 0);
            if self.poll_reads {
                return self.recv_now(key, dir);
            }
            return self.read(key, dir);
        }
        self.got(key, dir, n);
    }

    /// Direction `dir` read `n` bytes into its empty buffer: they are
    /// written on. End of file (0) is passed on as a half-close, as
    /// PostgreSQL's own client would; both ends closed ends the
    /// connection.
    fn got(&mut self, key: usize, dir: usize, n: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if n > 0 {
            conn.pipes[dir].len = n;
            return self.write(key, dir);
        }
        conn.pipes[dir].eof = true;
        let _ = conn.socks[1 - dir].shutdown(Shutdown::Write);
        if conn.pipes[1 - dir].eof {
            self.close(key);
        }
    }

    /// Shuts both sockets (their pending requests complete; watches are
    /// cancelled) and lets the connection go once nothing is in flight.
    fn close(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if !conn.closing {
            conn.closing = true;
            for s in &conn.socks {
                let _ = s.shutdown(Shutdown::Both);
            }
            if self.poll_reads {
                for dir in 0..2 {
                    let watch = tag(key, WATCH, dir);
                    self.queued
                        .push(opcode::AsyncCancel::new(watch).build().user_data(CANCEL));
                }
            }
        }
        if conn.in_flight == 0 {
            self.conns.remove(key);
        }
    }
}
