//! Telling a claims connection the server ended while it stays up (an
//! idle-session reaper's `pg_terminate_backend`, `idle_session_timeout`)
//! from a database that is down or refuses the proxy, and how long a
//! decision keeps replacing connections ended under it.
//!
//! Only a connection that was open and then ended counts: the server's
//! own word (57P01, 57P05, 57P02), its end of the stream closed, reset or
//! cut mid-message — however long the statement took (under load a
//! decision can take over a second), the peer answered and a new
//! connection is the mend. A silent database is not this (its statement
//! fails by the keepalives' and user timeout's `timed out`), nor is a
//! connect that fails (refused, unreachable, timed out), a TLS handshake
//! or a login the server refuses: retrying those at once mends nothing.
//!
//! A reaper may end the proxy's connections faster than a loaded machine
//! reconnects and runs a statement, so the replacing is bounded in time
//! ([`REAPED_BUDGET`]), not by a count of attempts: while the server keeps
//! answering, a decision keeps replacing its connection until it runs or
//! the budget is spent.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use postgres::error::SqlState;

/// How long one decision (or one taking of the liveness lock) keeps
/// replacing connections ended under it before it fails closed: above the
/// time a connect and a statement take on a loaded machine many times
/// over, below what a client waiting on a parked read notices as a hang.
pub(super) const REAPED_BUDGET: Duration = Duration::from_secs(5);

/// Attempts made whatever the budget says (a first statement slow enough
/// to spend it alone still gets a replacement).
pub(super) const REAPED_MIN_ATTEMPTS: u32 = 3;

/// Pause between attempts after [`REAPED_MIN_ATTEMPTS`]: a server that ends
/// every connection at once is not reconnected to in a tight loop.
const PAUSE: Duration = Duration::from_millis(20);

/// Whether `e` says the connection was ended while the server stays up:
/// the server's own word, or the open connection's stream closed or cut.
pub(super) fn reaped(e: &postgres::Error) -> bool {
    ended_by_server(e) || e.is_closed() || cut_open_connection(e)
}

/// Whether the server said it ended the connection: it is gone even
/// while the client has not read the end of the stream yet.
fn ended_by_server(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::IDLE_SESSION_TIMEOUT
            || *c == SqlState::CRASH_SHUTDOWN
    })
}

/// The connection's stream was cut (reset, aborted, ended mid-message)
/// without a message from the server. Failing to connect (`error
/// connecting to server`), a TLS handshake, a login, a silent peer timing
/// out and anything the server answered are not this.
fn cut_open_connection(e: &postgres::Error) -> bool {
    // The client's kinds are not public: its own words tell them apart.
    if e.to_string() != "error communicating with the server" {
        return false;
    }
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| {
        matches!(
            io.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        )
    })
}

/// The attempts of one decision whose connections are ended under it.
pub(super) struct Replacing {
    began: Instant,
    attempts: u32,
}

impl Replacing {
    /// The first attempt starts now.
    pub(super) fn start() -> Replacing {
        Replacing {
            began: Instant::now(),
            attempts: 1,
        }
    }

    /// After an attempt whose connection was ended under it: whether
    /// another follows (then it is counted, after a short pause once the
    /// first few went at once).
    pub(super) fn again(&mut self) -> bool {
        let more = self.attempts < REAPED_MIN_ATTEMPTS || self.began.elapsed() < REAPED_BUDGET;
        if more {
            if self.attempts >= REAPED_MIN_ATTEMPTS {
                std::thread::sleep(PAUSE);
            }
            self.attempts += 1;
        }
        more
    }

    /// Attempts made so far.
    pub(super) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How long the attempts have taken.
    pub(super) fn elapsed(&self) -> Duration {
        self.began.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_go_on_past_the_minimum_only_within_the_budget() {
        let mut r = Replacing::start();
        assert!(r.again() && r.again(), "the minimum goes at once");
        assert_eq!(r.attempts(), REAPED_MIN_ATTEMPTS);
        // Within the budget: more.
        assert!(r.again());
        // Once spent: none (the start moved back past the budget).
        r.began = Instant::now()
            .checked_sub(REAPED_BUDGET + Duration::from_millis(1))
            .unwrap_or_else(Instant::now);
        assert!(!r.again());
        assert_eq!(r.attempts(), REAPED_MIN_ATTEMPTS + 1);
    }
}
