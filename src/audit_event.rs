//! One audit record: who did what to which checkpoint, and when. Below
//! both the audit trail that stores records and the claims evidence worker
//! that makes some of them.
//!
//! Events are plain data so they can cross the queue to the writer thread
//! without borrowing anything from the connection that produced them.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::saver::checkpoint_ref::CheckpointRef;

/// What the proxy saw or decided. Stored as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    ReadLatest,
    ReadById,
    ReadList,
    BlobPut,
    CheckpointPut,
    WritesPut,
    DeleteThread,
    Migration,
    Unrecognized,
    InterruptParked,
    ResumeRecorded,
    ForkServed,
    WriteRejected,
    ClaimTaken,
    ClaimConsumed,
    ClaimRefused,
    ClaimWaited,
    ClaimTakeover,
    WriteFenced,
    /// A resume that reached the finished head of an answered interrupt,
    /// refused.
    LateDuplicate,
    EventsDropped,
    AuditPruned,
    ConfigReloaded,
    EvidenceLost,
    /// Claims an operator released through the admin API or the console.
    ClaimReleased,
    /// A client statement the proxy refused before it ran (one on the
    /// proxy's own schema, an unrecognized checkpoint statement, a guarded
    /// channel-history read, a checkpoint statement in SQL PREPARE,
    /// EXECUTE or DECLARE), or a read by id whose row it refused in place
    /// of the row (one that does not decode).
    StatementRefused,
    /// A read of a running head served without its run lease checked:
    /// the claims store failed to answer for it.
    LeaseUnchecked,
}

impl Operation {
    /// Every variant, so names can be parsed back without a second table.
    pub const ALL: [Operation; 27] = [
        Operation::ReadLatest,
        Operation::ReadById,
        Operation::ReadList,
        Operation::BlobPut,
        Operation::CheckpointPut,
        Operation::WritesPut,
        Operation::DeleteThread,
        Operation::Migration,
        Operation::Unrecognized,
        Operation::InterruptParked,
        Operation::ResumeRecorded,
        Operation::ForkServed,
        Operation::WriteRejected,
        Operation::ClaimTaken,
        Operation::ClaimConsumed,
        Operation::ClaimRefused,
        Operation::ClaimWaited,
        Operation::ClaimTakeover,
        Operation::WriteFenced,
        Operation::LateDuplicate,
        Operation::EventsDropped,
        Operation::AuditPruned,
        Operation::ConfigReloaded,
        Operation::EvidenceLost,
        Operation::ClaimReleased,
        Operation::StatementRefused,
        Operation::LeaseUnchecked,
    ];

    /// The snake_case name, identical to the serde representation.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::ReadLatest => "read_latest",
            Operation::ReadById => "read_by_id",
            Operation::ReadList => "read_list",
            Operation::BlobPut => "blob_put",
            Operation::CheckpointPut => "checkpoint_put",
            Operation::WritesPut => "writes_put",
            Operation::DeleteThread => "delete_thread",
            Operation::Migration => "migration",
            Operation::Unrecognized => "unrecognized",
            Operation::InterruptParked => "interrupt_parked",
            Operation::ResumeRecorded => "resume_recorded",
            Operation::ForkServed => "fork_served",
            Operation::WriteRejected => "write_rejected",
            Operation::ClaimTaken => "claim_taken",
            Operation::ClaimConsumed => "claim_consumed",
            Operation::ClaimRefused => "claim_refused",
            Operation::ClaimWaited => "claim_waited",
            Operation::ClaimTakeover => "claim_takeover",
            Operation::WriteFenced => "write_fenced",
            Operation::LateDuplicate => "late_duplicate",
            Operation::EventsDropped => "events_dropped",
            Operation::AuditPruned => "audit_pruned",
            Operation::ConfigReloaded => "config_reloaded",
            Operation::EvidenceLost => "evidence_lost",
            Operation::ClaimReleased => "claim_released",
            Operation::StatementRefused => "statement_refused",
            Operation::LeaseUnchecked => "lease_unchecked",
        }
    }

    /// Inverse of [`Operation::as_str`]; `None` for unknown names.
    pub fn parse(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lowercase hex SHA-256 of `bytes`: the trail records hashes rather than
/// values, so it can prove which answer a resume carried without becoming a
/// second copy of user data.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Content hash of one channel blob, so the trail can prove which value was
/// written without storing the value itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobDigest {
    pub channel: String,
    /// Lowercase hex SHA-256 of the blob bytes.
    pub sha256: String,
}

impl BlobDigest {
    /// Hash `bytes` and label the result with `channel`.
    pub fn of(channel: impl Into<String>, bytes: &[u8]) -> BlobDigest {
        BlobDigest {
            channel: channel.into(),
            sha256: digest(bytes),
        }
    }
}

/// Connection facts that are fixed after startup; built once per connection
/// and stamped onto every event so callers cannot forget a field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionContext {
    pub session_id: u64,
    pub client_addr: String,
    pub user: String,
    pub database: String,
    pub application_name: String,
}

impl SessionContext {
    /// Context for events the proxy emits on its own behalf (gap records,
    /// prune records), which belong to no client session.
    pub fn internal() -> SessionContext {
        SessionContext {
            application_name: "resumeguard".to_string(),
            ..SessionContext::default()
        }
    }
}

