//! The names a session's statements and portals go by, as the server
//! holds them and as unconfirmed changes may leave them: what a message
//! naming one will meet when the server reaches it.

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;

use super::super::frontend::Target;
use super::super::hooks::{Hooks, Refusal};
use super::super::sql_commands::SqlCommand;
use super::Tracker;

/// SQL-level commands of a text, each `PREPARE` with the annotation of
/// the statement it defines.
pub(super) type Commands<S> = Vec<(SqlCommand, Option<S>)>;

/// Shared SQL-level commands; `None` for the usual text with none (no
/// allocation on the hot path).
pub(super) type SharedCommands<S> = Option<Arc<Commands<S>>>;

pub(super) fn commands_of<S>(shared: &SharedCommands<S>) -> &[(SqlCommand, Option<S>)] {
    shared.as_deref().map_or(&[], Vec::as_slice)
}

/// A statement as the server holds it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Statement<S> {
    pub(super) annotation: S,
    /// SQL-level commands its text runs (`EXECUTE x` sent through Parse).
    pub(super) commands: SharedCommands<S>,
    /// Set when its text must not run.
    /// Boxed: rare, and queue entries move by value on every message.
    pub(super) refused: Option<Box<Refusal>>,
}

impl<S> Statement<S> {
    pub(super) fn new(annotation: S) -> Self {
        Statement {
            annotation,
            commands: None,
            refused: None,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Portal<P, S> {
    pub(super) annotation: Option<P>,
    pub(super) commands: SharedCommands<S>,
}

impl<P, S> Portal<P, S> {
    /// A portal nobody watches: the proxy may let it run unseen.
    pub(super) fn is_plain(&self) -> bool {
        self.annotation.is_none() && self.commands.is_none()
    }
}

/// The outcome of checking a text's SQL `EXECUTE`s.
pub(super) enum Executes {
    Allowed,
    Refused(Refusal),
    Ambiguous,
}

/// A change the server has not confirmed yet, riding on its queue entry.
pub(super) enum Change<H: Hooks> {
    Define {
        name: Vec<u8>,
        statement: Statement<H::Statement>,
    },
    Bind {
        portal: Vec<u8>,
        binding: Portal<H::Portal, H::Statement>,
    },
    Close {
        target: Target,
        name: Vec<u8>,
    },
    /// An Execute, Describe or Query: its watch, and the SQL commands
    /// whose CommandComplete changes statements.
    Answer {
        watch: Option<Box<H::Watch>>,
        commands: Commands<H::Statement>,
        /// A simple Query drops the unnamed statement and portal.
        resets_unnamed: bool,
    },
}

pub(super) struct Pending<H: Hooks> {
    /// The client's Sync count when the message was sent.
    pub(super) segment: u64,
    pub(super) change: Change<H>,
}

/// A statement name's state as the server will see it.
pub(super) enum Lookup<S> {
    Known(Option<S>),
    /// Depends on answers still owed for an earlier Sync.
    Ambiguous,
}

/// Statements or portals by name. The unnamed one — a fresh Parse or
/// Bind in every extended-protocol round of most drivers — has a slot of
/// its own, so the hot path hashes nothing; named ones hash with a fast
/// non-cryptographic hasher (names come from the session's own client).
#[derive(Debug)]
pub(super) struct Names<T> {
    unnamed: Option<T>,
    named: HashMap<Vec<u8>, T, RandomState>,
}

impl<T> Default for Names<T> {
    fn default() -> Self {
        Names {
            unnamed: None,
            named: HashMap::default(),
        }
    }
}

impl<T> Names<T> {
    pub(super) fn get(&self, name: &[u8]) -> Option<&T> {
        if name.is_empty() {
            self.unnamed.as_ref()
        } else {
            self.named.get(name)
        }
    }

    pub(super) fn insert(&mut self, name: Vec<u8>, value: T) {
        if name.is_empty() {
            self.unnamed = Some(value);
        } else {
            self.named.insert(name, value);
        }
    }

    pub(super) fn remove(&mut self, name: &[u8]) {
        if name.is_empty() {
            self.unnamed = None;
        } else {
            self.named.remove(name);
        }
    }

    pub(super) fn clear(&mut self) {
        self.unnamed = None;
        self.named.clear();
    }

    /// Forgets every named one (the unnamed one is the protocol's).
    pub(super) fn clear_named(&mut self) {
        self.named.clear();
    }
}

impl<H: Hooks> Tracker<H> {
    /// A statement name as the server will see it when it reaches the
    /// message being tracked now.
    pub(super) fn statement(&self, name: &[u8]) -> Lookup<Statement<H::Statement>> {
        let mut lookup = Settle::new(self.statements.get(name).cloned(), self.segment);
        for p in self.queue.payloads() {
            let effect = match &p.change {
                Change::Define { name: n, statement } if n == name => Some(statement.clone()),
                Change::Close {
                    target: Target::Statement,
                    name: n,
                } if n == name => None,
                Change::Answer {
                    resets_unnamed: true,
                    ..
                } if name.is_empty() => None,
                Change::Answer { commands, .. } => {
                    let found = commands.iter().rev().find_map(|(c, s)| match c {
                        SqlCommand::Prepare { name: n, .. } if n.as_bytes() == name => {
                            Some(s.clone().map(Statement::new))
                        }
                        SqlCommand::Deallocate { name: n } if n.as_bytes() == name => Some(None),
                        SqlCommand::DeallocateAll => Some(None),
                        _ => None,
                    });
                    match found {
                        Some(effect) => effect,
                        None => continue,
                    }
                }
                _ => continue,
            };
            lookup.change(p.segment, effect, |a, b| a == b);
        }
        lookup.finish()
    }

    pub(super) fn portal(&self, name: &[u8]) -> Lookup<Portal<H::Portal, H::Statement>> {
        // Two unwatched portals are alike whatever they run.
        let plain = |p: &Option<Portal<_, _>>| p.as_ref().is_none_or(Portal::is_plain);
        let mut lookup = Settle::new(self.portals.get(name).cloned(), self.segment);
        for p in self.queue.payloads() {
            let effect = match &p.change {
                Change::Bind { portal, binding } if portal == name => Some(binding.clone()),
                Change::Close {
                    target: Target::Portal,
                    name: n,
                } if n == name => None,
                Change::Answer {
                    resets_unnamed: true,
                    ..
                } if name.is_empty() => None,
                _ => continue,
            };
            lookup.change(p.segment, effect, |a, b| plain(a) && plain(b));
        }
        lookup.finish()
    }
}

/// The state a name will have, from its confirmed state and the
/// unconfirmed changes to it, fed oldest first.
struct Settle<T> {
    confirmed: Option<T>,
    segment: u64,
    last: Option<(u64, Option<T>)>,
    /// Some earlier change would leave the name unlike its confirmed state.
    differs: bool,
}

impl<T> Settle<T> {
    fn new(confirmed: Option<T>, segment: u64) -> Self {
        Settle {
            confirmed,
            segment,
            last: None,
            differs: false,
        }
    }

    fn change(
        &mut self,
        segment: u64,
        effect: Option<T>,
        same: impl Fn(&Option<T>, &Option<T>) -> bool,
    ) {
        self.differs |= !same(&effect, &self.confirmed);
        self.last = Some((segment, effect));
    }

    fn finish(self) -> Lookup<T> {
        match self.last {
            None => Lookup::Known(self.confirmed),
            // A change sent since the latest Sync: if it fails, the server
            // skips everything up to the next Sync, this message included.
            Some((s, effect)) if s == self.segment => Lookup::Known(effect),
            // Whichever of the earlier changes the server accepts, the name
            // ends up the same.
            Some(_) if !self.differs => Lookup::Known(self.confirmed),
            Some(_) => Lookup::Ambiguous,
        }
    }
}

pub(super) fn apply_command<S>(
    statements: &mut Names<Statement<S>>,
    command: SqlCommand,
    defines: Option<S>,
) {
    match command {
        SqlCommand::Prepare { name, .. } => {
            if let Some(annotation) = defines {
                statements.insert(name.into_bytes(), Statement::new(annotation));
            }
        }
        SqlCommand::Deallocate { name } => {
            statements.remove(name.as_bytes());
        }
        // The unnamed statement is the protocol's, not SQL's.
        SqlCommand::DeallocateAll => statements.clear_named(),
        SqlCommand::Execute { .. } | SqlCommand::Declare { .. } => {}
    }
}
