//! The console's claims: those held now (taken and not yet answered, or
//! answered with their run not yet gone past them), each with its lease
//! and a release an operator confirms on a page of its own; the release
//! is the admin API's (`POST /claims/release`), audited as
//! `claim_released`.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::html::{page, Frame};
use super::lists::short;
use super::{Shared, PAGE_SIZE};
use crate::admin::alert::alert;
use crate::admin::auth::ConsoleSession;
use crate::admin::auth::PeerAddr;
use crate::admin::blocking::{blocking, with_store};
use crate::admin::claims_release::{release_claims, Requester};
use crate::admin::html_escape::{esc, url};
use crate::admin::views::ClaimView;
use crate::claims::ClaimState;

const PATH: &str = "/ui/claims";

#[derive(Debug, Default, Deserialize)]
pub struct ClaimsQuery {
    thread: Option<String>,
    /// Claims skipped (the pages before).
    #[serde(default)]
    skip: usize,
    fragment: Option<u8>,
}

/// `GET /ui/claims`.
pub async fn claims(
    State(s): State<Shared>,
    session: Option<Extension<ConsoleSession>>,
    Query(q): Query<ClaimsQuery>,
) -> Response {
    let thread = q.thread.clone().filter(|t| !t.trim().is_empty());
    let st = s.clone();
    let listed = blocking(move || with_store(&st, |store| store.list(thread.as_deref()))).await;
    let live = match listed {
        Ok(records) => {
            let held: Vec<ClaimView> = records
                .iter()
                .filter(|r| {
                    r.state == ClaimState::Held
                        || (r.state == ClaimState::Consumed && r.superseded_at_ms.is_none())
                })
                .map(ClaimView::from)
                .collect();
            table(&held, &q)
        }
        Err(e) => alert(&e.to_string()),
    };
    if q.fragment == Some(1) {
        return Html(live).into_response();
    }
    let thread = esc(q.thread.as_deref().unwrap_or(""));
    let main = format!(
        "<div class=\"head\"><h1>Claims held</h1><p class=\"muted\">Approvals a reader holds now \
         (answered ones until their run saves its next checkpoint), with their lease. Releasing \
         one lets the next reader take the approval afresh.</p></div>\
         <form class=\"search\" method=\"get\" action=\"{PATH}\"><label>Thread<input name=\"thread\" \
         value=\"{thread}\" placeholder=\"thread id\"></label><button type=\"submit\">Search</button>\
         <a class=\"clear\" href=\"{PATH}\">Clear</a></form>\
         <section id=\"live\"{}>{live}</section>",
        if q.skip == 0 {
            " data-live=\"1\" aria-live=\"polite\""
        } else {
            ""
        }
    );
    let f = Frame {
        title: "Claims held",
        active: PATH,
        csrf: session.as_ref().map(|Extension(c)| c.csrf.as_str()),
        source: "claims store",
    };
    Html(page(&f, &main)).into_response()
}

fn table(held: &[ClaimView], q: &ClaimsQuery) -> String {
    if held.is_empty() {
        return "<p class=\"empty\">No claim is held.</p>".to_owned();
    }
    let mut out = String::from(
        "<table class=\"list\"><thead><tr><th>Thread</th><th>Checkpoint</th><th>State</th>\
         <th>Holder</th><th>Epoch</th><th>Lease</th><th></th></tr></thead><tbody>",
    );
    for c in held.iter().skip(q.skip).take(PAGE_SIZE) {
        let state = match c.state {
            "held" => "<span class=\"badge warn\">claimed</span>",
            _ => "<span class=\"badge info\">running</span>",
        };
        let _ = write!(
            out,
            "<tr><td data-label=\"Thread\"><a class=\"thread\" href=\"/ui/threads/{tu}\">{t}</a></td>\
             <td data-label=\"Checkpoint\"><code title=\"{cf}\">{cs}</code></td>\
             <td data-label=\"State\">{state}</td>\
             <td data-label=\"Holder\"><span class=\"who\">{addr}</span>\
             <div class=\"muted\">{app} · {proxy} · session {sid}</div></td>\
             <td data-label=\"Epoch\">{epoch}</td>\
             <td data-label=\"Lease\">claimed {claimed}<div class=\"muted\">lapses {lapses}</div></td>\
             <td><a class=\"button danger\" href=\"/ui/claims/release?thread={tu}&amp;checkpoint={cu}\">Release…</a></td></tr>",
            tu = url(&c.thread_id),
            t = esc(&c.thread_id),
            cf = esc(&c.checkpoint_id),
            cs = esc(&short(&c.checkpoint_id)),
            cu = url(&c.checkpoint_id),
            app = esc(if c.holder.application_name.is_empty() {
                "-"
            } else {
                &c.holder.application_name
            }),
            addr = esc(&c.holder.client_addr),
            proxy = esc(&c.holder.proxy_id),
            sid = c.holder.session_id,
            epoch = c.epoch,
            claimed = esc(&c.claimed_at),
            lapses = esc(&c.lapses_at),
        );
    }
    out.push_str("</tbody></table>");
    if held.len() > q.skip + PAGE_SIZE {
        let thread = q
            .thread
            .as_deref()
            .map(|t| format!("thread={}&amp;", url(t)))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<p class=\"pager\"><a href=\"{PATH}?{thread}skip={}\">More →</a></p>",
            q.skip + PAGE_SIZE
        );
    }
    out
}

