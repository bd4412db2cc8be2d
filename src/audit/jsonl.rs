//! JSON Lines output: one event object per line, for log shippers and `jq`.
//! The file can be replaced while the proxy runs (a reload: the same path
//! after logrotate moved it, or a new one): the new file is opened by the
//! reload and taken by the writer before its next batch. Each line carries
//! `prev_hash` and `hash` ([`super::chain`]); the chain continues across
//! a replaced file and, for a file appended to again, from its last line.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::chain::{link, ChainedRow, Heads, Verdict, Verifier, GENESIS};
use super::error::AuditError;
use super::private_file::open_append_private;
use crate::audit_event::AuditEvent;

/// Where a JSONL writer goes.
type Out = Box<dyn Write + Send>;

/// A file opened to replace a writer's output, waiting for the writer.
#[derive(Clone, Default)]
pub struct JsonlSwap(Arc<Mutex<Option<Out>>>);

impl JsonlSwap {
    /// Opens `target` now (as [`JsonlWriter::open`]) for the writer to take
    /// before its next batch; the output in use stays if it does not open.
    pub fn reopen(&self, target: &str) -> Result<(), AuditError> {
        let out = open_target(target)?;
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(out);
        }
        Ok(())
    }

    fn take(&self) -> Option<Out> {
        self.0.lock().ok()?.take()
    }
}

/// Append-only JSON Lines writer to a file or stdout.
pub struct JsonlWriter {
    out: Out,
    /// Encoded lines of the batch being written (reused).
    buf: Vec<u8>,
    /// A failed write may have left a partial line at the end of the file;
    /// the next write starts on a new line so later records stay intact.
    torn: bool,
    /// A replacement output, once a reload opened one.
    swap: JsonlSwap,
    /// Each replica's chain head, as written whole.
    heads: Heads,
    /// The hash on the last line of the file as it was opened, where each
    /// chain of this writer continues.
    tail: Option<String>,
}

/// One line: the event, chained.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    event: &'a AuditEvent,
    prev_hash: &'a str,
    hash: &'a str,
}

/// How much of a file's end is read for its last line's hash.
const TAIL_BYTES: u64 = 1 << 20;

/// The `hash` of the last whole line of the file at `target` (none for
/// stdout, a new file, anything but a regular file, or a last line
/// without one).
fn tail_hash(target: &str) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    if target == "-" {
        return None;
    }
    let file = File::open(target).ok()?;
    let meta = file.metadata().ok()?;
    // A device or a pipe (/dev/full, a FIFO) has no last line to read and
    // may never end.
    if !meta.is_file() {
        return None;
    }
    let mut file = file;
    file.seek(SeekFrom::Start(meta.len().saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut end = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut end).ok()?;
    let last = end
        .split(|&b| b == b'\n')
        .rev()
        .find(|l| !l.iter().all(u8::is_ascii_whitespace))?;
    let v: serde_json::Value = serde_json::from_slice(last).ok()?;
    v.get("hash")?.as_str().map(str::to_owned)
}

/// `"-"` is stdout; anything else a file path opened for append (created
/// mode 0600 if missing), so restarts never truncate the trail.
fn open_target(target: &str) -> Result<Out, AuditError> {
    if target == "-" {
        return Ok(Box::new(io::stdout()));
    }
    let file = open_append_private(Path::new(target)).map_err(|source| AuditError::OpenJsonl {
        target: target.to_owned(),
        source,
    })?;
    Ok(Box::new(file))
}

impl JsonlWriter {
    /// `"-"` writes to stdout; anything else is a file path opened for append
    /// (created mode 0600 if missing), so restarts never truncate the trail.
    pub fn open(target: &str) -> Result<JsonlWriter, AuditError> {
        Ok(JsonlWriter {
            out: open_target(target)?,
            buf: Vec::new(),
            torn: false,
            swap: JsonlSwap::default(),
            heads: Heads::default(),
            tail: tail_hash(target),
        })
    }

    /// The handle through which a reload replaces this writer's output.
    pub fn swap(&self) -> JsonlSwap {
        self.swap.clone()
    }

    /// Moves to a replacement output if one was opened.
    fn take_replacement(&mut self) {
        if let Some(new) = self.swap.take() {
            // Everything written so far went out unbuffered: nothing of
            // the old file is left behind.
            let _ = self.out.flush();
            self.out = new;
            self.torn = false;
        }
    }

