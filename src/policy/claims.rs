//! Consume-once decision: what a read of a parked head gets,
//! given what the claim store answered.
//!
//! Pure: the wire layer asks the store, calls [`decide_at`], and serves,
//! sleeps and asks again, or sends the [`Refusal`] as an ErrorResponse
//! before the result reaches the client, so a loser's node never runs.
//! A store that cannot answer refuses (fail closed): serving would let
//! every racer fire.
//!
//! SQLSTATEs (stable; clients may match on them):
//! - `55000` object_not_in_prerequisite_state, [`Refusal::Answered`]: the
//!   interrupt was already answered; retrying the same resume never helps.
//!   Also [`Refusal::RunInProgress`]: the interrupt was answered and the
//!   answering run is still writing; this read would run its tasks again.
//! - `55006` object_in_use, [`Refusal::InFlight`]: another session is
//!   answering it right now; a resume may succeed after that claim lapses.
//! - `58000` system_error, [`Refusal::StoreUnavailable`]: the claim store
//!   (outside PostgreSQL) failed; nothing about the thread is known.
//! - `55006` also for [`Refusal::ShuttingDown`]: this proxy is shutting
//!   down and grants nothing new; the same resume succeeds through
//!   another proxy or after the restart.
//! - `08006` connection_failure, [`Refusal::SessionEnded`]: the server
//!   ended the reader's own session while its read waited for the claim;
//!   nothing it wrote could commit, so it is not served (the connection
//!   is gone: this one is in class 08 on purpose).
//! - `57014` query_canceled, [`Refusal::Canceled`]: the reader's client
//!   sent a CancelRequest while its read waited for the claim, and the
//!   read is canceled as PostgreSQL cancels a statement.
//! - `0A000` feature_not_supported, [`Refusal::ClientEncoding`]: the
//!   reader's client encoding is converted by the server and the head's
//!   key holds characters outside ASCII; the same resume succeeds in the
//!   database's encoding. Also for [`Refusal::Undecodable`]: the head's
//!   row does not decode (a text that is not UTF-8), so whether it is
//!   parked cannot be told.
//!
//! - `RGF01` (class `RG`, resumeguard's own), [`WriteVerdict::Fenced`]: a
//!   write continuing a claimed checkpoint came from a session other than
//!   its current holder (see [`decide_write`]). Raised inside the server's
//!   transaction, so nothing of the write commits.
//!
//! No other is in class 40 or 08, so drivers and pools do not retry or drop
//! the connection on their own.

use regex::Regex;

use crate::claims::{
    format_ms, ClaimKey, ClaimOutcome, ClaimRecord, ClaimState, Holder, RunLease, StoreError,
};
use crate::saver::checkpoint_ref::CheckpointRef;

/// SQLSTATE for a resume of an interrupt already answered.
pub const SQLSTATE_ANSWERED: &str = "55000";
/// SQLSTATE for a resume while another session is answering.
pub const SQLSTATE_IN_FLIGHT: &str = "55006";
/// SQLSTATE for a read refused because the claim store failed.
pub const SQLSTATE_STORE_UNAVAILABLE: &str = "58000";
/// [`Refusal::SessionEnded`]: connection_failure.
pub const SQLSTATE_SESSION_ENDED: &str = "08006";
/// [`Refusal::Canceled`]: query_canceled.
pub const SQLSTATE_CANCELED: &str = "57014";
/// [`Refusal::ClientEncoding`]: feature_not_supported.
pub const SQLSTATE_CLIENT_ENCODING: &str = "0A000";

/// SQLSTATE for a write fenced off a claimed checkpoint.
pub const SQLSTATE_WRITE_FENCED: &str = "RGF01";

/// The SQL comment that marks a statement as inspection, where
/// `claims.inspection_sql_hint` is on: `/* resumeguard:inspect */` (or
/// `-- resumeguard:inspect`). Off by default: any client can write it,
/// and a resume that carries it never claims.
pub const INSPECTION_HINT: &str = "resumeguard:inspect";

