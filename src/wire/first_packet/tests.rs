//! The first packet's deadline over a real loopback socket: a client that
//! trickles its TLS handshake is closed at the deadline, as one that
//! trickles its StartupMessage is.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::ClientConnection;

use super::*;
use crate::wire::client_stream::tests::proxy_tls;
use crate::wire::tls_config::{client_config, Verify};

/// SSLRequest: length 8, request code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Far below any single read's timeout: every byte arrives in time.
const TRICKLE_PAUSE: Duration = Duration::from_millis(50);

/// The deadline the proxy is given, short for the test.
const STARTUP_DEADLINE: Duration = Duration::from_millis(300);

/// How late the proxy may give up on a loaded machine and still count as
/// having kept the deadline; the trickle itself lasts longer.
const GIVE_UP_WITHIN: Duration = Duration::from_secs(5);

/// A real rustls client's first flight: its ClientHello.
fn client_hello() -> Vec<u8> {
    let config = client_config(Verify::Nothing, None, None, true).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut hello = Vec::new();
    ClientConnection::new(config, name)
        .unwrap()
        .write_tls(&mut hello)
        .unwrap();
    hello
}

/// Opens a connection (after SSLRequest and its 'S' unless `direct`) and
/// sends a ClientHello one byte per [`TRICKLE_PAUSE`], until the proxy
/// closes it or twice [`GIVE_UP_WITHIN`] passed. Why the proxy's
/// `read_first_packet` closed it unread (`None` for any other outcome),
/// and how long that took.
fn trickled_handshake(direct: bool) -> (Option<String>, Duration) {
    let tls = proxy_tls(if direct {
        "trickle-direct"
    } else {
        "trickle-ssl"
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hello = client_hello();
    let client = std::thread::spawn(move || {
        let mut sock = TcpStream::connect(addr).unwrap();
        if !direct {
            sock.write_all(&SSL_REQUEST).unwrap();
            let mut answer = [0u8; 1];
            sock.read_exact(&mut answer).unwrap();
            assert_eq!(&answer, b"S");
        }
        let stop = Instant::now() + 2 * GIVE_UP_WITHIN;
        for byte in hello {
            if Instant::now() > stop || sock.write_all(&[byte]).is_err() {
                return;
            }
            std::thread::sleep(TRICKLE_PAUSE);
        }
    });
    let (sock, _) = listener.accept().unwrap();
    let started = Instant::now();
    let opened = read_first_packet(sock, Some(&tls), started + STARTUP_DEADLINE);
    let took = started.elapsed();
    // Closing the connection ends the client: its next byte fails.
    let unread = match opened {
        Err(NotOpened::Unreadable(connection, why)) => {
            drop(connection);
            Some(why)
        }
        _ => None,
    };
    client.join().unwrap();
    (unread, took)
}

fn assert_closed_at_the_deadline(direct: bool) {
    let (unread, took) = trickled_handshake(direct);
    let Some(why) = unread else {
        panic!("a trickled handshake (direct: {direct}) was not closed as timed out");
    };
    assert!(why.contains("TLS handshake"), "{why}");
    assert!(
        took >= STARTUP_DEADLINE,
        "gave up before the deadline: {took:?}"
    );
    assert!(
        took < GIVE_UP_WITHIN,
        "gave up long after the deadline: {took:?}"
    );
}

#[test]
fn a_handshake_trickled_after_ssl_request_ends_at_the_deadline() {
    assert_closed_at_the_deadline(false);
}

#[test]
fn a_direct_tls_handshake_trickled_ends_at_the_deadline() {
    assert_closed_at_the_deadline(true);
}
