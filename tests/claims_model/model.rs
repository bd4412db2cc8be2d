//! The model's steps and properties: the initial world, which steps each
//! state allows, what each step does, and the properties checked (with the
//! reachability ones that say the search covers what they are about).

use stateright::{Model, Property};

use super::store::{apply, consume, move_on};
use super::{
    ClaimsModel, Evidence, Phase, ProxyState, Reader, Step, World, SHUTDOWN_GRACE_MS, T0, TICK_MS,
};

impl Model for ClaimsModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        let b = &self.bounds;
        vec![World {
            now: T0,
            proxies: vec![ProxyState::Up; b.proxies],
            readers: vec![
                Reader {
                    phase: Phase::Idle,
                    session: true,
                    client: true,
                    cut: false,
                    epoch: None,
                    fired: false,
                    saw_answer: false,
                    since: T0,
                    served_at: T0,
                };
                b.readers
            ],
            claim: None,
            lease: None,
            answered: false,
            head_moved: false,
            evidence: vec![Vec::new(); b.proxies],
            crashes: 0,
            kills: 0,
            drains: 0,
            stale_commit: None,
            answer_lost: false,
        }]
    }

    fn actions(&self, w: &World, steps: &mut Vec<Step>) {
        if self.time_may_pass(w) {
            steps.push(Step::Tick);
        }
        for (r, reader) in w.readers.iter().enumerate() {
            let up = w.proxies[self.proxy_of(r)] == ProxyState::Up;
            let live = reader.session && reader.client;
            match reader.phase {
                Phase::Idle if live && up => steps.push(Step::Read(r)),
                Phase::Waiting if live && up => steps.push(Step::Poll(r)),
                Phase::Served if live => steps.push(Step::Check(r)),
                Phase::Checked if live => steps.push(Step::Commit(r)),
                Phase::Answered if live => steps.push(Step::PutNext(r)),
                _ => {}
            }
            let running = matches!(
                reader.phase,
                Phase::Served | Phase::Checked | Phase::Answered
            );
            if running && reader.client && w.crashes < self.bounds.crashes {
                steps.push(Step::Crash(r));
            }
        }
        for (p, state) in w.proxies.iter().enumerate() {
            match *state {
                ProxyState::Up if w.drains < self.bounds.drains => steps.push(Step::Drain(p)),
                ProxyState::Draining { until } => {
                    let holding = w.readers.iter().enumerate().any(|(r, reader)| {
                        self.proxy_of(r) == p
                            && reader.session
                            && matches!(
                                reader.phase,
                                Phase::Served | Phase::Checked | Phase::Answered
                            )
                    });
                    if !holding || w.now >= until {
                        steps.push(Step::DrainEnd(p));
                    }
                }
                // The exit flush applies what the store takes; answers are
                // lost at exit only where they may wait.
                ProxyState::Flushing if self.bounds.evidence_waits || !self.answer_pending(w) => {
                    steps.push(Step::Exit(p))
                }
                _ => {}
            }
            if *state != ProxyState::Down && w.kills < self.bounds.kills {
                steps.push(Step::Kill(p));
            }
            if *state != ProxyState::Down && !w.evidence[p].is_empty() {
                steps.push(Step::Apply(p));
            }
        }
    }

    fn next_state(&self, last: &World, step: Step) -> Option<World> {
        let mut w = last.clone();
        match step {
            Step::Tick => w.now += TICK_MS,
            Step::Read(r) => {
                if w.head_moved {
                    w.readers[r].phase = Phase::Late;
                } else {
                    w.readers[r].saw_answer = w.answered;
                    self.ask(&mut w, r);
                }
            }
            Step::Poll(r) => self.ask(&mut w, r),
            Step::Check(r) => {
                if self.fence(&mut w, r) {
                    w.readers[r].phase = Phase::Checked;
                    w.readers[r].since = w.now;
                } else {
                    w.readers[r].phase = Phase::Fenced;
                }
            }
            Step::Commit(r) => {
                self.commit(&mut w, r);
                w.answered = true;
                if self.bounds.answer_in_write {
                    let now = w.now;
                    consume(&mut w, now);
                }
                w.readers[r].phase = Phase::Answered;
                let ev = Evidence::Consumed {
                    session: r as u64 + 1,
                    written_at: w.now,
                };
                self.send(&mut w, r, ev);
            }
            Step::PutNext(r) => {
                if self.fence(&mut w, r) {
                    self.commit(&mut w, r);
                    w.head_moved = true;
                    if self.bounds.answer_in_write {
                        move_on(&mut w);
                    }
                    w.readers[r].phase = Phase::Done;
                    let ev = Evidence::MovedOn {
                        session: r as u64 + 1,
                    };
                    self.send(&mut w, r, ev);
                } else {
                    w.readers[r].phase = Phase::Fenced;
                }
            }
            Step::Crash(r) => {
                w.crashes += 1;
                w.readers[r].client = false;
                w.readers[r].cut = true;
                self.close(&mut w, r);
            }
            Step::Kill(p) => {
                w.kills += 1;
                w.proxies[p] = ProxyState::Down;
                w.answer_lost |= self.lost_answer(&w.evidence[p]);
                w.evidence[p].clear();
                for r in (0..w.readers.len()).filter(|r| self.proxy_of(*r) == p) {
                    if w.readers[r].session {
                        w.readers[r].session = false;
                        w.readers[r].cut = true;
                    }
                }
            }
            Step::Drain(p) => {
                w.drains += 1;
                w.proxies[p] = ProxyState::Draining {
                    until: w.now + SHUTDOWN_GRACE_MS,
                };
                // Waiting readers are refused at once; no new read is served.
                for r in (0..w.readers.len()).filter(|r| self.proxy_of(*r) == p) {
                    if matches!(w.readers[r].phase, Phase::Idle | Phase::Waiting) {
                        w.readers[r].phase = Phase::Refused;
                    }
                }
            }
            Step::DrainEnd(p) => {
                for r in (0..w.readers.len()).filter(|r| self.proxy_of(*r) == p) {
                    self.close(&mut w, r);
                }
                w.proxies[p] = ProxyState::Flushing;
            }
            Step::Exit(p) => {
                w.proxies[p] = ProxyState::Down;
                w.answer_lost |= self.lost_answer(&w.evidence[p]);
                w.evidence[p].clear();
            }
            Step::Apply(p) => {
                let ev = w.evidence[p].remove(0);
                apply(self, &mut w, p, ev);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // A run cut by a crash after its serve, or an answer whose
            // evidence died with its proxy, may be run again (by design).
            Property::always("one gated run per answer", |_, w: &World| {
                w.answer_lost || w.readers.iter().filter(|r| r.fired && !r.cut).count() <= 1
            }),
            Property::always("no fenced write commits", |_, w: &World| {
                w.stale_commit.is_none()
            }),
            Property::always(
                "no thread stranded once its holders are gone",
                |m, w: &World| {
                    let holders_gone = w.readers.iter().all(|r| r.epoch.is_none() || !r.session);
                    w.head_moved || !holders_gone || !m.stranded(w)
                },
            ),
            // Reachability: the search covers what the properties are about.
            // (Each holds trivially where its fault is not in the bounds.)
            Property::sometimes("a takeover runs the node after a crash", |m, w: &World| {
                m.bounds.crashes + m.bounds.kills == 0
                    || w.readers.iter().filter(|r| r.fired).count() >= 2
            }),
            Property::sometimes("a drained holder's run moves on", |m, w: &World| {
                m.bounds.drains == 0 || w.head_moved && w.proxies.contains(&ProxyState::Flushing)
            }),
            // Only a holder slower than its lapse is ever fenced.
            Property::sometimes("a racer is fenced", |m, w: &World| {
                !m.bounds.slow_runs || w.readers.iter().any(|r| r.phase == Phase::Fenced)
            }),
        ]
    }
}
