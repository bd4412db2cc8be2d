//! Channel binding cannot cross a TLS-terminating proxy: the client would
//! bind to the proxy's certificate (or to none, over plaintext), the
//! server checks its own. So the server's AuthenticationSASL list reaches
//! every client without `SCRAM-SHA-256-PLUS` (plain SCRAM is then chosen):
//! a plaintext client of a TLS upstream would otherwise be offered a
//! mechanism it must refuse, and a client that insists on channel binding
//! fails at once with a clear message of its own instead of a failed
//! proof.

use bytes::Bytes;

/// The mechanism removed from the list.
pub const PLUS: &[u8] = b"SCRAM-SHA-256-PLUS";

/// `frame` (one whole server message before authentication is over)
/// without `SCRAM-SHA-256-PLUS`, when it is an AuthenticationSASL that
/// offers it; `None` when it passes as it is.
pub fn without_plus(frame: &[u8]) -> Option<Bytes> {
    let offers_plus = frame.first() == Some(&b'R')
        && frame.get(5..9) == Some(&[0, 0, 0, 10][..])
        && frame[9..].split(|b| *b == 0).any(|n| n == PLUS);
    if !offers_plus {
        return None;
    }
    let mut out = Vec::with_capacity(frame.len());
    rewrite_sasl(frame, &mut out);
    Some(Bytes::from(out))
}

/// Appends `msg` to `out`, without `SCRAM-SHA-256-PLUS` when it is an
/// AuthenticationSASL (code 10: a list of names, each NUL-terminated,
/// ended by an empty one).
fn rewrite_sasl(msg: &[u8], out: &mut Vec<u8>) {
    if msg.get(5..9) != Some(&[0, 0, 0, 10][..]) {
        out.extend_from_slice(msg);
        return;
    }
    let names = &msg[9..];
    let kept: Vec<&[u8]> = names
        .split(|b| *b == 0)
        .take_while(|n| !n.is_empty())
        .filter(|n| *n != PLUS)
        .collect();
    let body_len = 4 + 4 + kept.iter().map(|n| n.len() + 1).sum::<usize>() + 1;
    out.push(b'R');
    out.extend_from_slice(&(body_len as i32).to_be_bytes());
    out.extend_from_slice(&10i32.to_be_bytes());
    for n in kept {
        out.extend_from_slice(n);
        out.push(0);
    }
    out.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::frame::message as msg;

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

    #[test]
    fn other_messages_pass_unchanged() {
        assert_eq!(without_plus(&sasl(&[b"SCRAM-SHA-256"])), None);
        assert_eq!(without_plus(&msg(b'R', &[0, 0, 0, 0])), None);
        assert_eq!(without_plus(&msg(b'R', &[0, 0, 0, 11, b'x'])), None);
        assert_eq!(without_plus(&msg(b'E', b"SFATAL\0\0")), None);
        assert_eq!(without_plus(b"R"), None);
    }
}
