//! The client and database encodings the server reported. Where they
//! differ, and neither is SQL_ASCII, the server converts every text the
//! client sends and every text it answers with: a thread id's bytes
//! outside ASCII as the proxy reads them are not the characters the
//! server stores, and another session in another encoding names the
//! same thread with other bytes. Such a key cannot be claimed.
//!
//! The server reports a changed encoding just before its next
//! ReadyForQuery, after the rows of any statement sent behind the change
//! in the same pipeline. So from a statement that is not checkpoint
//! traffic (any of which may change the encoding: `SET`, `RESET`,
//! `DISCARD`, `set_config`, a `COMMIT` ending a `SET LOCAL`, a function)
//! until a ReadyForQuery answers the last segment sent, the encoding is
//! unsettled, and counted as converted.

use crate::saver::checkpoint_ref::CheckpointRef;

#[derive(Debug, Default)]
pub(super) struct Encodings {
    client: Option<String>,
    server: Option<String>,
    /// A statement that may change the encoding was sent since the last
    /// ReadyForQuery.
    unsettled: bool,
}

/// What [`Encodings::converted`] names while the encoding is unsettled.
const UNSETTLED: &str = "(changed or not by a statement earlier in this pipeline, and not yet \
                         reported)";

impl Encodings {
    /// A ParameterStatus: takes `client_encoding` and `server_encoding`.
    pub(super) fn reported(&mut self, name: &[u8], value: &[u8]) {
        let slot = match name {
            b"client_encoding" => &mut self.client,
            b"server_encoding" => &mut self.server,
            _ => return,
        };
        *slot = Some(String::from_utf8_lossy(value).into_owned());
    }

    /// A statement that may change the encoding was sent.
    pub(super) fn unsettle(&mut self) {
        self.unsettled = true;
    }

    /// A ReadyForQuery answered the last segment sent: every change has
    /// been reported.
    pub(super) fn settle(&mut self) {
        self.unsettled = false;
    }

    /// The client encoding, when the server converts between it and the
    /// database's, or may (unsettled); neither reported: none; the
    /// database's not reported: UTF8, every database's default.
    pub(super) fn converted(&self) -> Option<&str> {
        if self.unsettled {
            return Some(UNSETTLED);
        }
        let client = self.client.as_deref()?;
        let server = self.server.as_deref().unwrap_or("UTF8");
        let raw = |e: &str| e.eq_ignore_ascii_case("SQL_ASCII");
        (!client.eq_ignore_ascii_case(server) && !raw(client) && !raw(server)).then_some(client)
    }

    /// The client encoding, when `texts` hold a character outside ASCII
    /// the server converts: what they name is not what the proxy read.
    pub(super) fn converts_any<'a>(
        &self,
        mut texts: impl Iterator<Item = &'a str>,
    ) -> Option<&str> {
        self.converted().filter(|_| texts.any(|t| !t.is_ascii()))
    }

    /// [`Self::converts_any`] of a checkpoint's thread, namespace and id.
    pub(super) fn converts_at(&self, at: &CheckpointRef) -> Option<&str> {
        self.converts_any(
            [
                at.thread_id.as_str(),
                at.checkpoint_ns.as_str(),
                at.checkpoint_id.as_str(),
            ]
            .into_iter(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(pairs: &[(&str, &str)]) -> Encodings {
        let mut e = Encodings::default();
        for (name, value) in pairs {
            e.reported(name.as_bytes(), value.as_bytes());
        }
        e
    }

    #[test]
    fn only_a_converting_pair_with_text_outside_ascii_counts() {
        let sjis = reported(&[("server_encoding", "UTF8"), ("client_encoding", "SJIS")]);
        assert_eq!(sjis.converted(), Some("SJIS"));
        assert_eq!(sjis.converts_any(["ﾃｩ-1"].into_iter()), Some("SJIS"));
        assert_eq!(sjis.converts_any(["thread-1", ""].into_iter()), None);
        for same in [
            reported(&[("server_encoding", "UTF8"), ("client_encoding", "UTF8")]),
            reported(&[
                ("server_encoding", "SQL_ASCII"),
                ("client_encoding", "LATIN1"),
            ]),
            reported(&[
                ("server_encoding", "UTF8"),
                ("client_encoding", "SQL_ASCII"),
            ]),
            reported(&[("client_encoding", "utf8")]),
            reported(&[("application_name", "x")]),
        ] {
            assert_eq!(same.converts_any(["ﾃｩ-1"].into_iter()), None, "{same:?}");
        }
        // A later report replaces the earlier one.
        let back = reported(&[
            ("server_encoding", "UTF8"),
            ("client_encoding", "LATIN1"),
            ("client_encoding", "UTF8"),
        ]);
        assert_eq!(back.converted(), None);
    }

    #[test]
    fn a_statement_that_may_change_the_encoding_unsettles_it_until_ready() {
        let mut e = reported(&[("server_encoding", "UTF8"), ("client_encoding", "UTF8")]);
        e.unsettle();
        assert_eq!(e.converts_any(["ﾃｩ-1"].into_iter()), Some(UNSETTLED));
        assert_eq!(e.converts_any(["t-1"].into_iter()), None);
        e.settle();
        assert_eq!(e.converted(), None);
    }
}
