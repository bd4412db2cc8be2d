//! The proxy's metric names and the functions that count its events, where
//! the events happen (the data path, the claim store, the evidence worker).
//! A leaf: it takes plain labels, so the layers that count need not know
//! the admin API that serves `/metrics` (`admin::metrics`: the recorder,
//! the help texts, the values read at scrape time). Each label a caller
//! passes is mapped beside the type it names (e.g.
//! `policy::claims::Refusal::metric_label`).
//!
//! Without a recorder installed (`--admin-listen off`, the CLI commands,
//! tests) every call is a no-op.

use std::time::Instant;

use ::metrics::{counter, histogram};

/// Checkpoint statements completed, by the saver classification's label.
pub const STATEMENTS: &str = "resumeguard_checkpoint_statements_total";
/// Time from the client's Execute to the statement's completion.
pub const STATEMENT_SECONDS: &str = "resumeguard_checkpoint_statement_seconds";
/// Time a claim store call on the data path took (a parked read's row, a
/// write's fence check wait for it).
pub const CLAIMS_STORE_SECONDS: &str = "resumeguard_claims_store_seconds";
/// Reads of a thread's head decided by the consume-once gate, by outcome.
pub const CLAIMS: &str = "resumeguard_claims_total";
/// Served reads that took over another holder's claim, by why.
pub const TAKEOVERS: &str = "resumeguard_claim_takeovers_total";
pub const REFUSED: &str = "resumeguard_claims_refused_total";
pub const FENCED: &str = "resumeguard_writes_fenced_total";
pub const FENCE_LOOKUPS: &str = "resumeguard_fence_lookups_total";
pub const FENCE_CHECKS: &str = "resumeguard_fence_checks_total";
pub const UPSTREAM_ERRORS: &str = "resumeguard_upstream_errors_total";
pub const CONNECTIONS_REFUSED: &str = "resumeguard_client_connections_refused_total";
/// Reads of a running head served without their run lease checked, the
/// claim store having failed to answer it.
pub const RUN_LEASE_UNCHECKED: &str = "resumeguard_run_lease_unchecked_total";
/// Connections of the PostgreSQL claims store replaced after the server
/// ended them, by which (`claims::postgres::conn` counts them).
pub const CLAIMS_RECONNECTS: &str = "resumeguard_claims_reconnects_total";
/// Client connections accepted (cancel requests included).
pub const CLIENT_CONNECTIONS: &str = "resumeguard_client_connections_total";
/// Sessions by where they relay: begun on an event loop, begun on threads
/// of their own, or moved from a loop to threads before a store call.
pub const RELAYED_SESSIONS: &str = "resumeguard_relayed_sessions_total";
/// Reads of a superseded checkpoint served without its recorded
/// `__resume__` writes.
pub const FORKS_SERVED: &str = "resumeguard_forks_served_total";
/// Blob writes the server answered `INSERT 0 0`: a blob with their key was
/// stored already, and the checkpoint naming it reads that one.
pub const BLOBS_KEPT: &str = "resumeguard_blobs_kept_total";
/// Checkpoint writes refused by the validity gate (23514).
pub const WRITES_REJECTED: &str = "resumeguard_writes_rejected_total";
/// Client statements refused (42501) for changing, locking or calling
/// into the proxy's own schema.
pub const OWN_SCHEMA_REFUSED: &str = "resumeguard_own_schema_refused_total";
/// Reads of a parked head that waited for another holder's claim.
pub const CLAIM_WAITS: &str = "resumeguard_claim_waits_total";
/// Claims consumed by evidence of their run.
pub const CLAIMS_CONSUMED: &str = "resumeguard_claims_consumed_total";
/// Bare resumes that reached an answered interrupt's finished head, by
/// outcome.
pub const LATE_DUPLICATES: &str = "resumeguard_late_duplicates_total";
/// Claims asked beside a read of a head expected parked, by what became
/// of the answer.
pub const CLAIMS_AHEAD: &str = "resumeguard_claims_ahead_total";
/// Sessions whose `application_name` changed mid-session: several
/// clients on one session (a transaction pooler in front).
pub const SHARED_SESSIONS: &str = "resumeguard_shared_sessions_total";
/// Data-path sockets that refused the keepalive or user-timeout
/// options, by side.
pub const KEEPALIVE_ERRORS: &str = "resumeguard_keepalive_errors_total";
/// Claim evidence waiting for a retry.
pub const EVIDENCE_PENDING: &str = "resumeguard_evidence_pending";
/// Claim evidence retried because the store could not take it.
pub const EVIDENCE_RETRIES: &str = "resumeguard_evidence_retries_total";
/// Claim evidence never applied, by reason.
pub const EVIDENCE_LOST: &str = "resumeguard_evidence_lost_total";
/// Late-duplicate checks that went on without this proxy's evidence
/// after waiting for it to reach the store.
pub const EVIDENCE_FLUSH_TIMEOUTS: &str = "resumeguard_evidence_flush_timeouts_total";

