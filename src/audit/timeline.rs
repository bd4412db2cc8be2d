//! Human-readable rendering of the trail: the story of each thread.
//!
//! The audience is someone asking "what happened to this run?", so each line
//! ends with a plain phrase (parked, answered, claimed, ...) and long ids are
//! shortened to the part that differs between neighbouring checkpoints.
//! Every line is escaped whole (`log_text::escaped`): its ids, names and
//! reasons are the clients' (or whoever wrote the trail's table), and none
//! of them may start a line of its own or reach the terminal as an escape.

use std::fmt::Write;

use super::approver;
use crate::audit_event::{AuditEvent, Operation};
use crate::log_text::escaped;

/// Width of the operation column: the longest operation name.
const OP_WIDTH: usize = 16;

/// One section per thread (in order of first appearance), one line per
/// event in the given order. Events without a thread (e.g. dropped-event
/// reports) get their own section so gaps in the trail stay visible.
pub fn render_timeline(events: &[AuditEvent]) -> String {
    let mut threads: Vec<(Option<&str>, Vec<&AuditEvent>)> = Vec::new();
    for ev in events {
        let key = ev.thread_id.as_deref();
        match threads.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(ev),
            None => threads.push((key, vec![ev])),
        }
    }
    let mut out = String::new();
    for (i, (thread, list)) in threads.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let plural = if list.len() == 1 { "" } else { "s" };
        let replicas = replicas(list);
        let from = match replicas.as_slice() {
            [_, _, ..] => format!(", replicas {}", replicas.join(", ")),
            _ => String::new(),
        };
        let header = match thread {
            Some(t) => format!("thread {t} ({} event{plural}{from})", list.len()),
            None => format!("(no thread) ({} event{plural}{from})", list.len()),
        };
        let _ = writeln!(out, "{}", escaped(&header));
        for ev in list {
            let line = render_line(ev, replicas.len() > 1);
            let _ = writeln!(out, "  {}", escaped(&line));
        }
    }
    out
}

/// The replicas that recorded `events`, in order of first appearance.
fn replicas<'a>(events: &[&'a AuditEvent]) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for ev in events {
        if !ev.proxy_id.is_empty() && !seen.contains(&ev.proxy_id.as_str()) {
            seen.push(&ev.proxy_id);
        }
    }
    seen
}

/// The events as a pretty JSON array, for `--json`.
pub fn render_json(events: &[AuditEvent]) -> String {
    // Serializing these plain structs cannot fail (string keys only); the
    // fallback keeps the output valid JSON regardless.
    serde_json::to_string_pretty(events).unwrap_or_else(|_| "[]".to_string())
}

/// `time  operation  ns/ckpt  task  channels  who  [proxy=replica]  —
/// phrase`, with empty fields left out; the replica only when the
/// thread's events come from more than one.
fn render_line(ev: &AuditEvent, show_replica: bool) -> String {
    let mut parts: Vec<String> = vec![
        ev.time.clone(),
        format!("{:<OP_WIDTH$}", ev.operation.as_str()),
    ];
    if let Some(ns) = ev.checkpoint_ns.as_deref().filter(|ns| !ns.is_empty()) {
        parts.push(format!("ns={}", short_ns(ns)));
    }
    if let Some(id) = &ev.checkpoint_id {
        parts.push(format!("ckpt={}", short_id(id)));
    }
    if let Some(task) = &ev.task_id {
        parts.push(format!("task={}", short_id(task)));
    }
    if !ev.channels.is_empty() {
        parts.push(format!("ch={}", ev.channels.join(",")));
    }
    parts.push(who(ev));
    if show_replica {
        parts.push(format!("proxy={}", or_dash(&ev.proxy_id)));
    }
    format!("{}  — {}", parts.join("  "), phrase(ev))
}

