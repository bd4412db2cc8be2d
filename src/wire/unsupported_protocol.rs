//! A StartupMessage in a protocol version PostgreSQL does not speak (2.0
//! and older, 4.0 and newer) gets PostgreSQL's own answer: the packet goes
//! to the upstream, whatever it answers (for a 2.0 client, a protocol-2.0
//! `E` text its client can read; for a newer one, an ErrorResponse) is
//! relayed, and the connection closes. The server names the versions it
//! supports, which only it knows. When the upstream cannot be asked, the
//! proxy answers in the same shape itself.

use std::io::{Read, Write};
use std::time::Instant;

use super::client_stream::ClientStream;
use super::messages::error_response::{error_response, protocol_2_error, Severity};
use super::messages::sqlstate::FEATURE_NOT_SUPPORTED;
use super::messages::startup::UnsupportedStartup;
use super::proxy::Proxy;
use super::upstream::Upstream;

/// The most of the server's answer relayed: one error message is far
/// less.
const MAX_ANSWER: usize = 8192;

/// Answers `startup` on `client` (the server's answer, or the proxy's
/// own), all by `deadline`.
pub fn answer_unsupported(
    proxy: &Proxy,
    client: &ClientStream,
    startup: &UnsupportedStartup,
    deadline: Instant,
) {
    let (major, minor) = (startup.major, startup.minor);
    let relayed = proxy
        .connect_upstream()
        .and_then(|server| relay_answer(&server, client, &startup.raw, deadline));
    match relayed {
        Ok(0) => {
            tracing::info!(
                major,
                minor,
                "unsupported frontend protocol: the server said nothing"
            );
            let _ = (&*client).write_all(&local_answer(major, minor));
        }
        Ok(bytes) => {
            tracing::info!(
                major,
                minor,
                bytes,
                "unsupported frontend protocol: the server's answer relayed"
            );
        }
        Err(e) => {
            tracing::info!(major, minor, error = %e, "unsupported frontend protocol: answered by the proxy");
            let _ = (&*client).write_all(&local_answer(major, minor));
        }
    }
}

/// Sends `packet` to the server and relays its answer until it closes
/// (at most [`MAX_ANSWER`] bytes, by `deadline`). The bytes relayed.
fn relay_answer(
    server: &Upstream,
    client: &ClientStream,
    packet: &[u8],
    deadline: Instant,
) -> std::io::Result<usize> {
    server.write_all(packet)?;
    let mut buf = [0u8; 2048];
    let mut relayed = 0;
    while relayed < MAX_ANSWER {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        server.set_read_timeout(Some(left))?;
        let n = match (&*server).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n.min(MAX_ANSWER - relayed),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if relayed > 0 => {
                tracing::debug!(error = %e, "reading the server's answer to an unsupported protocol");
                break;
            }
            Err(e) => return Err(e),
        };
        (&*client).write_all(&buf[..n])?;
        relayed += n;
    }
    server.close_notify();
    Ok(relayed)
}

/// What PostgreSQL sends such a client, from the proxy: to a client older
/// than 3.0, the protocol-2.0 error (`E`, the text, a NUL; no length
/// word); to a newer one, an ErrorResponse.
fn local_answer(major: u16, minor: u16) -> Vec<u8> {
    let message =
        format!("unsupported frontend protocol {major}.{minor}: server supports 3.0 to 3.2");
    if major < 3 {
        return protocol_2_error(&format!("FATAL:  {message}\n"));
    }
    error_response(Severity::Fatal, FEATURE_NOT_SUPPORTED, &message, None).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::connection::peek_frame;

    #[test]
    fn an_old_client_is_answered_in_protocol_two() {
        // The shape PostgreSQL 15 sends a 2.0 StartupMessage.
        assert_eq!(
            local_answer(2, 0),
            b"EFATAL:  unsupported frontend protocol 2.0: server supports 3.0 to 3.2\n\0"
        );
    }

    #[test]
    fn a_newer_client_is_answered_with_an_error_response() {
        let answer = local_answer(4, 1);
        let h = peek_frame(&answer, 1 << 16).unwrap().unwrap();
        assert_eq!((h.tag, h.total_len), (b'E', answer.len()));
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.contains("SFATAL\0") && text.contains("C0A000\0"),
            "{text}"
        );
        assert!(text.contains("unsupported frontend protocol 4.1"), "{text}");
    }
}