/// What a reader does when another session holds the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Poll until the claim is consumed (then refuse) or lapses (then take
    /// it over), for at most `max_wait_ms`.
    Wait { max_wait_ms: i64, poll_ms: i64 },
    /// Refuse at once.
    Refuse,
}

/// Why a read of a parked head is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Evidence of another run consumed the claim.
    Answered { by: Holder, at_ms: i64 },
    /// Another session holds a live claim (under [`WaitPolicy::Refuse`],
    /// or still after the maximum wait).
    InFlight { by: Holder, since_ms: i64 },
    /// The store failed; the text says why.
    StoreUnavailable(String),
    /// The head is past the parked checkpoint and still has tasks to run,
    /// and another session's run that answered the interrupt holds the
    /// thread's run lease: serving the head would run those tasks twice.
    RunInProgress { lease: RunLease },
    /// The proxy is shutting down: no claim, takeover or run is granted
    /// to a reader (its session closes next).
    ShuttingDown,
    /// The server ended the reader's own session while it waited: its
    /// node would run with nothing it writes able to commit.
    SessionEnded,
    /// The reader's client canceled the read (a CancelRequest with its
    /// backend key) while it waited for the claim.
    Canceled,
    /// The reader's session is in this client encoding, which the server
    /// converts, and the head's key holds characters outside ASCII: the
    /// bytes the proxy read are not the thread's, so no claim can be
    /// checked for it.
    ClientEncoding(String),
    /// The head's row does not decode (the text says why): whether it is
    /// parked cannot be told, so no claim can be checked for it.
    Undecodable(String),
}

/// What the wire layer does with the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Pass the result through; `takeover` when another session's claim
    /// was taken over, lapsed or abandoned (audited as a takeover).
    Serve { takeover: bool },
    /// Send the refusal instead of the result.
    Refuse { reason: Refusal },
    /// Hold the result, wait `ms`, and ask the store again.
    RetryAfter { ms: i64 },
}

/// The decision for one answer of the store. `waited_ms` is how long this
/// read has already waited; `now_ms` (the store's clock when it decided,
/// [`crate::claims::ClaimStore::try_claim_timed`]) is used only to stop a
/// wait at the holder's lapse time, when the next ask takes the claim
/// over: the record's times and it are on the same clock.
pub fn decide_at(
    outcome: &Result<ClaimOutcome, StoreError>,
    policy: &WaitPolicy,
    waited_ms: i64,
    now_ms: i64,
) -> ClaimDecision {
    let record = match outcome {
        // A write holding the claim's row is committing: ask again while
        // the wait allows (a takeover waits for that commit).
        Err(e @ StoreError::RowLocked { .. }) => match *policy {
            WaitPolicy::Wait {
                max_wait_ms,
                poll_ms,
            } if waited_ms < max_wait_ms => {
                return ClaimDecision::RetryAfter {
                    ms: poll_ms.max(1).min(max_wait_ms - waited_ms),
                }
            }
            _ => {
                return ClaimDecision::Refuse {
                    reason: Refusal::StoreUnavailable(e.to_string()),
                }
            }
        },
        Err(e) => {
            return ClaimDecision::Refuse {
                reason: Refusal::StoreUnavailable(e.to_string()),
            }
        }
        Ok(ClaimOutcome::Taken(_)) | Ok(ClaimOutcome::AlreadyHeld(_)) => {
            return ClaimDecision::Serve { takeover: false }
        }
        Ok(ClaimOutcome::TakenOver { .. }) => return ClaimDecision::Serve { takeover: true },
        Ok(ClaimOutcome::Consumed(r)) => {
            return ClaimDecision::Refuse {
                reason: Refusal::Answered {
                    by: r.holder.clone(),
                    at_ms: r.consumed_at_ms.unwrap_or(r.claimed_at_ms),
                },
            }
        }
        Ok(ClaimOutcome::Busy(r)) => r,
    };
    let in_flight = ClaimDecision::Refuse {
        reason: Refusal::InFlight {
            by: record.holder.clone(),
            since_ms: record.claimed_at_ms,
        },
    };
    match *policy {
        WaitPolicy::Refuse => in_flight,
        WaitPolicy::Wait {
            max_wait_ms,
            poll_ms,
        } => {
            if waited_ms >= max_wait_ms {
                return in_flight;
            }
            // A zero poll would spin; the lapse bound may be zero (the
            // claim lapsed between the store's clock and ours: ask now).
            let until_lapse = record.lapse_at_ms.saturating_sub(now_ms).max(0);
            let wait_left = max_wait_ms - waited_ms;
            ClaimDecision::RetryAfter {
                ms: poll_ms.max(1).min(wait_left).min(until_lapse),
            }
        }
    }
}

