//! A network at a distance, for the benchmark: a TCP relay that delivers
//! every byte a fixed one-way latency after it arrived, in both
//! directions, so a proxy beside the application can be measured against
//! a PostgreSQL 0.5–2 ms away (`bench/run.sh --parts distance`).
//!
//! ```text
//! cargo run --release --example latency_relay -- \
//!     --listen 127.0.0.1:P --upstream 127.0.0.1:Q --one-way-ms 5
//! ```
//!
//! The delay model is a wire, not a queue: each chunk read is stamped with
//! its arrival time and written at arrival + delay; reading goes on while
//! earlier chunks wait, so pipelined traffic costs one round trip, not one
//! per message. Order is kept (one writer per direction, deadlines in
//! arrival order); bandwidth is not throttled. A new connection's first
//! bytes towards the upstream also wait out the TCP handshake the relay
//! answered locally (one round trip), as a connection to a distant server
//! would. Memory is bounded: at most `--max-in-flight-bytes` wait per
//! direction; past that the relay stops reading that side, and TCP's own
//! flow control holds the sender back.
//!
//! With `--stats-listen ADDR` it also counts round trips per
//! `application_name` (see `turns.rs`), so a benchmark can read how many
//! an operation waited for, on the wire.
//!
//! tokio's timers tick in whole milliseconds, so a chunk sleeps on the
//! runtime until shortly before its deadline and the rest on a blocking
//! thread (`nanosleep`, tens of microseconds late at most).

mod turns;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use turns::{Connection, Registry};

/// Bytes read at most per chunk.
const READ_CHUNK: usize = 64 * 1024;

/// Below this much time to go, a chunk's wait leaves tokio's
/// millisecond timer for a precise sleep.
const COARSE_TIMER_SLACK: Duration = Duration::from_millis(2);

#[derive(Parser, Debug)]
#[command(about = "TCP relay that delays every byte by a fixed one-way latency")]
struct Args {
    /// Address to accept connections on.
    #[arg(long)]
    listen: SocketAddr,
    /// Address every accepted connection is relayed to.
    #[arg(long)]
    upstream: SocketAddr,
    /// One-way latency in milliseconds (fractions allowed; 0 relays at once).
    #[arg(long, default_value_t = 0.0)]
    one_way_ms: f64,
    /// Bytes waiting for delivery at most, per connection and direction.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    max_in_flight_bytes: usize,
    /// Answer every connection here with the round-trip and byte counts
    /// per application_name.
    #[arg(long)]
    stats_listen: Option<SocketAddr>,
}

/// How each relayed connection is delayed.
#[derive(Debug, Clone, Copy)]
struct Wire {
    one_way: Duration,
    max_in_flight: usize,
}

/// One chunk on its way: `None` is the sender's end of stream.
struct InFlight {
    due: Instant,
    bytes: Option<Bytes>,
    _room: Option<OwnedSemaphorePermit>,
}

fn main() {
    let args = Args::parse();
    if !(args.one_way_ms.is_finite() && args.one_way_ms >= 0.0) {
        eprintln!("latency_relay: --one-way-ms must be a non-negative number");
        std::process::exit(2);
    }
    let wire = Wire {
        one_way: Duration::from_secs_f64(args.one_way_ms / 1e3),
        max_in_flight: args
            .max_in_flight_bytes
            .clamp(READ_CHUNK, u32::MAX as usize),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latency_relay: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    let served = runtime.block_on(async move {
        let listener = TcpListener::bind(args.listen).await?;
        println!(
            "latency_relay listening on {} -> {} one-way {:?}",
            listener.local_addr()?,
            args.upstream,
            wire.one_way
        );
        let registry = Arc::new(Registry::default());
        if let Some(at) = args.stats_listen {
            let stats = TcpListener::bind(at).await?;
            tokio::spawn(serve_stats(stats, Arc::clone(&registry)));
        }
        serve(listener, args.upstream, wire, registry).await
    });
    if let Err(e) = served {
        eprintln!("latency_relay: {e}");
        std::process::exit(1);
    }
}

/// Relays every connection `listener` accepts to `upstream`.
async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    wire: Wire,
    registry: Arc<Registry>,
) -> io::Result<()> {
    loop {
        let (client, _) = listener.accept().await?;
        let tracked = registry.open();
        tokio::spawn(async move {
            if let Err(e) = relay(client, upstream, wire, &tracked.conn).await {
                if e.kind() != io::ErrorKind::ConnectionReset
                    && e.kind() != io::ErrorKind::BrokenPipe
                {
                    eprintln!("latency_relay: connection ended: {e}");
                }
            }
        });
    }
}

