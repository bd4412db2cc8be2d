//! A connection's first packet: answered SSL and GSSAPI encryption
//! requests (and the TLS handshake when the proxy has a certificate),
//! then the StartupMessage or a CancelRequest, all within one deadline
//! however slowly the bytes come.

use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

use bytes::BytesMut;

use super::client_stream::{ClientStream, ClientTls};
use super::connection::ReadBuffer;
use super::messages::sqlstate;
use super::messages::startup::{self, FirstPacket};

/// invalid_authorization_specification: what PostgreSQL answers when no
/// pg_hba.conf line admits an unencrypted connection.
pub const INVALID_AUTHORIZATION: &str = "28000";

/// The first byte of a TLS handshake record: a client opening with TLS
/// directly (PostgreSQL 17's `sslnegotiation=direct`).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Why a connection was refused before its session began: told to the
/// client (when it can still hear plaintext) with this SQLSTATE.
#[derive(Debug)]
pub struct Refusal {
    pub sqlstate: &'static str,
    pub message: String,
}

fn protocol(message: impl Into<String>) -> Refusal {
    Refusal {
        sqlstate: sqlstate::PROTOCOL_VIOLATION,
        message: message.into(),
    }
}

/// What the connection opened with, and the stream to go on with.
pub struct Opened {
    pub client: ClientStream,
    pub first: FirstPacket,
    /// Bytes after the packet: the client's first messages.
    pub early: BytesMut,
}

/// Why a connection ends before it opened.
pub enum NotOpened {
    /// The client left (or failed its TLS handshake, which is logged)
    /// before sending anything: nothing to answer, nothing to log.
    Left,
    /// Bytes that are no first packet PostgreSQL would read: a length word
    /// out of range (a Terminate sent before the StartupMessage), a
    /// CancelRequest of the wrong size, a packet cut short by the client's
    /// close; or a TLS handshake unfinished at the deadline (its client
    /// could not read a plaintext error). PostgreSQL logs these and closes
    /// without a word; so does the proxy (the stream is given to end its
    /// TLS session cleanly).
    Unreadable(ClientStream, String),
    /// Refused, with the stream to tell the client why on.
    Refused(ClientStream, Refusal),
}

/// Reads the connection's first packet. SSLRequest is answered 'S' and
/// the handshake run when `tls` is given, 'N' otherwise; GSSENCRequest is
/// answered 'N'. With `tls`, a connection may also open with a TLS
/// ClientHello directly. With `tls.require`, a StartupMessage sent in
/// plaintext is refused.
pub fn read_first_packet(
    sock: TcpStream,
    tls: Option<&ClientTls>,
    deadline: Instant,
) -> Result<Opened, NotOpened> {
    let mut client = ClientStream::Plain(sock);
    let mut rb = ReadBuffer::default();
    let first = loop {
        let len = loop {
            if let (Some(tls), false, Some(&TLS_HANDSHAKE_RECORD)) =
                (tls, client.is_tls(), rb.bytes.first())
            {
                let early = rb.bytes.split();
                client = upgrade(client, tls, &early, true, deadline)?;
                continue;
            }
            match startup::peek_len(&rb.bytes) {
                Ok(Some(len)) => break len,
                Ok(None) => {}
                Err(e) => return Err(NotOpened::Unreadable(client, e.to_string())),
            }
            match rb.fill_before(&client, deadline) {
                Ok(0) if rb.bytes.is_empty() => return Err(NotOpened::Left),
                Ok(0) => {
                    let why = "incomplete startup packet".to_owned();
                    return Err(NotOpened::Unreadable(client, why));
                }
                Ok(_) => {}
                Err(e) if is_timeout(&e) => {
                    let msg = "timed out waiting for the startup packet";
                    return Err(NotOpened::Refused(client, protocol(msg)));
                }
                Err(_) => return Err(NotOpened::Left),
            }
        };
        let packet = rb.bytes.split_to(len);
        let parsed = match startup::parse(&packet) {
            Ok(p) => p,
            Err(e) if e.is_told() => {
                return Err(NotOpened::Refused(client, protocol(e.to_string())))
            }
            Err(e) => return Err(NotOpened::Unreadable(client, e.to_string())),
        };
        match (parsed, &client) {
            (FirstPacket::SslRequest | FirstPacket::GssEncRequest, ClientStream::Tls(_)) => {
                let msg = "encryption requested on an encrypted connection";
                return Err(NotOpened::Refused(client, protocol(msg)));
            }
            (request @ (FirstPacket::SslRequest | FirstPacket::GssEncRequest), _) => {
                if !rb.bytes.is_empty() {
                    // Bytes after an encryption request, before our answer:
                    // a client must wait for it (PgBouncer refuses this too).
                    let msg = "received unencrypted data after an encryption request";
                    return Err(NotOpened::Refused(client, protocol(msg)));
                }
                let tls = tls.filter(|_| request == FirstPacket::SslRequest);
                let answer: &[u8] = if tls.is_some() { b"S" } else { b"N" };
                if let Err(e) = (&client).write_all(answer) {
                    tracing::debug!(error = %e, "client left during encryption negotiation");
                    return Err(NotOpened::Left);
                }
                if let Some(tls) = tls {
                    client = upgrade(client, tls, &[], false, deadline)?;
                }
            }
            (FirstPacket::Startup(_), ClientStream::Plain(_)) if tls.is_some_and(|t| t.require) => {
                let refusal = Refusal {
                    sqlstate: INVALID_AUTHORIZATION,
                    message: "resumeguard: TLS is required (require_tls): \
                              connect with sslmode=require or stronger"
                        .into(),
                };
                return Err(NotOpened::Refused(client, refusal));
            }
            (other, _) => break other,
        }
    };
    Ok(Opened {
        client,
        first,
        early: rb.bytes,
    })
}

/// The TLS handshake on a plain client connection (on its own handle of
/// the socket), finished by `deadline`. The client, mid-handshake, cannot
/// read a plaintext error, so a failed handshake just closes the
/// connection: a failure is logged here, one unfinished at the deadline is
/// given back to be logged with the connection's other startup timeouts.
fn upgrade(
    client: ClientStream,
    tls: &ClientTls,
    early: &[u8],
    direct: bool,
    deadline: Instant,
) -> Result<ClientStream, NotOpened> {
    let ClientStream::Plain(sock) = &client else {
        return Ok(client);
    };
    let handle = match sock.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "client socket unusable for TLS");
            return Err(NotOpened::Left);
        }
    };
    match ClientStream::accept_tls(handle, tls, early, direct, deadline) {
        Ok(upgraded) => Ok(upgraded),
        Err(e) if is_timeout(&e) => {
            let why = "timed out waiting for the TLS handshake".to_owned();
            Err(NotOpened::Unreadable(client, why))
        }
        Err(e) => {
            tracing::info!(error = %e, direct, "client TLS handshake failed");
            Err(NotOpened::Left)
        }
    }
}

pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests;