    /// Write `events`, one line each, unbuffered, so a batch is visible to
    /// readers as soon as it is written. On failure, also how many leading
    /// events were written as whole lines: the rest may be retried without
    /// duplicating those.
    pub fn append<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a AuditEvent>,
    ) -> Result<(), (usize, AuditError)> {
        self.take_replacement();
        self.buf.clear();
        if self.torn {
            self.buf.push(b'\n');
        }
        let prefix = self.buf.len();
        let mut line_ends = Vec::new();
        let mut chained = Vec::new();
        let mut heads = Heads::default();
        for ev in events {
            let tail = &self.tail;
            let known = &self.heads;
            let prev = match heads.get::<std::convert::Infallible>(&ev.proxy_id, || {
                Ok(known.head(&ev.proxy_id).or_else(|| tail.clone()))
            }) {
                Ok(prev) => prev,
                Err(never) => match never {},
            };
            let hash = match link(&prev, ev) {
                Ok(hash) => hash,
                Err(e) => return Err((0, AuditError::EncodeEvent(e))),
            };
            let line = Line {
                event: ev,
                prev_hash: &prev,
                hash: &hash,
            };
            if let Err(e) = serde_json::to_writer(&mut self.buf, &line) {
                return Err((0, AuditError::EncodeEvent(e)));
            }
            heads.advance(&ev.proxy_id, hash.clone());
            chained.push((ev.proxy_id.clone(), hash));
            self.buf.push(b'\n');
            line_ends.push(self.buf.len());
        }
        let mut pos = 0;
        while pos < self.buf.len() {
            let failed = match self.out.write(&self.buf[pos..]) {
                Ok(0) => io::ErrorKind::WriteZero.into(),
                Ok(n) => {
                    pos += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => e,
            };
            let (whole, e) = self.torn_at(pos, prefix, &line_ends, failed);
            // The chains advance by the lines written whole: the rest is
            // retried from there and hashes the same.
            for (proxy, hash) in chained.into_iter().take(whole) {
                self.heads.advance(&proxy, hash);
            }
            return Err((whole, e));
        }
        for (proxy, hash) in chained {
            self.heads.advance(&proxy, hash);
        }
        self.torn = false;
        self.out
            .flush()
            .map_err(|e| (line_ends.len(), AuditError::FlushJsonl(e)))
    }

    /// The failure of a write that stopped after `pos` bytes.
    fn torn_at(
        &mut self,
        pos: usize,
        prefix: usize,
        line_ends: &[usize],
        e: io::Error,
    ) -> (usize, AuditError) {
        let whole = line_ends.iter().take_while(|&&end| end <= pos).count();
        if pos > 0 {
            self.torn = pos != prefix && !line_ends.contains(&pos);
        }
        (whole, AuditError::WriteJsonl(e))
    }
}

