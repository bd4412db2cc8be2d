//! One thread's page: its approvals drawn as a timeline (an inline SVG,
//! one lane per replica; each approval a bar parked → claimed → running →
//! answered, refusals, forks and fenced writes marked where they
//! happened), then its events, and whether the audit chain verifies.

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;

use super::html::{page, Frame};
use super::lists::{client, short, text, time};
use super::Shared;
use crate::admin::alert::alert;
use crate::admin::auth::ConsoleSession;
use crate::admin::blocking::blocking;
use crate::admin::html_escape::esc;
use crate::admin::ledger::{thread_ledger, Approval, Mark, ThreadLedger};
use crate::admin::request_error::RequestError;
use crate::audit::{AuditError, Break, Operation, TrailSource};
use crate::error_chain::chain;

/// How long a walk of the chain answers the console's pages.
const CHAIN_CHECK_FRESH: Duration = Duration::from_secs(30);

/// Events a thread's page lists at most.
const MAX_EVENTS: usize = 500;

/// Why the console cannot show the audit chain as verified.
#[derive(Debug, Clone, thiserror::Error)]
enum ChainFault {
    /// The first place a chain stops proving its trail.
    #[error("the audit chain does not verify: {0}")]
    Broken(Break),
    #[error("the audit chain could not be walked: {}", chain(.0.as_ref()))]
    Unwalkable(Arc<AuditError>),
}

/// The last walk of the audit chain, shared by the pages.
#[derive(Default)]
pub struct ChainCheck(Mutex<Option<(Instant, Result<String, ChainFault>)>>);

impl ChainCheck {
    /// `Ok(summary)` when every chain verifies, the first break otherwise;
    /// walked again when the last walk is stale.
    fn verdict(&self, trail: &TrailSource) -> Result<String, ChainFault> {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, v)) = last.as_ref() {
            if at.elapsed() < CHAIN_CHECK_FRESH {
                return v.clone();
            }
        }
        let v = match trail.verify() {
            Ok(verdict) => match verdict.breaks.first() {
                None => {
                    let records: u64 = verdict.chains.iter().map(|c| c.records).sum();
                    Ok(format!(
                        "the audit chain verifies: {records} record(s) in {} chain(s)",
                        verdict.chains.len()
                    ))
                }
                Some(b) => {
                    tracing::error!(break_at = b.id(), "the audit chain does not verify: {b}");
                    Err(ChainFault::Broken(b.clone()))
                }
            },
            Err(e) => Err(ChainFault::Unwalkable(Arc::new(e))),
        };
        *last = Some((Instant::now(), v.clone()));
        v
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct ThreadQuery {
    /// `1`: every event, reads and blob writes too.
    all: Option<u8>,
}

/// `GET /ui/threads/{id}`.
pub async fn thread(
    State(s): State<Shared>,
    session: Option<Extension<ConsoleSession>>,
    Path(id): Path<String>,
    Query(q): Query<ThreadQuery>,
) -> Response {
    let Some(trail) = s.audit_trail.clone() else {
        return (StatusCode::NOT_FOUND, RequestError::NoTrail.to_string()).into_response();
    };
    let source = trail.describe();
    let (thread_id, st) = (id.clone(), s.clone());
    let read = blocking(move || {
        let events = trail
            .thread_events(&thread_id)
            .map_err(RequestError::Trail)?;
        let verdict = st.chain_check.verdict(&trail);
        Ok((events, verdict))
    })
    .await;
    let (status, main) = match read {
        Ok((events, verdict)) if events.iter().any(|e| e.thread_id.as_deref() == Some(&id)) => {
            let ledger = thread_ledger(&id, events);
            (StatusCode::OK, render(&ledger, &verdict, q.all == Some(1)))
        }
        Ok(_) => (
            StatusCode::NOT_FOUND,
            format!(
                "<div class=\"head\"><h1>Thread {}</h1></div><p class=\"empty\">No audit events for this thread.</p>",
                esc(&id)
            ),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            alert(&e.to_string()),
        ),
    };
    let title = format!("Thread {id}");
    let f = Frame {
        title: &title,
        active: "",
        csrf: session.as_ref().map(|Extension(c)| c.csrf.as_str()),
        source: &source,
    };
    (status, Html(page(&f, &main))).into_response()
}

