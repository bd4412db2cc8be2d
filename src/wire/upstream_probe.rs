//! Whether the upstream answers as a PostgreSQL a session could use:
//! connect, negotiate TLS exactly as sessions do (so a certificate the
//! sessions would refuse fails here too), send a startup message and read
//! the server's first answer. A TCP port that accepts is not enough.

use std::io::{self, Read};
use std::time::Duration;

use bytes::BytesMut;

use super::messages::authentication::is_authentication_ok;
use super::messages::error_response::error_fields;
use super::messages::startup::write_startup_message;
use super::messages::terminate::write_terminate;
use super::messages::write::EncodeError;
use super::proxy::RelayConfig;

/// The step of the probe that failed, and why.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("connect: {0}")]
    Connect(io::Error),
    /// TLS negotiation, in the words of the sessions' own negotiation.
    #[error("{0}")]
    Tls(io::Error),
    #[error("startup: {0}")]
    Startup(io::Error),
    #[error("startup: {0}")]
    StartupMessage(EncodeError),
    #[error("no answer to the startup: {0}")]
    NoAnswer(io::Error),
    /// An ErrorResponse other than a login refusal: its message and
    /// SQLSTATE, escaped.
    #[error("the server refused the startup: {message} ({code})")]
    Refused { message: String, code: String },
    /// The tag of a first answer that is neither an authentication request
    /// nor an error, escaped.
    #[error("the server answered the startup with message {0:?}, not an authentication request")]
    Unexpected(String),
    #[error("the server answered nothing")]
    Nothing,
}

/// The login the probe's startup names. Any authentication request is an
/// answer (the probe then closes, as libpq does when it has no password
/// to give: PostgreSQL logs nothing), and so is a refusal of the login
/// itself (no such role or database, no `pg_hba.conf` line): the server
/// is up and judging logins. Any other error (starting up, shutting down,
/// too many connections) is not.
const LOGIN_REFUSALS: [&[u8]; 2] = [b"28", b"3D"];

/// Longest first answer the probe reads (an ErrorResponse or an
/// authentication request is far shorter).
const MAX_ANSWER: usize = 64 * 1024;

/// Checks the upstream of `config` with a startup for `user`; each step
/// bounded by `timeout`. The error says which step failed and why.
pub fn probe_upstream(
    config: &RelayConfig,
    user: &str,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let sock = config
        .upstream
        .connect(timeout)
        .map_err(ProbeError::Connect)?;
    let server = config
        .upstream_tls
        .negotiate(sock, timeout)
        .map_err(ProbeError::Tls)?;
    server
        .set_read_timeout(Some(timeout))
        .map_err(ProbeError::Startup)?;
    let mut startup = BytesMut::new();
    let params = [
        ("user", user),
        ("database", "postgres"),
        ("application_name", "resumeguard-readyz"),
    ];
    write_startup_message(&mut startup, params).map_err(ProbeError::StartupMessage)?;
    server.write_all(&startup).map_err(ProbeError::Startup)?;
    let answer = read_message(&server).map_err(ProbeError::NoAnswer)?;
    let verdict = judge(&answer);
    if is_authentication_ok(&answer) {
        // AuthenticationOk: end the session politely.
        let mut terminate = BytesMut::new();
        if write_terminate(&mut terminate).is_ok() {
            let _ = server.write_all(&terminate);
        }
    }
    server.close_notify();
    verdict
}

/// One whole server message: tag, length, body.
fn read_message(mut server: &super::upstream::Upstream) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 5];
    server.read_exact(&mut head)?;
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let body = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_sub(4))
        .filter(|l| *l <= MAX_ANSWER)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "not a PostgreSQL message (tag {:?}, length {len})",
                    head[0].escape_ascii().to_string()
                ),
            )
        })?;
    let mut message = head.to_vec();
    message.resize(5 + body, 0);
    server.read_exact(&mut message[5..])?;
    Ok(message)
}

/// The first answer to a startup, judged.
fn judge(answer: &[u8]) -> Result<(), ProbeError> {
    match answer.first() {
        Some(b'R') => Ok(()),
        Some(b'E') => {
            let code = field(answer, b'C').unwrap_or_default();
            let message = field(answer, b'M').unwrap_or_default();
            if LOGIN_REFUSALS.iter().any(|class| code.starts_with(class)) {
                return Ok(());
            }
            Err(ProbeError::Refused {
                message: message.escape_ascii().to_string(),
                code: code.escape_ascii().to_string(),
            })
        }
        Some(other) => Err(ProbeError::Unexpected(other.escape_ascii().to_string())),
        None => Err(ProbeError::Nothing),
    }
}

/// A field of an ErrorResponse (`C`: SQLSTATE, `M`: message).
fn field(error: &[u8], code: u8) -> Option<&[u8]> {
    error_fields(error)
        .find(|(c, _)| *c == code)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::connection::message as msg;

    #[test]
    fn answers_are_judged() {
        assert!(judge(&msg(b'R', &[0, 0, 0, 10])).is_ok());
        let no_role = msg(b'E', b"SFATAL\0C28000\0Mrole \"x\" does not exist\0\0");
        assert!(judge(&no_role).is_ok());
        let starting = msg(
            b'E',
            b"SFATAL\0C57P03\0Mthe database system is starting up\0\0",
        );
        let why = judge(&starting).unwrap_err().to_string();
        assert!(
            why.contains("starting up") && why.contains("57P03"),
            "{why}"
        );
        assert!(judge(&msg(b'Z', b"I")).is_err());
    }
}
