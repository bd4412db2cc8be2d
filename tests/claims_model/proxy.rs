//! The proxy's gate and fence, with the shipped decisions: a read asks the
//! store and is served, refused or kept waiting; a write is fenced or
//! accepted with its commit cover; sessions close and send evidence; and
//! the timing assumptions under which time may pass.

use resumeguard::claims::{ClaimOutcome, Holder};
use resumeguard::policy::claims::{
    commit_cover, decide_at, decide_write, ClaimDecision, WaitPolicy, WriteVerdict, Writer,
    COMMIT_COVER_MS,
};

use super::store::{apply, current_holder, keep_until, try_claim};
use super::{
    holder, proxy_id, ClaimsModel, Evidence, Phase, ProxyState, Reader, World, LAPSE_MS,
    LONG_AFTER_MS, T0, TICK_MS, WAIT,
};

impl ClaimsModel {
    /// The gate asks the store and decides (`ClaimsLeg::resolve`, one
    /// round of its loop).
    pub(super) fn ask(&self, w: &mut World, r: usize) {
        let h = holder(&self.bounds, r);
        let waited = match w.readers[r].phase {
            Phase::Waiting => w.now - w.readers[r].since,
            _ => 0,
        };
        let outcome = try_claim(self, w, &h, self.proxy_of(r));
        let epoch = match &outcome {
            ClaimOutcome::Taken(c)
            | ClaimOutcome::AlreadyHeld(c)
            | ClaimOutcome::TakenOver { now: c, .. } => Some(c.epoch),
            _ => None,
        };
        let reader = &mut w.readers[r];
        match decide_at(&Ok(outcome), &WAIT, waited, w.now) {
            ClaimDecision::Serve { .. } => {
                reader.epoch = epoch;
                reader.served_at = w.now;
                // A node served its parked head runs: its effect counts from
                // here, whatever happens to the connection.
                reader.fired = !reader.saw_answer;
                reader.phase = if reader.saw_answer {
                    Phase::Answered
                } else {
                    Phase::Served
                };
            }
            ClaimDecision::Refuse { .. } => reader.phase = Phase::Refused,
            ClaimDecision::RetryAfter { .. } => {
                if reader.phase != Phase::Waiting {
                    reader.since = w.now;
                }
                reader.phase = Phase::Waiting;
            }
        }
    }

    /// The fence on a write of reader `r`'s run continuing the parked
    /// checkpoint (`enforce::fencing`'s store lookup): accepted (with the
    /// claim kept through the commit) or fenced.
    pub(super) fn fence(&self, w: &mut World, r: usize) -> bool {
        let h = holder(&self.bounds, r);
        let took: Vec<(String, i64)> = w.readers[r]
            .epoch
            .map(|e| (self.key.fingerprint.clone(), e))
            .into_iter()
            .collect();
        let writer = Writer {
            session: &h,
            took: &took,
            known_claimed: true,
        };
        let current = current_holder(w);
        let verdict = decide_write(&writer, &Ok(current.clone()));
        if let (Some(c), WriteVerdict::Accept(_)) = (&current, &verdict) {
            if let Some(until) = commit_cover(&verdict, c, w.now) {
                if !keep_until(w, c.epoch, until) {
                    return false;
                }
            }
        }
        matches!(verdict, WriteVerdict::Accept(_))
    }

    /// A write of reader `r` commits: it must still be the holder.
    pub(super) fn commit(&self, w: &mut World, r: usize) {
        let h = holder(&self.bounds, r);
        let mine = current_holder(w)
            .is_none_or(|c| c.holder.same_session(&h) && Some(c.epoch) == w.readers[r].epoch);
        if !mine {
            w.stale_commit.get_or_insert(r);
        }
    }

    pub(super) fn send(&self, w: &mut World, r: usize, ev: Evidence) {
        let p = self.proxy_of(r);
        if w.proxies[p] != ProxyState::Down {
            w.evidence[p].push(ev);
        }
    }

    /// A session closes: the proxy sends its holder-gone evidence.
    pub(super) fn close(&self, w: &mut World, r: usize) {
        if w.readers[r].session {
            w.readers[r].session = false;
            if w.readers[r].epoch.is_some() {
                self.send(
                    w,
                    r,
                    Evidence::HolderGone {
                        session: r as u64 + 1,
                    },
                );
            }
        }
    }

    /// Whether time may pass one tick: the modelling assumptions that a
    /// live client's gated node reaches its write before its claim's lapse,
    /// and a write passed by the fence commits within the commit cover.
    pub(super) fn time_may_pass(&self, w: &World) -> bool {
        let next = w.now + TICK_MS;
        if next > T0 + self.bounds.horizon_ms {
            return false;
        }
        if !self.bounds.evidence_waits && self.answer_pending(w) {
            return false;
        }
        // A run of a live client reaches its next checkpoint within its
        // lapse from its serve (slow runs: any time later).
        let prompt = |r: &Reader| self.bounds.slow_runs || next < r.served_at + LAPSE_MS;
        w.readers.iter().all(|r| {
            let live = r.client && r.session;
            match r.phase {
                Phase::Checked if live => next < r.since + COMMIT_COVER_MS && prompt(r),
                Phase::Served | Phase::Answered if live => prompt(r),
                _ => true,
            }
        })
    }

    /// Whether evidence of an answer waits in a live proxy's queue.
    pub(super) fn answer_pending(&self, w: &World) -> bool {
        w.proxies
            .iter()
            .zip(&w.evidence)
            .any(|(p, queue)| *p != ProxyState::Down && self.lost_answer(queue))
    }

    /// Whether a queue about to be lost holds evidence of an answer that
    /// only it would record (not when its write recorded it).
    pub(super) fn lost_answer(&self, queue: &[Evidence]) -> bool {
        !self.bounds.answer_in_write && queue.iter().any(Evidence::answers)
    }

    /// Whether a reader arriving long after now, through a new proxy, with
    /// every pending evidence of a live proxy applied, is refused the
    /// interrupt although the thread never moved on.
    pub(super) fn stranded(&self, w: &World) -> bool {
        let mut s = w.clone();
        for p in 0..s.proxies.len() {
            if s.proxies[p] != ProxyState::Down {
                for ev in std::mem::take(&mut s.evidence[p]) {
                    apply(self, &mut s, p, ev);
                }
            }
        }
        let fresh = Holder {
            proxy_id: proxy_id(s.proxies.len()),
            session_id: 1_000,
            client_addr: "10.0.1.1:50000".to_owned(),
            application_name: "agent".to_owned(),
        };
        s.proxies.push(ProxyState::Up);
        let fresh_proxy = s.proxies.len() - 1;
        // The first ask finds gone holders (the sweep), the next one after
        // their grace takes what they left.
        s.now += LONG_AFTER_MS;
        try_claim(self, &mut s, &fresh, fresh_proxy);
        s.now += LONG_AFTER_MS;
        let outcome = try_claim(self, &mut s, &fresh, fresh_proxy);
        !matches!(
            decide_at(&Ok(outcome), &WaitPolicy::Refuse, 0, s.now),
            ClaimDecision::Serve { .. }
        )
    }
}
