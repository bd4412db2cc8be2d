//! Where the proxy's logs go, and which: `RUST_LOG`, else
//! `resumeguard=info`. A filter of targets and levels alone (almost every
//! setting) is static: entering a session's span then takes no lock and
//! keeps no per-span state. Only a setting with span or field directives
//! (`[…]`) needs the full `EnvFilter`. The subscriber is wrapped in
//! [`LazyEnter`], so an event loop's turn enters its session's span only
//! when something in the turn logs.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use resumeguard::log_scope::LazyEnter;

use super::LogFormat;

/// The filter a `RUST_LOG` setting reads as.
#[derive(Debug)]
enum LogFilter {
    Static(Box<Targets>),
    Spans(Box<EnvFilter>),
}

/// Logs to stderr, as text lines or JSON objects.
pub fn init(format: LogFormat) {
    let (targets, spans) = match filter(std::env::var("RUST_LOG").ok().as_deref()) {
        LogFilter::Static(t) => (Some(*t), None),
        LogFilter::Spans(e) => (None, Some(*e)),
    };
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let filtered = tracing_subscriber::registry().with(targets).with(spans);
    match format {
        LogFormat::Text => {
            LazyEnter::new(filtered.with(logs.with_ansi(std::io::stderr().is_terminal()))).init()
        }
        LogFormat::Json => LazyEnter::new(filtered.with(logs.json())).init(),
    }
}

/// sqlparser logs the SQL it parses (literals included) at debug level,
/// so it stays at `warn` unless `RUST_LOG` names it.
fn filter(rust_log: Option<&str>) -> LogFilter {
    let spec = rust_log.unwrap_or("resumeguard=info");
    let spec = if spec.contains("sqlparser") {
        spec.to_owned()
    } else {
        format!("{spec},sqlparser=warn")
    };
    if !spec.contains('[') {
        if let Ok(targets) = Targets::from_str(&spec) {
            return LogFilter::Static(Box::new(targets));
        }
    }
    LogFilter::Spans(Box::new(
        EnvFilter::try_new(&spec)
            .unwrap_or_else(|_| EnvFilter::new("resumeguard=info,sqlparser=warn")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    fn targets(rust_log: Option<&str>) -> Targets {
        match filter(rust_log) {
            LogFilter::Static(t) => *t,
            other => panic!("{rust_log:?} read as {other:?}"),
        }
    }

    #[test]
    fn targets_and_levels_read_as_a_static_filter() {
        let default = targets(None);
        assert!(default.would_enable("resumeguard::wire", &Level::INFO));
        assert!(!default.would_enable("resumeguard::wire", &Level::DEBUG));
        assert!(!default.would_enable("sqlparser::parser", &Level::INFO));
        assert!(!default.would_enable("other", &Level::ERROR));
        let set = targets(Some("debug,resumeguard::claims=trace"));
        assert!(set.would_enable("resumeguard::claims::store", &Level::TRACE));
        assert!(set.would_enable("other", &Level::DEBUG));
        assert!(!set.would_enable("sqlparser::parser", &Level::INFO));
        assert!(targets(Some("sqlparser=debug")).would_enable("sqlparser", &Level::DEBUG));
    }

    #[test]
    fn span_directives_read_as_an_env_filter() {
        let spans = filter(Some("resumeguard[session{user=app}]=debug"));
        assert!(matches!(spans, LogFilter::Spans(_)), "{spans:?}");
    }
}
