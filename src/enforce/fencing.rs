//! Fencing: a write that continues a claimed checkpoint (its gated task's
//! results, a checkpoint whose parent it is) is accepted only from the
//! claim's current holder (its session, or its pool: see
//! [`crate::policy::claims::decide_write`]). A superseded holder still
//! running after a takeover, or a session replaying a run's statements,
//! would otherwise fork the record with a second child of the parked
//! checkpoint. A write accepted from the holder whose claim would lapse
//! (or count as abandoned) within [`crate::policy::claims::COMMIT_COVER_MS`]
//! has the claim kept that long, so no takeover lands before it commits.
//!
//! Where it is decided, cheapest first:
//! - *Known*: the session itself created the checkpoint in its run (its
//!   put committed) and never saw it parked: no claim can be on it, so
//!   no question is asked (every step of a run continues the checkpoint
//!   its previous step created).
//! - *In the write's transaction*: when the claims schema lives in the
//!   session's own database, the server runs `fence_write` (see
//!   `claims::postgres::schema`) just ahead of the write, in the same
//!   round trip ([`crate::wire::injected`]): it decides on the claim row
//!   and keeps it locked until the write's transaction ends, so a
//!   takeover waits for that commit. Its RGF01 is the client's error.
//!   For a write that answers (a gated task's results, a next
//!   checkpoint) it also consumes the claim there: the answer and its
//!   claim's consumption commit together, whenever the off-path evidence
//!   is applied.
//! - *A lookup* in the claim store at the Bind, before the write is
//!   forwarded (claims in another database, `[claims] dsn` with no
//!   `fence_database`): one round trip to the store per checkpoint
//!   continued per transaction, plus one to keep the claim when it would
//!   lapse before the commit.
//!
//! Any verdict is kept until the transaction ends, so a `put_writes`
//! batch and its checkpoint ask once. The end is seen from the client's
//! side of a pipeline, where the next transaction's writes are tracked
//! before the server has answered the last one: every Sync, and a bound
//! `COMMIT` or `ROLLBACK`, ends it, since the client side cannot always
//! tell whether a block opened in SQL text spans a Sync. A write in such a block after a
//! Sync is checked again: in its transaction, by one more `fence_write` in
//! the same round trip; by lookup, with one more round trip to the store.
//! What a check's answer needs later (its audit record) rides with the
//! write's watch, not here. What a session needs to know of its
//! own claims (the generations it took, the parked checkpoints it read,
//! the checkpoints it created) is kept here, in memory, bounded.

use std::collections::VecDeque;

use std::sync::Arc;

use super::claim_gate::{ClaimsLeg, InTransactionFence};
use super::converted_write::{self, Unchecked};
use super::events::{fenced, FencedWrite};
use super::evidence::{Continuation, Step};
use super::fence_check::FenceCheck;
use crate::audit::{AuditEvent, SessionContext};
use crate::claims::failure_streak::Failure;
use crate::claims::{ClaimKey, Holder, Now, NEXT_CHECKPOINT};
use crate::log_text::shown;
use crate::policy::claims::{
    commit_cover, decide_write, fenced_message, WriteVerdict, Writer, COMMIT_COVER_MS,
    SQLSTATE_STORE_UNAVAILABLE, SQLSTATE_WRITE_FENCED,
};
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::write_record::WriteRecord;
use crate::wire::injected::Injection;
use crate::wire::tracker::Refusal;

/// How many claims (and parked checkpoints) a session remembers: a
/// session answers one interrupt at a time; a long-lived pooled connection
/// only needs its recent ones.
const REMEMBERED: usize = 32;

/// One session's fencing state.
#[derive(Debug, Default)]
pub struct FenceGate {
    /// Claims this session took: the checkpoint, fingerprint and epoch.
    took: VecDeque<(CheckpointRef, String, i64)>,
    /// Parked checkpoints this session read (claimed or refused).
    parked: VecDeque<CheckpointRef>,
    /// Checkpoints this session created in its run (their put
    /// committed) and never saw parked.
    created: VecDeque<CheckpointRef>,
    /// Verdicts of the current transaction, by checkpoint continued.
    decided: Vec<(CheckpointRef, WriteVerdict)>,
    /// Checkpoints the server checks in the current transaction, and
    /// whether an answer to them was recorded there.
    checking: Vec<(CheckpointRef, bool)>,
}

/// What happens to a write continuing a checkpoint.
pub enum FenceStep {
    Pass,
    Refuse(Box<Fenced>),
    /// The server checks it first, in the write's transaction.
    InTransaction(Box<(Injection, FenceCheck)>),
}

/// An answer the server records on its claim in the write's transaction.
struct Answer {
    /// The claim's evidence text.
    what: String,
    /// A next checkpoint: the claims on its parent are superseded too.
    moves_on: bool,
    /// `claims.run_lease_ms` (0: none).
    lease_ms: i64,
}

/// Whether a write continuing a checkpoint answers its interrupt: its
/// evidence text, and whether it moves the thread on.
fn answer_of(step: &Step) -> Option<(String, bool)> {
    match step {
        Step::TaskWrote(what) => Some((what.clone(), false)),
        Step::Child => Some((NEXT_CHECKPOINT.to_owned(), true)),
        Step::Progress => None,
    }
}

