//! Claims and live sessions as the admin API's JSON: the same facts as
//! `resumeguard claims list` and the session registry, with times in
//! RFC 3339.

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::audit::format_rfc3339_millis;
use crate::claims::ClaimRecord;
use crate::wire::registry::SessionSummary;

#[derive(Debug, Serialize)]
pub struct ClaimView {
    pub thread_id: String,
    pub checkpoint_ns: String,
    pub checkpoint_id: String,
    /// The interrupt's fingerprint, shortened as in `claims list`.
    pub interrupt: String,
    pub state: &'static str,
    /// The claim's generation (one more on each new holder).
    pub epoch: i64,
    pub holder: HolderView,
    pub claimed_at: String,
    pub lapses_at: String,
    pub consumed_at: Option<String>,
    pub evidence: Option<String>,
    pub refusals: i64,
    pub takeovers: i64,
    /// When the thread saved a child of this checkpoint.
    pub superseded_at: Option<String>,
    /// When the holder counts as gone (its connection closed).
    pub holder_gone_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct HolderView {
    pub proxy_id: String,
    pub session_id: u64,
    pub client_addr: String,
    pub application_name: String,
}

impl From<&ClaimRecord> for ClaimView {
    fn from(r: &ClaimRecord) -> Self {
        ClaimView {
            thread_id: r.key.at.thread_id.clone(),
            checkpoint_ns: r.key.at.checkpoint_ns.clone(),
            checkpoint_id: r.key.at.checkpoint_id.clone(),
            interrupt: r.key.short_fingerprint().to_owned(),
            state: r.state.as_str(),
            epoch: r.epoch,
            holder: HolderView {
                proxy_id: r.holder.proxy_id.clone(),
                session_id: r.holder.session_id,
                client_addr: r.holder.client_addr.clone(),
                application_name: r.holder.application_name.clone(),
            },
            claimed_at: time(r.claimed_at_ms),
            lapses_at: time(r.lapse_at_ms),
            consumed_at: r.consumed_at_ms.map(time),
            evidence: r.evidence.clone(),
            refusals: r.refusals,
            takeovers: r.takeovers,
            superseded_at: r.superseded_at_ms.map(time),
            holder_gone_at: r.abandon_at_ms.map(time),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct SessionView {
    pub id: u64,
    pub peer: String,
    pub user: String,
    pub database: String,
    pub application_name: String,
    /// Came in on the inspection listener.
    pub inspection: bool,
    pub started_at: String,
}

impl From<&SessionSummary> for SessionView {
    fn from(s: &SessionSummary) -> Self {
        SessionView {
            id: s.id,
            peer: s.peer.clone(),
            user: s.user.clone(),
            database: s.database.clone(),
            application_name: s.application_name.clone(),
            inspection: s.inspection_listener,
            started_at: format_rfc3339_millis(s.started_at),
        }
    }
}

/// Wall-clock milliseconds as RFC 3339 UTC.
fn time(ms: i64) -> String {
    let t = if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    };
    format_rfc3339_millis(t)
}
