//! The validity verdict for one decoded checkpoint write: which payloads a
//! blob, checkpoint or pending-write INSERT carries, and what the channel
//! rules say about each.

use serde_json::Value;

use super::{ChannelPayload, ChannelRules, Verdict, Violation, WriteContext};
use crate::saver::write_record::WriteRecord;

/// Which statement carried the write, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// A channel value stored in `checkpoint_blobs`.
    Blob,
    /// A checkpoint: its inline `channel_values`.
    Checkpoint,
    /// A pending write in `checkpoint_writes` (durable before the checkpoint).
    PendingWrite,
}

impl WriteKind {
    pub fn label(self) -> &'static str {
        match self {
            WriteKind::Blob => "channel value",
            WriteKind::Checkpoint => "checkpoint",
            WriteKind::PendingWrite => "pending write",
        }
    }
}

/// A rejected write: what failed, described for the client.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub violation: Violation,
    pub message: String,
}

/// Checks every payload of one write. `None`: nothing in it breaks a rule.
pub fn check_write(rules: &ChannelRules, kind: WriteKind, rec: &WriteRecord) -> Option<Rejection> {
    if rules.is_empty() {
        return None;
    }
    let thread_id = rec.thread_id.as_deref().unwrap_or_default();
    let checkpoint_ns = rec.checkpoint_ns.as_deref().unwrap_or_default();
    // A blob row carries no checkpoint id, only the channel version.
    let version_label;
    let checkpoint_id = match (kind, &rec.checkpoint_id, &rec.version) {
        (_, Some(id), _) => id.as_str(),
        (_, None, Some(v)) => {
            version_label = format!("(channel version {v})");
            version_label.as_str()
        }
        _ => "",
    };
    let metadata: Option<Value> = rec
        .metadata
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok());
    let ctx = WriteContext {
        thread_id,
        checkpoint_ns,
        checkpoint_id,
        metadata: metadata.as_ref(),
    };
    let payload = || ChannelPayload::Blob {
        type_tag: rec.type_tag.as_deref().unwrap_or("msgpack"),
        blob: rec.blob.as_deref(),
    };
    let violation = match kind {
        WriteKind::Blob => {
            let channel = rec.channel.as_deref()?;
            invalid(rules.check_channel_value(&ctx, channel, payload()))
        }
        WriteKind::PendingWrite => {
            let channel = rec.channel.as_deref()?;
            invalid(rules.check_pending_write(&ctx, channel, payload()))
        }
        WriteKind::Checkpoint => {
            let checkpoint: Value = match rec.checkpoint.as_deref().map(serde_json::from_str) {
                Some(Ok(v)) => v,
                _ => return None,
            };
            rules.check_checkpoint(&ctx, &checkpoint).into_iter().next()
        }
    }?;
    let message = format!(
        "resumeguard: {} rejected: {}",
        kind.label(),
        violation.describe(&ctx)
    );
    Some(Rejection { violation, message })
}

fn invalid(v: Verdict) -> Option<Violation> {
    match v {
        Verdict::Invalid(violation) => Some(violation),
        Verdict::Valid | Verdict::NoRule => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rules() -> (ChannelRules, std::path::PathBuf) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rg-write-check-{}-{n}", std::process::id()));
        std::fs::create_dir_all(dir.join("channels")).unwrap();
        std::fs::write(
            dir.join("channels/items.toml"),
            "[[channel]]\nname = \"items\"\nthread_id = \"cv-.*\"\nschema = { type = \"array\", items = { type = \"string\" } }\n",
        )
        .unwrap();
        (ChannelRules::load(&dir).unwrap(), dir)
    }

    fn pending(thread: &str, blob: &'static [u8]) -> WriteRecord {
        WriteRecord {
            thread_id: Some(thread.into()),
            checkpoint_ns: Some(String::new()),
            checkpoint_id: Some("ck-7".into()),
            task_id: Some("task".into()),
            channel: Some("items".into()),
            type_tag: Some("msgpack".into()),
            blob: Some(Bytes::from_static(blob)),
            ..WriteRecord::default()
        }
    }

    #[test]
    fn none_in_a_string_list_is_rejected_with_its_path() {
        let (rules, dir) = rules();
        // msgpack [None]
        let r = check_write(
            &rules,
            WriteKind::PendingWrite,
            &pending("cv-1", b"\x91\xc0"),
        )
        .unwrap();
        assert!(
            r.message.contains("pending write rejected"),
            "{}",
            r.message
        );
        assert!(r.message.contains("\"items\""), "{}", r.message);
        assert!(r.message.contains("cv-1"), "{}", r.message);
        assert!(r.message.contains("ck-7"), "{}", r.message);
        assert_eq!(r.violation.schema_path, "/items/type");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn valid_values_and_unselected_threads_pass() {
        let (rules, dir) = rules();
        // msgpack ["a"]
        assert_eq!(
            check_write(
                &rules,
                WriteKind::PendingWrite,
                &pending("cv-1", b"\x91\xa1a")
            ),
            None
        );
        assert_eq!(
            check_write(
                &rules,
                WriteKind::PendingWrite,
                &pending("other", b"\x91\xc0")
            ),
            None
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn blobs_are_named_by_their_version_and_checkpoints_by_inline_values() {
        let (rules, dir) = rules();
        let mut blob = pending("cv-2", b"\x92\xa1a\x05");
        blob.checkpoint_id = None;
        blob.version = Some("00002.0.5".into());
        let r = check_write(&rules, WriteKind::Blob, &blob).unwrap();
        assert!(
            r.message.contains("channel version 00002.0.5"),
            "{}",
            r.message
        );
        let cp = WriteRecord {
            thread_id: Some("cv-3".into()),
            checkpoint_ns: Some(String::new()),
            checkpoint_id: Some("ck-9".into()),
            checkpoint: Some(r#"{"v":4,"channel_values":{"items":[null]}}"#.into()),
            metadata: Some("{}".into()),
            ..WriteRecord::default()
        };
        assert!(check_write(&rules, WriteKind::Checkpoint, &cp).is_some());
        std::fs::remove_dir_all(dir).ok();
    }
}