/// A fenced write: the refusal the server raises and its audit record.
pub struct Fenced {
    pub refusal: Refusal,
    pub event: AuditEvent,
}

fn remember<T>(list: &mut VecDeque<T>, item: T) {
    if list.len() == REMEMBERED {
        list.pop_front();
    }
    list.push_back(item);
}

impl FenceGate {
    /// This session was served a claim on `key` at generation `epoch`.
    pub fn took(&mut self, key: &ClaimKey, epoch: i64) {
        let at = key.at.clone();
        let known = self
            .took
            .iter()
            .any(|(c, f, e)| *c == at && *f == key.fingerprint && *e == epoch);
        if !known {
            remember(&mut self.took, (at.clone(), key.fingerprint.clone(), epoch));
        }
        self.read_parked(key);
    }

    /// This session read `key`'s checkpoint as a parked head.
    pub fn read_parked(&mut self, key: &ClaimKey) {
        let at = key.at.clone();
        self.created.retain(|c| *c != at);
        if !self.parked.contains(&at) {
            remember(&mut self.parked, at);
        }
    }

    /// This session's put of checkpoint `at` committed: its run's next
    /// writes continue a checkpoint nobody could have claimed.
    pub fn created(&mut self, at: CheckpointRef) {
        if !self.parked.contains(&at) && !self.created.contains(&at) {
            remember(&mut self.created, at);
        }
    }

    /// This session wrote an interrupt on `at`: it parks there, and a
    /// reader may claim it from now on.
    pub fn parks(&mut self, at: &CheckpointRef) {
        self.created.retain(|c| c != at);
    }

    /// The transaction ended (committed or rolled back), or may have (a
    /// client's Sync): later writes ask again.
    pub fn end_transaction(&mut self) {
        self.decided.clear();
        self.checking.clear();
    }

    /// Asks the store who holds `at` now and decides; a write accepted from
    /// the holder whose claim would lapse (or count as abandoned) before
    /// the write can commit has the claim kept through the commit first.
    fn lookup(
        &self,
        leg: &ClaimsLeg,
        session: &Holder,
        at: &CheckpointRef,
        progress: bool,
    ) -> WriteVerdict {
        let took: Vec<(String, i64)> = self
            .took
            .iter()
            .filter(|(c, _, _)| c == at)
            .map(|(_, f, e)| (f.clone(), *e))
            .collect();
        let writer = Writer {
            session,
            took: &took,
            known_claimed: progress || self.parked.contains(at),
        };
        let read = crate::metrics::claims_store_call("fence_lookup", || {
            leg.store.current_holder_timed(
                &at.thread_id,
                &at.checkpoint_ns,
                &at.checkpoint_id,
                Now::STORE,
            )
        });
        let (current, read_at_ms) = match read {
            Ok((current, at_ms)) => {
                if leg.fence_lookups.succeeded() {
                    tracing::info!("fence lookups answered again: writes are fenced again");
                }
                (Ok(current), at_ms)
            }
            Err(e) => {
                if leg.fence_lookups.failed(&e) == Failure::Began {
                    tracing::error!(error = %e, "fence lookups failing: writes continuing a \
                        checkpoint this session does not know claimed pass unfenced, those it \
                        does are refused (58000), until the claim store answers");
                }
                (Err(e), 0)
            }
        };
        let verdict = decide_write(&writer, &current);
        let Ok(Some(claim)) = &current else {
            return verdict;
        };
        // Measured against the store's clock as it read the claim.
        if commit_cover(&verdict, claim, read_at_ms).is_none() {
            return verdict;
        }
        match leg
            .store
            .keep_for(&claim.key, claim.epoch, Now::STORE, COMMIT_COVER_MS)
        {
            Ok(true) => verdict,
            // Taken over or released since the read: decide on the claim
            // as it is now.
            Ok(false) => decide_write(
                &writer,
                &leg.store
                    .current_holder(&at.thread_id, &at.checkpoint_ns, &at.checkpoint_id),
            ),
            Err(e) => WriteVerdict::StoreUnavailable(e.to_string()),
        }
    }

