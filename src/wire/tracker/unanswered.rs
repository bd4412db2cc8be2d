//! What the messages still waiting for the server's answer will change,
//! indexed by name, so that a message naming a statement or portal learns
//! what the server will meet when it gets there in constant time, however
//! deep the pipeline.
//!
//! Kept in step with the response queue: a change is added when its
//! message is queued, and forgotten, oldest first, when its entry leaves
//! the queue (answered, or skipped after an error); an answer's SQL
//! commands are forgotten one by one as the server confirms them.
//!
//! One name's unanswered changes are kept oldest first, with alike
//! neighbours merged into runs: what a lookup asks of them (the latest
//! change, and whether every change leaves the name alike its confirmed
//! state) is answered in constant time however many changes wait.

use std::collections::VecDeque;

use super::super::hooks::Hooks;
use super::super::messages::frontend::Target;
use super::super::sql_commands::SqlCommand;
use super::names::{Change, Lookup, Names, Pending, Portal, Statement};
use super::sql_changes::{Confirmed, SqlChanges};

/// Runs kept allocated once a name's changes are all answered; a deep
/// pipeline's larger buffer is let go.
const KEEP_RUNS: usize = 64;

/// States of a name that no lookup tells apart: a change to one of them
/// cannot matter to a name in another of them.
trait Alike {
    fn alike(a: Option<&Self>, b: Option<&Self>) -> bool;
}

/// When a change was sent: its place among every change the tracker
/// queued, and the client's Sync count then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    order: u64,
    segment: u64,
}

/// Consecutive changes alike one another.
#[derive(Debug)]
struct Run<T> {
    /// The name's state after the latest of them.
    effect: Option<T>,
    count: usize,
    /// The latest of them.
    latest: Sent,
}

/// One name's unanswered changes, oldest first, alike neighbours merged.
#[derive(Debug)]
struct NameChanges<T> {
    runs: VecDeque<Run<T>>,
}

impl<T> Default for NameChanges<T> {
    fn default() -> Self {
        NameChanges {
            runs: VecDeque::new(),
        }
    }
}

impl<T: Alike> NameChanges<T> {
    fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Adds the newest change: the name holds `effect` once it applies.
    fn push_newest(&mut self, sent: Sent, effect: Option<T>) {
        if let Some(run) = self.runs.back_mut() {
            if T::alike(run.effect.as_ref(), effect.as_ref()) {
                run.effect = effect;
                run.count += 1;
                run.latest = sent;
                return;
            }
        }
        self.runs.push_back(Run {
            effect,
            count: 1,
            latest: sent,
        });
    }

    /// Forgets the oldest change (answered, or skipped by the server).
    /// False when there was none.
    fn pop_oldest(&mut self) -> bool {
        let Some(run) = self.runs.front_mut() else {
            return false;
        };
        run.count -= 1;
        if run.count == 0 {
            self.runs.pop_front();
            if self.runs.is_empty() && self.runs.capacity() > KEEP_RUNS {
                self.runs.shrink_to(KEEP_RUNS);
            }
        }
        true
    }

    /// The newest change: when it was sent, and what it leaves.
    fn latest(&self) -> Option<(Sent, Option<&T>)> {
        self.runs.back().map(|r| (r.latest, r.effect.as_ref()))
    }

    /// Whether every change leaves the name alike `confirmed`.
    fn all_alike(&self, confirmed: Option<&T>) -> bool {
        match self.runs.len() {
            0 => true,
            // Alike neighbours are merged: two runs differ from each
            // other, so one of them differs from `confirmed`.
            1 => self
                .runs
                .front()
                .is_some_and(|r| T::alike(r.effect.as_ref(), confirmed)),
            _ => false,
        }
    }
}

/// A statement name's unanswered changes.
#[derive(Debug)]
struct StatementChanges<S> {
    changes: NameChanges<Statement<S>>,
    /// Unanswered answers that forget every statement and then name this
    /// one: they do not leave it forgotten.
    spared: usize,
}

impl<S> Default for StatementChanges<S> {
    fn default() -> Self {
        StatementChanges {
            changes: NameChanges::default(),
            spared: 0,
        }
    }
}

impl<S: PartialEq> StatementChanges<S> {
    fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.spared == 0
    }
}

impl<S: PartialEq> Alike for Statement<S> {
    fn alike(a: Option<&Self>, b: Option<&Self>) -> bool {
        a == b
    }
}

impl<P, S> Alike for Portal<P, S> {
    /// Two unwatched portals are alike whatever they run.
    fn alike(a: Option<&Self>, b: Option<&Self>) -> bool {
        a.is_none_or(Portal::is_plain) && b.is_none_or(Portal::is_plain)
    }
}

/// What a statement will hold after a change.
enum StatementEffect<'a, S> {
    Defined(&'a Statement<S>),
    /// SQL `PREPARE` of a statement with this annotation.
    Prepared(&'a S),
    Gone,
}

impl<S: Clone> StatementEffect<'_, S> {
    fn to_owned(&self) -> Option<Statement<S>> {
        match self {
            StatementEffect::Defined(s) => Some(Statement::clone(s)),
            StatementEffect::Prepared(s) => Some(Statement::new(S::clone(s))),
            StatementEffect::Gone => None,
        }
    }
}