/// What an audited takeover says about the claim it took: a held claim
/// that lapsed with no evidence, or a consumed claim whose answering run
/// was abandoned before its next checkpoint (its holder gone, the thread
/// never moved on, no live run lease).
pub fn takeover_reason(previous: &ClaimRecord) -> &'static str {
    match previous.state {
        ClaimState::Consumed => TAKEOVER_ABANDONED,
        ClaimState::Held | ClaimState::Released => TAKEOVER_LAPSED,
    }
}

/// The metrics label of a takeover's reason ([`takeover_reason`]'s text):
/// `lapsed` or `abandoned`.
pub fn takeover_metric_label(reason: Option<&str>) -> &'static str {
    if reason == Some(TAKEOVER_LAPSED) {
        "lapsed"
    } else {
        "abandoned"
    }
}

/// [`takeover_reason`] of a lapsed claim.
pub const TAKEOVER_LAPSED: &str = "lapsed claim: its holder recorded no evidence of a run in time";
/// [`takeover_reason`] of an abandoned run.
pub const TAKEOVER_ABANDONED: &str = "takeover of an abandoned run: the interrupt was answered, \
    but the answering session closed and its run wrote no next checkpoint";

/// The decision for a read of a thread's head that is not parked but has
/// tasks still to run: refused while another session's answering run holds
/// the lease (a late resume would otherwise continue that run and repeat
/// its next tasks); served otherwise — including when the store cannot
/// answer, because only reads of parked heads fail closed. While the proxy
/// is `draining`, only the lease's own holder is served: anyone else would
/// start a run on a session about to close.
pub fn decide_running_head(
    lease: &Result<Option<RunLease>, StoreError>,
    reader: &Holder,
    draining: bool,
) -> ClaimDecision {
    match lease {
        Ok(Some(lease)) if !lease.holder.same_session(reader) => ClaimDecision::Refuse {
            reason: Refusal::RunInProgress {
                lease: lease.clone(),
            },
        },
        Ok(Some(_)) => ClaimDecision::Serve { takeover: false },
        _ if draining => ClaimDecision::Refuse {
            reason: Refusal::ShuttingDown,
        },
        _ => ClaimDecision::Serve { takeover: false },
    }
}

