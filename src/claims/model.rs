//! What a claim is: the interrupt it guards, who holds it, and where it is
//! in its life (held → consumed, or released by an operator).
//!
//! The key names the interrupt, not just the checkpoint: a node that calls
//! `interrupt()` a second time parks again on the same checkpoint with a
//! new `__interrupt__` write, and that second answer must not be refused
//! because the first one was consumed (Remit's two-interrupt failure).

use std::time::{Duration, UNIX_EPOCH};

use crate::saver::checkpoint_ref::CheckpointRef;
use sha2::{Digest, Sha256};

/// One interrupt of one parked checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimKey {
    /// The parked checkpoint.
    pub at: CheckpointRef,
    /// [`interrupt_fingerprint`] of the checkpoint's `__interrupt__` writes.
    pub fingerprint: String,
}

impl ClaimKey {
    /// The first 12 hex digits of the fingerprint: enough to tell
    /// interrupts apart in messages and tables.
    pub fn short_fingerprint(&self) -> &str {
        short(&self.fingerprint)
    }
}

/// The session that took a claim. `proxy_id` + `session_id` identify it
/// across replicas; address and application_name are for the humans who
/// read refusals and `claims list`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    pub proxy_id: String,
    pub session_id: u64,
    pub client_addr: String,
    pub application_name: String,
}

impl Holder {
    /// Whether `other` is the same session (same proxy, same connection).
    pub fn same_session(&self, other: &Holder) -> bool {
        self.proxy_id == other.proxy_id && self.session_id == other.session_id
    }
}

/// Where a claim is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimState {
    /// A reader took it and no evidence of its run has arrived yet.
    Held,
    /// Evidence of a run arrived: the interrupt is answered for good.
    Consumed,
    /// An operator let it go: the next reader takes it afresh.
    Released,
}

impl ClaimState {
    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Held => "held",
            ClaimState::Consumed => "consumed",
            ClaimState::Released => "released",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn parse(s: &str) -> Option<ClaimState> {
        match s {
            "held" => Some(ClaimState::Held),
            "consumed" => Some(ClaimState::Consumed),
            "released" => Some(ClaimState::Released),
            _ => None,
        }
    }
}

/// One row of the claim store. Times are milliseconds since the Unix
/// epoch on the claims database's clock ([`super::clock`]), so replicas
/// whose own clocks disagree compare them directly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRecord {
    pub key: ClaimKey,
    pub holder: Holder,
    pub state: ClaimState,
    pub claimed_at_ms: i64,
    /// A held claim with no evidence by this time may be taken over.
    pub lapse_at_ms: i64,
    pub consumed_at_ms: Option<i64>,
    /// What consumed it (or, on a held claim, the progress last noted).
    pub evidence: Option<String>,
    /// The claim's generation: 1 when the key is first taken, one more on
    /// each new holder (a take after a release, a takeover). A holder
    /// whose generation is no longer the key's latest is superseded: its
    /// writes that continue the checkpoint are fenced.
    pub epoch: i64,
    /// Readers refused while this claim was live or consumed.
    pub refusals: i64,
    /// Times another session took this claim over (after it lapsed, or
    /// after its answering run was abandoned).
    pub takeovers: i64,
    /// When the thread put a checkpoint whose parent is this claim's
    /// checkpoint (it moved on), if it did.
    pub superseded_at_ms: Option<i64>,
    /// When the holder counts as gone: its connection closed, plus
    /// `holder_gone_grace_ms`. `None` while the connection is open.
    pub abandon_at_ms: Option<i64>,
}

impl ClaimRecord {
    /// The record of `key` just taken by `holder` at `now_ms`, generation
    /// `epoch`: held, nothing counted yet (tests and the model check build
    /// their records from it).
    pub fn taken(
        key: &ClaimKey,
        holder: &Holder,
        now_ms: i64,
        lapse_at_ms: i64,
        epoch: i64,
    ) -> ClaimRecord {
        ClaimRecord {
            key: key.clone(),
            holder: holder.clone(),
            state: ClaimState::Held,
            claimed_at_ms: now_ms,
            lapse_at_ms,
            consumed_at_ms: None,
            evidence: None,
            epoch,
            refusals: 0,
            takeovers: 0,
            superseded_at_ms: None,
            abandon_at_ms: None,
        }
    }

