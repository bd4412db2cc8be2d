//! Channel binding cannot cross a TLS-terminating proxy: the client would
//! bind to the proxy's certificate, the server checks its own. So the
//! server's AuthenticationSASL list reaches a TLS client without
//! `SCRAM-SHA-256-PLUS` (plain SCRAM is then chosen), and a client that
//! insists on channel binding fails at once with a clear message of its
//! own instead of a failed proof.

use super::tls_stream::OutgoingFilter;

/// The mechanism removed from the list.
pub const PLUS: &[u8] = b"SCRAM-SHA-256-PLUS";

/// Authentication messages are small; a larger 'R' passes unread.
const MAX_AUTH_MESSAGE: usize = 64 * 1024;

/// Follows the server→client byte stream until authentication is over
/// (AuthenticationOk or an ErrorResponse), rewriting AuthenticationSASL;
/// from then on bytes pass untouched. Messages may be split across writes
/// anywhere.
#[derive(Default)]
pub struct StripPlus {
    state: State,
    /// Bytes of the current header or authentication message.
    partial: Vec<u8>,
}

#[derive(Default, Clone, Copy)]
enum State {
    /// Collecting a message's type byte and length.
    #[default]
    Header,
    /// Collecting a whole authentication message of this many bytes.
    Auth(usize),
    /// Passing `n` more bytes of the current message; then done with
    /// authentication when the flag is set.
    Pass(usize, bool),
    Done,
}

impl OutgoingFilter for StripPlus {
    fn done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        let partial = &mut self.partial;
        while !input.is_empty() {
            match self.state {
                State::Done => {
                    out.extend_from_slice(input);
                    return;
                }
                State::Pass(n, done_after) => {
                    let k = n.min(input.len());
                    out.extend_from_slice(&input[..k]);
                    input = &input[k..];
                    self.state = match (n - k, done_after) {
                        (0, true) => State::Done,
                        (0, false) => State::Header,
                        (left, _) => State::Pass(left, done_after),
                    };
                }
                State::Header => {
                    let k = (5 - partial.len()).min(input.len());
                    partial.extend_from_slice(&input[..k]);
                    input = &input[k..];
                    if partial.len() < 5 {
                        return;
                    }
                    let tag = partial[0];
                    let len = i32::from_be_bytes([partial[1], partial[2], partial[3], partial[4]]);
                    let total = usize::try_from(len).unwrap_or(0) + 1;
                    self.state = if total < 5 {
                        // Not a message stream this filter understands.
                        State::Done
                    } else if tag == b'R' && total <= MAX_AUTH_MESSAGE {
                        State::Auth(total)
                    } else {
                        State::Pass(total - 5, tag == b'E')
                    };
                    if !matches!(self.state, State::Auth(_)) {
                        out.append(partial);
                    }
                    if let State::Pass(0, done_after) = self.state {
                        self.state = if done_after {
                            State::Done
                        } else {
                            State::Header
                        };
                    }
                }
                State::Auth(total) => {
                    let k = (total - partial.len()).min(input.len());
                    partial.extend_from_slice(&input[..k]);
                    input = &input[k..];
                    if partial.len() < total {
                        return;
                    }
                    let ok = partial.get(5..9) == Some(&[0, 0, 0, 0][..]);
                    rewrite_sasl(partial, out);
                    partial.clear();
                    self.state = if ok { State::Done } else { State::Header };
                }
            }
        }
    }
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

    fn run(chunks: &[&[u8]]) -> Vec<u8> {
        let mut f = StripPlus::default();
        let mut out = Vec::new();
        for c in chunks {
            f.push(c, &mut out);
        }
        out
    }

    #[test]
    fn plus_is_removed_from_the_mechanism_list() {
        let offer = sasl(&[b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"]);
        assert_eq!(run(&[&offer]), sasl(&[b"SCRAM-SHA-256"]));
    }

    #[test]
    fn split_anywhere_gives_the_same_bytes() {
        let mut stream = sasl(&[b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"]);
        stream.extend(msg(b'R', &[0, 0, 0, 11, b'x', b'y']));
        stream.extend(msg(b'R', &[0, 0, 0, 0]));
        // After AuthenticationOk nothing is touched, even a lookalike.
        let after = sasl(&[b"SCRAM-SHA-256-PLUS"]);
        stream.extend(&after);
        let mut want = sasl(&[b"SCRAM-SHA-256"]);
        want.extend(msg(b'R', &[0, 0, 0, 11, b'x', b'y']));
        want.extend(msg(b'R', &[0, 0, 0, 0]));
        want.extend(&after);
        for cut in 0..stream.len() {
            assert_eq!(run(&[&stream[..cut], &stream[cut..]]), want, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(run(&bytes), want);
    }

    #[test]
    fn other_messages_and_errors_pass_unchanged() {
        let mut stream = msg(b'v', &[0, 3, 0, 2, 0, 0, 0, 0]);
        stream.extend(msg(b'E', b"SFATAL\0\0"));
        stream.extend(sasl(&[b"SCRAM-SHA-256-PLUS"]));
        assert_eq!(run(&[&stream]), stream);
    }
}
