//! The ring on socket pairs: a watch reports bytes and the peer's end, a
//! wake-up from another thread ends a wait, a send writes, and a send a
//! peer does not take can be cancelled.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::*;

/// Waits until a completion comes (a wake-up ends a wait without one).
fn next(ring: &mut Ring) -> Done {
    let mut done = Vec::new();
    while done.is_empty() {
        ring.wait(None, &mut done).unwrap();
    }
    assert_eq!(done.len(), 1, "{done:?}");
    done[0]
}

#[test]
fn a_watch_reports_bytes_then_the_peers_end_and_goes_on() {
    let mut ring = Ring::new().unwrap();
    let (a, mut b) = UnixStream::pair().unwrap();
    ring.watch(a.as_raw_fd(), 7).unwrap();
    let mut done = Vec::new();
    ring.wait(Some(Duration::ZERO), &mut done).unwrap();
    assert!(done.is_empty(), "nothing to read yet: {done:?}");
    b.write_all(b"x").unwrap();
    // A wait of no time takes what happened meanwhile.
    ring.wait(Some(Duration::ZERO), &mut done).unwrap();
    assert_eq!(done.len(), 1, "{done:?}");
    let got = done[0];
    assert_eq!(
        (got.tag, got.readiness(), got.more),
        (7, (true, false), true)
    );
    drop(b);
    let got = next(&mut ring);
    assert_eq!((got.tag, got.readiness().1), (7, true), "{got:?}");
}

#[test]
fn a_wake_from_another_thread_ends_a_wait_and_a_timed_wait_ends_alone() {
    let mut ring = Ring::new().unwrap();
    let waker = ring.waker();
    let woke = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        waker.wake().unwrap();
    });
    let mut done = Vec::new();
    ring.wait(None, &mut done).unwrap();
    assert!(done.is_empty(), "{done:?}");
    woke.join().unwrap();
    // Taken: the next wait waits for its timeout.
    ring.wait(Some(Duration::from_millis(10)), &mut done)
        .unwrap();
    assert!(done.is_empty(), "{done:?}");
}

#[test]
fn a_send_writes_and_one_a_peer_does_not_take_is_cancelled() {
    let mut ring = Ring::new().unwrap();
    let (a, mut b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let bytes = b"hello".to_vec();
    unsafe { ring.send(a.as_raw_fd(), &bytes, 3) }.unwrap();
    let got = next(&mut ring);
    assert_eq!((got.tag, got.result), (3, 5));
    let mut read = [0; 5];
    b.read_exact(&mut read).unwrap();
    assert_eq!(&read, b"hello");
    // The peer's buffer full: the send waits in the kernel.
    let fill = vec![0u8; 1 << 16];
    while (&a).write(&fill).is_ok() {}
    unsafe { ring.send(a.as_raw_fd(), &bytes, 4) }.unwrap();
    let mut done = Vec::new();
    ring.wait(Some(Duration::from_millis(20)), &mut done)
        .unwrap();
    assert!(done.is_empty(), "{done:?}");
    ring.cancel(4).unwrap();
    let got = next(&mut ring);
    assert_eq!(got.tag, 4);
    assert!(got.cancelled(), "{got:?}");
}
