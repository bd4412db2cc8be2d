//! What only the PostgreSQL backend does: claim generations (epochs),
//! holders of proxy processes that are gone (liveness locks), migrations
//! raced by proxies starting together, and failing closed on a lost or
//! unreachable database. Run against a real server (`crate::test_pg_server`):
//! the fixtures shared by the focused test files under `tests/`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::{db_clock, ClaimStore, EvidenceItem, WriteEvidence, NEXT_CHECKPOINT};
use crate::claims::{
    interrupt_fingerprint, ClaimKey, ClaimOutcome, ClaimRecord, ClaimState, Holder, WrittenAt,
};
use crate::config::shared_schema::SHARED_SCHEMA;
use crate::pg::{migration, PgTarget};
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::test_pg_server::PgSchema;

const LAPSE: i64 = 600_000;
const T0: i64 = 1_700_000_000_000;
const GRACE: i64 = 1_000;

pub(crate) fn key(checkpoint_id: &str) -> ClaimKey {
    ClaimKey {
        at: CheckpointRef {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: checkpoint_id.into(),
        },
        fingerprint: interrupt_fingerprint(&[("gate", Some(&b"approve?"[..]))]),
    }
}

pub(crate) fn holder(proxy: &str, session: u64) -> Holder {
    Holder {
        proxy_id: proxy.into(),
        session_id: session,
        client_addr: "10.0.0.1:5000".into(),
        application_name: "worker".into(),
    }
}

/// Ends the backends of `sql`'s pids (a `SELECT pid FROM …`), as an
/// idle-session reaper does, and waits (at most 5 s) until each has
/// exited: a backend being ended still holds its locks until it exits,
/// so a lock counted after this is a new one; how many.
fn terminate(db: &PgSchema, pids: &str, params: &[&(dyn postgres::types::ToSql + Sync)]) -> u64 {
    db.admin()
        .execute(
            &format!("SELECT pg_terminate_backend(pid, 5000) FROM ({pids}) p"),
            params,
        )
        .expect("terminate")
}

/// One write's evidence on `k`'s checkpoint, passed the proxy at
/// `written_at`.
fn evidence_item<'a>(
    kind: WriteEvidence,
    k: &'a ClaimKey,
    what: &'a str,
    written_at: Option<i64>,
) -> EvidenceItem<'a> {
    EvidenceItem {
        kind,
        at: &k.at,
        what,
        written_at: written_at.map(WrittenAt::from),
    }
}

/// `k` claimed by p1's session 1 at T0, for the lapse `LAPSE`.
fn claim_as_p1(store: &ClaimStore, k: &ClaimKey) {
    store
        .try_claim(k, &holder("p1", 1), T0, LAPSE)
        .expect("claim");
}

/// `k` claimed by p1's session 1 at T0 and answered at T0 + 2 (written
/// at T0 + 1): its thread's run lease starts then.
fn answer(store: &ClaimStore, k: &ClaimKey) {
    claim_as_p1(store, k);
    let at = &k.at;
    store
        .consume(
            &at.thread_id,
            &at.checkpoint_ns,
            &at.checkpoint_id,
            "task a wrote x",
            T0 + 1,
            T0 + 2,
        )
        .expect("consume");
}

mod claiming;
mod connections;
mod evidence;
mod fencing;
mod liveness;
mod schema;
