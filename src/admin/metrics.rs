//! The proxy's Prometheus metrics: the recorder behind `/metrics`, the
//! help text of every metric, the counters whose labels depend on a
//! decision (called where the decision is made), and the values read at
//! scrape time (connections, audit queue, unknown-saver traffic).
//!
//! Without a recorder installed (`--admin-listen off`, the CLI commands,
//! tests) every counter call is a no-op.

use std::fmt::Write as _;
use std::time::Instant;

use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

use super::AdminError;
use crate::audit::{AuditSink, AuditStats};
use crate::policy::claims::{Accepted, FenceReason, Refusal, WriteVerdict, TAKEOVER_LAPSED};
use crate::saver::classify::StatementKind;
use crate::wire::proxy::Proxy;

/// Checkpoint statements completed, by the saver classification's label.
pub const STATEMENTS: &str = "resumeguard_checkpoint_statements_total";
/// Time from the client's Execute to the statement's completion.
pub const STATEMENT_SECONDS: &str = "resumeguard_checkpoint_statement_seconds";
/// Time a claim store call on the data path took (a parked read's row, a
/// write's fence check wait for it).
pub const CLAIMS_STORE_SECONDS: &str = "resumeguard_claims_store_seconds";

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
        "resumeguard_client_connections_total",
        "Client connections accepted (cancel requests included)"
    );
    describe_counter!(
        "resumeguard_client_connections_refused_total",
        "Client connections refused at startup, by reason (max_client_conn)"
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
        "resumeguard_forks_served_total",
        "Reads of a superseded checkpoint served without its recorded __resume__ writes"
    );
    describe_counter!(
        "resumeguard_writes_rejected_total",
        "Checkpoint writes refused by the validity gate (23514)"
    );
    describe_counter!(
        "resumeguard_late_duplicates_total",
        "Bare resumes whose __resume__ write reached the finished head of an answered \
         interrupt, by outcome: refused (55000), store_unavailable (58000, fail closed)"
    );
    describe_counter!(
        "resumeguard_claims_total",
        "Consume-once claim outcomes: taken, takeover, lapsed (a takeover of a lapsed claim), \
         waited, refused, consumed"
    );
    describe_counter!(
        "resumeguard_claims_refused_total",
        "Reads of a thread's head refused, by reason: answered (55000), in_flight (55006), \
         run_in_progress (55000, run lease), store_unavailable (58000)"
    );
    describe_counter!(
        "resumeguard_writes_fenced_total",
        "Writes continuing a claimed checkpoint refused because they came from a session other \
         than its holder (RGF01), by reason: superseded_holder, other_proxy, other_client; and \
         store_unavailable (58000, fail closed)"
    );
    describe_counter!(
        "resumeguard_fence_lookups_total",
        "Claim store lookups made to fence writes continuing a checkpoint, by outcome: \
         unclaimed, holder, pool, fenced, failed"
    );
    describe_counter!(
        "resumeguard_own_schema_refused_total",
        "Client statements refused (42501) because they would change, lock or call into the \
         proxy's own schema, or put it on search_path"
    );
    describe_counter!(
        "resumeguard_fence_checks_total",
        "Writes continuing a checkpoint fenced without a claim store lookup, by where: known \
         (the session created the checkpoint in its run), in_transaction (checked by the \
         server inside the write's transaction, same round trip)"
    );
    describe_counter!(
        "resumeguard_upstream_errors_total",
        "Upstream failures: connect (no connection, or it failed during startup), lost (the \
         server ended a started session the client had not closed)"
    );
}

/// A checkpoint statement completed: counted by class and, when it was
/// executed (not a Describe), timed. Labels are static: no allocation.
pub fn statement_completed(kind: &StatementKind, executed_at: Option<Instant>) {
    let Some(at) = executed_at else { return };
    let seconds = at.elapsed().as_secs_f64();
    macro_rules! class {
        ($label:literal) => {{
            counter!(STATEMENTS, "class" => $label).increment(1);
            histogram!(STATEMENT_SECONDS, "class" => $label).record(seconds);
        }};
    }
    match kind.label() {
        "read_latest" => class!("read_latest"),
        "read_by_id" => class!("read_by_id"),
        "read_list" => class!("read_list"),
        "writes_read" => class!("writes_read"),
        "blob_upsert" => class!("blob_upsert"),
        "checkpoint_upsert" => class!("checkpoint_upsert"),
        "writes_upsert" => class!("writes_upsert"),
        "writes_insert_ignore" => class!("writes_insert_ignore"),
        "delete_thread" => class!("delete_thread"),
        "delete_threads" => class!("delete_threads"),
        "delete_namespaces" => class!("delete_namespaces"),
        "delete_listed_checkpoints" => class!("delete_listed_checkpoints"),
        "delete_all_but_kept" => class!("delete_all_but_kept"),
        "delete_blob_versions" => class!("delete_blob_versions"),
        "unparent" => class!("unparent"),
        "read_without_writes" => class!("read_without_writes"),
        "channel_history_read" => class!("channel_history_read"),
        "migration" => class!("migration"),
        "unrecognized" => class!("unrecognized"),
        _ => class!("other"),
    }
}

