//! Telling a transaction pooler (PgBouncer, Supavisor, Neon's `-pooler`
//! endpoints in transaction mode) from PostgreSQL itself, at start: the
//! claims store's liveness is a session-level advisory lock and its
//! decisions are cached prepared statements, and neither survives a pooler
//! that hands each transaction to whichever server connection is free.
//!
//! The probe opens two connections. The first takes a session advisory
//! lock (a key of its own, in the two-integer key space the instance locks
//! do not use) and reads its backend's pid; the second opens a transaction
//! and, inside it, reads its backend's pid and tries the same key; then the
//! first reads its pid again while that transaction is still open.
//! Straight to PostgreSQL each connection is one backend for its life: the
//! second cannot be the first's backend nor take its lock, and the first
//! keeps its pid. Behind a transaction pooler the first's backend went back
//! to the pool after its statement, so the second is handed it (it then
//! reports the same pid and takes the lock its own session never asked
//! for), or the first's next statement runs on another backend. Any of the
//! three is proof; none can happen without a pooler. Simple-protocol
//! queries only, so the probe itself needs no prepared statement to
//! survive.

use std::time::{SystemTime, UNIX_EPOCH};

use postgres::{Client, SimpleQueryMessage};

use crate::pg::connect::connect;
use crate::pg::PgTarget;

/// The first half of the probe's two-integer advisory key ("rg").
const PROBE_CLASS: i32 = 0x7267;

/// Rounds of the probe before a target counts as PostgreSQL itself.
const ROUNDS: i32 = 3;

/// A claims target that hands transactions, not sessions, to its clients.
#[derive(Debug, thiserror::Error)]
#[error(
    "claims database {shown} is behind a transaction pooler ({evidence}): the claims \
     store's liveness lock and prepared statements need a session of their own; point \
     `[claims] dsn` (RESUMEGUARD_CLAIMS_DSN) at PostgreSQL itself, not at the pooler \
     (docs/poolers.md)"
)]
pub struct TransactionPooler {
    pub shown: String,
    /// What the probe saw.
    pub evidence: String,
}

/// What the probe found.
#[derive(Debug)]
pub enum Probe {
    /// Each connection is a session of its own: PostgreSQL, or a pooler in
    /// session mode.
    Sessions,
    /// A transaction pooler, and what showed it.
    TransactionPooler(String),
    /// The probe could not run (unreachable, authentication, ...): the
    /// store's own connecting says why.
    NotRun(String),
}

/// Probes `target`; refuses it when it is a transaction pooler. A probe
/// that could not run is logged and lets the store start (it reports the
/// same cause, fail closed, and retries).
pub fn refuse_transaction_pooler(target: &PgTarget) -> Result<(), TransactionPooler> {
    match probe(target) {
        Probe::Sessions => Ok(()),
        Probe::TransactionPooler(evidence) => Err(TransactionPooler {
            shown: target.shown().to_owned(),
            evidence,
        }),
        Probe::NotRun(why) => {
            tracing::warn!(
                at = %target.shown(),
                error = %why,
                "claims database: could not check for a transaction pooler at start"
            );
            Ok(())
        }
    }
}

/// Runs the probe on two fresh connections to `target`, a few rounds.
pub fn probe(target: &PgTarget) -> Probe {
    let mut config = target.config().clone();
    config.application_name("resumeguard-pooler-probe");
    let key = probe_key();
    let mut first = match connect(&config, target) {
        Ok(c) => c,
        Err(e) => return Probe::NotRun(crate::error_chain::chain(&e).to_string()),
    };
    let mut second = match connect(&config, target) {
        Ok(c) => c,
        Err(e) => return Probe::NotRun(crate::error_chain::chain(&e).to_string()),
    };
    // A busy pooler may lend the first's backend to a third client in
    // between: a few rounds, each with a key of its own.
    let mut found = Ok(None);
    for round in 0..ROUNDS {
        let key = key.wrapping_add(round) & 0x7fff_ffff;
        found = sessions_or_pooler(&mut first, &mut second, key);
        // Best effort: behind a pooler the unlock may land on another
        // backend; the key is this probe's own and nothing waits for it.
        let _ = first.simple_query(&format!("SELECT pg_advisory_unlock({PROBE_CLASS}, {key})"));
        if !matches!(found, Ok(None)) {
            break;
        }
    }
    match found {
        Ok(None) => Probe::Sessions,
        Ok(Some(evidence)) => Probe::TransactionPooler(evidence),
        Err(e) => {
            let text = crate::error_chain::chain(&e).to_string();
            // PgBouncer in statement mode refuses the second's transaction.
            if text.contains("pooling mode") {
                Probe::TransactionPooler(text)
            } else {
                Probe::NotRun(text)
            }
        }
    }
}