/// Answers every connection with the counts so far, then closes it.
async fn serve_stats(listener: TcpListener, registry: Arc<Registry>) {
    while let Ok((mut s, _)) = listener.accept().await {
        let text = registry.render();
        tokio::spawn(async move {
            let _ = s.write_all(text.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}

/// Which way a direction carries bytes, for the counters.
#[derive(Debug, Clone, Copy)]
enum Way {
    Up,
    Down,
}

/// One connection, both directions, until both have ended (or one fails).
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    wire: Wire,
    counts: &Connection,
) -> io::Result<()> {
    let accepted = Instant::now();
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // The handshake the relay answered at once would have taken a round
    // trip: the client's first bytes leave no earlier than that.
    let handshake_done = accepted + 2 * wire.one_way;
    tokio::try_join!(
        direction(
            client_read,
            server_write,
            wire,
            handshake_done,
            (counts, Way::Up)
        ),
        direction(
            server_read,
            client_write,
            wire,
            accepted,
            (counts, Way::Down)
        ),
    )?;
    Ok(())
}

/// Bytes from `from` to `to`, each delivered `wire.one_way` after it was
/// read (and not before `not_before`), reads and writes running at once.
async fn direction(
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    wire: Wire,
    not_before: Instant,
    counted: (&Connection, Way),
) -> io::Result<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(wire.max_in_flight));
    tokio::try_join!(
        read_side(from, tx, room, (wire.one_way, not_before), counted),
        write_side(to, rx)
    )?;
    Ok(())
}

/// Reads chunks and stamps them with their due time; waits for room when
/// the direction's in-flight bytes are at the cap (so the sender is held
/// back by TCP flow control, not by an unbounded queue).
async fn read_side(
    mut from: OwnedReadHalf,
    tx: mpsc::UnboundedSender<InFlight>,
    room: Arc<Semaphore>,
    (one_way, not_before): (Duration, Instant),
    (counts, way): (&Connection, Way),
) -> io::Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        buf.reserve(READ_CHUNK);
        let n = from.read_buf(&mut buf).await?;
        let due = Instant::now().max(not_before) + one_way;
        if n == 0 {
            // The receiver gone means the writer failed; its error ends the relay.
            let _ = tx.send(InFlight {
                due,
                bytes: None,
                _room: None,
            });
            return Ok(());
        }
        let bytes = buf.split().freeze();
        match way {
            Way::Up => counts.client_sent(&bytes),
            Way::Down => counts.server_sent(&bytes),
        }
        // n <= READ_CHUNK <= max_in_flight <= u32::MAX (clamped in main).
        let permits = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let Ok(permit) = room.clone().acquire_many_owned(permits).await else {
            return Ok(());
        };
        let chunk = InFlight {
            due,
            bytes: Some(bytes),
            _room: Some(permit),
        };
        if tx.send(chunk).is_err() {
            return Ok(());
        }
    }
}