    /// What happens to a write continuing `cont`, from `session`.
    pub fn check(
        &mut self,
        leg: &ClaimsLeg,
        ctx: &SessionContext,
        session: &Holder,
        converted: Option<&str>,
        (cont, kind_label, rec): (&Continuation, &'static str, &Arc<WriteRecord>),
    ) -> FenceStep {
        let at = &cont.at;
        if self.created.contains(at) {
            crate::metrics::fence_check("known");
            return FenceStep::Pass;
        }
        let answer = answer_of(&cont.step);
        // Checked already in this transaction, and answered when this
        // write answers.
        if self
            .checking
            .iter()
            .any(|(c, answered)| c == at && (*answered || answer.is_none()))
        {
            return FenceStep::Pass;
        }
        if let Some(fence) = leg
            .fence_in_transaction
            .as_ref()
            .filter(|f| f.database == ctx.database)
        {
            self.checking.retain(|(c, _)| c != at);
            self.checking.push((at.clone(), answer.is_some()));
            crate::metrics::fence_check("in_transaction");
            let check = FenceCheck {
                continues: at.clone(),
                statement: kind_label,
                record: Arc::clone(rec),
                raised: None,
            };
            let answer = answer.map(|(what, moves_on)| Answer {
                what,
                moves_on,
                lease_ms: leg.timings.current().run_lease_ms,
            });
            let injection = self.injection(fence, leg.fence_cover_ms(), session, at, answer);
            return FenceStep::InTransaction(Box::new((injection, check)));
        }
        if let Some(encoding) = converted {
            crate::metrics::fenced_unchecked("client_encoding");
            let (refusal, event) =
                converted_write::refused(ctx, (at, kind_label, rec), encoding, Unchecked::Holder);
            return FenceStep::Refuse(Box::new(Fenced { refusal, event }));
        }
        match self.lookup_step(leg, ctx, session, (cont, kind_label, rec)) {
            Some(fenced) => FenceStep::Refuse(Box::new(fenced)),
            None => FenceStep::Pass,
        }
    }

    /// The server's check of a write continuing `at` from `session`, its
    /// claim covered `cover_ms` past the check, and for an answer the
    /// claim's consumption: the function's arguments, every one a
    /// parameter.
    fn injection(
        &self,
        fence: &InTransactionFence,
        cover_ms: i64,
        session: &Holder,
        at: &CheckpointRef,
        answer: Option<Answer>,
    ) -> Injection {
        let took: Vec<String> = self
            .took
            .iter()
            .filter(|(c, _, _)| c == at)
            .map(|(_, f, e)| format!("{f}:{e}"))
            .collect();
        Injection {
            sql: format!(
                "SELECT {}.fence_write($1, $2, $3, $4, $5::int8, $6, $7, $8, $9::int8, $10, \
                 $11::bool, $12::int8)",
                fence.schema
            ),
            params: vec![
                Some(at.thread_id.clone()),
                Some(at.checkpoint_ns.clone()),
                Some(at.checkpoint_id.clone()),
                Some(session.proxy_id.clone()),
                Some(session.session_id.to_string()),
                Some(session.client_addr.clone()),
                Some(session.application_name.clone()),
                Some(took.join(",")),
                Some(cover_ms.to_string()),
                answer.as_ref().map(|a| a.what.clone()),
                Some(answer.as_ref().is_some_and(|a| a.moves_on).to_string()),
                Some(answer.as_ref().map_or(0, |a| a.lease_ms).to_string()),
            ],
        }
    }

    /// The verdict of a claim store lookup on a write continuing `cont`;
    /// `None` lets it through.
    fn lookup_step(
        &mut self,
        leg: &ClaimsLeg,
        ctx: &SessionContext,
        session: &Holder,
        (cont, kind_label, rec): (&Continuation, &str, &WriteRecord),
    ) -> Option<Fenced> {
        let at = &cont.at;
        let cached = self.decided.iter().find(|(c, _)| c == at).map(|(_, v)| v);
        let (verdict, was_cached) = match cached {
            Some(v) => (v.clone(), true),
            None => {
                let v = self.lookup(leg, session, at, cont.step == Step::Progress);
                self.decided.push((at.clone(), v.clone()));
                (v, false)
            }
        };
        let (lookup, refused_for) = verdict.metric_labels();
        crate::metrics::write_fence(lookup, refused_for, was_cached);
        let (sqlstate, message, fence, current) = match &verdict {
            WriteVerdict::Accept(_) => return None,
            WriteVerdict::Fenced { current, reason } => (
                SQLSTATE_WRITE_FENCED,
                fenced_message(at, current, reason, session),
                reason.label(),
                Some(current.as_ref()),
            ),
            WriteVerdict::StoreUnavailable(why) => (
                SQLSTATE_STORE_UNAVAILABLE,
                format!(
                    "resumeguard: write continuing thread \"{}\", checkpoint_ns \"{}\", \
                     checkpoint \"{}\" refused (fail closed): claim store unavailable, its \
                     holder cannot be checked: {why}",
                    at.thread_id, at.checkpoint_ns, at.checkpoint_id
                ),
                "store_unavailable",
                None,
            ),
        };
        tracing::warn!(thread = %shown(&at.thread_id), checkpoint = %shown(&at.checkpoint_id), "{}", shown(&message));
        let event = fenced(
            ctx,
            &FencedWrite {
                record: rec,
                continues: at,
                statement: kind_label,
                sqlstate,
                message: &message,
                fence,
                current,
            },
        );
        let detail = match current {
            Some(c) => format!(
                "the claim's holder: proxy {}, session {}, epoch {}",
                c.holder.proxy_id, c.holder.session_id, c.epoch
            ),
            None => String::new(),
        };
        Some(Fenced {
            refusal: Refusal {
                sqlstate,
                message,
                detail,
            },
            event,
        })
    }
}

#[cfg(test)]
mod tests;
