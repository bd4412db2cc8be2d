//! JSON Lines output: one event object per line, for log shippers and `jq`.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::Context;

use super::event::AuditEvent;

/// Append-only JSON Lines writer to a file or stdout.
pub struct JsonlWriter {
    out: Box<dyn Write + Send>,
}

impl JsonlWriter {
    /// `"-"` writes to stdout; anything else is a file path opened for append
    /// (created if missing), so restarts never truncate the trail.
    pub fn open(target: &str) -> anyhow::Result<JsonlWriter> {
        let out: Box<dyn Write + Send> = if target == "-" {
            Box::new(io::stdout())
        } else {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(target)
                .with_context(|| format!("opening audit jsonl file {target}"))?;
            Box::new(BufWriter::new(file))
        };
        Ok(JsonlWriter { out })
    }

    /// Write `events`, one line each, then flush so a batch is visible to
    /// readers as soon as it is written.
    pub fn append(&mut self, events: &[AuditEvent]) -> anyhow::Result<()> {
        for ev in events {
            serde_json::to_writer(&mut self.out, ev).context("encoding audit event")?;
            self.out.write_all(b"\n").context("writing audit jsonl")?;
        }
        self.out.flush().context("flushing audit jsonl")
    }
}

/// Read back every event from a JSON Lines file (blank lines are skipped).
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<AuditEvent>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut events = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let ev = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: bad audit event", path.display(), n + 1))?;
        events.push(ev);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::event::{BlobDigest, Operation, SessionContext};
    use crate::audit::test_util::temp_path;

    #[test]
    fn round_trips_and_appends_across_opens() {
        let path = temp_path("jsonl-roundtrip", "jsonl");
        let ctx = SessionContext {
            session_id: 3,
            user: "u".into(),
            ..SessionContext::default()
        };
        let mut a = AuditEvent::new(&ctx, Operation::BlobPut).with_thread("t");
        a.channels = vec!["messages".into()];
        a.blob_sha256 = vec![BlobDigest::of("messages", b"hi")];
        let b = AuditEvent::new(&ctx, Operation::CheckpointPut)
            .with_detail(serde_json::json!({"rows": 1}));

        JsonlWriter::open(path.to_str().unwrap())
            .unwrap()
            .append(std::slice::from_ref(&a))
            .unwrap();
        // A second writer (e.g. after restart) appends rather than truncates.
        JsonlWriter::open(path.to_str().unwrap())
            .unwrap()
            .append(std::slice::from_ref(&b))
            .unwrap();

        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text
            .lines()
            .next()
            .unwrap()
            .contains("\"operation\":\"blob_put\""));
        assert_eq!(read_jsonl(&path).unwrap(), vec![a, b]);
        let _ = std::fs::remove_file(&path);
    }
}
