//! Evidence of a run, applied to the claim store off the data path.
//!
//! Committed checkpoint writes tell the store how a resume is going: a
//! run-level `__resume__` is progress (the holder is alive and answered),
//! the gated task's own writes consume the claim, a new checkpoint moves
//! the thread on, a deleted thread forgets its claims, a closed holder
//! session lets its claims lapse sooner. One worker thread per proxy
//! applies them in order, so the relay never waits on SQLite for them.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use serde_json::json;

use super::{now_ms, ClaimRecord, ClaimStore, StoreError};
use crate::audit::{AuditEvent, AuditSink, Operation, SessionContext};
use crate::config::live::LiveClaimsTimings;
use crate::saver::checkpoint_ref::CheckpointRef;

/// What a committed write or a closed session means for claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// A run-level answer was recorded: the holder is alive.
    Progress {
        at: CheckpointRef,
        /// When the write passed the proxy (wall-clock ms).
        written_at_ms: i64,
    },
    /// The gated task wrote its results: the interrupt is consumed.
    Consumed {
        at: CheckpointRef,
        what: String,
        /// When the write passed the proxy: claims taken later (on a newer
        /// interrupt of the same checkpoint) are not consumed by it.
        written_at_ms: i64,
    },
    /// A checkpoint with this parent was written.
    MovedOn {
        /// The new checkpoint's parent.
        parent: CheckpointRef,
    },
    ThreadDeleted {
        thread_id: String,
    },
    HolderGone {
        session_id: u64,
    },
}

/// The sending side, cheap to clone; never blocks the relay.
#[derive(Clone)]
pub struct EvidenceSender {
    tx: SyncSender<(SessionContext, Evidence)>,
}

impl EvidenceSender {
    pub fn send(&self, ctx: &SessionContext, ev: Evidence) {
        match self.tx.try_send((ctx.clone(), ev)) {
            Ok(()) => {}
            Err(TrySendError::Full((_, ev))) => {
                // Dropping evidence only delays consumption: the claim then
                // lapses as it would without evidence. Say so.
                tracing::warn!(
                    ?ev,
                    "claim evidence queue full: evidence dropped, claim will lapse"
                );
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// Starts the worker for `store`; it ends when every sender is dropped.
/// Each piece of evidence is applied with the progress hold and holder-gone
/// grace `timings` holds when it is applied (a reload may change them).
pub fn start(
    store: Arc<ClaimStore>,
    proxy_id: String,
    timings: Arc<LiveClaimsTimings>,
    audit: AuditSink,
) -> EvidenceSender {
    let (tx, rx) = sync_channel(65_536);
    let spawned = std::thread::Builder::new()
        .name("resumeguard-claims".into())
        .spawn(move || run(&store, &proxy_id, &timings, &audit, rx));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the claim evidence worker: claims will only lapse");
    }
    EvidenceSender { tx }
}

fn run(
    store: &ClaimStore,
    proxy_id: &str,
    timings: &LiveClaimsTimings,
    audit: &AuditSink,
    rx: Receiver<(SessionContext, Evidence)>,
) {
    for (ctx, ev) in rx {
        let now = now_ms();
        let timing = timings.current();
        let result = match &ev {
            Evidence::Progress { at, written_at_ms } => store
                .note_progress(
                    (&at.thread_id, &at.checkpoint_ns, &at.checkpoint_id),
                    "run-level __resume__ recorded",
                    *written_at_ms,
                    now,
                    timing.progress_hold_ms,
                )
                .map(|_| Vec::new()),
            Evidence::Consumed {
                at,
                what,
                written_at_ms,
            } => store.consume(
                &at.thread_id,
                &at.checkpoint_ns,
                &at.checkpoint_id,
                what,
                *written_at_ms,
                now,
            ),
            Evidence::MovedOn { parent } => store.move_on(
                &parent.thread_id,
                &parent.checkpoint_ns,
                &parent.checkpoint_id,
                now,
            ),
            Evidence::ThreadDeleted { thread_id } => {
                store.forget_thread(thread_id).map(|_| Vec::new())
            }
            Evidence::HolderGone { session_id } => store
                .holder_gone(proxy_id, *session_id, now, timing.holder_gone_grace_ms)
                .map(|_| Vec::new()),
        };
        match result {
            Ok(consumed) => {
                crate::admin::metrics::claims_consumed(consumed.len());
                for record in consumed {
                    audit.record(consumed_event(&ctx, &ev, &record));
                }
            }
            // An unopened or replaced store was reported once, at ERROR.
            Err(e @ (StoreError::Open { .. } | StoreError::Replaced { .. })) => {
                tracing::debug!(error = %e, ?ev, "claim evidence not applied")
            }
            Err(e) => tracing::warn!(error = %e, ?ev, "claim evidence not applied"),
        }
    }
}

fn consumed_event(ctx: &SessionContext, ev: &Evidence, record: &ClaimRecord) -> AuditEvent {
    let late = record.consumed_after_lapse() || now_ms() > record.lapse_at_ms;
    if late {
        // The map form writes nothing until its node finished: a gate
        // longer than the lapse lets a second resume take over meanwhile.
        tracing::warn!(
            thread = %record.key.at.thread_id,
            checkpoint = %record.key.at.checkpoint_id,
            "claim consumed after it lapsed: a resume ran longer than claims.lapse_ms \
             (map-form resume with a slow gate?); raise claims.lapse_ms"
        );
    }
    let evidence = match ev {
        Evidence::Consumed { what, .. } => what.clone(),
        Evidence::MovedOn { .. } => super::NEXT_CHECKPOINT.to_owned(),
        other => format!("{other:?}"),
    };
    let mut e = AuditEvent::new(ctx, Operation::ClaimConsumed)
        .with_thread(record.key.at.thread_id.clone())
        .with_checkpoint(
            record.key.at.checkpoint_ns.clone(),
            record.key.at.checkpoint_id.clone(),
        );
    e.detail = json!({
        "interrupt": record.key.short_fingerprint(),
        "holder": {
            "client_addr": record.holder.client_addr,
            "application_name": record.holder.application_name,
            "proxy_id": record.holder.proxy_id,
            "session_id": record.holder.session_id,
        },
        "evidence": evidence,
        "after_lapse": late,
    });
    e
}