/// Runs `call`, a claim store call on the data path, and times it; `op`
/// is `claim`, `run_lease` or `fence_lookup`.
pub fn claims_store_call<T>(op: &'static str, call: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = call();
    histogram!(CLAIMS_STORE_SECONDS, "op" => op).record(started.elapsed().as_secs_f64());
    out
}

/// Forks served by one completed read.
pub fn forks_served(n: usize) {
    if n > 0 {
        counter!("resumeguard_forks_served_total").increment(n as u64);
    }
}

/// A read of a parked head was served its claim: taken afresh, or taken
/// over (`why`: the takeover's reason; a lapsed claim also counts as
/// lapsed).
pub fn claim_served(takeover: bool, why: Option<&str>) {
    if !takeover {
        counter!("resumeguard_claims_total", "outcome" => "taken").increment(1);
        return;
    }
    counter!("resumeguard_claims_total", "outcome" => "takeover").increment(1);
    if why == Some(TAKEOVER_LAPSED) {
        counter!("resumeguard_claims_total", "outcome" => "lapsed").increment(1);
    }
}

/// A read of a thread's head was refused.
pub fn claim_refused(reason: &Refusal) {
    counter!("resumeguard_claims_total", "outcome" => "refused").increment(1);
    match reason {
        Refusal::Answered { .. } => {
            counter!("resumeguard_claims_refused_total", "reason" => "answered").increment(1)
        }
        Refusal::InFlight { .. } => {
            counter!("resumeguard_claims_refused_total", "reason" => "in_flight").increment(1)
        }
        Refusal::RunInProgress { .. } => {
            counter!("resumeguard_claims_refused_total", "reason" => "run_in_progress").increment(1)
        }
        Refusal::StoreUnavailable(_) => {
            counter!("resumeguard_claims_refused_total", "reason" => "store_unavailable")
                .increment(1)
        }
    }
}

/// A bare resume's write onto a finished head of a thread was refused:
/// `refused` (its interrupt was answered before) or `store_unavailable`.
pub fn late_duplicate(outcome: &'static str) {
    counter!("resumeguard_late_duplicates_total", "outcome" => outcome).increment(1);
}

/// A write continuing a checkpoint that needed no question to the claim
/// store: `known` (the session created the checkpoint in its run, so no
/// claim can be on it) or `in_transaction` (the server checks it inside
/// the write's own transaction, in the same round trip).
pub fn fence_check(place: &'static str) {
    counter!("resumeguard_fence_checks_total", "where" => place).increment(1);
}

/// A write the server fenced inside its transaction, by the reason it
/// gave (superseded_holder, other_proxy, other_client).
pub fn fenced_in_transaction(reason: &str) {
    let reason = match reason {
        "superseded_holder" => "superseded_holder",
        "other_proxy" => "other_proxy",
        _ => "other_client",
    };
    counter!("resumeguard_writes_fenced_total", "reason" => reason).increment(1);
}

/// A write continuing a checkpoint got `verdict` from one store lookup
/// (`cached`: decided earlier in the same transaction, no lookup).
pub fn write_fence(verdict: &WriteVerdict, cached: bool) {
    let outcome = match verdict {
        WriteVerdict::Accept(Accepted::Unclaimed) => "unclaimed",
        WriteVerdict::Accept(Accepted::Holder) => "holder",
        WriteVerdict::Accept(Accepted::Pool) => "pool",
        WriteVerdict::Accept(Accepted::Unknown) | WriteVerdict::StoreUnavailable(_) => "failed",
        WriteVerdict::Fenced { .. } => "fenced",
    };
    if !cached {
        counter!("resumeguard_fence_lookups_total", "outcome" => outcome).increment(1);
    }
    match verdict {
        WriteVerdict::Fenced { reason, .. } => match reason {
            FenceReason::Superseded { .. } => {
                counter!("resumeguard_writes_fenced_total", "reason" => "superseded_holder")
                    .increment(1)
            }
            FenceReason::OtherProxy => {
                counter!("resumeguard_writes_fenced_total", "reason" => "other_proxy").increment(1)
            }
            FenceReason::OtherClient => {
                counter!("resumeguard_writes_fenced_total", "reason" => "other_client").increment(1)
            }
        },
        WriteVerdict::StoreUnavailable(_) => {
            counter!("resumeguard_writes_fenced_total", "reason" => "store_unavailable")
                .increment(1)
        }
        WriteVerdict::Accept(_) => {}
    }
}

/// Values the process keeps anyway, read when `/metrics` is scraped, in
/// the exposition format (appended to the recorder's output).
pub fn scrape_time(proxy: &Proxy, audit: &AuditSink) -> String {
    let stats = audit.stats();
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
        );
    };
    put(
        "resumeguard_client_connections",
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