/// One thing a queued change does to the names.
enum Touch<'a, H: Hooks> {
    Statement {
        name: &'a [u8],
        effect: StatementEffect<'a, H::Statement>,
        /// The same answer forgets every statement first.
        spared: bool,
    },
    Portal {
        name: &'a [u8],
        effect: Option<&'a Portal<H::Portal, H::Statement>>,
    },
    /// Every statement is forgotten.
    ForgetAll,
}

/// Every touch of `change`, the same whether it is being added or
/// forgotten, so the two stay each other's inverse.
fn touches<'a, H: Hooks>(change: &'a Change<H>, mut touch: impl FnMut(Touch<'a, H>)) {
    match change {
        Change::Define { name, statement } => touch(Touch::Statement {
            name,
            effect: StatementEffect::Defined(statement),
            spared: false,
        }),
        Change::Bind { portal, binding } => touch(Touch::Portal {
            name: portal,
            effect: Some(binding),
        }),
        Change::Close {
            target: Target::Statement,
            name,
        } => touch(Touch::Statement {
            name,
            effect: StatementEffect::Gone,
            spared: false,
        }),
        Change::Close {
            target: Target::Portal,
            name,
        } => touch(Touch::Portal { name, effect: None }),
        Change::Answer {
            commands,
            resets_unnamed,
            ..
        } => {
            if *resets_unnamed {
                touch(Touch::Statement {
                    name: b"",
                    effect: StatementEffect::Gone,
                    spared: false,
                });
                touch(Touch::Portal {
                    name: b"",
                    effect: None,
                });
            }
            let forgets_all = commands.forgets_all();
            for (name, defines) in commands.decided() {
                touch(Touch::Statement {
                    name,
                    effect: match defines {
                        Some(annotation) => StatementEffect::Prepared(annotation),
                        None => StatementEffect::Gone,
                    },
                    spared: forgets_all,
                });
            }
            if forgets_all {
                touch(Touch::ForgetAll);
            }
        }
    }
}

pub(super) struct Unanswered<H: Hooks> {
    /// Order of the next change added.
    next_order: u64,
    statements: Names<StatementChanges<H::Statement>>,
    portals: Names<NameChanges<Portal<H::Portal, H::Statement>>>,
    /// Answers still to forget every statement (`DEALLOCATE ALL`,
    /// `DISCARD ALL`), oldest first.
    forget_all: VecDeque<Sent>,
    /// How many changes wait, by the client's Sync count when they were
    /// sent, oldest first.
    segments: VecDeque<(u64, usize)>,
}

impl<H: Hooks> Default for Unanswered<H> {
    fn default() -> Self {
        Unanswered {
            next_order: 0,
            statements: Names::default(),
            portals: Names::default(),
            forget_all: VecDeque::new(),
            segments: VecDeque::new(),
        }
    }
}

/// A change to forget was not there: the index and the queue disagree.
/// Never expected; loud rather than silent.
fn lost(what: &str) {
    debug_assert!(false, "unanswered changes out of step: {what}");
    tracing::error!(
        what,
        "unanswered changes out of step with the response queue"
    );
}

impl<H: Hooks> Unanswered<H> {
    /// Adds a change just queued.
    pub(super) fn add(&mut self, pending: &Pending<H>) {
        let sent = Sent {
            order: self.next_order,
            segment: pending.segment,
        };
        self.next_order += 1;
        match self.segments.back_mut() {
            Some((segment, n)) if *segment == pending.segment => *n += 1,
            _ => self.segments.push_back((pending.segment, 1)),
        }
        touches(&pending.change, |t| self.apply(sent, t));
    }

    fn apply(&mut self, sent: Sent, touch: Touch<'_, H>) {
        match touch {
            Touch::Statement {
                name,
                effect,
                spared,
            } => self.statements.update(name, |s| {
                s.changes.push_newest(sent, effect.to_owned());
                s.spared += usize::from(spared);
            }),
            Touch::Portal { name, effect } => self
                .portals
                .update(name, |p| p.push_newest(sent, effect.cloned())),
            Touch::ForgetAll => self.forget_all.push_back(sent),
        }
    }

    /// Forgets the oldest change: its queue entry left the queue.
    pub(super) fn forget_oldest(&mut self, pending: &Pending<H>) {
        match self.segments.front_mut() {
            Some((_, n)) if *n > 1 => *n -= 1,
            Some(_) => {
                self.segments.pop_front();
            }
            None => lost("segment"),
        }
        touches(&pending.change, |t| self.unapply(t));
    }

    fn unapply(&mut self, touch: Touch<'_, H>) {
        match touch {
            Touch::Statement { name, spared, .. } => self.forget_statement(name, spared),
            Touch::Portal { name, .. } => {
                let found = self.portals.update_existing(name, |p| {
                    let popped = p.pop_oldest();
                    (popped, !p.is_empty())
                });
                if found != Some(true) {
                    lost("portal");
                }
            }
            Touch::ForgetAll => self.forget_forget_all(),
        }
    }