/// One append-only audit record (pgAudit-like columns plus checkpoint keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// RFC 3339 UTC with milliseconds, e.g. `2024-05-01T12:00:00.123Z`.
    pub time: String,
    /// The replica that recorded it (`[claims] proxy_id`, else
    /// `<hostname>-<pid>`), stamped by the sink as it is recorded; empty in trails
    /// written before replicas were named.
    #[serde(default)]
    pub proxy_id: String,
    pub session_id: u64,
    pub client_addr: String,
    pub user: String,
    pub database: String,
    pub application_name: String,
    pub operation: Operation,
    pub thread_id: Option<String>,
    pub checkpoint_ns: Option<String>,
    pub checkpoint_id: Option<String>,
    pub parent_checkpoint_id: Option<String>,
    pub task_id: Option<String>,
    pub channels: Vec<String>,
    pub blob_sha256: Vec<BlobDigest>,
    /// Free-form extras, e.g. `{"rows":1}` or `{"reason":"..."}`.
    pub detail: serde_json::Value,
    /// A checkpoint's metadata on its way to the sink, which keeps only its
    /// `[audit] approver_keys` (as `detail.approver`); never stored.
    #[serde(skip)]
    pub run_metadata: Option<serde_json::Value>,
    /// An answer's resume value, decoded, on its way to the sink, which
    /// keeps only what `[audit] approver_pointers` name (as
    /// `detail.approver`); or an interrupt's question, which it keeps (as
    /// `detail.question`) only with `[audit] log_values`. Never stored as is.
    #[serde(skip)]
    pub answer: Option<serde_json::Value>,
}

impl AuditEvent {
    /// An event stamped with the current time and the session's identity;
    /// checkpoint keys start empty and are filled by the caller.
    pub fn new(ctx: &SessionContext, operation: Operation) -> AuditEvent {
        AuditEvent {
            time: AuditEvent::now_string(),
            proxy_id: String::new(),
            session_id: ctx.session_id,
            client_addr: ctx.client_addr.clone(),
            user: ctx.user.clone(),
            database: ctx.database.clone(),
            application_name: ctx.application_name.clone(),
            operation,
            thread_id: None,
            checkpoint_ns: None,
            checkpoint_id: None,
            parent_checkpoint_id: None,
            task_id: None,
            channels: Vec::new(),
            blob_sha256: Vec::new(),
            detail: serde_json::Value::Null,
            run_metadata: None,
            answer: None,
        }
    }

    /// Current wall-clock time as RFC 3339 UTC with milliseconds.
    pub fn now_string() -> String {
        crate::timestamp::format_rfc3339_millis(SystemTime::now())
    }

    /// Builder-style setter for the thread id.
    pub fn with_thread(mut self, thread_id: impl Into<String>) -> AuditEvent {
        self.thread_id = Some(thread_id.into());
        self
    }

    /// Builder-style setter for the thread, namespace and checkpoint id.
    pub fn at(mut self, at: &CheckpointRef) -> AuditEvent {
        self.thread_id = Some(at.thread_id.clone());
        self.checkpoint_ns = Some(at.checkpoint_ns.clone());
        self.checkpoint_id = Some(at.checkpoint_id.clone());
        self
    }

    /// Builder-style setter for the checkpoint namespace and id.
    pub fn with_checkpoint(
        mut self,
        checkpoint_ns: impl Into<String>,
        checkpoint_id: impl Into<String>,
    ) -> AuditEvent {
        self.checkpoint_ns = Some(checkpoint_ns.into());
        self.checkpoint_id = Some(checkpoint_id.into());
        self
    }

    /// Builder-style setter for the free-form detail object.
    pub fn with_detail(mut self, detail: serde_json::Value) -> AuditEvent {
        self.detail = detail;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_known_vectors() {
        assert_eq!(
            digest(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            digest(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn now_string_has_rfc3339_shape() {
        let s = AuditEvent::now_string();
        let b = s.as_bytes();
        assert_eq!(s.len(), 24, "{s}");
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16], b[19], b[23]),
            (b'-', b'-', b'T', b':', b':', b'.', b'Z')
        );
        assert!(s.as_str() >= "2024-01-01T00:00:00.000Z", "{s}");
    }

    #[test]
    fn operation_names_round_trip_and_match_serde() {
        for op in Operation::ALL {
            assert_eq!(Operation::parse(op.as_str()), Some(op));
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.as_str()));
        }
        assert_eq!(Operation::parse("nope"), None);
        assert_eq!(Operation::InterruptParked.as_str(), "interrupt_parked");
    }

    #[test]
    fn new_stamps_session_and_leaves_keys_empty() {
        let ctx = SessionContext {
            session_id: 7,
            client_addr: "10.0.0.1:5000".into(),
            user: "app".into(),
            database: "lg".into(),
            application_name: "worker".into(),
        };
        let ev = AuditEvent::new(&ctx, Operation::CheckpointPut)
            .with_thread("t1")
            .with_checkpoint("", "c1");
        assert_eq!(ev.session_id, 7);
        assert_eq!(ev.user, "app");
        assert_eq!(ev.database, "lg");
        assert_eq!(ev.application_name, "worker");
        assert_eq!(ev.client_addr, "10.0.0.1:5000");
        assert_eq!(ev.thread_id.as_deref(), Some("t1"));
        assert_eq!(ev.checkpoint_ns.as_deref(), Some(""));
        assert_eq!(ev.checkpoint_id.as_deref(), Some("c1"));
        assert_eq!(ev.task_id, None);
        assert!(ev.channels.is_empty() && ev.blob_sha256.is_empty());
        assert!(ev.detail.is_null());
    }
}
