//! Rows of the PostgreSQL `claims` table: the column list, the filters,
//! the mapping between a row and a [`ClaimRecord`].

use postgres::Row;

use super::conn::{Fail, Tx};
use crate::claims::model::{ClaimKey, ClaimRecord, ClaimState, Holder};
use crate::saver::checkpoint_ref::CheckpointRef;

pub(super) const COLUMNS: &str = "thread_id, checkpoint_ns, checkpoint_id, fingerprint, state, \
    proxy_id, session_id, client_addr, application_name, claimed_at_ms, lapse_at_ms, \
    consumed_at_ms, evidence, refusals, takeovers, superseded_at_ms, abandon_at_ms, epoch";

pub(super) const KEY_MATCH: &str =
    "thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 AND fingerprint = $4";

/// A claim key's four columns as the first four parameters ([`KEY_MATCH`]).
pub(super) fn key_params(key: &ClaimKey) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    vec![
        &key.at.thread_id,
        &key.at.checkpoint_ns,
        &key.at.checkpoint_id,
        &key.fingerprint,
    ]
}

pub(super) const CHECKPOINT_MATCH: &str =
    "thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3";

/// The order of listed claims: text compared bytewise (`COLLATE "C"`),
/// whatever the database's collation.
pub(super) const ORDER: &str = "ORDER BY thread_id COLLATE \"C\", checkpoint_ns COLLATE \"C\", \
    claimed_at_ms, checkpoint_id COLLATE \"C\", fingerprint COLLATE \"C\"";

pub(super) fn select_key(
    tx: &mut Tx<'_>,
    key: &ClaimKey,
    lock: bool,
) -> Result<Option<ClaimRecord>, Fail> {
    let s = tx.schema;
    let for_update = if lock { " FOR UPDATE" } else { "" };
    let rows = tx.query(
        &format!("SELECT {COLUMNS} FROM {s}.claims WHERE {KEY_MATCH}{for_update}"),
        &key_params(key),
    )?;
    rows.first().map(record).transpose()
}

pub(super) fn select_where(
    tx: &mut Tx<'_>,
    filter: &str,
    args: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<ClaimRecord>, Fail> {
    select(tx, filter, args, "")
}

fn select(
    tx: &mut Tx<'_>,
    filter: &str,
    args: &[&(dyn postgres::types::ToSql + Sync)],
    lock: &str,
) -> Result<Vec<ClaimRecord>, Fail> {
    let s = tx.schema;
    tx.query(
        &format!("SELECT {COLUMNS} FROM {s}.claims WHERE {filter} {ORDER}{lock}"),
        args,
    )?
    .iter()
    .map(record)
    .collect()
}

/// The four holder columns starting at column `first`.
pub(super) fn holder_at(r: &Row, first: usize) -> Result<Holder, Fail> {
    Ok(Holder {
        proxy_id: r.try_get(first)?,
        // Stored as the same 64 bits in a signed bigint.
        session_id: r.try_get::<_, i64>(first + 1)? as u64,
        client_addr: r.try_get(first + 2)?,
        application_name: r.try_get(first + 3)?,
    })
}

/// A row selected with [`COLUMNS`].
pub(super) fn record(r: &Row) -> Result<ClaimRecord, Fail> {
    let state: String = r.try_get(4)?;
    let state = ClaimState::parse(&state)
        .ok_or_else(|| Fail(format!("unknown claim state {state:?} in the claims table")))?;
    Ok(ClaimRecord {
        key: ClaimKey {
            at: CheckpointRef {
                thread_id: r.try_get(0)?,
                checkpoint_ns: r.try_get(1)?,
                checkpoint_id: r.try_get(2)?,
            },
            fingerprint: r.try_get(3)?,
        },
        holder: holder_at(r, 5)?,
        state,
        claimed_at_ms: r.try_get(9)?,
        lapse_at_ms: r.try_get(10)?,
        consumed_at_ms: r.try_get(11)?,
        evidence: r.try_get(12)?,
        refusals: r.try_get(13)?,
        takeovers: r.try_get(14)?,
        superseded_at_ms: r.try_get(15)?,
        abandon_at_ms: r.try_get(16)?,
        epoch: r.try_get(17)?,
    })
}
