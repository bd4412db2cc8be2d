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

/// Checks every payload of one write: the first violation, if any.
pub fn check_write(rules: &ChannelRules, kind: WriteKind, rec: &WriteRecord) -> Option<Violation> {
    if rules.is_empty() {
        return None;
    }
    let metadata = metadata_of(rec);
    let ctx = context(rec, &metadata);
    let payload = || ChannelPayload::Blob {
        type_tag: rec.type_tag.as_deref().unwrap_or("msgpack"),
        blob: rec.blob.as_deref(),
    };
    match kind {
        WriteKind::Blob => {
            let channel = rec.channel.as_deref()?;
            invalid(rules.check_channel_value(&ctx.ctx(), channel, payload()))
        }
        WriteKind::PendingWrite => {
            let channel = rec.channel.as_deref()?;
            invalid(rules.check_pending_write(&ctx.ctx(), channel, payload()))
        }
        WriteKind::Checkpoint => {
            // Numbers are read at any precision (jsonb's own range); what
            // still fails to parse cannot be checked, so it is refused
            // wherever a rule could apply, as an unreadable blob is.
            match serde_json::from_str::<Value>(rec.checkpoint.as_deref()?) {
                Ok(checkpoint) => rules
                    .check_checkpoint(&ctx.ctx(), &checkpoint)
                    .into_iter()
                    .next(),
                Err(e) => rules.undecodable_checkpoint(&ctx.ctx(), &e.to_string()),
            }
        }
    }
}

/// The client's error message for a rejected write. `at` is the write that
/// names the checkpoint: the rejected one itself, or, for a blob (which
/// carries only a channel version), the checkpoint row of the same `put`.
pub fn rejection_message(
    kind: WriteKind,
    violation: &Violation,
    at: &WriteRecord,
    show_value: bool,
) -> String {
    let metadata = metadata_of(at);
    let ctx = context(at, &metadata);
    format!(
        "resumeguard: {} rejected: {}",
        kind.label(),
        violation.describe_as(&ctx.ctx(), show_value)
    )
}

/// The owned parts of a [`WriteContext`].
struct Context<'a> {
    thread_id: &'a str,
    checkpoint_ns: &'a str,
    checkpoint_id: String,
    metadata: &'a Option<Value>,
}

impl Context<'_> {
    fn ctx(&self) -> WriteContext<'_> {
        WriteContext {
            thread_id: self.thread_id,
            checkpoint_ns: self.checkpoint_ns,
            checkpoint_id: &self.checkpoint_id,
            metadata: self.metadata.as_ref(),
        }
    }
}

fn metadata_of(rec: &WriteRecord) -> Option<Value> {
    rec.metadata
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok())
}

