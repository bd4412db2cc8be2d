//! The proxy's Prometheus metrics as `/metrics` serves them: the
//! recorder, the help text of every metric and its label sets known up
//! front (started at zero, so a scrape before the first event shows them),
//! and the values read at scrape time (connections, audit queue,
//! unknown-saver traffic, build and process). The events are counted where
//! they happen, through [`crate::metrics`]. Names follow the Prometheus
//! conventions: counters end in `_total`, gauges do not, no family is
//! both; each event is counted in one series of a family.
//! `docs/metrics.md` lists them all.

use std::fmt::Write as _;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, Unit};

mod process;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

use super::AdminError;
use crate::audit::{AuditSink, AuditStats};
use crate::metrics::{
    BLOBS_KEPT, CLAIMS, CLAIMS_AHEAD, CLAIMS_CONSUMED, CLAIMS_RECONNECTS, CLAIMS_STORE_SECONDS,
    CLAIM_WAITS, CLIENT_CONNECTIONS, CONNECTIONS_REFUSED, EVIDENCE_FLUSH_TIMEOUTS, EVIDENCE_LOST,
    EVIDENCE_PENDING, EVIDENCE_RETRIES, FENCED, FENCE_CHECKS, FENCE_LOOKUPS, FORKS_SERVED,
    KEEPALIVE_ERRORS, LATE_DUPLICATES, OWN_SCHEMA_REFUSED, REFUSED, RELAYED_SESSIONS,
    RUN_LEASE_UNCHECKED, SHARED_SESSIONS, STATEMENTS, STATEMENT_CLASSES, STATEMENT_SECONDS,
    TAKEOVERS, UPSTREAM_ERRORS, WRITES_REJECTED,
};
use crate::wire::proxy::Proxy;

/// 1, labelled with the running binary's version.
const BUILD_INFO: &str = "resumeguard_build_info";
/// Label sets known up front, started at zero by [`describe`].
const KNOWN: &[(&str, &str, &[&str])] = &[
    (
        CLAIMS,
        "outcome",
        &["taken", "takeover", "refused", "held_known"],
    ),
    (TAKEOVERS, "reason", &["lapsed", "abandoned"]),
    (
        CLAIMS_AHEAD,
        "result",
        &["used", "undecided", "unused", "withdrawn", "skipped"],
    ),
    (KEEPALIVE_ERRORS, "side", &["client", "upstream"]),
    (
        REFUSED,
        "reason",
        &[
            "answered",
            "in_flight",
            "run_in_progress",
            "store_unavailable",
            "shutting_down",
            "session_ended",
            "canceled",
            "client_encoding",
            "undecodable",
        ],
    ),
    (
        EVIDENCE_LOST,
        "reason",
        &["retry_queue_full", "queue_full", "worker_gone", "shutdown"],
    ),
    (
        FENCED,
        "reason",
        &[
            "superseded_holder",
            "other_proxy",
            "other_client",
            "store_unavailable",
        ],
    ),
    (
        FENCE_LOOKUPS,
        "outcome",
        &["unclaimed", "holder", "pool", "fenced", "failed"],
    ),
    (FENCE_CHECKS, "where", &["known", "in_transaction"]),
    (CLAIMS_RECONNECTS, "connection", &["decision", "liveness"]),
    (UPSTREAM_ERRORS, "kind", &["connect", "lost"]),
    (CONNECTIONS_REFUSED, "reason", &["max_client_conn"]),
    (
        RELAYED_SESSIONS,
        "relay",
        &["event_loop", "threads", "moved_to_threads"],
    ),
    (STATEMENTS, "class", STATEMENT_CLASSES),
];

/// Counters without labels, started at zero by [`describe`].
const UNLABELLED: &[&str] = &[
    CLIENT_CONNECTIONS,
    FORKS_SERVED,
    BLOBS_KEPT,
    WRITES_REJECTED,
    OWN_SCHEMA_REFUSED,
    CLAIM_WAITS,
    CLAIMS_CONSUMED,
    RUN_LEASE_UNCHECKED,
    EVIDENCE_RETRIES,
    EVIDENCE_FLUSH_TIMEOUTS,
    SHARED_SESSIONS,
];

/// Upper bounds of the latency buckets, in seconds: a checkpoint read is
/// ~0.5 ms, a parked read that waits for a claim up to seconds.
const LATENCY_BUCKETS: [f64; 15] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0,
];

/// Upper bounds of the claim store's buckets, in seconds: one loopback
/// round trip is ~0.1 ms; a store's statement timeout is 2 s.
const STORE_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0,
];

