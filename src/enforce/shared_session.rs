//! A session that carries more than one client's transactions: its
//! application_name changes mid-session, as a transaction pooler in front
//! of the proxy makes it (PgBouncer logs in once and sets each client's
//! name on the server connection it lends that client). Consume-once tells
//! claim holders apart by session, so a claim such a session takes is held
//! by whichever client's transaction runs on it next: another client's
//! read of the parked head can be served as the holder's own. The proxy
//! cannot tell those clients apart; it says so once per session (WARN)
//! and counts it (`resumeguard_shared_sessions_total`), never silently.

use crate::log_text::shown;

/// Whether this session was already reported.
#[derive(Debug, Default)]
pub struct SharedSessionWatch {
    reported: bool,
}

impl SharedSessionWatch {
    /// The server reported the session's application_name as `to`; it
    /// was `from`. Reports the first change (the server's report of the
    /// name the session logged in with changes nothing).
    pub fn application_name(&mut self, from: &str, to: &str) -> bool {
        if from == to || self.reported {
            return false;
        }
        self.reported = true;
        metrics::counter!(crate::metrics::SHARED_SESSIONS).increment(1);
        tracing::warn!(
            from = %shown(from),
            to = %shown(to),
            "application_name changed mid-session: this session carries more than one \
             client (a transaction pooler in front of the proxy?); consume-once tells claim \
             holders apart by session, so a claim taken here cannot be held to one client \
             and another client's resume on this session can be served as the holder's: \
             put the pooler behind the proxy or run it in session mode (docs/poolers.md)"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::SharedSessionWatch;

    #[test]
    fn the_first_change_is_reported_once() {
        let mut watch = SharedSessionWatch::default();
        assert!(!watch.application_name("app", "app"));
        assert!(watch.application_name("app", "racer-1"));
        assert!(!watch.application_name("racer-1", "racer-2"));
    }
}