#[derive(Debug, Deserialize)]
pub struct ReleaseQuery {
    thread: String,
    checkpoint: Option<String>,
}

/// `GET /ui/claims/release`: what would be released, and the form that
/// does it.
pub async fn confirm(
    session: Option<Extension<ConsoleSession>>,
    Query(q): Query<ReleaseQuery>,
) -> Response {
    let csrf = session.as_ref().map(|Extension(c)| c.csrf.as_str());
    let checkpoint = q.checkpoint.as_deref().unwrap_or("");
    let main = format!(
        "<div class=\"head\"><h1>Release a claim</h1></div><div class=\"card confirm\">\
         <p>Release the claim of thread <b>{t}</b>{c}? Its holder's writes will be fenced, and \
         the next reader of the parked checkpoint takes the approval afresh. The release is \
         recorded in the audit trail.</p>\
         <form method=\"post\" action=\"/ui/claims/release\">\
         <input type=\"hidden\" name=\"thread\" value=\"{t}\">\
         <input type=\"hidden\" name=\"checkpoint\" value=\"{cp}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\" class=\"danger\" id=\"confirm-release\">Release</button> \
         <a href=\"{PATH}\">Cancel</a></form></div>",
        t = esc(&q.thread),
        c = if checkpoint.is_empty() {
            String::new()
        } else {
            format!(" at checkpoint <code>{}</code>", esc(checkpoint))
        },
        cp = esc(checkpoint),
        csrf = esc(csrf.unwrap_or("")),
    );
    let f = Frame {
        title: "Release a claim",
        active: PATH,
        csrf,
        source: "claims store",
    };
    Html(page(&f, &main)).into_response()
}

#[derive(Debug, Deserialize)]
pub struct ReleaseForm {
    thread: String,
    #[serde(default)]
    checkpoint: String,
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/claims/release`: the confirmed form. A console session's
/// form must carry its CSRF token (a bearer request needs none: nothing
/// ambient carries it).
pub async fn release(
    State(s): State<Shared>,
    session: Option<Extension<ConsoleSession>>,
    peer: Option<Extension<PeerAddr>>,
    Form(form): Form<ReleaseForm>,
) -> Response {
    if let Some(Extension(session)) = &session {
        if !session.csrf_matches(&form.csrf) {
            tracing::warn!("console release refused: the form's CSRF token is not the session's");
            let msg = "the form's CSRF token is not this session's: nothing was released";
            return (StatusCode::FORBIDDEN, Html(format!("<p>{msg}</p>"))).into_response();
        }
    }
    let checkpoint = Some(form.checkpoint).filter(|c| !c.is_empty());
    let thread = form.thread.clone();
    let requester = Requester {
        addr: peer.map(|Extension(p)| p.0),
        via: "console",
    };
    let (status, said) = match release_claims(Arc::clone(&s), form.thread, checkpoint, requester).await
    {
        Ok(n) => (
            StatusCode::OK,
            format!(
                "<p class=\"note good\" role=\"status\">Released {n} claim(s) of thread <b>{}</b>.</p>",
                esc(&thread)
            ),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            alert(&e.to_string()),
        ),
    };
    let main = format!(
        "<div class=\"head\"><h1>Release a claim</h1></div>{said}<p><a href=\"{PATH}\">← Claims held</a> · \
         <a href=\"/ui/threads/{}\">the thread</a></p>",
        url(&thread)
    );
    let f = Frame {
        title: "Release a claim",
        active: PATH,
        csrf: session.as_ref().map(|Extension(c)| c.csrf.as_str()),
        source: "claims store",
    };
    (status, Html(page(&f, &main))).into_response()
}