/// The recorder: counters and gauges as they are, the statement latency
/// and the claim store's as histograms.
pub fn recorder() -> Result<PrometheusRecorder, AdminError> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(STATEMENT_SECONDS.to_owned()),
            &LATENCY_BUCKETS,
        )
        .map_err(AdminError::Buckets)?
        .set_buckets_for_metric(
            Matcher::Full(CLAIMS_STORE_SECONDS.to_owned()),
            &STORE_BUCKETS,
        )
        .map_err(AdminError::Buckets)?
        .build_recorder())
}

/// Help texts, for the recorder in effect (global, or a test's local one).
pub fn describe() {
    describe_counter!(
        CLIENT_CONNECTIONS,
        "Client connections accepted (cancel requests included)"
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Client connections refused at startup, by reason (max_client_conn)"
    );
    describe_counter!(
        RELAYED_SESSIONS,
        "Sessions by where they relay (relay): begun on an event loop, begun on threads, \
         moved from a loop to threads before a call to the claim store"
    );
    describe_counter!(
        STATEMENTS,
        "Checkpoint statements completed, by the saver classification (class)"
    );
    describe_histogram!(
        STATEMENT_SECONDS,
        Unit::Seconds,
        "Checkpoint statements: client's Execute to the statement's completion, by class"
    );
    describe_histogram!(
        CLAIMS_STORE_SECONDS,
        Unit::Seconds,
        "Claim store calls on the data path, which a parked read's row or a checkpoint write \
         waits for, by op: claim (a parked head's claim, one attempt), run_lease (a running head's \
         lease check), fence_lookup (a write's check of the holder)"
    );
    describe_counter!(
        FORKS_SERVED,
        "Reads of a superseded checkpoint served without its recorded __resume__ writes"
    );
    describe_counter!(
        BLOBS_KEPT,
        "Blob writes that inserted no row: a blob with their key was stored already, and the checkpoint naming it reads that one"
    );
    describe_counter!(
        SHARED_SESSIONS,
        "Sessions whose application_name changed mid-session: one session carrying \
         several clients (a transaction pooler in front), whose claims cannot be held to one"
    );
    describe_counter!(
        WRITES_REJECTED,
        "Checkpoint writes refused by the validity gate (23514)"
    );
    describe_counter!(
        LATE_DUPLICATES,
        "Bare resumes whose __resume__ write reached the finished head of an answered \
         interrupt, by outcome: refused (55000), store_unavailable (58000, fail closed)"
    );
    describe_counter!(
        CLAIMS,
        "Reads of a thread's head decided by the consume-once gate, each counted once by \
         outcome: taken (a claim taken afresh), takeover (another holder's claim taken over), \
         refused, held_known (a holder's re-read of its own claim, answered without asking \
         the store)"
    );
    describe_counter!(
        TAKEOVERS,
        "Claims taken over, by reason: lapsed (its holder recorded no evidence of a run in \
         time), abandoned (the answering session closed before its run's next checkpoint)"
    );
    describe_counter!(
        CLAIM_WAITS,
        "Reads of a parked head that waited for another holder's claim before their decision"
    );
    describe_counter!(
        CLAIMS_CONSUMED,
        "Claims consumed by evidence of their run (the gated task's writes, a next checkpoint)"
    );
    describe_counter!(
        REFUSED,
        "Reads of a thread's head refused, by reason: answered (55000), in_flight (55006), \
         run_in_progress (55000, run lease), store_unavailable (58000), shutting_down (55006, \
         the proxy is draining), session_ended (08006, the server ended the reader's session \
         while it waited), canceled (57014, its client canceled it while it waited), \
         client_encoding (0A000, a converted client encoding and a key outside ASCII), \
         undecodable (0A000, the head's row does not decode)"
    );
    describe_counter!(
        RUN_LEASE_UNCHECKED,
        "Reads of a running head served without their run lease checked: the claim store \
         failed to answer it (each also an ERROR and a lease_unchecked audit record); a late \
         resume may then repeat a run"
    );
    describe_counter!(
        FENCED,
        "Writes continuing a claimed checkpoint refused because they came from a session other \
         than its holder (RGF01), by reason: superseded_holder, other_proxy, other_client; and \
         store_unavailable (58000, fail closed)"
    );
    describe_counter!(
        FENCE_LOOKUPS,
        "Claim store lookups made to fence writes continuing a checkpoint, by outcome: \
         unclaimed, holder, pool, fenced, failed"
    );
    describe_counter!(
        OWN_SCHEMA_REFUSED,
        "Client statements refused (42501) because they would change, lock or call into the \
         proxy's own schema, or put it on search_path"
    );
    describe_counter!(
        FENCE_CHECKS,
        "Writes continuing a checkpoint fenced without a claim store lookup, by where: known \
         (the session created the checkpoint in its run), in_transaction (checked by the \
         server inside the write's transaction, same round trip)"
    );
    describe_counter!(
        EVIDENCE_RETRIES,
        "Claim evidence (holder gone, consumed, progress, moved on) retried because the claim \
         store could not take it (row locked, store down)"
    );
    describe_counter!(
        CLAIMS_RECONNECTS,
        "PostgreSQL claims store connections found ended by the server (an idle-session \
         reaper, idle_session_timeout) and replaced, by connection: decision (the decision \
         it was found by ran again at once), liveness (the lock taken again)"
    );
    describe_gauge!(EVIDENCE_PENDING, "Claim evidence waiting for a retry");
    describe_counter!(
        EVIDENCE_LOST,
        "Claim evidence never applied (each also audited as evidence_lost), by reason: \
         retry_queue_full, queue_full, worker_gone, shutdown, unknown_savepoint (a ROLLBACK \
         TO a savepoint the session was not seen to set)"
    );
    describe_counter!(
        CLAIMS_AHEAD,
        "Claims asked beside a read of a head this proxy expected parked, by result: used \
         (its answer decided the read), undecided (asked again after the read), unused (the \
         read returned another head, none, or failed), withdrawn (of those, a claim taken \
         ahead and deleted), skipped (too many in flight: asked after the read)"
    );
    describe_counter!(
        KEEPALIVE_ERRORS,
        "Data-path sockets that refused the TCP keepalive or user-timeout options, by side: \
         client, upstream (a silent peer of that session is not noticed within the bound)"
    );
    describe_counter!(
        EVIDENCE_FLUSH_TIMEOUTS,
        "Late-duplicate checks that waited for this proxy's claim evidence to reach the store \
         and went on without it (each also a WARN)"
    );
    describe_counter!(
        UPSTREAM_ERRORS,
        "Upstream failures: connect (no connection, or it failed during startup), lost (the \
         server ended a started session the client had not closed)"
    );
    for name in UNLABELLED {
        counter!(*name).increment(0);
    }
    for (name, label, values) in KNOWN {
        for value in *values {
            counter!(*name, *label => *value).increment(0);
        }
    }
}