/// Writes each chunk at its due time, in order; the end of stream becomes
/// a shutdown of the write side at its due time.
async fn write_side(
    mut to: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<InFlight>,
) -> io::Result<()> {
    while let Some(chunk) = rx.recv().await {
        wait_until(chunk.due).await;
        match &chunk.bytes {
            Some(bytes) => to.write_all(bytes).await?,
            None => {
                to.shutdown().await?;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Waits until `due`: on tokio's timer while it is far, then a precise
/// sleep on a blocking thread for the last stretch.
async fn wait_until(due: Instant) {
    let now = Instant::now();
    if due <= now {
        return;
    }
    if due - now > COARSE_TIMER_SLACK {
        tokio::time::sleep_until((due - COARSE_TIMER_SLACK).into()).await;
    }
    let left = due.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        // A failed blocking task only means the wait was shorter.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(left)).await;
    }
}

#[cfg(test)]
mod tests {
    //! The delay model, checked against its lower bounds: a round trip
    //! never takes less than two one-way delays, and pipelined messages
    //! share one round trip instead of paying one each.

    use super::*;

    const ONE_WAY: Duration = Duration::from_millis(20);

    /// An echo server and a relay in front of it; the relay's address.
    async fn echo_behind_relay(max_in_flight: usize) -> SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let _ = s.set_nodelay(true);
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let relay_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay_listener.local_addr().unwrap();
        let wire = Wire {
            one_way: ONE_WAY,
            max_in_flight,
        };
        tokio::spawn(serve(relay_listener, echo_addr, wire, Arc::default()));
        relay_addr
    }

    async fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ping_pong_takes_at_least_two_one_way_delays() {
        let mut s = connect(echo_behind_relay(1 << 20).await).await;
        let mut pong = [0u8; 4];
        for i in 0u32..5 {
            let started = Instant::now();
            s.write_all(&i.to_be_bytes()).await.unwrap();
            s.read_exact(&mut pong).await.unwrap();
            let took = started.elapsed();
            assert_eq!(pong, i.to_be_bytes());
            assert!(took >= 2 * ONE_WAY, "round trip {i} took {took:?}");
        }
    }

    /// 100 messages sent 0.4 ms apart over a fresh connection through the
    /// relay at `addr` (blocking sockets on their own threads, so each is
    /// its own chunk for the relay, spread over two one-way delays): each
    /// echo's round trip, sorted, and the time until the last echo.
    fn pipelined_echoes(addr: SocketAddr) -> (Vec<Duration>, Duration) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        // One ping-pong first, so the handshake's round trip is behind us.
        let mut one = [0u8; 1];
        s.write_all(b"x").unwrap();
        s.read_exact(&mut one).unwrap();
        let mut w = s.try_clone().unwrap();
        let started = Instant::now();
        let writer = std::thread::spawn(move || {
            (0u32..100)
                .map(|i| {
                    let at = Instant::now();
                    w.write_all(&i.to_be_bytes()).unwrap();
                    std::thread::sleep(Duration::from_micros(400));
                    at
                })
                .collect::<Vec<_>>()
        });
        let mut echoed = Vec::new();
        for i in 0u32..100 {
            let mut msg = [0u8; 4];
            s.read_exact(&mut msg).unwrap();
            assert_eq!(msg, i.to_be_bytes(), "order kept");
            echoed.push(Instant::now());
        }
        let took = started.elapsed();
        let sent = writer.join().unwrap();
        let mut round_trips: Vec<Duration> =
            sent.iter().zip(&echoed).map(|(s, e)| *e - *s).collect();
        round_trips.sort();
        (round_trips, took)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_messages_share_one_round_trip() {
        let addr = echo_behind_relay(1 << 20).await;
        let rtt = 2 * ONE_WAY;
        let mut medians = Vec::new();
        // The upper bound is on time, which a busy host can stretch: up to
        // three tries. A relay that batches fails every one.
        for _ in 0..3 {
            let (round_trips, took) = tokio::task::spawn_blocking(move || pipelined_echoes(addr))
                .await
                .unwrap();
            assert!(round_trips[0] >= rtt, "fastest echo {:?}", round_trips[0]);
            // Serialized, 100 messages would take 100 round trips (4 s).
            assert!(
                took < 10 * rtt,
                "100 pipelined messages took {took:?}, more than 10 round trips"
            );
            // A relay that waited out one chunk's delay before reading the
            // next would batch: half the echoes would take 1.5 round trips
            // or more.
            medians.push(round_trips[50]);
            if round_trips[50] < rtt * 5 / 4 {
                return;
            }
        }
        panic!("median echo {medians:?} in each try, each message should take one round trip");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_bytes_arrive_intact_past_the_in_flight_cap() {
        // A cap of one read chunk: the relay holds the sender back many
        // times over 4 MiB each way, and still loses or reorders nothing.
        let s = connect(echo_behind_relay(READ_CHUNK).await).await;
        let (mut r, mut w) = s.into_split();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let sent: Vec<u8> = (0..4 * 1024 * 1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let to_send = sent.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&to_send).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes changed on the way");
    }
}
