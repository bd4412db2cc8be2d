//! Rows of the `claims` table: the column list, the key and checkpoint
//! filters, and the mapping between a row and a [`ClaimRecord`], shared by
//! every operation of the store.

use rusqlite::{OptionalExtension, Row, ToSql, Transaction};

use super::model::{ClaimKey, ClaimRecord, ClaimState, Holder};
use crate::saver::checkpoint_ref::CheckpointRef;

pub(super) const COLUMNS: &str = "thread_id, checkpoint_ns, checkpoint_id, fingerprint, state, \
    proxy_id, session_id, client_addr, application_name, claimed_at_ms, lapse_at_ms, \
    consumed_at_ms, evidence, refusals, takeovers, superseded_at_ms, abandon_at_ms, epoch";

pub(super) const KEY_MATCH: &str =
    "thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3 AND fingerprint = ?4";

pub(super) const CHECKPOINT_MATCH: &str =
    "thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3";

pub(super) fn key_params(key: &ClaimKey) -> [&dyn ToSql; 4] {
    [
        &key.at.thread_id,
        &key.at.checkpoint_ns,
        &key.at.checkpoint_id,
        &key.fingerprint,
    ]
}

pub(super) fn select_key(
    tx: &Transaction<'_>,
    key: &ClaimKey,
) -> rusqlite::Result<Option<ClaimRecord>> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM claims WHERE {KEY_MATCH}"))?
        .query_row(key_params(key).as_slice(), record)
        .optional()
}

pub(super) fn select_where(
    tx: &Transaction<'_>,
    filter: &str,
    args: &[&dyn ToSql],
) -> rusqlite::Result<Vec<ClaimRecord>> {
    tx.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM claims WHERE {filter} \
         ORDER BY thread_id, checkpoint_ns, claimed_at_ms, checkpoint_id, fingerprint"
    ))?
    .query_map(args, record)?
    .collect()
}

/// The four holder columns (proxy_id, session_id, client_addr,
/// application_name) starting at column `first`.
pub(super) fn holder_at(r: &Row<'_>, first: usize) -> rusqlite::Result<Holder> {
    Ok(Holder {
        proxy_id: r.get(first)?,
        // Stored as the same 64 bits in SQLite's signed INTEGER.
        session_id: r.get::<_, i64>(first + 1)? as u64,
        client_addr: r.get(first + 2)?,
        application_name: r.get(first + 3)?,
    })
}

/// A row selected with [`COLUMNS`].
fn record(r: &Row<'_>) -> rusqlite::Result<ClaimRecord> {
    let state: String = r.get(4)?;
    let state = ClaimState::parse(&state).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            format!("unknown claim state {state:?}").into(),
        )
    })?;
    Ok(ClaimRecord {
        key: ClaimKey {
            at: CheckpointRef {
                thread_id: r.get(0)?,
                checkpoint_ns: r.get(1)?,
                checkpoint_id: r.get(2)?,
            },
            fingerprint: r.get(3)?,
        },
        holder: holder_at(r, 5)?,
        state,
        claimed_at_ms: r.get(9)?,
        lapse_at_ms: r.get(10)?,
        consumed_at_ms: r.get(11)?,
        evidence: r.get(12)?,
        refusals: r.get(13)?,
        takeovers: r.get(14)?,
        superseded_at_ms: r.get(15)?,
        abandon_at_ms: r.get(16)?,
        epoch: r.get(17)?,
    })
}