impl Refusal {
    /// The refusal's reason in the metrics label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Refusal::Answered { .. } => "answered",
            Refusal::InFlight { .. } => "in_flight",
            Refusal::RunInProgress { .. } => "run_in_progress",
            Refusal::StoreUnavailable(..) => "store_unavailable",
            Refusal::ShuttingDown => "shutting_down",
            Refusal::SessionEnded => "session_ended",
            Refusal::Canceled => "canceled",
            Refusal::ClientEncoding(_) => "client_encoding",
            Refusal::Undecodable(_) => "undecodable",
        }
    }

    /// The SQLSTATE of the ErrorResponse (see the module docs).
    pub fn sqlstate(&self) -> &'static str {
        match self {
            Refusal::Answered { .. } | Refusal::RunInProgress { .. } => SQLSTATE_ANSWERED,
            Refusal::InFlight { .. } | Refusal::ShuttingDown => SQLSTATE_IN_FLIGHT,
            Refusal::StoreUnavailable(..) => SQLSTATE_STORE_UNAVAILABLE,
            Refusal::SessionEnded => SQLSTATE_SESSION_ENDED,
            Refusal::Canceled => SQLSTATE_CANCELED,
            Refusal::ClientEncoding(_) | Refusal::Undecodable(_) => SQLSTATE_CLIENT_ENCODING,
        }
    }

    /// The ErrorResponse message: what happened to which interrupt, by
    /// whom and when.
    pub fn message(&self, key: &ClaimKey) -> String {
        let what = format!(
            "thread \"{}\", checkpoint_ns \"{}\", checkpoint \"{}\", interrupt {}",
            key.at.thread_id,
            key.at.checkpoint_ns,
            key.at.checkpoint_id,
            key.short_fingerprint()
        );
        match self {
            Refusal::Answered { by, at_ms } => format!(
                "resumeguard: interrupt already answered: {what} was answered by {} at {}; \
                 this read of the parked checkpoint was refused before its node ran",
                who(by),
                format_ms(*at_ms)
            ),
            Refusal::InFlight { by, since_ms } => format!(
                "resumeguard: interrupt is being answered: {what} was claimed by {} at {} \
                 and that run has not finished; this read of the parked checkpoint was refused before its node ran",
                who(by),
                format_ms(*since_ms)
            ),
            Refusal::StoreUnavailable(detail) => {
                format!("resumeguard: read of parked {what} refused (fail closed): {detail}")
            }
            Refusal::RunInProgress { lease } => format!(
                "resumeguard: interrupt already answered and its run is in progress: \
                 thread \"{}\", checkpoint_ns \"{}\": interrupt {} of checkpoint \"{}\" was \
                 answered by {} at {}, and that run last wrote at {}; this read of the \
                 thread's head (checkpoint \"{}\", tasks still to run) was refused before \
                 any node ran",
                lease.thread_id,
                lease.checkpoint_ns,
                lease.short_fingerprint(),
                lease.answered_checkpoint_id,
                who(&lease.holder),
                format_ms(lease.answered_at_ms),
                format_ms(lease.last_write_ms),
                key.at.checkpoint_id
            ),
            Refusal::ShuttingDown => format!(
                "resumeguard is shutting down: {what} was not claimed, this read of the \
                 thread's head was refused before any node ran"
            ),
            Refusal::SessionEnded => format!(
                "resumeguard: the server ended this session while its read of parked {what} \
                 waited for the claim; nothing was served and no node ran"
            ),
            Refusal::Canceled => format!(
                "canceling statement due to user request: the read of parked {what} waited \
                 for its claim and was canceled by resumeguard; nothing was served and no node ran"
            ),
            Refusal::ClientEncoding(encoding) => format!(
                "resumeguard: read of {what} refused (fail closed): the server converts this \
                 session's client_encoding {encoding} to the database's, so the key's characters \
                 outside ASCII are not the bytes the proxy read, and no claim can be checked \
                 for them; no node ran"
            ),
            Refusal::Undecodable(why) => format!(
                "resumeguard: read of the head of thread \"{}\", checkpoint_ns \"{}\" refused \
                 (fail closed): its row does not decode ({why}), so whether it is parked cannot \
                 be told and no claim can be checked for it; no node ran",
                key.at.thread_id, key.at.checkpoint_ns
            ),
        }
    }

    /// The ErrorResponse hint: what the client can do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            Refusal::Answered { .. } => {
                "Read the thread's state to see the answer; resuming it again has no effect. \
                 If the answering run died before its next checkpoint, the thread continues \
                 once that session's connection has closed (claims.holder_gone_grace_ms), \
                 or after `resumeguard claims release`."
            }
            Refusal::InFlight { .. } => {
                "If the other session died, a resume succeeds once its claim lapses. \
                 Inspection reads marked by application_name, the inspection listener \
                 or (with claims.inspection_sql_hint) a /* resumeguard:inspect */ comment \
                 are never refused."
            }
            Refusal::StoreUnavailable(_) => {
                "Check the claims database named above and the proxy's credential for it \
                 ([claims] dsn or the upstream URL; password_file, password_command, \
                 PGPASSWORD); /readyz says whether it is reachable now. Other traffic \
                 still flows."
            }
            Refusal::RunInProgress { .. } => {
                "Resuming again has no effect on an answered interrupt. To watch a running \
                 thread, mark the read as inspection (application_name, the inspection \
                 listener or, with claims.inspection_sql_hint, a /* resumeguard:inspect */ \
                 comment); claims.run_lease_ms \
                 sets how long after the run's last write this applies."
            }
            Refusal::ShuttingDown => {
                "Retry the same resume through another proxy or once this one has \
                 restarted; nothing ran."
            }
            Refusal::SessionEnded => {
                "Resume again on a new connection; the thread continues with the first \
                 reader once the claim's holder is gone."
            }
            Refusal::Canceled => {
                "The client canceled the read while another session held the claim; resume \
                 again to wait for it."
            }
            Refusal::ClientEncoding(_) => {
                "Resume with client_encoding set to the database's encoding (PGCLIENTENCODING, \
                 or options=-c client_encoding=UTF8); threads whose keys are ASCII resume in \
                 any encoding."
            }
            Refusal::Undecodable(_) => {
                "The proxy reads a checkpoint row whose texts are UTF-8: resume with \
                 client_encoding UTF8 (PGCLIENTENCODING, or options=-c client_encoding=UTF8), \
                 whatever the database's encoding (a key outside ASCII claims only where the \
                 database is UTF8 too). A read marked as inspection is served unclaimed."
            }
        }
    }
}

