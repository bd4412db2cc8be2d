//! The names a session's statements and portals go by, as the server
//! holds them and as unconfirmed changes may leave them: what a message
//! naming one will meet when the server reaches it.

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;

use super::super::hooks::Hooks;
use super::super::messages::frontend::Target;
use super::super::refusal::Refusal;
use super::super::sql_commands::SqlCommand;
use super::sql_changes::SqlChanges;

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
    /// Boxed: only a watched portal has one, and queue entries carrying
    /// a Bind's portal move by value on every message.
    pub(super) annotation: Option<Box<P>>,
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
        commands: SqlChanges<H::Statement>,
        /// A simple Query drops the unnamed statement and portal.
        resets_unnamed: bool,
    },
}

impl<H: Hooks> Change<H> {
    /// What an answer changes: nothing to follow when nobody watches it,
    /// it runs no SQL command that changes statements and it drops no
    /// unnamed statement or portal (the queue entry then carries no
    /// change). Inlined: a change returned from a call is copied out of
    /// it, on every Execute.
    #[inline(always)]
    pub(super) fn answer(
        watch: Option<H::Watch>,
        commands: SqlChanges<H::Statement>,
        resets_unnamed: bool,
    ) -> Option<Self> {
        if watch.is_none() && commands.is_empty() && !resets_unnamed {
            return None;
        }
        Some(Change::Answer {
            watch: watch.map(Box::new),
            commands,
            resets_unnamed,
        })
    }
}

pub(super) struct Pending<H: Hooks> {
    /// The client's Sync count when the message was sent.
    pub(super) segment: u64,
    pub(super) change: Change<H>,
}

/// A statement name's state as the server will see it.
#[derive(Debug, PartialEq)]
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
        } else if self.named.is_empty() {
            // Usual for the unconfirmed changes: no name to hash.
            None
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

    /// Every one of them.
    #[cfg(test)]
    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.unnamed.iter().chain(self.named.values())
    }

    /// Changes the one called `name`, made first if there is none.
    pub(super) fn update(&mut self, name: &[u8], change: impl FnOnce(&mut T))
    where
        T: Default,
    {
        if name.is_empty() {
            change(self.unnamed.get_or_insert_with(T::default));
        } else if let Some(value) = self.named.get_mut(name) {
            change(value);
        } else {
            change(self.named.entry(name.to_vec()).or_default());
        }
    }

    /// Changes the one called `name`, if there is one: `change` says what
    /// it found and whether to keep it (the unnamed one is always kept, so
    /// what it holds stays allocated for the next round).
    pub(super) fn update_existing<R>(
        &mut self,
        name: &[u8],
        change: impl FnOnce(&mut T) -> (R, bool),
    ) -> Option<R> {
        if name.is_empty() {
            return self.unnamed.as_mut().map(|v| change(v).0);
        }
        let (found, keep) = change(self.named.get_mut(name)?);
        if !keep {
            self.named.remove(name);
        }
        Some(found)
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
                statements.insert(name, Statement::new(annotation));
            }
        }
        SqlCommand::Deallocate { name } => {
            statements.remove(&name);
        }
        // The unnamed statement is the protocol's, not SQL's.
        SqlCommand::DeallocateAll => statements.clear_named(),
        SqlCommand::Execute { .. }
        | SqlCommand::Declare { .. }
        | SqlCommand::Fetch { .. }
        | SqlCommand::Savepoint { .. }
        | SqlCommand::Release { .. }
        | SqlCommand::RollbackTo { .. } => {}
    }
}