/// The lines of the JSON Lines file at `path`, each with its index from
/// 0; opening and reading errors name the file.
fn numbered_lines(
    path: &Path,
) -> Result<impl Iterator<Item = Result<(usize, String), AuditError>> + '_, AuditError> {
    let file = File::open(path).map_err(|source| AuditError::OpenJsonlToRead {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(BufReader::new(file)
        .lines()
        .enumerate()
        .map(move |(n, line)| {
            line.map(|line| (n, line))
                .map_err(|source| AuditError::ReadJsonl {
                    path: path.to_path_buf(),
                    source,
                })
        }))
}

/// Read back every event from a JSON Lines file (blank lines are skipped).
pub fn read_jsonl(path: &Path) -> Result<Vec<AuditEvent>, AuditError> {
    let mut events = Vec::new();
    for line in numbered_lines(path)? {
        let (n, line) = line?;
        if line.trim().is_empty() {
            continue;
        }
        let ev = serde_json::from_str(&line).map_err(|source| AuditError::BadJsonlLine {
            path: path.to_path_buf(),
            line: n + 1,
            source,
        })?;
        events.push(ev);
    }
    Ok(events)
}

/// Walk every chain of a JSON Lines trail; a record's id is its line
/// number. A first line that continues a chain (a rotated file's
/// successor) starts its chain unproven, as after a prune; a line that
/// does not parse (torn by a failed write) is skipped: the chain shows
/// whether a record is missing around it.
pub fn verify_jsonl(path: &Path) -> Result<Verdict, AuditError> {
    let mut rows = Vec::new();
    let mut continues = Vec::new();
    for line in numbered_lines(path)? {
        let (n, line) = line?;
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let text = |k: &str| value.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let (prev_hash, hash) = (text("prev_hash"), text("hash"));
        let Ok(event) = serde_json::from_value::<AuditEvent>(value) else {
            continue;
        };
        rows.push(ChainedRow {
            id: n as i64 + 1,
            event,
            prev_hash,
            hash,
        });
    }
    // Each chain's first line is where this file takes it up.
    let mut seen = std::collections::HashSet::new();
    for row in &rows {
        if seen.insert(row.event.proxy_id.clone()) {
            if let Some(prev) = row.prev_hash.as_ref().filter(|p| *p != GENESIS) {
                let mut start = AuditEvent::new(
                    &crate::audit_event::SessionContext::internal(),
                    crate::audit_event::Operation::AuditPruned,
                );
                start.detail = serde_json::json!({
                    super::chain::CHAIN_STARTS: { row.event.proxy_id.clone(): prev }
                });
                continues.push(start);
            }
        }
    }
    let mut verifier = Verifier::new(&continues);
    for row in rows {
        verifier.record(row)?;
    }
    Ok(verifier.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::test_util::temp_path;
    use crate::audit_event::{BlobDigest, Operation, SessionContext};

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

    /// Accepts `budget` bytes into a shared buffer, then fails with ENOSPC.
    struct Disk {
        data: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
        budget: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            use std::sync::atomic::Ordering;
            let room = self.budget.load(Ordering::SeqCst);
            if room == 0 {
                return Err(io::Error::from_raw_os_error(28));
            }
            let n = buf.len().min(room);
            self.budget.fetch_sub(n, Ordering::SeqCst);
            self.data.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_write_reports_whole_lines_and_the_next_starts_a_new_line() {
        use std::sync::atomic::Ordering;
        let disk = Disk {
            data: Default::default(),
            budget: Default::default(),
        };
        let (data, budget) = (disk.data.clone(), disk.budget.clone());
        let mut writer = JsonlWriter {
            out: Box::new(disk),
            buf: Vec::new(),
            torn: false,
            swap: JsonlSwap::default(),
            heads: Heads::default(),
            tail: None,
        };
        let evs: Vec<AuditEvent> = (0..3)
            .map(|n| {
                AuditEvent::new(&SessionContext::default(), Operation::ReadLatest)
                    .with_detail(serde_json::json!({ "n": n }))
            })
            .collect();
        let hash = GENESIS;
        let chained = Line {
            event: &evs[0],
            prev_hash: hash,
            hash,
        };
        let line = serde_json::to_string(&chained).unwrap().len() + 1;
        // One whole line and half of the next fit.
        budget.store(line + line / 2, Ordering::SeqCst);
        let (written, error) = writer.append(&evs).unwrap_err();
        assert_eq!(written, 1);
        let shown = crate::error_chain::chain(&error).to_string();
        assert!(shown.contains("No space left"), "{shown}");
        // The retry of the rest lands on its own line.
        budget.store(usize::MAX / 2, Ordering::SeqCst);
        writer.append(&evs[1..]).unwrap();
        let text = String::from_utf8(data.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let parsed: Vec<Option<AuditEvent>> =
            lines.iter().map(|l| serde_json::from_str(l).ok()).collect();
        assert_eq!(parsed[0].as_ref(), Some(&evs[0]));
        assert_eq!(parsed[1], None, "the torn line");
        assert_eq!(parsed[2].as_ref(), Some(&evs[1]));
        assert_eq!(parsed[3].as_ref(), Some(&evs[2]));
        // The retried line follows the last whole one in the chain.
        let field = |l: &str, k: &str| -> String {
            serde_json::from_str::<serde_json::Value>(l).unwrap()[k]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(field(lines[2], "prev_hash"), field(lines[0], "hash"));
    }

    #[test]
    fn a_bad_line_is_reported_with_its_file_and_line() {
        let path = temp_path("jsonl-bad-line", "jsonl");
        let ev = AuditEvent::new(&SessionContext::default(), Operation::ReadLatest);
        let good = serde_json::to_string(&ev).unwrap();
        std::fs::write(&path, format!("{good}\n\n{{\"time\": 1}}\n")).unwrap();
        let err = read_jsonl(&path).unwrap_err();
        let _ = std::fs::remove_file(&path);
        match &err {
            AuditError::BadJsonlLine { path: p, line, .. } => {
                assert_eq!((p, *line), (&path, 3));
            }
            other => panic!("{other:?}"),
        }
        let shown = crate::error_chain::chain(&err).to_string();
        assert!(
            shown.starts_with(&format!("{}:3: bad audit event: ", path.display())),
            "{shown}"
        );
    }

    #[test]
    fn a_reopened_file_gets_the_next_batch() {
        let path = temp_path("jsonl-reopen", "jsonl");
        let moved = path.with_extension("jsonl.1");
        let ev = |n: u32| {
            AuditEvent::new(&SessionContext::default(), Operation::ReadLatest)
                .with_detail(serde_json::json!({ "n": n }))
        };
        // Each event made once: its time is part of what is compared.
        let (e1, e2, e3) = (ev(1), ev(2), ev(3));
        let mut writer = JsonlWriter::open(path.to_str().unwrap()).unwrap();
        writer.append(std::slice::from_ref(&e1)).unwrap();
        std::fs::rename(&path, &moved).unwrap();
        writer.append(std::slice::from_ref(&e2)).unwrap();
        assert!(!path.exists(), "without a reopen the moved file is written");
        let swap = writer.swap();
        assert!(swap.reopen("/proc/nonexistent/x.jsonl").is_err());
        swap.reopen(path.to_str().unwrap()).unwrap();
        writer.append(std::slice::from_ref(&e3)).unwrap();
        assert_eq!(read_jsonl(&moved).unwrap(), vec![e1, e2]);
        assert_eq!(read_jsonl(&path).unwrap(), vec![e3]);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&moved);
    }

    #[test]
    fn a_new_file_is_created_0600() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp_path("jsonl-mode", "jsonl");
        JsonlWriter::open(path.to_str().unwrap()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn lines_are_chained_across_opens_and_reopens_and_verify_names_an_edit() {
        use crate::audit::chain::Break;
        let path = temp_path("jsonl-chain", "jsonl");
        let target = path.to_str().unwrap();
        let ev = |n: u64| {
            let mut e = AuditEvent::new(&SessionContext::default(), Operation::ReadLatest)
                .with_detail(serde_json::json!({ "n": n }));
            e.proxy_id = "proxy-a".into();
            e
        };
        JsonlWriter::open(target)
            .unwrap()
            .append([&ev(1), &ev(2)])
            .unwrap();
        // A restart appends to the same file: the chain goes on.
        let mut w = JsonlWriter::open(target).unwrap();
        w.append([&ev(3)]).unwrap();
        let verdict = verify_jsonl(&path).unwrap();
        assert!(verdict.holds(), "{:?}", verdict.breaks);
        assert_eq!(verdict.chains[0].records, 3);
        assert!(!verdict.chains[0].after_prune);

        // Rotated: the new file takes the chain up where the old one ended.
        let rotated = temp_path("jsonl-chain-rotated", "jsonl");
        w.swap().reopen(rotated.to_str().unwrap()).unwrap();
        w.append([&ev(4)]).unwrap();
        let old = verify_jsonl(&path).unwrap();
        let new = verify_jsonl(&rotated).unwrap();
        assert!(new.holds() && new.chains[0].after_prune, "{new:?}");
        let first: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&rotated).unwrap().trim()).unwrap();
        assert_eq!(
            first["prev_hash"].as_str(),
            Some(old.chains[0].head.as_str())
        );

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen(r#""n":2"#, r#""n":7"#, 1)).unwrap();
        assert_eq!(
            verify_jsonl(&path).unwrap().breaks,
            vec![Break::Changed {
                id: 2,
                proxy_id: "proxy-a".into()
            }]
        );
        let lines: Vec<&str> = text.lines().collect();
        std::fs::write(&path, format!("{}\n{}\n", lines[0], lines[2])).unwrap();
        assert_eq!(
            verify_jsonl(&path).unwrap().breaks,
            vec![Break::Missing {
                id: 2,
                after: 1,
                proxy_id: "proxy-a".into()
            }]
        );
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&rotated);
    }
}