/// How to mark a read as inspection under this configuration: the
/// `claims.inspection_application_names` patterns in effect, the
/// inspection listener, and the SQL comment where it is on. Told to a
/// read refused during a run: most such reads are a status page's.
pub fn inspection_remedy(patterns: &[&str], sql_hint: bool) -> String {
    let names = if patterns.is_empty() {
        "none is set".to_owned()
    } else {
        let quoted: Vec<String> = patterns.iter().map(|p| format!("{p:?}")).collect();
        format!("now {}", quoted.join(", "))
    };
    let comment = if sql_hint {
        "or start the statement with the comment /* resumeguard:inspect */"
    } else {
        "or, with claims.inspection_sql_hint = true (off now), start the statement with the \
         comment /* resumeguard:inspect */"
    };
    format!(
        "mark the read as inspection: connect with an application_name matching \
         claims.inspection_application_names ({names}), or through the inspection listener \
         (claims.inspection_listen), {comment}"
    )
}

/// The session sending a write that continues a checkpoint (its task's
/// pending writes on it, or a checkpoint whose parent it is).
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    pub session: &'a Holder,
    /// The claims this session took on that checkpoint, as
    /// (fingerprint, epoch): a generation it held that is not the current
    /// one was taken over.
    pub took: &'a [(String, i64)],
    /// Whether the proxy knows the checkpoint was claimed without asking
    /// the store: this session took or was refused a claim on it, or the
    /// write is a run-level `__resume__` (only a resume writes one).
    pub known_claimed: bool,
}

/// Why a write continuing a claimed checkpoint is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Nobody holds a claim on the checkpoint.
    Unclaimed,
    /// The writer is the holder's session.
    Holder,
    /// Another session of the same proxy and the same client (host
    /// address and application_name) as the holder: its pool.
    Pool,
    /// The store could not answer and nothing tells the proxy the
    /// checkpoint was claimed (see [`decide_write`]).
    Unknown,
}

/// Why a write is fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceReason {
    /// The writing session held generation `epoch` of the claim, which
    /// was taken over since.
    Superseded { epoch: i64 },
    /// The writer is on another proxy than the holder.
    OtherProxy,
    /// The writer is another client than the holder (host address or
    /// application_name differ).
    OtherClient,
}

/// What happens to a write that continues a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteVerdict {
    Accept(Accepted),
    /// Raised in the write's place ([`SQLSTATE_WRITE_FENCED`]).
    Fenced {
        current: Box<ClaimRecord>,
        reason: FenceReason,
    },
    /// The store failed on a checkpoint known to be claimed: refused
    /// ([`SQLSTATE_STORE_UNAVAILABLE`]), fail closed.
    StoreUnavailable(String),
}

