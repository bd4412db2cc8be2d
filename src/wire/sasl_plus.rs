//! Channel binding cannot cross a TLS-terminating proxy: the client would
//! bind to the proxy's certificate (or to none, over plaintext), the
//! server checks its own, and the binding is inside the SCRAM proof, so
//! the proxy cannot mend it. Hence:
//! - a plaintext client gets the server's AuthenticationSASL list without
//!   `SCRAM-SHA-256-PLUS` (it would have to refuse a server offering it
//!   over no TLS), and authenticates with plain SCRAM;
//! - a TLS client sees the list as the server sent it; when it starts
//!   SCRAM with channel binding (`SCRAM-SHA-256-PLUS`: libpq's
//!   `channel_binding=prefer`, its default, and `require`), or says it
//!   could bind but believes the server cannot (`y`, which a TLS server
//!   refuses as a downgrade), the proxy answers FATAL 08004 saying why and
//!   what to set, instead of the server's "SCRAM channel binding
//!   negotiation error" or a failed proof that point nowhere.

use bytes::{Bytes, BytesMut};

use super::messages::authentication::{
    sasl_mechanism_list, write_authentication_sasl, SaslInitialResponse,
};

/// The mechanism removed from the list.
pub const PLUS: &[u8] = b"SCRAM-SHA-256-PLUS";

/// SCRAM without channel binding.
const SCRAM: &[u8] = b"SCRAM-SHA-256";

/// What a client refused for channel binding is told to set.
pub const BINDING_HINT: &str = "Connect through resumeguard without channel binding: \
     channel_binding=disable (libpq: psql, psycopg, and libpq's default `prefer` \
     must be turned off), channelBinding=disable (JDBC), Channel Binding=Disable \
     (Npgsql), enableChannelBinding: false (node-postgres). The proxy's own TLS \
     connection to the server is checked by the upstream's sslmode (verify-full).";

/// A SASL start asking for channel binding the proxy cannot carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRefusal {
    pub message: String,
}

/// The refusal for `frame` (a client message before authentication is
/// over) when it is a SASLInitialResponse asking for channel binding over
/// an `upstream_tls` connection; `None` for every other message. Exact:
/// a SASLInitialResponse is a mechanism name, a length and that many
/// bytes, which no password message (one string) is.
pub fn binding_refused(frame: &[u8], upstream_tls: bool) -> Option<BindingRefusal> {
    if !upstream_tls {
        return None;
    }
    let SaslInitialResponse { mechanism, data } = SaslInitialResponse::read(frame)?;
    let message = if mechanism == PLUS && data.starts_with(b"p=") {
        "resumeguard: channel binding cannot pass a TLS-terminating proxy: the client \
         binds SCRAM-SHA-256-PLUS to resumeguard's certificate, the server checks its own, \
         so the login would fail"
    } else if mechanism == SCRAM && data.starts_with(b"y,") {
        "resumeguard: channel binding cannot pass a TLS-terminating proxy: the client \
         supports it and believes the server does not, which a TLS server refuses as a \
         downgrade"
    } else {
        return None;
    };
    Some(BindingRefusal {
        message: message.to_owned(),
    })
}

/// `frame` (one whole server message before authentication is over)
/// without `SCRAM-SHA-256-PLUS`, when it is an AuthenticationSASL that
/// offers it; `None` when it passes as it is.
pub fn without_plus(frame: &[u8]) -> Option<Bytes> {
    let names = sasl_mechanism_list(frame)?;
    if !names.split(|b| *b == 0).any(|n| n == PLUS) {
        return None;
    }
    let kept = names
        .split(|b| *b == 0)
        .take_while(|n| !n.is_empty())
        .filter(|n| *n != PLUS);
    let mut out = BytesMut::with_capacity(frame.len());
    write_authentication_sasl(&mut out, kept).ok()?;
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::connection::message as msg;

    fn sasl(names: &[&[u8]]) -> Vec<u8> {
        let mut body = 10i32.to_be_bytes().to_vec();
        for n in names {
            body.extend_from_slice(n);
            body.push(0);
        }
        body.push(0);
        msg(b'R', &body)
    }

    #[test]
    fn plus_is_removed_from_the_mechanism_list() {
        let offer = sasl(&[b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"]);
        assert_eq!(
            without_plus(&offer).as_deref(),
            Some(&sasl(&[b"SCRAM-SHA-256"])[..])
        );
    }

    fn sasl_start(mechanism: &[u8], data: &[u8]) -> Vec<u8> {
        let mut body = mechanism.to_vec();
        body.push(0);
        body.extend_from_slice(&(data.len() as i32).to_be_bytes());
        body.extend_from_slice(data);
        msg(b'p', &body)
    }

    #[test]
    fn a_sasl_start_asking_for_binding_is_refused_over_tls_only() {
        let plus = sasl_start(PLUS, b"p=tls-server-end-point,,n=,r=abc");
        let y = sasl_start(SCRAM, b"y,,n=,r=abc");
        let n = sasl_start(SCRAM, b"n,,n=,r=abc");
        assert!(binding_refused(&plus, true).is_some());
        assert!(binding_refused(&y, true).is_some());
        assert_eq!(binding_refused(&n, true), None);
        assert_eq!(binding_refused(&plus, false), None);
        // A cleartext password that spells a mechanism is a password.
        let mut password = PLUS.to_vec();
        password.push(0);
        assert_eq!(binding_refused(&msg(b'p', &password), true), None);
        assert_eq!(binding_refused(b"p", true), None);
    }

    #[test]
    fn other_messages_pass_unchanged() {
        assert_eq!(without_plus(&sasl(&[b"SCRAM-SHA-256"])), None);
        assert_eq!(without_plus(&msg(b'R', &[0, 0, 0, 0])), None);
        assert_eq!(without_plus(&msg(b'R', &[0, 0, 0, 11, b'x'])), None);
        assert_eq!(without_plus(&msg(b'E', b"SFATAL\0\0")), None);
        assert_eq!(without_plus(b"R"), None);
    }
}
