//! TCP keepalives and a user timeout on the data path's sockets (the
//! client's and the upstream's), so a peer that vanishes without a word —
//! a primary cut off by a dead switch, a client host powered off — ends
//! its sessions within a stated bound instead of after the kernel's
//! retransmission gives up (about 15 minutes) or never (an idle session).

use std::net::TcpStream;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use socket2::{SockRef, TcpKeepalive};

/// `[keepalive]` in the configuration file. A silent peer is noticed
/// within about `user_timeout_ms` plus one `interval_ms` whether the
/// session is idle (keepalive probes go unanswered) or sending (its data
/// goes unacknowledged): 70 s with the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Keepalive {
    /// Idle time before the first probe; 0 turns keepalives off.
    pub idle_ms: u64,
    /// Time between unanswered probes.
    pub interval_ms: u64,
    /// Unanswered probes before the connection is dropped (when
    /// `user_timeout_ms` is 0; otherwise that bound ends it first).
    pub count: u32,
    /// Longest time sent data may stay unacknowledged, and (Linux) the
    /// longest a connection probed by keepalives may go unanswered; 0: the
    /// system's default.
    pub user_timeout_ms: u64,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle_ms: 30_000,
            interval_ms: 10_000,
            count: 3,
            user_timeout_ms: 60_000,
        }
    }
}

impl Keepalive {
    /// Sets the options on `sock`. A socket that refuses one is logged and
    /// counted (it still serves, as it would without keepalives).
    pub fn apply(&self, sock: &TcpStream, side: &'static str) {
        if let Err(e) = self.try_apply(sock) {
            metrics::counter!(crate::metrics::KEEPALIVE_ERRORS, "side" => side).increment(1);
            tracing::error!(side, error = %e, "cannot set TCP keepalives on a connection: a silent peer will not be noticed in time");
        }
    }

    fn try_apply(&self, sock: &TcpStream) -> std::io::Result<()> {
        let sock = SockRef::from(sock);
        if self.idle_ms > 0 {
            let params = TcpKeepalive::new()
                .with_time(Duration::from_millis(self.idle_ms))
                .with_interval(Duration::from_millis(self.interval_ms.max(1_000)))
                .with_retries(self.count.max(1));
            sock.set_tcp_keepalive(&params)?;
        }
        if self.user_timeout_ms > 0 {
            sock.set_tcp_user_timeout(Some(Duration::from_millis(self.user_timeout_ms)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_reach_the_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let k = Keepalive {
            idle_ms: 7_000,
            interval_ms: 2_000,
            count: 4,
            user_timeout_ms: 9_000,
        };
        k.try_apply(&sock).unwrap();
        let s = SockRef::from(&sock);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(7));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(2));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(9)));
    }
}