impl WriteVerdict {
    /// The metrics labels of the verdict: the store lookup's outcome, and
    /// the reason the write was refused when it was.
    pub fn metric_labels(&self) -> (&'static str, Option<&'static str>) {
        match self {
            WriteVerdict::Accept(Accepted::Unclaimed) => ("unclaimed", None),
            WriteVerdict::Accept(Accepted::Holder) => ("holder", None),
            WriteVerdict::Accept(Accepted::Pool) => ("pool", None),
            WriteVerdict::Accept(Accepted::Unknown) => ("failed", None),
            WriteVerdict::StoreUnavailable(_) => ("failed", Some("store_unavailable")),
            WriteVerdict::Fenced { reason, .. } => ("fenced", Some(reason.label())),
        }
    }
}

/// The fencing rule for a write continuing a checkpoint, given the
/// checkpoint's current claim ([`crate::claims::ClaimStore::current_holder`]).
///
/// In order: no claim (none ever, or released): accepted. The holder's
/// own session: accepted. Another session of the holder's proxy from the
/// same client host address with the same application_name: accepted, as
/// the holder's pool (psycopg and node-postgres pools read on one
/// connection and write on others, and one pool connection may take over
/// the claim another one's unmarked `get_state` left). Otherwise fenced:
/// a session that held an earlier generation of the current claim (taken
/// over since by another client), a session on another proxy, any other
/// client. So two processes sharing host, proxy and application_name
/// count as one client: give each its own application_name to fence them
/// from each other.
///
/// A store that cannot answer fails closed where the proxy knows the
/// checkpoint is claimed ([`Writer::known_claimed`]); elsewhere the write
/// passes, since every step of every run continues some checkpoint and
/// refusing them all would stop unrelated traffic (counted, and said at
/// ERROR when the lookups begin to fail: `enforce::fencing`).
pub fn decide_write(
    writer: &Writer<'_>,
    current: &Result<Option<ClaimRecord>, StoreError>,
) -> WriteVerdict {
    let current = match current {
        Ok(Some(c)) => c,
        Ok(None) => return WriteVerdict::Accept(Accepted::Unclaimed),
        Err(e) if writer.known_claimed => return WriteVerdict::StoreUnavailable(e.to_string()),
        Err(_) => return WriteVerdict::Accept(Accepted::Unknown),
    };
    let me = writer.session;
    let holder = &current.holder;
    if holder.same_session(me) {
        return WriteVerdict::Accept(Accepted::Holder);
    }
    if holder.proxy_id == me.proxy_id
        && client_host(&holder.client_addr) == client_host(&me.client_addr)
        && holder.application_name == me.application_name
    {
        return WriteVerdict::Accept(Accepted::Pool);
    }
    let fenced = |reason| WriteVerdict::Fenced {
        current: Box::new(current.clone()),
        reason,
    };
    let superseded = writer
        .took
        .iter()
        .filter(|(fingerprint, epoch)| {
            *fingerprint == current.key.fingerprint && *epoch < current.epoch
        })
        .map(|(_, epoch)| *epoch)
        .max();
    if let Some(epoch) = superseded {
        return fenced(FenceReason::Superseded { epoch });
    }
    if holder.proxy_id != me.proxy_id {
        return fenced(FenceReason::OtherProxy);
    }
    fenced(FenceReason::OtherClient)
}

/// How long a write accepted from a claim's holder (or its pool) stays
/// covered: for this long after the check the claim can neither lapse nor
/// count as abandoned, so no takeover lands between the write's check and
/// its commit (a pipelined saver call commits within milliseconds).
pub const COMMIT_COVER_MS: i64 = 2_000;

