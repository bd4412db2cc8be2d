//! The keepalive and liveness settings of the proxy's connections to its
//! own database: how soon each end counts the other gone after a network
//! partition.

use std::time::Duration;

/// TCP keepalive probes and user timeout with which one end of a
/// connection counts the other gone within a bound: an idle connection is
/// probed after half the bound, three probes fill the rest; data left
/// unacknowledged for the whole bound ends it. Probes are whole seconds,
/// as the server's `tcp_keepalives_*` settings and the kernel take them;
/// under a bound of 5 s they overshoot it and the user timeout (which
/// Linux also applies to unanswered probes) holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadPeer {
    pub idle: Duration,
    pub interval: Duration,
    pub retries: u32,
    pub user_timeout: Duration,
}

impl DeadPeer {
    pub fn within(bound: Duration) -> DeadPeer {
        let secs = bound.as_secs().max(2);
        let idle = (secs / 2).max(1);
        let retries = 3;
        let interval = ((secs - idle) / u64::from(retries)).max(1);
        DeadPeer {
            idle: Duration::from_secs(idle),
            interval: Duration::from_secs(interval),
            retries,
            user_timeout: bound,
        }
    }

    /// The client's side: every connection made with `config` (TCP;
    /// a Unix socket has no such settings and needs none).
    pub fn apply(self, config: &mut postgres::Config) {
        config
            .keepalives(true)
            .keepalives_idle(self.idle)
            .keepalives_interval(self.interval)
            .keepalives_retries(self.retries)
            .tcp_user_timeout(self.user_timeout);
    }
}
