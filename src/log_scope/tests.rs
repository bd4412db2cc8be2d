//! A turn's span is entered only when something inside it needs it, and
//! what it logs carries the span as if it had been entered from the start.

use std::sync::{Arc, Mutex};

use tracing::span::Id;
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::{in_scope, LazyEnter};

/// What the layer saw: each event's current span, and how often each span
/// was entered.
#[derive(Default)]
struct Seen {
    events: Vec<Option<String>>,
    entered: Vec<String>,
    parents: Vec<(String, Option<String>)>,
}

#[derive(Clone, Default)]
struct Watch(Arc<Mutex<Seen>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Watch {
    fn on_event(&self, _: &Event<'_>, ctx: Context<'_, S>) {
        let current = ctx.lookup_current().map(|s| s.name().to_owned());
        self.0.lock().unwrap().events.push(current);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            self.0.lock().unwrap().entered.push(span.name().to_owned());
        }
    }

    fn on_new_span(&self, _: &tracing::span::Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let parent = span.parent().map(|p| p.name().to_owned());
            self.0
                .lock()
                .unwrap()
                .parents
                .push((span.name().to_owned(), parent));
        }
    }
}

fn lazily<R>(watch: &Watch, f: impl FnOnce() -> R) -> R {
    let subscriber = LazyEnter::new(tracing_subscriber::registry().with(watch.clone()));
    tracing::subscriber::with_default(subscriber, f)
}

#[test]
fn a_turn_that_logs_nothing_never_enters_its_span() {
    let watch = Watch::default();
    lazily(&watch, || {
        let session = tracing::info_span!("session");
        for _ in 0..3 {
            in_scope(&session, || 1 + 1);
        }
        tracing::info!("after");
    });
    let seen = watch.0.lock().unwrap();
    assert!(seen.entered.is_empty());
    assert_eq!(seen.events, vec![None]);
}

#[test]
fn what_a_turn_logs_carries_its_span_entered_once_and_left_at_its_end() {
    let watch = Watch::default();
    lazily(&watch, || {
        let session = tracing::info_span!("session");
        in_scope(&session, || {
            tracing::info!("one");
            tracing::warn!("two");
            assert_eq!(
                tracing::Span::current().metadata().map(|m| m.name()),
                Some("session")
            );
        });
        tracing::info!("after");
    });
    let seen = watch.0.lock().unwrap();
    assert_eq!(seen.entered, vec!["session"]);
    let session = Some("session".to_owned());
    assert_eq!(seen.events, vec![session.clone(), session, None]);
}

#[test]
fn a_span_made_inside_a_turn_is_the_turns_child() {
    let watch = Watch::default();
    lazily(&watch, || {
        let session = tracing::info_span!("session");
        in_scope(&session, || {
            let inner = tracing::info_span!("inner");
            inner.in_scope(|| tracing::info!("deep"));
        });
    });
    let seen = watch.0.lock().unwrap();
    assert!(seen
        .parents
        .contains(&("inner".to_owned(), Some("session".to_owned()))));
    assert_eq!(seen.events, vec![Some("inner".to_owned())]);
}

#[test]
fn a_turn_inside_a_turn_gives_the_outer_one_back() {
    let watch = Watch::default();
    lazily(&watch, || {
        let outer = tracing::info_span!("outer");
        let inner = tracing::info_span!("inner");
        in_scope(&outer, || {
            in_scope(&inner, || tracing::info!("in"));
            tracing::info!("out");
        });
    });
    let seen = watch.0.lock().unwrap();
    assert_eq!(
        seen.events,
        vec![Some("inner".to_owned()), Some("outer".to_owned())]
    );
}

#[test]
fn under_another_subscriber_a_turn_enters_its_span_at_once() {
    let watch = Watch::default();
    let subscriber = tracing_subscriber::registry().with(watch.clone());
    tracing::subscriber::with_default(subscriber, || {
        let session = tracing::info_span!("session");
        in_scope(&session, || 1 + 1);
    });
    assert_eq!(watch.0.lock().unwrap().entered, vec!["session"]);
}