    fn forget_statement(&mut self, name: &[u8], spared: bool) {
        let found = self.statements.update_existing(name, |s| {
            let popped = s.changes.pop_oldest();
            let unspared = !spared || s.spared > 0;
            if spared {
                s.spared = s.spared.saturating_sub(1);
            }
            (popped && unspared, !s.is_empty())
        });
        if found != Some(true) {
            lost("statement");
        }
    }

    fn forget_forget_all(&mut self) {
        if self.forget_all.pop_front().is_none() {
            lost("DEALLOCATE ALL");
        }
    }

    /// The oldest entry's SQL command `confirmed` was applied; `rest` is
    /// what of its commands is left.
    pub(super) fn sql_confirmed(
        &mut self,
        confirmed: &Confirmed<H::Statement>,
        rest: &SqlChanges<H::Statement>,
    ) {
        if confirmed.decided {
            let name = match &confirmed.command {
                SqlCommand::Prepare { name, .. } | SqlCommand::Deallocate { name } => name,
                _ => {
                    lost("decided command without a name");
                    return;
                }
            };
            // Decided means after the answer's last DEALLOCATE ALL, which
            // is applied by now: nothing spares it any more.
            self.forget_statement(name, false);
        }
        if confirmed.ended_forget_all {
            self.forget_forget_all();
            // What the answer names after it is no longer spared by it.
            for (name, _) in rest.decided() {
                let found = self.statements.update_existing(name, |s| {
                    let had = s.spared > 0;
                    s.spared = s.spared.saturating_sub(1);
                    (had, !s.is_empty())
                });
                if found != Some(true) {
                    lost("spared statement");
                }
            }
        }
    }

    /// Nothing is indexed (every name left is an unnamed slot kept for
    /// the next round, with nothing in it).
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.statements.values().all(StatementChanges::is_empty)
            && self.portals.values().all(NameChanges::is_empty)
            && self.forget_all.is_empty()
            && self.segments.is_empty()
    }

    /// Whether a change waiting for its answer names the unnamed
    /// statement or portal.
    pub(super) fn names_unnamed(&self) -> bool {
        self.statements.get(b"").is_some_and(|s| !s.is_empty())
            || self.portals.get(b"").is_some_and(|p| !p.is_empty())
    }

    /// No change sent before the latest Sync (`now`) waits for its answer.
    pub(super) fn settled(&self, now: u64) -> bool {
        self.segments.front().is_none_or(|(s, _)| *s >= now)
    }

    /// A statement name as the server will see it when it reaches the
    /// message being tracked now (`now`: the client's Sync count), from
    /// its `confirmed` state and the changes still unanswered.
    pub(super) fn statement<'a>(
        &'a self,
        name: &[u8],
        confirmed: Option<&'a Statement<H::Statement>>,
        now: u64,
    ) -> Lookup<&'a Statement<H::Statement>> {
        let own = self.statements.get(name);
        let mut latest = own.and_then(|o| o.changes.latest());
        if let Some(&forget) = self.forget_all.back() {
            // An answer that forgets all and then names this one is later
            // than its own forgetting.
            if latest.is_none_or(|(sent, _)| forget.order > sent.order) {
                latest = Some((forget, None));
            }
        }
        settle(confirmed, latest, now, || {
            let spared = own.map_or(0, |o| o.spared);
            own.is_none_or(|o| o.changes.all_alike(confirmed))
                && (self.forget_all.len() <= spared || Statement::alike(None, confirmed))
        })
    }

    pub(super) fn portal<'a>(
        &'a self,
        name: &[u8],
        confirmed: Option<&'a Portal<H::Portal, H::Statement>>,
        now: u64,
    ) -> Lookup<&'a Portal<H::Portal, H::Statement>> {
        let own = self.portals.get(name);
        let latest = own.and_then(NameChanges::latest);
        settle(confirmed, latest, now, || {
            own.is_none_or(|o| o.all_alike(confirmed))
        })
    }
}

/// The state a name will have, from its confirmed state, its latest
/// unanswered change and whether every one of them leaves it alike the
/// confirmed state (asked only when the latest change was sent before
/// the latest Sync).
fn settle<'a, T>(
    confirmed: Option<&'a T>,
    latest: Option<(Sent, Option<&'a T>)>,
    now: u64,
    all_alike: impl FnOnce() -> bool,
) -> Lookup<&'a T> {
    match latest {
        None => Lookup::Known(confirmed),
        // A change sent since the latest Sync: if it fails, the server
        // skips everything up to the next Sync, this message included.
        Some((sent, effect)) if sent.segment == now => Lookup::Known(effect),
        // Whichever of the earlier changes the server accepts, the name
        // ends up the same.
        Some(_) if all_alike() => Lookup::Known(confirmed),
        Some(_) => Lookup::Ambiguous,
    }
}

#[cfg(test)]
mod tests;