/// The saver classification's labels of [`STATEMENTS`] (and
/// [`STATEMENT_SECONDS`]); any other is counted as `other`.
pub const STATEMENT_CLASSES: &[&str] = &[
    "read_latest",
    "read_by_id",
    "read_list",
    "writes_read",
    "blob_upsert",
    "checkpoint_upsert",
    "writes_upsert",
    "writes_insert_ignore",
    "delete_thread",
    "delete_threads",
    "delete_namespaces",
    "delete_listed_checkpoints",
    "delete_all_but_kept",
    "delete_blob_versions",
    "unparent",
    "read_without_writes",
    "channel_history_read",
    "migration",
    "unrecognized",
    "other",
];

/// A checkpoint statement of the saver classification `label` completed:
/// counted by class and, when it was executed (not a Describe), timed.
/// Labels are static: no allocation.
pub fn statement_completed(label: &str, executed_at: Option<Instant>) {
    let Some(at) = executed_at else { return };
    let seconds = at.elapsed().as_secs_f64();
    let class = STATEMENT_CLASSES
        .iter()
        .copied()
        .find(|c| *c == label)
        .unwrap_or("other");
    counter!(STATEMENTS, "class" => class).increment(1);
    histogram!(STATEMENT_SECONDS, "class" => class).record(seconds);
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
        counter!(FORKS_SERVED).increment(n as u64);
    }
}

/// A blob write kept the blob stored under its key.
pub fn blob_kept() {
    counter!(BLOBS_KEPT).increment(1);
}

/// A read of a parked head was served its claim: taken afresh (`None`),
/// or taken over (the takeover's reason label, `lapsed` or `abandoned`).
pub fn claim_served(takeover: Option<&'static str>) {
    let Some(reason) = takeover else {
        counter!(CLAIMS, "outcome" => "taken").increment(1);
        return;
    };
    counter!(CLAIMS, "outcome" => "takeover").increment(1);
    counter!(TAKEOVERS, "reason" => reason).increment(1);
}

/// A read of a parked head waited for another holder's claim (it is
/// counted again by its decision).
pub fn claim_waited() {
    counter!(CLAIM_WAITS).increment(1);
}

/// A read of a running head was served without its run lease checked:
/// the claim store failed to answer it.
pub fn run_lease_unchecked() {
    counter!(RUN_LEASE_UNCHECKED).increment(1);
}

/// A connection of the PostgreSQL claims store (`decision`, `liveness`)
/// the server ended was replaced.
pub fn claims_reconnected(connection: &'static str) {
    counter!(CLAIMS_RECONNECTS, "connection" => connection).increment(1);
}

/// Claims consumed by evidence of their run.
pub fn claims_consumed(n: usize) {
    counter!(CLAIMS_CONSUMED).increment(n as u64);
}

/// A read of a thread's head was refused, for the refusal's `reason`
/// label.
pub fn claim_refused(reason: &'static str) {
    counter!(CLAIMS, "outcome" => "refused").increment(1);
    counter!(REFUSED, "reason" => reason).increment(1);
}

/// A bare resume's write onto a finished head of a thread was refused:
/// `refused` (its interrupt was answered before) or `store_unavailable`.
pub fn late_duplicate(outcome: &'static str) {
    counter!(LATE_DUPLICATES, "outcome" => outcome).increment(1);
}

/// A write continuing a checkpoint that needed no question to the claim
/// store: `known` (the session created the checkpoint in its run, so no
/// claim can be on it) or `in_transaction` (the server checks it inside
/// the write's own transaction, in the same round trip).
pub fn fence_check(place: &'static str) {
    counter!(FENCE_CHECKS, "where" => place).increment(1);
}

/// A write the server fenced inside its transaction, by the reason it
/// gave (superseded_holder, other_proxy, other_client).
pub fn fenced_in_transaction(reason: &str) {
    let reason = match reason {
        "superseded_holder" => "superseded_holder",
        "other_proxy" => "other_proxy",
        _ => "other_client",
    };
    counter!(FENCED, "reason" => reason).increment(1);
}

/// A write continuing a checkpoint refused before any lookup, because
/// none could be made for it: `client_encoding` (the server converts the
/// session's encoding and the key holds characters outside ASCII).
pub fn fenced_unchecked(reason: &'static str) {
    counter!(FENCED, "reason" => reason).increment(1);
}

/// A write continuing a checkpoint was decided by one store lookup with
/// outcome `lookup` (`cached`: decided earlier in the same transaction,
/// no lookup), and refused for `fenced` when it was.
pub fn write_fence(lookup: &'static str, fenced: Option<&'static str>, cached: bool) {
    if !cached {
        counter!(FENCE_LOOKUPS, "outcome" => lookup).increment(1);
    }
    if let Some(reason) = fenced {
        counter!(FENCED, "reason" => reason).increment(1);
    }
}
