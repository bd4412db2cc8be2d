//! The approvals console (`/ui`): server-rendered pages of what the proxy
//! decided, read from the audit trail and the claims store — interrupts
//! waiting now, answers with their approvers, refusals, forks served,
//! writes rejected and fenced, claims held (with a release an operator
//! confirms), and each thread's timeline. Self-contained: its stylesheet
//! and its one script are compiled into the binary. Lists are paged by
//! record id and refresh themselves while their first page is shown.
//!
//! - `html`: the shared frame.
//! - `lists`: the list pages' columns, search form and pager.
//! - `claims_page`: claims held and their release.
//! - `thread_page`: one thread's timeline drawn, its events, the chain.

mod claims_page;
mod html;
mod lists;
mod thread_page;

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;

pub use thread_page::ChainCheck;

use super::alert::alert;
use super::auth::{self, ConsoleSession};
use super::blocking::blocking;
use super::html_escape::url;
use super::login_page::login_page;
use super::request_error::RequestError;
use super::AdminState;
use crate::audit::{ConsoleFilter, ConsoleList, EventFilter, TrailSource};

type Shared = Arc<AdminState>;

/// Records on a page of a list.
pub const PAGE_SIZE: usize = 50;

const CSS: &str = include_str!("console/assets/console.css");
const JS: &str = include_str!("console/assets/console.js");

/// The login form and the static files: answered without the token.
pub fn open_routes() -> Router<Shared> {
    Router::new()
        .route("/ui/login", get(login_form).post(auth::login))
        .route("/ui/static/console.css", get(|| asset("text/css", CSS)))
        .route(
            "/ui/static/console.js",
            get(|| asset("text/javascript", JS)),
        )
}

/// The console's pages: behind the token.
pub fn guarded_routes() -> Router<Shared> {
    let list = |l: ConsoleList, path: &'static str| {
        get(move |s, session, q| list_page(s, session, q, l, path))
    };
    Router::new()
        .route("/ui", get(|| async { see_other("/ui/waiting") }))
        .route("/ui/", get(|| async { see_other("/ui/waiting") }))
        .route("/ui/waiting", list(ConsoleList::Waiting, "/ui/waiting"))
        .route("/ui/answered", list(ConsoleList::Answered, "/ui/answered"))
        .route("/ui/refused", list(ConsoleList::Refused, "/ui/refused"))
        .route("/ui/forks", list(ConsoleList::Forks, "/ui/forks"))
        .route("/ui/rejected", list(ConsoleList::Rejected, "/ui/rejected"))
        .route("/ui/fenced", list(ConsoleList::Fenced, "/ui/fenced"))
        .route("/ui/claims", get(claims_page::claims))
        .route(
            "/ui/claims/release",
            get(claims_page::confirm).post(claims_page::release),
        )
        .route("/ui/threads/{id}", get(thread_page::thread))
        .route("/ui/logout", post(auth::logout))
}

async fn login_form() -> Html<String> {
    login_page(None, "")
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

fn see_other(to: &'static str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(LOCATION, HeaderValue::from_static(to));
    r
}

/// The search's time window as the trail's times (ages such as `2h`
/// are counted back from now).
fn window(q: &Search) -> Result<(Option<String>, Option<String>), RequestError> {
    EventFilter::parse(
        q.since.as_deref(),
        q.until.as_deref(),
        &[],
        SystemTime::now(),
    )
    .map(|w| (w.since, w.until))
    .map_err(RequestError::Window)
}

/// A list page's query: the search and the page.
#[derive(Debug, Default, Deserialize)]
pub struct Search {
    pub thread: Option<String>,
    pub approver: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    /// The page after this record id (older).
    pub before: Option<i64>,
    /// `1`: only the live region (the page's script polls it).
    pub fragment: Option<u8>,
}

impl Search {
    /// Empty fields of the form count as absent.
    fn normalized(mut self) -> Search {
        for f in [
            &mut self.thread,
            &mut self.approver,
            &mut self.since,
            &mut self.until,
        ] {
            if f.as_deref().is_some_and(|v| v.trim().is_empty()) {
                *f = None;
            }
        }
        self
    }

    /// The search as a query string ending in `&` (for the pager).
    fn query_without_page(&self) -> String {
        let mut out = String::new();
        for (k, v) in [
            ("thread", &self.thread),
            ("approver", &self.approver),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = v {
                out.push_str(&format!("{k}={}&", url(v)));
            }
        }
        out
    }
}

fn frame<'a>(
    title: &'a str,
    active: &'a str,
    session: &'a Option<Extension<ConsoleSession>>,
    source: &'a str,
) -> html::Frame<'a> {
    html::Frame {
        title,
        active,
        csrf: session.as_ref().map(|Extension(c)| c.csrf.as_str()),
        source,
    }
}

async fn list_page(
    State(s): State<Shared>,
    session: Option<Extension<ConsoleSession>>,
    Query(q): Query<Search>,
    list: ConsoleList,
    path: &'static str,
) -> Response {
    let q = q.normalized();
    let (title, about) = lists::heading(list);
    let source = s
        .audit_trail
        .as_ref()
        .map(TrailSource::describe)
        .unwrap_or_default();
    let rows = match (s.audit_trail.clone(), window(&q)) {
        (Some(trail), Ok((since, until))) => {
            let filter = ConsoleFilter {
                thread: q.thread.clone(),
                approver: q.approver.clone(),
                since,
                until,
                before_id: q.before,
                limit: PAGE_SIZE,
            };
            blocking(move || {
                trail
                    .console_list(list, &filter)
                    .map_err(RequestError::Trail)
            })
            .await
        }
        (None, _) => Err(RequestError::NoTrail),
        (_, Err(e)) => Err(e),
    };
    let live = match &rows {
        Ok(rows) => lists::table(
            path,
            list,
            rows,
            &q,
            rows.len() == PAGE_SIZE,
            s.audit.log_values(),
        ),
        Err(e) => alert(&e.to_string()),
    };
    if q.fragment == Some(1) {
        return Html(live).into_response();
    }
    let polls = q.before.is_none() && rows.is_ok();
    let main = format!(
        "<div class=\"head\"><h1>{title}</h1><p class=\"muted\">{about}</p></div>{}\
         <section id=\"live\"{}>{live}</section>",
        lists::search_form(path, list, &q),
        if polls {
            " data-live=\"1\" aria-live=\"polite\""
        } else {
            ""
        }
    );
    let status = match &rows {
        Ok(_) => StatusCode::OK,
        Err(RequestError::NoTrail) => StatusCode::NOT_FOUND,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    let f = frame(title, path, &session, &source);
    (status, Html(html::page(&f, &main))).into_response()
}
