//! The console's list pages: what each list shows of a record (columns),
//! the search form, the live region and its pager.

use std::fmt::Write;
use std::time::SystemTime;

use serde_json::Value;

use super::Search;
use crate::admin::html_escape::{esc, url};
use crate::audit::{ConsoleList, ListedEvent, Operation};

/// A list page's title and the sentence under it.
pub fn heading(list: ConsoleList) -> (&'static str, &'static str) {
    match list {
        ConsoleList::Waiting => (
            "Waiting",
            "Interrupts parked now: no answer recorded, the run not gone past them.",
        ),
        ConsoleList::Answered => (
            "Answered",
            "Each interrupt's first answer: who approved, when, and how long it waited.",
        ),
        ConsoleList::Refused => (
            "Refused",
            "Racers refused a claimed approval, late duplicate answers, reads refused while a run held the thread, and statements refused before they ran (on the proxy's own schema, or checkpoint statements the proxy cannot follow).",
        ),
        ConsoleList::Forks => (
            "Forks served",
            "Reads of a past checkpoint answered as a fork: the pending writes of the original run hidden.",
        ),
        ConsoleList::Rejected => (
            "Writes rejected",
            "Checkpoint writes refused by a validity rule (the rule and the path that broke it).",
        ),
        ConsoleList::Fenced => (
            "Writes fenced",
            "Writes continuing a claimed checkpoint from other than its holder, refused.",
        ),
    }
}

/// The column headers of a list.
fn columns(list: ConsoleList) -> &'static [&'static str] {
    match list {
        ConsoleList::Waiting => &["Thread", "Node", "Waiting since", "Parked by", "Question"],
        ConsoleList::Answered => &[
            "Thread", "Approver", "Answered", "Waited", "Answer", "Proxy",
        ],
        ConsoleList::Refused => &["Thread", "Refused", "When", "Client", "Reason"],
        ConsoleList::Forks => &["Thread", "Checkpoint", "When", "Client", "Hidden writes"],
        ConsoleList::Rejected => &["Thread", "Rule", "Path", "When", "Client"],
        ConsoleList::Fenced => &["Thread", "Holder", "Epoch", "When", "Writer"],
    }
}

/// The search form: thread, approver (answers only), time window.
pub fn search_form(path: &str, list: ConsoleList, q: &Search) -> String {
    let v = |o: &Option<String>| esc(o.as_deref().unwrap_or(""));
    let approver = if list == ConsoleList::Answered {
        format!(
            "<label>Approver<input name=\"approver\" value=\"{}\" placeholder=\"alice\"></label>",
            v(&q.approver)
        )
    } else {
        String::new()
    };
    format!(
        "<form class=\"search\" method=\"get\" action=\"{path}\">\
         <label>Thread<input name=\"thread\" value=\"{}\" placeholder=\"thread id\"></label>{approver}\
         <label>Since<input name=\"since\" value=\"{}\" placeholder=\"2h or 2026-12-01T00:00:00Z\"></label>\
         <label>Until<input name=\"until\" value=\"{}\" placeholder=\"RFC 3339 or age\"></label>\
         <button type=\"submit\">Search</button><a class=\"clear\" href=\"{path}\">Clear</a></form>",
        v(&q.thread),
        v(&q.since),
        v(&q.until),
    )
}