/// Until when `current` must be kept ([`crate::claims::ClaimStore::keep_for`])
/// for a write accepted from its holder at `now_ms` (the store's clock) to
/// commit under it;
/// `None` when the claim already holds that long or the write was not
/// accepted as the holder's.
pub fn commit_cover(verdict: &WriteVerdict, current: &ClaimRecord, now_ms: i64) -> Option<i64> {
    if !matches!(
        verdict,
        WriteVerdict::Accept(Accepted::Holder | Accepted::Pool)
    ) {
        return None;
    }
    let until = now_ms.saturating_add(COMMIT_COVER_MS);
    let lapses = current.state == ClaimState::Held && current.lapse_at_ms < until;
    let abandoned = current.abandon_at_ms.is_some_and(|at| at < until);
    (lapses || abandoned).then_some(until)
}

/// The host part of a client address (`10.0.0.1:5432` → `10.0.0.1`,
/// `[::1]:5432` → `[::1]`); an address without a port is its own host.
fn client_host(addr: &str) -> &str {
    match addr.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    }
}

impl FenceReason {
    /// What the writer is, in the fenced write's message.
    pub fn describe(&self, writer: &Holder) -> String {
        match self {
            FenceReason::Superseded { epoch } => format!(
                "this session (proxy {}, session {}) held epoch {epoch}, which was taken over",
                writer.proxy_id, writer.session_id
            ),
            FenceReason::OtherProxy => format!(
                "this session is on proxy {}, not the holder's",
                writer.proxy_id
            ),
            FenceReason::OtherClient => format!(
                "this session is another client ({}, application_name \"{}\")",
                writer.client_addr, writer.application_name
            ),
        }
    }

    /// The reason's name in the audit record and the metrics label.
    pub fn label(&self) -> &'static str {
        match self {
            FenceReason::Superseded { .. } => "superseded_holder",
            FenceReason::OtherProxy => "other_proxy",
            FenceReason::OtherClient => "other_client",
        }
    }
}

/// The message of a fenced write: which checkpoint, who holds it at which
/// epoch, and why this writer is not them.
pub fn fenced_message(
    at: &CheckpointRef,
    current: &ClaimRecord,
    reason: &FenceReason,
    writer: &Holder,
) -> String {
    format!(
        "resumeguard: write fenced: thread \"{}\", checkpoint_ns \"{}\", \
         checkpoint \"{}\" is held by {} at epoch {} (interrupt {}); {}; \
         nothing of this write was committed",
        at.thread_id,
        at.checkpoint_ns,
        at.checkpoint_id,
        who(&current.holder),
        current.epoch,
        current.key.short_fingerprint(),
        reason.describe(writer)
    )
}

pub(crate) fn who(by: &Holder) -> String {
    format!(
        "client {} (application_name \"{}\", proxy {}, session {})",
        by.client_addr, by.application_name, by.proxy_id, by.session_id
    )
}

/// Inspection reads never claim and are never refused: marked by an
/// application_name pattern, by the SQL comment hint (only where
/// `claims.inspection_sql_hint` is on; the caller passes `sql_hint` false
/// otherwise), or by arriving on the listener dedicated to inspection.
pub fn is_inspection(
    application_name: &str,
    patterns: &[Regex],
    sql_hint: bool,
    inspection_listener: bool,
) -> bool {
    inspection_listener || sql_hint || patterns.iter().any(|p| p.is_match(application_name))
}

/// Whether `sql` carries [`INSPECTION_HINT`] in a `/* */` or `--` comment.
pub fn has_inspection_hint(sql: &str) -> bool {
    let mut rest = sql;
    while let Some(start) = rest.find(['/', '-']) {
        let tail = &rest[start..];
        let (body, next) = if let Some(after) = tail.strip_prefix("/*") {
            match after.find("*/") {
                Some(end) => (&after[..end], &after[end + 2..]),
                None => (after, ""),
            }
        } else if let Some(after) = tail.strip_prefix("--") {
            match after.find('\n') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        } else {
            rest = &tail[1..];
            continue;
        };
        if body.contains(INSPECTION_HINT) {
            return true;
        }
        rest = next;
    }
    false
}

#[cfg(test)]
mod tests;