fn render(l: &ThreadLedger, verdict: &Result<String, ChainFault>, all: bool) -> String {
    let state = l
        .state
        .map(|s| format!("{s:?}").to_lowercase())
        .unwrap_or_else(|| "never parked".to_owned());
    let chain = match verdict {
        Ok(v) => format!("<p class=\"note good\" id=\"chain\">✓ {}</p>", esc(v)),
        Err(e) => format!(
            "<p class=\"note bad\" id=\"chain\" role=\"alert\">✗ {}</p>",
            esc(&e.to_string())
        ),
    };
    let mut out = format!(
        "<div class=\"head\"><h1>Thread <span class=\"thread-id\">{}</span> \
         <span class=\"badge state-{state}\">{state}</span></h1>\
         <p class=\"muted\">{} approval(s) · {} event(s) · replicas {}</p></div>{chain}",
        esc(&l.thread_id),
        l.approvals.len(),
        l.timeline.len(),
        esc(&if l.replicas.is_empty() {
            "—".to_owned()
        } else {
            l.replicas.join(", ")
        }),
    );
    out.push_str("<h2>Timeline</h2>");
    out.push_str(&svg(l));
    out.push_str(LEGEND);
    out.push_str(&approvals(l));
    out.push_str(&events(l, all));
    out
}

const LEGEND: &str = "<p class=\"legend\"><span class=\"k parked\"></span>parked \
    <span class=\"k claimed\"></span>claimed <span class=\"k running\"></span>running \
    <span class=\"k done\"></span>answered and gone on \
    <span class=\"sym refused\">✕</span>refused <span class=\"sym fork\">◆</span>fork served \
    <span class=\"sym fenced\">■</span>write fenced / rejected</p>";

/// Milliseconds since the epoch of an RFC 3339 time.
fn ms(t: &str) -> Option<i64> {
    let at = humantime::parse_rfc3339(t).ok()?;
    let d = at.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// Where each approval's phases start and end, in its lane.
struct Bar<'a> {
    lane: usize,
    a: &'a Approval,
}