/// The table of a page of `rows`, and the link to the next (older) page
/// when this one is full.
pub fn table(
    path: &str,
    list: ConsoleList,
    rows: &[ListedEvent],
    q: &Search,
    full: bool,
    show_values: bool,
) -> String {
    let now = SystemTime::now();
    let mut out = String::new();
    if rows.is_empty() {
        let none = match (list, q.before) {
            (ConsoleList::Waiting, None) => "Nothing is waiting for an answer.",
            (_, Some(_)) => "No older records.",
            _ => "No records match.",
        };
        let _ = write!(out, "<p class=\"empty\">{none}</p>");
        return out;
    }
    out.push_str("<table class=\"list\"><thead><tr>");
    for c in columns(list) {
        let _ = write!(out, "<th>{c}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        let cells = cells(list, r, now, show_values);
        let _ = write!(out, "<tr data-id=\"{}\">", r.id);
        for (c, cell) in columns(list).iter().zip(cells) {
            let _ = write!(out, "<td data-label=\"{c}\">{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    if full {
        if let Some(last) = rows.last() {
            let _ = write!(
                out,
                "<p class=\"pager\"><a href=\"{path}?{}before={}\">Older →</a></p>",
                q.query_without_page(),
                last.id
            );
        }
    }
    out
}

fn cells(list: ConsoleList, r: &ListedEvent, now: SystemTime, show_values: bool) -> Vec<String> {
    let ev = &r.event;
    let d = &ev.detail;
    let thread = match ev.thread_id.as_deref() {
        Some(t) => thread_link(t, ev.checkpoint_ns.as_deref()),
        // A refused statement that names no thread.
        None => "—".to_owned(),
    };
    let when = time(&ev.time, now);
    match list {
        ConsoleList::Waiting => vec![
            thread,
            esc(&node(d)),
            format!(
                "{when}<div class=\"muted\">waiting {}</div>",
                esc(&since(&ev.time, now))
            ),
            client(ev),
            question(ev, show_values),
        ],
        ConsoleList::Answered => vec![
            thread,
            approver(r.approver.as_deref()),
            when,
            r.parked_at
                .as_deref()
                .map(|p| esc(&between(p, &ev.time)))
                .unwrap_or_else(|| "—".to_owned()),
            digest(ev),
            format!("<code>{}</code>", esc(or_dash(&ev.proxy_id))),
        ],
        ConsoleList::Refused => {
            let (kind, class) = match (ev.operation, text(d, "head").as_str()) {
                (Operation::LateDuplicate, _) => ("late duplicate", "warn"),
                (Operation::StatementRefused, _) => ("statement refused", "bad"),
                (_, "running") => ("read during a run", "info"),
                _ => ("racer refused", "bad"),
            };
            vec![
                thread,
                format!("<span class=\"badge {class}\">{kind}</span>"),
                when,
                client(ev),
                format!("<span class=\"reason\">{}</span>", esc(&text(d, "reason"))),
            ]
        }
        ConsoleList::Forks => vec![
            thread,
            format!(
                "<code>{}</code>",
                esc(&short(ev.checkpoint_id.as_deref().unwrap_or("")))
            ),
            when,
            client(ev),
            d.get("hidden")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
                .to_string(),
        ],
        ConsoleList::Rejected => vec![
            thread,
            format!("<code>{}</code>", esc(&text(d, "rule"))),
            format!("<code>{}</code>", esc(&text(d, "instance_path"))),
            when,
            client(ev),
        ],
        ConsoleList::Fenced => vec![
            thread,
            holder(d.get("holder")),
            esc(&d
                .get("epoch")
                .map(Value::to_string)
                .unwrap_or_else(|| "—".into())),
            when,
            client(ev),
        ],
    }
}

pub fn thread_link(thread: &str, ns: Option<&str>) -> String {
    let ns = match ns.filter(|n| !n.is_empty()) {
        Some(n) => format!("<div class=\"muted\">ns {}</div>", esc(n)),
        None => String::new(),
    };
    format!(
        "<a class=\"thread\" href=\"/ui/threads/{}\">{}</a>{ns}",
        url(thread),
        esc(thread)
    )
}

/// The node that parked: the last name of the task's path.
fn node(detail: &Value) -> String {
    let path = text(detail, "task_path");
    let name = path
        .rsplit([',', '|'])
        .map(|p| p.trim().trim_matches(['~', '\'', '"', '(', ')']))
        .find(|p| !p.is_empty() && !p.starts_with("__pregel"));
    match name {
        Some(n) => n.to_owned(),
        None if detail.get("run_level") == Some(&Value::Bool(true)) => "(run)".to_owned(),
        None => "—".to_owned(),
    }
}

/// `user@client` and the application, or the proxy for its own records.
pub fn client(ev: &crate::audit::AuditEvent) -> String {
    format!(
        "<span class=\"who\">{}@{}</span><div class=\"muted\">{}{}</div>",
        esc(or_dash(&ev.user)),
        esc(or_dash(&ev.client_addr)),
        esc(or_dash(&ev.application_name)),
        if ev.proxy_id.is_empty() {
            String::new()
        } else {
            format!(" · {}", esc(&ev.proxy_id))
        }
    )
}

/// The interrupt's question where the trail holds it, else its digest.
fn question(ev: &crate::audit::AuditEvent, show_values: bool) -> String {
    match ev.detail.get("question") {
        Some(q) if show_values => {
            let text = match q {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("<span class=\"question\">{}</span>", esc(&text))
        }
        _ => digest(ev),
    }
}

fn digest(ev: &crate::audit::AuditEvent) -> String {
    match ev.blob_sha256.first() {
        Some(b) => format!(
            "<code title=\"sha256 {}\">sha256 {}…</code>",
            esc(&b.sha256),
            esc(b.sha256.get(..12).unwrap_or(&b.sha256))
        ),
        None => "—".to_owned(),
    }
}

/// `{"user_id":"alice"}` as `user_id alice`.
fn approver(json: Option<&str>) -> String {
    let Some(json) = json else {
        return "<span class=\"muted\">not named</span>".to_owned();
    };
    let shown = match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                format!("<span class=\"muted\">{}</span> <b>{}</b>", esc(k), esc(&v))
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => esc(json),
    };
    format!("<span class=\"approver\">{shown}</span>")
}

fn holder(h: Option<&Value>) -> String {
    match h {
        Some(h) => format!(
            "<code>{}</code><div class=\"muted\">session {} · {}</div>",
            esc(&text(h, "proxy_id")),
            esc(&h
                .get("session_id")
                .map(Value::to_string)
                .unwrap_or_default()),
            esc(&text(h, "client_addr")),
        ),
        None => "—".to_owned(),
    }
}

pub fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// A checkpoint id's tail: the part that differs between neighbours.
pub fn short(id: &str) -> String {
    let n = id.chars().count();
    if n <= 12 {
        id.to_owned()
    } else {
        format!("…{}", id.chars().skip(n - 10).collect::<String>())
    }
}

/// The record's time, shown without its date when it is today's.
pub fn time(t: &str, now: SystemTime) -> String {
    let today = crate::audit::format_rfc3339_millis(now);
    let shown = match (t.get(..10), today.get(..10), t.get(11..19)) {
        (Some(d), Some(td), Some(clock)) if d == td => clock.to_owned(),
        _ => t.replacen('T', " ", 1),
    };
    format!(
        "<time datetime=\"{}\" title=\"{}\">{}</time>",
        esc(t),
        esc(t),
        esc(&shown)
    )
}

/// How long ago `t` was.
fn since(t: &str, now: SystemTime) -> String {
    match humantime::parse_rfc3339(t)
        .ok()
        .and_then(|at| now.duration_since(at).ok())
    {
        Some(d) => span(d.as_secs()),
        None => "—".to_owned(),
    }
}

/// The time from `from` to `to`.
fn between(from: &str, to: &str) -> String {
    match (humantime::parse_rfc3339(from), humantime::parse_rfc3339(to)) {
        (Ok(a), Ok(b)) => match b.duration_since(a) {
            Ok(d) if d.as_secs() == 0 => format!("{} ms", d.as_millis()),
            Ok(d) => span(d.as_secs()),
            Err(_) => "—".to_owned(),
        },
        _ => "—".to_owned(),
    }
}

fn span(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {} s", s / 60, s % 60),
        s if s < 86_400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        s => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_the_last_name_of_the_task_path() {
        let d = serde_json::json!({"task_path": "~__pregel_pull, review", "run_level": false});
        assert_eq!(node(&d), "review");
        let run = serde_json::json!({"task_path": "", "run_level": true});
        assert_eq!(node(&run), "(run)");
    }

    #[test]
    fn a_refused_statement_without_a_thread_is_listed_as_one() {
        let refused = crate::audit::AuditEvent::new(
            &crate::audit::SessionContext::default(),
            Operation::StatementRefused,
        )
        .with_detail(serde_json::json!({"refusal": "own_schema", "reason": "<own schema>"}));
        let row = ListedEvent {
            id: 1,
            event: refused,
            approver: None,
            parked_at: None,
        };
        let cells = cells(ConsoleList::Refused, &row, SystemTime::now(), false);
        assert_eq!(cells[0], "—", "no thread link to nowhere");
        assert!(cells[1].contains("statement refused"), "{}", cells[1]);
        assert!(cells[4].contains("&lt;own schema&gt;"), "{}", cells[4]);
    }

    #[test]
    fn an_approver_is_shown_escaped() {
        let shown = approver(Some(r#"{"resume/by":"<b>mallory</b>"}"#));
        assert!(shown.contains("&lt;b&gt;mallory&lt;/b&gt;"), "{shown}");
        assert!(!shown.contains("<b>mallory"), "{shown}");
        assert_eq!(span(3725), "1 h 2 min");
        assert_eq!(
            between("2026-12-01T00:00:00.000Z", "2026-12-01T00:00:00.250Z"),
            "250 ms"
        );
    }
}