    /// Consumed after its lapse time: the run took longer than the lapse,
    /// so a racer could have taken it over meanwhile (the map-form long
    /// gate the issue asks to warn about).
    pub fn consumed_after_lapse(&self) -> bool {
        matches!(self.consumed_at_ms, Some(at) if at > self.lapse_at_ms)
    }
}

/// The run that answered an interrupt, while it is still writing: reads
/// of the thread's head that would continue it from another session are
/// refused (see `policy::claims::decide_running_head`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunLease {
    pub thread_id: String,
    pub checkpoint_ns: String,
    /// The parked checkpoint whose interrupt was answered.
    pub answered_checkpoint_id: String,
    /// The fingerprint of that interrupt.
    pub fingerprint: String,
    /// The session that answered it (the claim's holder).
    pub holder: Holder,
    pub answered_at_ms: i64,
    /// The run's latest write on the thread.
    pub last_write_ms: i64,
    /// The lease ends then unless the run writes again.
    pub until_ms: i64,
}

impl RunLease {
    /// The answered interrupt's fingerprint, shortened as in
    /// [`ClaimKey::short_fingerprint`].
    pub fn short_fingerprint(&self) -> &str {
        short(&self.fingerprint)
    }
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// Identifies an interrupt by its `__interrupt__` pending writes, given as
/// (task_id, blob). Pass only that channel's writes. Order-independent:
/// rows come back in any order, so they are sorted by task id (then blob)
/// first; each field is length-prefixed so no two lists hash alike by
/// concatenation.
pub fn interrupt_fingerprint(writes: &[(&str, Option<&[u8]>)]) -> String {
    let mut sorted: Vec<&(&str, Option<&[u8]>)> = writes.iter().collect();
    sorted.sort();
    let mut h = Sha256::new();
    h.update(b"resumeguard-interrupt-v1\0");
    h.update((sorted.len() as u64).to_le_bytes());
    for (task_id, blob) in sorted {
        h.update((task_id.len() as u64).to_le_bytes());
        h.update(task_id.as_bytes());
        match blob {
            None => h.update([0u8]),
            Some(b) => {
                h.update([1u8]);
                h.update((b.len() as u64).to_le_bytes());
                h.update(b);
            }
        }
    }
    hex::encode(h.finalize())
}

/// RFC 3339 UTC with milliseconds for a claim time.
pub fn format_ms(ms: i64) -> String {
    let t = if ms >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_millis(ms.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_millis(ms.unsigned_abs()))
    };
    crate::timestamp::format_rfc3339_millis(t.unwrap_or(UNIX_EPOCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_ignores_row_order() {
        let a = interrupt_fingerprint(&[("t1", Some(b"x")), ("t2", None)]);
        let b = interrupt_fingerprint(&[("t2", None), ("t1", Some(b"x"))]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn a_new_interrupt_value_is_a_new_fingerprint() {
        let first = interrupt_fingerprint(&[("gate", Some(b"ask 1"))]);
        let second = interrupt_fingerprint(&[("gate", Some(b"ask 2"))]);
        assert_ne!(first, second);
    }

    #[test]
    fn fields_do_not_run_into_each_other() {
        let a = interrupt_fingerprint(&[("ab", Some(b"c"))]);
        let b = interrupt_fingerprint(&[("a", Some(b"bc"))]);
        let null = interrupt_fingerprint(&[("a", None)]);
        let empty = interrupt_fingerprint(&[("a", Some(b""))]);
        assert_ne!(a, b);
        assert_ne!(null, empty);
    }

    #[test]
    fn times_render_as_rfc3339_utc() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn states_round_trip() {
        for s in [ClaimState::Held, ClaimState::Consumed, ClaimState::Released] {
            assert_eq!(ClaimState::parse(s.as_str()), Some(s));
        }
        assert_eq!(ClaimState::parse("other"), None);
    }
}