fn svg(l: &ThreadLedger) -> String {
    let lanes: Vec<&str> = if l.replicas.is_empty() {
        vec![""]
    } else {
        l.replicas.iter().map(String::as_str).collect()
    };
    let lane_of = |m: &Mark| lanes.iter().position(|r| *r == m.proxy_id).unwrap_or(0);
    let times: Vec<i64> = l.timeline.iter().filter_map(|e| ms(&e.time)).collect();
    let (Some(&t0), Some(&t1)) = (times.iter().min(), times.iter().max()) else {
        return String::new();
    };
    let now = ms(&crate::audit::format_rfc3339_millis(SystemTime::now())).unwrap_or(t1);
    let still_open = l.approvals.iter().any(|a| a.completed.is_none());
    let t1 = if still_open { now.max(t1) } else { t1 };
    let span = (t1 - t0).max(1) as f64;
    let (left, width, lane_h, top) = (150.0, 820.0, 56.0, 30.0);
    let x = |t: i64| left + (t - t0) as f64 / span * width;
    let xm = |m: &Mark| ms(&m.time).map_or(left, x);
    let height = top + lane_h * lanes.len() as f64 + 10.0;
    let mut s = format!(
        "<svg class=\"timeline\" viewBox=\"0 0 1000 {height}\" role=\"img\" \
         aria-label=\"timeline of the thread's approvals\" preserveAspectRatio=\"xMinYMin meet\">"
    );
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"16\" class=\"axis\">{}</text>\
         <text x=\"{}\" y=\"16\" class=\"axis\" text-anchor=\"end\">{}</text>",
        esc(&clock(t0)),
        left + width,
        esc(&clock(t1))
    );
    for (i, lane) in lanes.iter().enumerate() {
        let y = top + lane_h * i as f64 + lane_h / 2.0;
        let name = if lane.is_empty() { "proxy" } else { lane };
        let _ = write!(
            s,
            "<text x=\"8\" y=\"{}\" class=\"lane\">{}</text>\
             <line x1=\"{left}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" class=\"lane-line\"/>",
            y + 4.0,
            esc(&short_lane(name)),
            left + width
        );
    }
    let bars: Vec<Bar<'_>> = l
        .approvals
        .iter()
        .map(|a| Bar {
            lane: lane_of(&a.parked),
            a,
        })
        .collect();
    for b in &bars {
        let a = b.a;
        let y = top + lane_h * b.lane as f64 + lane_h / 2.0 - 7.0;
        let parked = xm(&a.parked);
        let claimed = a.claimed.as_ref().map(xm);
        let answered = a.answered.as_ref().or(a.consumed.as_ref()).map(xm);
        let completed = a.completed.as_ref().map(xm);
        let end_now = x(t1);
        let phases = [
            (
                "parked",
                Some(parked),
                claimed.or(answered).or(completed).or(Some(end_now)),
            ),
            ("claimed", claimed, answered.or(completed).or(Some(end_now))),
            ("running", answered, completed.or(Some(end_now))),
        ];
        for (class, from, to) in phases {
            if let (Some(from), Some(to)) = (from, to) {
                let w = (to - from).max(6.0);
                let _ = write!(
                    s,
                    "<rect x=\"{from:.1}\" y=\"{y}\" width=\"{w:.1}\" height=\"14\" rx=\"3\" class=\"{class}\">\
                     <title>{class} at checkpoint {}</title></rect>",
                    esc(&short(&a.checkpoint_id))
                );
            }
        }
        if let Some(c) = completed {
            let _ = write!(
                s,
                "<circle cx=\"{c:.1}\" cy=\"{}\" r=\"5\" class=\"done\"><title>{}</title></circle>",
                y + 7.0,
                esc(&format!(
                    "run went on at {}",
                    a.completed.as_ref().map_or("", |m| m.time.as_str())
                ))
            );
        }
        if let Some(m) = &a.answered {
            let who = text(&m.detail, "approver");
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" class=\"answered\">✓<title>{}</title></text>",
                xm(m) - 4.0,
                y - 3.0,
                esc(&format!("answered at {} {who}", m.time))
            );
        }
    }
    let marks = l
        .approvals
        .iter()
        .flat_map(|a| {
            a.refused
                .iter()
                .map(|m| ("refused", "✕", m))
                .chain(a.forks_served.iter().map(|m| ("fork", "◆", m)))
                .chain(a.fenced.iter().map(|m| ("fenced", "■", m)))
        })
        .chain(l.refused.iter().map(|m| ("refused", "✕", m)))
        .chain(l.forks_served.iter().map(|m| ("fork", "◆", m)))
        .chain(l.writes_fenced.iter().map(|m| ("fenced", "■", m)))
        .chain(l.writes_rejected.iter().map(|m| ("fenced", "■", m)));
    let late: Vec<Mark> = l
        .timeline
        .iter()
        .filter(|e| e.operation == Operation::LateDuplicate)
        .map(Mark::of)
        .collect();
    let marks = marks.chain(late.iter().map(|m| ("refused", "✕", m)));
    for (class, sym, m) in marks {
        let y = top + lane_h * lane_of(m) as f64 + lane_h / 2.0 + 22.0;
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{y}\" class=\"sym {class}\" text-anchor=\"middle\">{sym}\
             <title>{}</title></text>",
            xm(m),
            esc(&format!(
                "{} at {} by {}@{} ({})",
                m.operation, m.time, m.user, m.client_addr, m.application_name
            ))
        );
    }
    s.push_str("</svg>");
    s
}

fn short_lane(name: &str) -> String {
    if name.chars().count() > 18 {
        format!("{}…", name.chars().take(17).collect::<String>())
    } else {
        name.to_owned()
    }
}