/// `None`: every connection kept its own backend; else what showed a pooler.
fn sessions_or_pooler(
    first: &mut Client,
    second: &mut Client,
    key: i32,
) -> Result<Option<String>, postgres::Error> {
    let lock = format!("SELECT pg_backend_pid(), pg_try_advisory_lock({PROBE_CLASS}, {key})");
    let (first_pid, first_locked) = pid_and_flag(first, &lock)?;
    if first_locked != Some(true) {
        // Another process holds this probe's key: nothing can be told.
        return Ok(None);
    }
    let mut open = second.transaction()?;
    let try_xact =
        format!("SELECT pg_backend_pid(), pg_try_advisory_xact_lock({PROBE_CLASS}, {key})");
    let (second_pid, second_locked) = pid_and_flag(&mut open, &try_xact)?;
    let second_took_it = second_locked == Some(true);
    // Already shown: the first is not asked again (behind a pooler of one
    // server connection it would wait for the transaction holding it).
    if let Some(evidence) = verdict(first_pid, second_pid, second_took_it, first_pid) {
        open.rollback()?;
        return Ok(Some(evidence));
    }
    let (first_again, _) = pid_and_flag(first, "SELECT pg_backend_pid(), true")?;
    open.rollback()?;
    Ok(verdict(first_pid, second_pid, second_took_it, first_again))
}

/// The probe's reading of the pids and the lock (see the file's doc).
fn verdict(
    first_pid: Option<i64>,
    second_pid: Option<i64>,
    second_took_the_lock: bool,
    first_again: Option<i64>,
) -> Option<String> {
    let shown = |p: Option<i64>| p.map_or_else(|| "?".to_owned(), |p| p.to_string());
    if second_pid.is_some() && second_pid == first_pid {
        return Some(format!(
            "a second connection was handed the first one's backend (pid {})",
            shown(first_pid)
        ));
    }
    if second_took_the_lock {
        return Some(
            "a second connection took the session advisory lock the first one holds".to_owned(),
        );
    }
    if first_again != first_pid {
        return Some(format!(
            "one connection's statements ran on backends {} and {}",
            shown(first_pid),
            shown(first_again)
        ));
    }
    None
}

/// The first row's two columns: a pid and a boolean.
fn pid_and_flag(
    client: &mut impl postgres::GenericClient,
    sql: &str,
) -> Result<(Option<i64>, Option<bool>), postgres::Error> {
    for message in client.simple_query(sql)? {
        if let SimpleQueryMessage::Row(row) = message {
            let pid = row.get(0).and_then(|p| p.parse().ok());
            let flag = row.get(1).map(|f| f == "t");
            return Ok((pid, flag));
        }
    }
    Ok((None, None))
}

/// A key unlikely to meet another probe's (process id and clock).
fn probe_key() -> i32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
    (mixed & 0x7fff_ffff) as i32
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn one_backend_per_connection_is_no_pooler() {
        assert_eq!(verdict(Some(10), Some(11), false, Some(10)), None);
    }

    #[test]
    fn each_sign_of_a_transaction_pooler_is_named() {
        let same = verdict(Some(10), Some(10), true, Some(11)).unwrap_or_default();
        assert!(
            same.contains("handed the first one's backend (pid 10)"),
            "{same}"
        );
        let lock = verdict(Some(10), Some(11), true, Some(10)).unwrap_or_default();
        assert!(lock.contains("took the session advisory lock"), "{lock}");
        let moved = verdict(Some(10), Some(11), false, Some(12)).unwrap_or_default();
        assert!(moved.contains("backends 10 and 12"), "{moved}");
    }
}
