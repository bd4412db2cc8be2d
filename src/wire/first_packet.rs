//! A connection's first packet: answered SSL and GSSAPI encryption
//! requests, then the StartupMessage or a CancelRequest, all within one
//! deadline however slowly the bytes come.

use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

use bytes::BytesMut;

use super::read_buffer::ReadBuffer;
use super::startup::{self, FirstPacket};

/// Reads the connection's first packet, answering SSL and GSSAPI
/// encryption requests with 'N' (no TLS yet) until a real one arrives.
/// The whole exchange must finish within the startup timeout, however
/// slowly the bytes come. Bytes after the packet are the client's first
/// messages: they come back with it.
pub fn read_first_packet(
    client: &mut TcpStream,
    deadline: Instant,
) -> Result<Option<(FirstPacket, BytesMut)>, String> {
    let mut rb = ReadBuffer::default();
    let first = loop {
        let len = loop {
            match startup::peek_len(&rb.bytes).map_err(|e| e.to_string())? {
                Some(len) => break len,
                None => match fill_before(&mut rb, client, deadline) {
                    Ok(0) => return Ok(None),
                    Ok(_) => {}
                    Err(e) if is_timeout(&e) => {
                        return Err("timed out waiting for the startup packet".into())
                    }
                    Err(_) => return Ok(None),
                },
            }
        };
        let packet = rb.bytes.split_to(len);
        match startup::parse(&packet).map_err(|e| e.to_string())? {
            FirstPacket::SslRequest | FirstPacket::GssEncRequest => {
                if !rb.bytes.is_empty() {
                    // Bytes after an encryption request, before our answer:
                    // a client must wait for it (PgBouncer refuses this too).
                    return Err("received unencrypted data after an encryption request".into());
                }
                client.write_all(b"N").map_err(|e| e.to_string())?;
            }
            other => break other,
        }
    };
    Ok(Some((first, rb.bytes)))
}

/// One read, given up at `deadline`.
pub fn fill_before(
    rb: &mut ReadBuffer,
    client: &TcpStream,
    deadline: Instant,
) -> std::io::Result<usize> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    client.set_read_timeout(Some(left))?;
    rb.fill(client)
}

pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