fn clock(t_ms: i64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(t_ms).unwrap_or(0));
    let s = crate::audit::format_rfc3339_millis(t);
    s.get(11..23).map(str::to_owned).unwrap_or(s)
}

fn approvals(l: &ThreadLedger) -> String {
    if l.approvals.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Approvals</h2><table class=\"list\"><thead><tr><th>Checkpoint</th><th>State</th>\
         <th>Parked</th><th>Claimed</th><th>Answered</th><th>Refused</th><th>Forks</th></tr></thead><tbody>",
    );
    let at = |m: &Option<Mark>| {
        m.as_ref().map_or_else(
            || "—".to_owned(),
            |m| {
                let approver = match m.detail.get("approver") {
                    Some(a) => format!("<div class=\"approver\">{}</div>", esc(&a.to_string())),
                    None => String::new(),
                };
                format!(
                    "{}<div class=\"muted\">{}@{}</div>{approver}",
                    esc(&m.time),
                    esc(&m.user),
                    esc(&m.client_addr)
                )
            },
        )
    };
    for a in &l.approvals {
        let state = format!("{:?}", a.state).to_lowercase();
        let _ = write!(
            out,
            "<tr><td data-label=\"Checkpoint\"><code title=\"{}\">{}</code></td>\
             <td data-label=\"State\"><span class=\"badge state-{state}\">{state}</span></td>\
             <td data-label=\"Parked\">{}</td><td data-label=\"Claimed\">{}</td>\
             <td data-label=\"Answered\">{}</td><td data-label=\"Refused\">{}</td>\
             <td data-label=\"Forks\">{}</td></tr>",
            esc(&a.checkpoint_id),
            esc(&short(&a.checkpoint_id)),
            at(&Some(a.parked.clone())),
            at(&a.claimed),
            at(&a.answered),
            a.refused.len(),
            a.forks_served.len(),
        );
    }
    out.push_str("</tbody></table>");
    out
}

/// Reads and the writes of channel values and pending writes: shown only
/// when all events are asked for.
fn noise(op: Operation) -> bool {
    matches!(
        op,
        Operation::ReadLatest
            | Operation::ReadById
            | Operation::ReadList
            | Operation::BlobPut
            | Operation::WritesPut
    )
}

fn events(l: &ThreadLedger, all: bool) -> String {
    let now = SystemTime::now();
    let shown: Vec<_> = l
        .timeline
        .iter()
        .filter(|e| all || !noise(e.operation))
        .collect();
    let toggle = if all {
        "<a href=\"?\">Story only</a>".to_owned()
    } else {
        format!("<a href=\"?all=1\">All {} events</a>", l.timeline.len())
    };
    let mut out = format!(
        "<h2>Events <span class=\"muted small\">{} shown · {toggle}</span></h2>\
         <table class=\"list events\"><thead><tr><th>Time</th><th>Operation</th><th>Checkpoint</th>\
         <th>Client</th><th>Detail</th></tr></thead><tbody>",
        shown.len().min(MAX_EVENTS)
    );
    for e in shown.iter().take(MAX_EVENTS) {
        let detail = if e.detail.is_null() {
            String::new()
        } else {
            e.detail.to_string()
        };
        let _ = write!(
            out,
            "<tr class=\"op-{op}\"><td data-label=\"Time\">{}</td><td data-label=\"Operation\">\
             <span class=\"op\">{op}</span></td><td data-label=\"Checkpoint\"><code>{}</code></td>\
             <td data-label=\"Client\">{}</td><td data-label=\"Detail\"><code class=\"detail\">{}</code></td></tr>",
            time(&e.time, now),
            esc(&short(e.checkpoint_id.as_deref().unwrap_or(""))),
            client(e),
            esc(&detail),
            op = e.operation.as_str(),
        );
    }
    out.push_str("</tbody></table>");
    if shown.len() > MAX_EVENTS {
        let _ = write!(
            out,
            "<p class=\"muted\">The first {MAX_EVENTS} of {} events; `resumeguard audit --thread` lists them all.</p>",
            shown.len()
        );
    }
    out
}