fn context<'a>(rec: &'a WriteRecord, metadata: &'a Option<Value>) -> Context<'a> {
    // A blob row carries no checkpoint id, only the channel version.
    let checkpoint_id = match (&rec.checkpoint_id, &rec.version) {
        (Some(id), _) => id.clone(),
        (None, Some(v)) => format!("(channel version {v})"),
        _ => String::new(),
    };
    Context {
        thread_id: rec.thread_id.as_deref().unwrap_or_default(),
        checkpoint_ns: rec.checkpoint_ns.as_deref().unwrap_or_default(),
        checkpoint_id,
        metadata,
    }
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
            "[[channel]]\nname = \"items\"\nthread_id = \"cv-.*\"\nschema = { type = \"array\", items = { type = \"string\" } }\n\
             [[channel]]\nname = \"count\"\nthread_id = \"cv-.*\"\nschema = { type = \"integer\" }\n",
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
        let rec = pending("cv-1", b"\x91\xc0");
        let v = check_write(&rules, WriteKind::PendingWrite, &rec).unwrap();
        let message = rejection_message(WriteKind::PendingWrite, &v, &rec, true);
        assert!(message.contains("pending write rejected"), "{message}");
        assert!(message.contains("\"items\""), "{message}");
        assert!(message.contains("cv-1"), "{message}");
        assert!(message.contains("ck-7"), "{message}");
        assert_eq!(v.schema_path, "/items/type");
        assert!(message.contains("null is not of type"), "{message}");
        // Values are shown only when configured; the rule by file, not path.
        let quiet = rejection_message(WriteKind::PendingWrite, &v, &rec, false);
        assert!(!quiet.contains("null"), "{quiet}");
        assert!(quiet.contains("fails its \"type\" keyword"), "{quiet}");
        assert!(!quiet.contains(&dir.display().to_string()), "{quiet}");
        assert!(quiet.contains("items.toml:"), "{quiet}");
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
        let v = check_write(&rules, WriteKind::Blob, &blob).unwrap();
        let alone = rejection_message(WriteKind::Blob, &v, &blob, true);
        assert!(alone.contains("channel version 00002.0.5"), "{alone}");
        // Named by the checkpoint row of the same put when there is one.
        let mut checkpoint_row = blob.clone();
        checkpoint_row.checkpoint_id = Some("ck-8".into());
        let named = rejection_message(WriteKind::Blob, &v, &checkpoint_row, true);
        assert!(named.contains("checkpoint ck-8"), "{named}");
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

    fn checkpoint(thread: &str, json: String) -> WriteRecord {
        WriteRecord {
            thread_id: Some(thread.into()),
            checkpoint_ns: Some(String::new()),
            checkpoint_id: Some("ck-10".into()),
            checkpoint: Some(json),
            metadata: Some("{}".into()),
            ..WriteRecord::default()
        }
    }

    /// `10**400` as Python's `json.dumps` writes it.
    fn big_int() -> String {
        format!("1{}", "0".repeat(400))
    }

    #[test]
    fn checkpoints_with_numbers_past_f64_are_still_checked() {
        let (rules, dir) = rules();
        let bad = checkpoint(
            "cv-4",
            format!(
                r#"{{"v":4,"channel_values":{{"count":"notint","name":{},"f":1e400}}}}"#,
                big_int()
            ),
        );
        let v = check_write(&rules, WriteKind::Checkpoint, &bad).unwrap();
        assert_eq!(v.channel, "count");
        assert_eq!(v.schema_path, "/type");
        // A big integer is an integer: valid, not refused as unreadable.
        let good = checkpoint(
            "cv-4",
            format!(
                r#"{{"v":4,"channel_values":{{"count":{},"name":1e400}}}}"#,
                big_int()
            ),
        );
        assert_eq!(check_write(&rules, WriteKind::Checkpoint, &good), None);
        let negative = checkpoint(
            "cv-4",
            format!(r#"{{"channel_values":{{"count":-{}}}}}"#, big_int()),
        );
        assert_eq!(check_write(&rules, WriteKind::Checkpoint, &negative), None);
        // Below f64's resolution is not rounded to an integer.
        let tiny = checkpoint("cv-4", r#"{"channel_values":{"count":1e-400}}"#.into());
        assert!(check_write(&rules, WriteKind::Checkpoint, &tiny).is_some());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn unreadable_checkpoint_json_is_refused_where_a_rule_applies() {
        let (rules, dir) = rules();
        // Nesting past the parser's limit, and a torn document.
        let deep = format!(
            r#"{{"channel_values":{{"count":"notint","x":{}1{}}}}}"#,
            "[".repeat(300),
            "]".repeat(300)
        );
        for json in [deep, r#"{"channel_values":{"count":"notint""#.to_owned()] {
            let rec = checkpoint("cv-5", json.clone());
            let v = check_write(&rules, WriteKind::Checkpoint, &rec).unwrap();
            assert!(
                v.message.contains("checkpoint JSON could not be decoded"),
                "{v:?}"
            );
            assert!(v.rule.contains("items.toml:"), "{v:?}");
            let message = rejection_message(WriteKind::Checkpoint, &v, &rec, true);
            assert!(
                message.contains("cv-5") && message.contains("ck-10"),
                "{message}"
            );
            // No rule selects this thread: nothing to refuse.
            assert_eq!(
                check_write(&rules, WriteKind::Checkpoint, &checkpoint("other", json)),
                None
            );
        }
        std::fs::remove_dir_all(dir).ok();
    }
}
