//! A session's span, entered only when something inside it logs. The
//! event loop moves a session's bytes in many short turns, and entering
//! and leaving a span each turn costs the registry a lookup and two
//! atomic updates; almost no turn logs. Under [`LazyEnter`] a turn run in
//! [`in_scope`] marks its span as pending, and the span is entered the
//! first time an event, a new span or a lookup of the current span needs
//! it, then left when the turn ends. What gets logged carries the same
//! span as before.

use std::cell::Cell;
use std::num::NonZeroU64;

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Metadata, Span, Subscriber};
use tracing_core::span::Current;

thread_local! {
    /// The span of the turn running on this thread, and whether it has
    /// been entered.
    static PENDING: Cell<Option<(NonZeroU64, bool)>> = const { Cell::new(None) };
}

/// A subscriber that enters the pending span of an [`in_scope`] turn
/// before anything that would see it, and is otherwise `inner`.
pub struct LazyEnter {
    inner: Box<dyn Subscriber + Send + Sync>,
}

impl LazyEnter {
    pub fn new(inner: impl Subscriber + Send + Sync) -> Self {
        LazyEnter {
            inner: Box::new(inner),
        }
    }

    fn enter_pending(&self) {
        PENDING.with(|pending| {
            if let Some((id, false)) = pending.get() {
                pending.set(Some((id, true)));
                self.inner.enter(&Id::from_non_zero_u64(id));
            }
        });
    }
}

impl Subscriber for LazyEnter {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.inner.on_register_dispatch(subscriber)
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.inner.max_level_hint()
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.enter_pending();
        self.inner.new_span(span)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.inner.record(span, values)
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.inner.record_follows_from(span, follows)
    }

    fn event_enabled(&self, event: &Event<'_>) -> bool {
        self.inner.event_enabled(event)
    }

    fn event(&self, event: &Event<'_>) {
        self.enter_pending();
        self.inner.event(event)
    }

    fn enter(&self, span: &Id) {
        self.enter_pending();
        self.inner.enter(span)
    }

    fn exit(&self, span: &Id) {
        self.inner.exit(span)
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.inner.clone_span(id)
    }

    fn try_close(&self, id: Id) -> bool {
        self.inner.try_close(id)
    }

    fn current_span(&self) -> Current {
        self.enter_pending();
        self.inner.current_span()
    }
}

/// Runs `f` inside `span`: entered lazily under [`LazyEnter`], at once
/// under any other subscriber.
pub fn in_scope<R>(span: &Span, f: impl FnOnce() -> R) -> R {
    let Some(id) = span.id() else {
        return f();
    };
    if !tracing::dispatcher::get_default(|d| d.is::<LazyEnter>()) {
        return span.in_scope(f);
    }
    let outer = PENDING.with(|p| p.replace(Some((id.into_non_zero_u64(), false))));
    let _turn = Turn { outer };
    f()
}

/// Leaves the turn's span if it was entered, and restores the pending
/// span of the turn around it (also when `f` unwinds).
struct Turn {
    outer: Option<(NonZeroU64, bool)>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some((id, true)) = PENDING.with(|p| p.replace(self.outer)) {
            tracing::dispatcher::get_default(|d| d.exit(&Id::from_non_zero_u64(id)));
        }
    }
}

#[cfg(test)]
mod tests;
