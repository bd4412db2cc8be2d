//! The store's updates, restated from its SQL: the sweep of holders whose
//! proxy process is gone, `try_claim` with the shipped claim rule,
//! `consume`, `holder_gone`, `keep_until`, `move_on`, `current_holder`, and
//! a proxy's evidence applied.

use resumeguard::claims::{ClaimOutcome, ClaimRecord, ClaimState, Holder, RunLease};

use super::claims_rule::decide_existing;
use super::{
    holder, proxy_index, ClaimsModel, Evidence, ProxyState, World, HOLDER_GONE_GRACE_MS, LAPSE_MS,
    RUN_LEASE_MS,
};

/// PostgreSQL's `sweep`: claims and leases of holders on another proxy
/// process that is gone count as if their connection had closed.
fn sweep(w: &mut World, reader_proxy: usize, gone_until: i64) {
    let dead = |w: &World, h: &Holder| {
        let p = proxy_index(h);
        p != reader_proxy && w.proxies.get(p).is_none_or(|s| *s == ProxyState::Down)
    };
    if let Some(c) = w.claim.clone() {
        if dead(w, &c.holder)
            && matches!(c.state, ClaimState::Held | ClaimState::Consumed)
            && c.abandon_at_ms.is_none()
        {
            let c = w.claim.as_mut().expect("checked above");
            c.abandon_at_ms = Some(gone_until);
            if c.state == ClaimState::Held {
                c.lapse_at_ms = c.lapse_at_ms.min(gone_until);
            }
        }
    }
    if let Some(l) = w.lease.clone() {
        if dead(w, &l.holder) && l.until_ms > gone_until {
            w.lease.as_mut().expect("checked above").until_ms = gone_until;
        }
    }
}

/// `try_claim`: the sweep, then the shipped rule on the existing row.
pub(super) fn try_claim(
    m: &ClaimsModel,
    w: &mut World,
    h: &Holder,
    reader_proxy: usize,
) -> ClaimOutcome {
    let now = w.now;
    let lapse_at = now + LAPSE_MS;
    let Some(prev) = w.claim.clone() else {
        let taken = ClaimRecord::taken(&m.key, h, now, lapse_at, 1);
        w.claim = Some(taken.clone());
        return ClaimOutcome::Taken(taken);
    };
    if !(prev.state == ClaimState::Held && prev.holder.same_session(h)) {
        sweep(w, reader_proxy, now + HOLDER_GONE_GRACE_MS);
    }
    let prev = w.claim.clone().expect("present above");
    let writing =
        prev.state == ClaimState::Consumed && w.lease.as_ref().is_some_and(|l| l.until_ms > now);
    let outcome = decide_existing(prev, h, now, lapse_at, writing);
    if let ClaimOutcome::Taken(r) | ClaimOutcome::TakenOver { now: r, .. } = &outcome {
        w.claim = Some(r.clone());
    }
    outcome
}

/// `consume` (and `move_on`'s consume): held claims taken by `taken_by`
/// become consumed and start their holder's run lease; live leases last
/// the run lease past this write.
pub(super) fn consume(w: &mut World, taken_by: i64) {
    let now = w.now;
    if let Some(c) = w.claim.as_mut() {
        if c.state == ClaimState::Held && c.claimed_at_ms <= taken_by {
            c.state = ClaimState::Consumed;
            c.consumed_at_ms = Some(now);
            w.lease = Some(RunLease {
                thread_id: c.key.at.thread_id.clone(),
                checkpoint_ns: c.key.at.checkpoint_ns.clone(),
                answered_checkpoint_id: c.key.at.checkpoint_id.clone(),
                fingerprint: c.key.fingerprint.clone(),
                holder: c.holder.clone(),
                answered_at_ms: now,
                last_write_ms: now,
                until_ms: now + RUN_LEASE_MS,
            });
        }
    }
    if let Some(l) = w.lease.as_mut() {
        if l.until_ms > now {
            l.last_write_ms = now;
            l.until_ms = l.until_ms.max(now + RUN_LEASE_MS);
        }
    }
}

/// `holder_gone`: the session's held claims lapse, its claims count as
/// abandoned and its leases end, no later than the grace from now.
fn holder_gone(w: &mut World, h: &Holder) {
    let until = w.now + HOLDER_GONE_GRACE_MS;
    if let Some(c) = w.claim.as_mut() {
        if c.holder.same_session(h) {
            if c.state == ClaimState::Held && c.lapse_at_ms > until {
                c.lapse_at_ms = until;
            }
            if matches!(c.state, ClaimState::Held | ClaimState::Consumed)
                && c.abandon_at_ms.is_none()
            {
                c.abandon_at_ms = Some(until);
            }
        }
    }
    if let Some(l) = w.lease.as_mut() {
        if l.holder.same_session(h) && l.until_ms > until {
            l.until_ms = until;
        }
    }
}

/// `keep_until`: generation `epoch`, held or consumed, neither lapses nor
/// counts as abandoned before `until`.
pub(super) fn keep_until(w: &mut World, epoch: i64, until: i64) -> bool {
    match w.claim.as_mut() {
        Some(c)
            if c.epoch == epoch && matches!(c.state, ClaimState::Held | ClaimState::Consumed) =>
        {
            if c.state == ClaimState::Held {
                c.lapse_at_ms = c.lapse_at_ms.max(until);
            }
            c.abandon_at_ms = c.abandon_at_ms.map(|at| at.max(until));
            true
        }
        _ => false,
    }
}

/// `move_on`: the thread put a checkpoint whose parent is the parked
/// one: every held claim on it is consumed, its rows superseded.
pub(super) fn move_on(w: &mut World) {
    consume(w, i64::MAX);
    let now = w.now;
    if let Some(c) = w.claim.as_mut() {
        c.superseded_at_ms.get_or_insert(now);
    }
}

/// `current_holder`: the held or consumed claim on the checkpoint.
pub(super) fn current_holder(w: &World) -> Option<ClaimRecord> {
    w.claim
        .clone()
        .filter(|c| matches!(c.state, ClaimState::Held | ClaimState::Consumed))
}

pub(super) fn apply(m: &ClaimsModel, w: &mut World, p: usize, ev: Evidence) {
    let h = holder(&m.bounds, m.reader_of(ev.session()));
    debug_assert_eq!(m.proxy_of(m.reader_of(ev.session())), p);
    match ev {
        Evidence::Consumed { written_at, .. } => consume(w, written_at),
        Evidence::MovedOn { .. } => move_on(w),
        Evidence::HolderGone { .. } => holder_gone(w, &h),
    }
}
