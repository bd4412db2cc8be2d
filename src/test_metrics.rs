//! What the proxy counts while a test runs a step, as `/metrics` renders
//! it: tests of where the guard must count that it stopped guarding read
//! it. Only the calling thread's counts are recorded.

use metrics::with_local_recorder;
use metrics_exporter_prometheus::PrometheusBuilder;

/// The metrics `step` records on this thread, in the exposition format.
pub fn recorded<T>(step: impl FnOnce() -> T) -> (T, String) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let out = with_local_recorder(&recorder, step);
    (out, recorder.handle().render())
}

/// Whether the rendered `body` has `line` (a series and its value).
pub fn has_line(body: &str, line: &str) -> bool {
    body.lines().any(|l| l == line)
}
