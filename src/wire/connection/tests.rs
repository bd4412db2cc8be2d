//! The read buffer's sizing and streaming, a connection's reads, and the
//! framing of what they bring.

use std::io::Cursor;
use std::sync::Mutex;

use super::message as msg;
use super::*;

/// A reader that hands out `chunks` one per call.
struct Chunks(Vec<Vec<u8>>);

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(mut chunk) = (!self.0.is_empty()).then(|| self.0.remove(0)) else {
            return Ok(0);
        };
        let n = chunk.len().min(buf.len());
        buf[..n].copy_from_slice(&chunk[..n]);
        if n < chunk.len() {
            self.0.insert(0, chunk.split_off(n));
        }
        Ok(n)
    }
}

#[test]
fn appends_what_arrives_and_grows_while_reads_fill_it() {
    let mut rb = ReadBuffer::default();
    let mut src = Chunks(vec![b"abc".to_vec(), vec![7u8; 100_000]]);
    assert_eq!(rb.fill(&mut src).unwrap(), 3);
    assert_eq!(&rb.bytes[..], b"abc");
    let mut sizes = Vec::new();
    while rb.bytes.len() < 100_003 {
        sizes.push(rb.fill(&mut src).unwrap());
    }
    assert_eq!(sizes[..4], [2048, 4096, 8192, 16384]);
    assert_eq!(rb.bytes.len(), 100_003);
    assert_eq!(rb.fill(&mut src).unwrap(), 0);
    assert_eq!(rb.bytes.len(), 100_003, "end of file appends nothing");
}

#[test]
fn passes_a_message_in_chunks_and_keeps_what_follows() {
    let mut rb = ReadBuffer::default();
    let mut passing = Passing {
        left: 10,
        forward: true,
    };
    let mut sent = Vec::new();
    rb.bytes.extend_from_slice(b"0123");
    rb.pass(&mut passing, |b| {
        sent.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    assert_eq!((passing.left, rb.bytes.len()), (6, 0));
    rb.bytes.extend_from_slice(b"456789next");
    rb.pass(&mut passing, |b| {
        sent.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    assert_eq!(passing.left, 0);
    assert_eq!(&sent[..], b"0123456789");
    assert_eq!(&rb.bytes[..], b"next");
}

#[test]
fn a_replaced_message_is_dropped_not_sent() {
    let mut rb = ReadBuffer::default();
    let mut passing = Passing {
        left: 3,
        forward: false,
    };
    rb.bytes.extend_from_slice(b"abcS");
    rb.pass(&mut passing, |_| panic!("dropped bytes are not sent"))
        .unwrap();
    assert_eq!((passing.left, &rb.bytes[..]), (0, &b"S"[..]));
}

#[test]
fn small_reads_shrink_the_room_again() {
    let mut rb = ReadBuffer::default();
    let mut big = Chunks(vec![vec![1u8; 64 * 1024]]);
    while rb.fill(&mut big).unwrap() > 0 {}
    assert!(rb.want > MIN_READ);
    let _ = rb.bytes.split_to(rb.bytes.len());
    for _ in 0..10 {
        rb.fill(Chunks(vec![b"x".to_vec()])).unwrap();
    }
    assert_eq!(rb.want, MIN_READ);
    assert_eq!(rb.bytes.len(), 10);
}

/// A socket handle whose reads come from a byte string.
struct Script(Mutex<Cursor<Vec<u8>>>);

impl Read for &Script {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.lock() {
            Ok(mut c) => c.read(buf),
            Err(_) => Err(std::io::ErrorKind::Other.into()),
        }
    }
}

fn connection(bytes: &[u8]) -> Connection<Box<Script>> {
    Connection::new(
        Box::new(Script(Mutex::new(Cursor::new(bytes.to_vec())))),
        b"early",
    )
}

#[test]
fn early_bytes_come_first_and_reads_append() {
    let mut c = connection(b"-read");
    assert_eq!(c.buffered(), b"early");
    assert_eq!(c.read().unwrap(), 5);
    assert_eq!(c.buffered(), b"early-read");
    c.consume(6);
    assert_eq!(c.buffered(), b"read");
    assert_eq!(c.read().unwrap(), 0, "end of file");
}

#[test]
fn a_streaming_message_passes_before_anything_else_is_framed() {
    let mut c = connection(b"6789next");
    c.consume(3);
    c.stream_on(Some(Passing {
        left: 6,
        forward: true,
    }));
    let mut sent = Vec::new();
    assert!(c
        .pass_streaming(|b| {
            sent.extend_from_slice(b);
            Ok(())
        })
        .unwrap());
    assert_eq!((&sent[..], c.buffered()), (&b"ly"[..], &b""[..]));
    c.read().unwrap();
    assert!(!c
        .pass_streaming(|b| {
            sent.extend_from_slice(b);
            Ok(())
        })
        .unwrap());
    assert_eq!((&sent[..], c.buffered()), (&b"ly6789"[..], &b"next"[..]));
    assert!(
        !c.pass_streaming(|_| panic!("nothing streams")).unwrap(),
        "the message is through"
    );
}

#[test]
fn frames_a_whole_message() {
    let m = msg(b'Q', b"select 1\0");
    let h = peek_frame(&m, 1 << 20).unwrap().unwrap();
    assert_eq!(h.tag, b'Q');
    assert_eq!(h.total_len, m.len());
}

#[test]
fn waits_for_header_and_body() {
    let m = msg(b'Q', b"select 1\0");
    for cut in 0..m.len() {
        assert_eq!(peek_frame(&m[..cut], 1 << 20).unwrap(), None, "cut {cut}");
    }
}

#[test]
fn reads_the_header_before_the_body() {
    let m = msg(b'd', &[7u8; 1000]);
    assert_eq!(peek_header(&m[..4], 1 << 20).unwrap(), None);
    for cut in [5, 6, 500, m.len()] {
        let h = peek_header(&m[..cut], 1 << 20).unwrap().unwrap();
        assert_eq!((h.tag, h.total_len), (b'd', 1005), "cut {cut}");
    }
    assert!(peek_header(&m[..5], 100).is_err(), "the ceiling holds");
}

#[test]
fn frames_only_the_first_of_two() {
    let mut m = msg(b'S', b"");
    m.extend(msg(b'H', b""));
    let h = peek_frame(&m, 1 << 20).unwrap().unwrap();
    assert_eq!((h.tag, h.total_len), (b'S', 5));
}

#[test]
fn refuses_negative_and_short_lengths() {
    let mut m = vec![b'Q'];
    m.extend_from_slice(&(-1i32).to_be_bytes());
    assert!(matches!(
        peek_frame(&m, 1 << 20),
        Err(FrameError::BadLength { declared: -1, .. })
    ));
    let mut m = vec![b'Q'];
    m.extend_from_slice(&3i32.to_be_bytes());
    assert!(peek_frame(&m, 1 << 20).is_err());
}

#[test]
fn refuses_oversized_header_before_the_body_arrives() {
    // 2 GiB: the i32 wraps negative; 1.5 GiB stays positive but is too big.
    let mut m = vec![b'P'];
    m.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    assert!(peek_frame(&m, 1 << 30).is_err());
    let mut m = vec![b'P'];
    m.extend_from_slice(&0x6000_0000u32.to_be_bytes());
    let err = peek_frame(&m, 1 << 30).unwrap_err();
    assert!(err.to_string().contains("above the limit"), "{err}");
}