/// `user@client app=name s=session`, or `resumeguard` for internal events.
fn who(ev: &AuditEvent) -> String {
    if ev.user.is_empty() && ev.client_addr.is_empty() && ev.session_id == 0 {
        return format!("app={}", or_dash(&ev.application_name));
    }
    format!(
        "{}@{} app={} s={}",
        or_dash(&ev.user),
        or_dash(&ev.client_addr),
        or_dash(&ev.application_name),
        ev.session_id
    )
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// The plain-language part of the line: what this event means for the run.
fn phrase(ev: &AuditEvent) -> String {
    let by_task = ev
        .task_id
        .as_deref()
        .map(|t| format!(" by task {}", short_id(t)))
        .unwrap_or_default();
    let mut p = match ev.operation {
        Operation::ReadLatest => "read latest checkpoint".to_string(),
        Operation::ReadById => "read checkpoint by id".to_string(),
        Operation::ReadList => "listed checkpoints".to_string(),
        Operation::BlobPut if ev.detail.get("written").and_then(|w| w.as_bool()) == Some(false) => {
            format!(
                "channel value not stored: {} already held a value under its version, which \
                 the checkpoint reads",
                ev.channels.join(", ")
            )
        }
        Operation::BlobPut => format!(
            "stored {} channel value(s)",
            ev.channels.len().max(ev.blob_sha256.len())
        ),
        Operation::CheckpointPut => {
            let what = match ev.detail.get("source").and_then(|s| s.as_str()) {
                Some("update") => "state updated by hand (update_state)",
                _ => "checkpoint saved",
            };
            match &ev.parent_checkpoint_id {
                Some(parent) => format!("{what} (parent {})", short_id(parent)),
                None => format!("{what} (first in thread)"),
            }
        }
        Operation::WritesPut => format!("pending writes stored{by_task}"),
        Operation::DeleteThread => "thread deleted".to_string(),
        Operation::Migration => "schema migration".to_string(),
        Operation::Unrecognized => "unrecognized statement relayed".to_string(),
        Operation::InterruptParked => format!("run parked: interrupt recorded{by_task}"),
        Operation::ResumeRecorded => match ev.blob_sha256.first() {
            Some(b) => format!("answer recorded (sha256 {})", short_digest(&b.sha256)),
            None => "answer recorded".to_string(),
        },
        Operation::ForkServed => match &ev.checkpoint_id {
            Some(id) => format!("fork served from checkpoint {}", short_id(id)),
            None => "fork served".to_string(),
        },
        Operation::WriteRejected => "write rejected".to_string(),
        Operation::WriteFenced => {
            "write fenced: its checkpoint is claimed by another session".to_string()
        }
        Operation::LateDuplicate => {
            "late duplicate resume refused: the interrupt was answered before".to_string()
        }
        Operation::ClaimTaken => format!("resume claimed by session {}", ev.session_id),
        Operation::ClaimConsumed => "claim consumed: resume completed".to_string(),
        // The record's reason (appended below) says why: answered, in
        // flight, a store that could not be reached, a run holding it.
        Operation::ClaimRefused => match ev.detail.get("head").and_then(|h| h.as_str()) {
            Some("running") => "read refused while a run holds the thread".to_string(),
            _ => "claim refused".to_string(),
        },
        Operation::ClaimWaited => "waited for another session's claim".to_string(),
        Operation::ClaimTakeover => match ev.detail.get("takeover").and_then(|t| t.as_str()) {
            Some(why) => format!("claim taken over from its holder ({why})"),
            None => "claim taken over from its holder".to_string(),
        },
        Operation::EventsDropped => {
            let n = ev.detail.get("dropped").and_then(|d| d.as_u64());
            let n = n.map(|n| format!("{n} ")).unwrap_or_default();
            let window = match (
                ev.detail.get("first_lost").and_then(|t| t.as_str()),
                ev.detail.get("last_lost").and_then(|t| t.as_str()),
            ) {
                (Some(first), Some(last)) => format!(" from {first} to {last}"),
                _ => String::new(),
            };
            format!("audit gap: {n}event(s) lost{window}")
        }
        Operation::AuditPruned => match ev.detail.get("cutoff").and_then(|c| c.as_str()) {
            Some(cutoff) => format!("audit trail pruned: rows before {cutoff} removed"),
            None => "audit trail pruned: oldest rows removed".to_string(),
        },
        Operation::EvidenceLost => match ev.detail.get("evidence").and_then(|c| c.as_str()) {
            Some(kind) => format!("claim evidence lost ({kind}): the claim lapses instead"),
            None => "claim evidence lost: the claim lapses instead".to_string(),
        },
        Operation::ClaimReleased => match ev.detail.get("released").and_then(|c| c.as_u64()) {
            Some(n) => format!("{n} claim(s) released by an operator"),
            None => "claims released by an operator".to_string(),
        },
        // Which refusal it was; the reason is appended below.
        Operation::StatementRefused => match ev.detail.get("refusal").and_then(|r| r.as_str()) {
            Some(kind) => format!("statement refused ({})", kind.replace('_', " ")),
            None => "statement refused".to_string(),
        },
        // The reason (appended below) names the store's failure.
        Operation::LeaseUnchecked => "read during a run served unchecked".to_string(),
        Operation::ConfigReloaded => match ev.detail.get("part").and_then(|c| c.as_str()) {
            Some(part) => format!("configuration reloaded (SIGHUP): {part}"),
            None => "configuration reloaded (SIGHUP)".to_string(),
        },
    };
    if let Some(rows) = ev.detail.get("rows").and_then(|r| r.as_u64()) {
        let _ = write!(p, " ({rows} row{})", if rows == 1 { "" } else { "s" });
    }
    if let Some(reason) = ev.detail.get("reason").and_then(|r| r.as_str()) {
        let _ = write!(p, ": {reason}");
    }
    if let Some(approver) = approver::describe(&ev.detail) {
        let _ = write!(p, ", by {approver}");
    }
    p
}

/// LangGraph checkpoint ids are UUIDv6: time-ordered, so neighbours share
/// the prefix and differ at the end. Keep the tail.
fn short_id(id: &str) -> String {
    let n = id.chars().count();
    if n <= 12 {
        return id.to_string();
    }
    let tail: String = id.chars().skip(n - 8).collect();
    format!("…{tail}")
}

/// Namespaces look like `node:task_id|child:task_id`; keep node names and
/// shorten the task ids.
fn short_ns(ns: &str) -> String {
    ns.split('|')
        .map(|seg| match seg.split_once(':') {
            Some((node, task)) => format!("{node}:{}", short_id(task)),
            None => seg.to_string(),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// Hashes are uniformly random: the conventional git-style prefix suffices.
fn short_digest(hex: &str) -> String {
    if hex.len() <= 12 {
        return hex.to_string();
    }
    format!("{}…", hex.get(..8).unwrap_or(hex))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_event::{BlobDigest, SessionContext};

    fn ctx(session_id: u64) -> SessionContext {
        SessionContext {
            session_id,
            client_addr: "10.1.2.3:40000".into(),
            user: "lg".into(),
            database: "db".into(),
            application_name: "agent".into(),
        }
    }

    fn ev(session: u64, op: Operation, thread: &str) -> AuditEvent {
        let mut e = AuditEvent::new(&ctx(session), op).with_thread(thread);
        e.time = "2024-05-01T12:00:00.000Z".into();
        e
    }

    fn interrupt_story() -> Vec<AuditEvent> {
        let mut put = ev(1, Operation::CheckpointPut, "t-1")
            .with_checkpoint("", "1ef4f797-8335-6428-8001-8a1503f9b875");
        put.parent_checkpoint_id = Some("1ef4f797-8335-6427-8000-0000deadbeef".into());
        put.channels = vec!["messages".into()];

        let mut parked = ev(1, Operation::InterruptParked, "t-1")
            .with_checkpoint("", "1ef4f797-8335-6428-8001-8a1503f9b875");
        parked.task_id = Some("c0ffee00-1111-2222-3333-444455556666".into());
        parked.channels = vec!["__interrupt__".into()];

        let mut claim = ev(2, Operation::ClaimTaken, "t-1");
        claim.application_name = "resumer".into();

        let mut answer = ev(2, Operation::ResumeRecorded, "t-1");
        answer.channels = vec!["__resume__".into()];
        answer.blob_sha256 = vec![BlobDigest::of("__resume__", b"yes")];

        let refused = ev(3, Operation::ClaimRefused, "t-1")
            .with_detail(serde_json::json!({"reason": "held by session 2"}));
        let consumed = ev(2, Operation::ClaimConsumed, "t-1");
        vec![put, parked, claim, answer, refused, consumed]
    }

    fn position(haystack: &str, needle: &str) -> usize {
        haystack
            .find(needle)
            .unwrap_or_else(|| panic!("missing {needle:?} in:\n{haystack}"))
    }

    #[test]
    fn tells_the_interrupt_story_in_order() {
        let text = render_timeline(&interrupt_story());
        let answer_sha = crate::audit_event::digest(b"yes");
        let phrases = [
            "thread t-1 (6 events)",
            "checkpoint saved (parent …deadbeef)",
            "run parked: interrupt recorded by task …55556666",
            "resume claimed by session 2",
            &format!("answer recorded (sha256 {}…)", &answer_sha[..8]),
            "claim refused: held by session 2",
            "claim consumed: resume completed",
        ];
        let mut last = 0;
        for p in phrases {
            let at = position(&text, p);
            assert!(at >= last, "{p:?} out of order in:\n{text}");
            last = at;
        }
        assert_eq!(text.lines().count(), 7, "{text}");
        let parked_line = text.lines().nth(2).unwrap();
        assert!(parked_line.starts_with("  2024-05-01T12:00:00.000Z  interrupt_parked "));
        assert!(parked_line.contains("ckpt=…03f9b875"));
        assert!(parked_line.contains("ch=__interrupt__"));
        assert!(parked_line.contains("lg@10.1.2.3:40000 app=agent s=1"));
        assert!(text.contains("app=resumer s=2"));
        // The full id appears nowhere: lines stay short.
        assert!(!text.contains("1ef4f797-8335-6428-8001-8a1503f9b875"));
    }

    #[test]
    fn groups_threads_and_shows_gaps() {
        let mut events = vec![
            ev(1, Operation::ReadLatest, "a").with_detail(serde_json::json!({"rows": 1})),
            ev(1, Operation::ReadList, "b").with_detail(serde_json::json!({"rows": 3})),
            ev(1, Operation::DeleteThread, "a"),
        ];
        let mut gap = AuditEvent::new(&SessionContext::internal(), Operation::EventsDropped)
            .with_detail(serde_json::json!({
                "dropped": 42,
                "reason": "queue_full",
                "first_lost": "2024-05-01T12:00:00.100Z",
                "last_lost": "2024-05-01T12:00:00.900Z",
            }));
        gap.time = "2024-05-01T12:00:01.000Z".into();
        events.push(gap);
        let mut sub = ev(1, Operation::BlobPut, "b");
        sub.checkpoint_ns = Some("outer:c0ffee00-1111-2222-3333-444455556666".into());
        sub.channels = vec!["x".into(), "y".into()];
        events.push(sub);

        let text = render_timeline(&events);
        let a = position(&text, "thread a (2 events)");
        let read = position(&text, "read latest checkpoint (1 row)");
        let deleted = position(&text, "thread deleted");
        let b = position(&text, "thread b (2 events)");
        let list = position(&text, "listed checkpoints (3 rows)");
        let blobs = position(&text, "ns=outer:…55556666");
        let stored = position(&text, "stored 2 channel value(s)");
        let none = position(&text, "(no thread) (1 event)");
        let dropped = position(
            &text,
            "audit gap: 42 event(s) lost from 2024-05-01T12:00:00.100Z \
             to 2024-05-01T12:00:00.900Z: queue_full",
        );
        assert!(a < read && read < deleted && deleted < b);
        assert!(b < list && list < blobs && blobs < stored && stored < none && none < dropped);
        assert!(text.contains("app=resumeguard  — audit gap"), "{text}");
    }

    #[test]
    fn says_that_a_blob_write_kept_the_stored_value() {
        let mut kept = ev(1, Operation::BlobPut, "t").with_detail(serde_json::json!({
            "statement": "blob_upsert", "written": false,
        }));
        kept.channels = vec!["approved".into()];
        let text = render_timeline(&[kept]);
        assert!(
            text.contains(
                "channel value not stored: approved already held a value under its version, \
                 which the checkpoint reads"
            ),
            "{text}"
        );
    }

    #[test]
    fn says_that_a_read_during_a_run_went_unchecked_and_why() {
        let unchecked = ev(1, Operation::LeaseUnchecked, "t").with_detail(serde_json::json!({
            "head": "running",
            "reason": "run lease unknown (claim store failed: timed out)",
        }));
        let text = render_timeline(&[unchecked]);
        assert!(
            text.contains(
                "read during a run served unchecked: run lease unknown (claim store failed: \
                 timed out)"
            ),
            "{text}"
        );
    }

    #[test]
    fn says_what_a_prune_removed() {
        let mut pruned = AuditEvent::new(&SessionContext::internal(), Operation::AuditPruned)
            .with_detail(serde_json::json!({
                "rows": 2,
                "cutoff": "2024-04-01T00:00:00.000Z",
                "by": "cli",
            }));
        pruned.time = "2024-05-01T12:00:01.000Z".into();
        let text = render_timeline(&[pruned]);
        assert!(
            text.contains(
                "audit trail pruned: rows before 2024-04-01T00:00:00.000Z removed (2 rows)"
            ),
            "{text}"
        );
    }

    #[test]
    fn says_which_statement_was_refused() {
        let refused =
            AuditEvent::new(&ctx(3), Operation::StatementRefused).with_detail(serde_json::json!({
                "refusal": "own_schema",
                "reason": "resumeguard: schema resumeguard belongs to resumeguard",
            }));
        let text = render_timeline(&[refused]);
        assert!(
            text.contains(
                "statement refused (own schema): resumeguard: schema resumeguard belongs to resumeguard\n"
            ),
            "the reason once, after the kind of refusal: {text}"
        );
    }

    #[test]
    fn says_why_a_claim_was_refused_or_taken_over() {
        let running = ev(3, Operation::ClaimRefused, "t-1").with_detail(serde_json::json!({
            "head": "running",
            "reason": "a run is in progress on thread \"t-1\"",
        }));
        let unreachable = ev(4, Operation::ClaimRefused, "t-1").with_detail(serde_json::json!({
            "head": "parked",
            "reason": "the claim store is unreachable",
        }));
        let takeover = ev(5, Operation::ClaimTakeover, "t-1").with_detail(serde_json::json!({
            "takeover": "lapsed claim: its holder recorded no evidence of a run in time",
        }));
        let text = render_timeline(&[running, unreachable, takeover]);
        for line in [
            "read refused while a run holds the thread: a run is in progress on thread \"t-1\"",
            "claim refused: the claim store is unreachable",
            "claim taken over from its holder (lapsed claim: its holder recorded no evidence of a run in time)",
        ] {
            assert!(text.contains(line), "{line:?} in:\n{text}");
        }
        assert!(!text.contains("already claimed"), "{text}");
    }

    #[test]
    fn names_the_approver_and_labels_hand_updates() {
        let mut update = ev(4, Operation::CheckpointPut, "t-1")
            .with_detail(serde_json::json!({"source": "update", "approver": {"user_id": "bob"}}));
        update.parent_checkpoint_id = Some("c1".into());
        let answer = ev(2, Operation::ResumeRecorded, "t-1")
            .with_detail(serde_json::json!({"approver": {"user_id": "alice", "email": "a@x"}}));
        let text = render_timeline(&[update, answer]);
        assert!(
            text.contains("state updated by hand (update_state) (parent c1), by user_id=bob"),
            "{text}"
        );
        assert!(
            text.contains("answer recorded, by email=a@x user_id=alice"),
            "{text}"
        );
    }

    #[test]
    fn names_the_replica_when_a_thread_spans_several() {
        let mut story = interrupt_story();
        for ev in &mut story {
            ev.proxy_id = "proxy-a".into();
        }
        let one = render_timeline(&story);
        assert!(
            !one.contains("proxy="),
            "one replica, no replica column:\n{one}"
        );
        assert!(one.starts_with("thread t-1 (6 events)\n"), "{one}");
        story[4].proxy_id = "proxy-b".into();
        let two = render_timeline(&story);
        assert!(
            two.starts_with("thread t-1 (6 events, replicas proxy-a, proxy-b)\n"),
            "{two}"
        );
        let refused = two.lines().find(|l| l.contains("claim refused")).unwrap();
        assert!(
            refused.contains("s=3  proxy=proxy-b  — claim refused"),
            "{refused}"
        );
        let claimed = two.lines().find(|l| l.contains("resume claimed")).unwrap();
        assert!(claimed.contains("proxy=proxy-a"), "{claimed}");
    }

    #[test]
    fn client_text_cannot_forge_lines_or_reach_the_terminal() {
        let forged = "t\n2026-05-01T12:00:00.000Z  resume_recorded  — answer recorded\x1b]0;x\x07";
        let mut ctx = ctx(4);
        ctx.user = "u\n[forged]\u{202e}".into();
        ctx.application_name = "\x1b[2Japp\r".into();
        let mut e = AuditEvent::new(&ctx, Operation::ClaimRefused).with_thread(forged);
        e.time = "2024-05-01T12:00:00.000Z\n".into();
        e.checkpoint_id = Some("c\u{85}".into());
        e.detail = serde_json::json!({"reason": "bad\nvalue"});
        let text = render_timeline(&[e]);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.chars().all(|c| c == '\n' || !c.is_control()) && !text.contains('\u{202e}'),
            "{text:?}"
        );
        assert!(
            text.starts_with("thread t\\n2026-05-01T12:00:00.000Z"),
            "{text}"
        );
        assert!(text.contains("answer recorded\\u{1b}]0;x\\u{7}"), "{text}");
        assert!(text.contains("u\\n[forged]\\u{202e}@"), "{text}");
        assert!(text.contains("app=\\u{1b}[2Japp\\r"), "{text}");
        assert!(text.contains(": bad\\nvalue"), "{text}");
    }

    #[test]
    fn renders_empty_input() {
        assert_eq!(render_timeline(&[]), "");
        assert_eq!(render_json(&[]), "[]");
    }

    #[test]
    fn json_output_round_trips() {
        let events = interrupt_story();
        let json = render_json(&events);
        let back: Vec<AuditEvent> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, events);
        assert!(json.contains("\"operation\": \"interrupt_parked\""));
    }

    #[test]
    fn shortens_ids_sensibly() {
        assert_eq!(short_id("short"), "short");
        assert_eq!(
            short_id("1ef4f797-8335-6428-8001-8a1503f9b875"),
            "…03f9b875"
        );
        assert_eq!(
            short_ns("a:1ef4f797-8335-6428-8001-8a1503f9b875|b"),
            "a:…03f9b875|b"
        );
        assert_eq!(short_digest(&"ab".repeat(32)), "abababab…");
    }
}
