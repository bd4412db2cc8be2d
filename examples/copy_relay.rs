//! The floor for any userspace relay, for the benchmark: bytes copied
//! between client and server by two blocking threads per connection, with
//! no framing, no protocol state, nothing decided. `bench/run.sh` measures
//! it beside resumeguard (configuration `copy-relay`), so the cost of the
//! extra hop itself is told apart from the cost of what resumeguard does.
//!
//! `copy_relay serve --listen HOST:PORT --upstream HOST:PORT [ignored...]`
//! (the benchmark harness's command line for every proxy; it prints
//! `DATABASE_URL=` when listening, as `resumeguard serve` does).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

#[path = "shared/harness_args.rs"]
mod harness_args;

fn main() {
    let (listen, upstream) = harness_args::listen_and_upstream(
        "copy_relay serve --listen HOST:PORT --upstream HOST:PORT",
    );
    let listener = harness_args::listener("copy_relay", &listen);
    println!("DATABASE_URL=postgres://{listen}/postgres");
    for client in listener.incoming().flatten() {
        let upstream = upstream.clone();
        std::thread::spawn(move || relay(client, &upstream));
    }
}

fn relay(client: TcpStream, upstream: &str) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || copy(client, server));
    copy(s2, c2);
    let _ = up.join();
}

/// Copies until either side closes, then closes both.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