/// Appends one unlabelled metric, its help and type, in the exposition
/// format.
fn sample(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
    );
}

/// Values the process keeps anyway, read when `/metrics` is scraped, in
/// the exposition format (appended to the recorder's output).
pub fn scrape_time(proxy: &Proxy, audit: &AuditSink) -> String {
    let stats = audit.stats();
    let mut out = format!(
        "# HELP {BUILD_INFO} Always 1; the running binary's version is its label\n\
         # TYPE {BUILD_INFO} gauge\n{BUILD_INFO}{{version=\"{}\"}} 1\n\n",
        env!("CARGO_PKG_VERSION")
    );
    let mut put =
        |name: &str, kind: &str, help: &str, value: u64| sample(&mut out, name, kind, help, value);
    put(
        "resumeguard_client_connections_open",
        "gauge",
        "Client connections open now (startup included): what max_client_conn limits",
        proxy.sessions.live() as u64,
    );
    put(
        "resumeguard_unknown_saver_statements_total",
        "counter",
        "Checkpoint-table statements no saver profile recognizes (logged once per shape)",
        crate::saver::unknown::unknown_total(),
    );
    put(
        "resumeguard_audit_queue_depth",
        "gauge",
        "Audit events queued for the writer threads, summed over the outputs \
         (an event waiting for two outputs counts twice)",
        stats.queue_depth(),
    );
    put(
        "resumeguard_audit_events_dropped_total",
        "counter",
        "Audit events lost by the output that lost the most (queue full, \
         given up after failed writes, or left at shutdown)",
        audit.dropped_total(),
    );
    put(
        "resumeguard_audit_write_errors_total",
        "counter",
        "Failed audit write attempts, over all outputs",
        stats.write_errors,
    );
    process::render(&mut out);
    let outputs = audit.output_stats();
    if !outputs.is_empty() {
        for (name, kind, help, value) in [
            (
                "resumeguard_audit_output_queue_depth",
                "gauge",
                "Audit events queued for one output's writer thread",
                AuditStats::queue_depth as fn(&AuditStats) -> u64,
            ),
            (
                "resumeguard_audit_output_events_lost_total",
                "counter",
                "Audit events one output lost (its queue full, given up after failed \
                 writes, or left at shutdown)",
                |s| s.lost,
            ),
            (
                "resumeguard_audit_output_write_errors_total",
                "counter",
                "Failed audit write attempts of one output",
                |s| s.write_errors,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (output, s) in &outputs {
                let _ = writeln!(out, "{name}{{output=\"{output}\"}} {}", value(s));
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests;
