//! The SQL `PREPARE` / `DEALLOCATE` and savepoint commands one answer
//! still owes confirmation for, in text order: each is applied when its
//! CommandComplete arrives, and each `PREPARE` / `DEALLOCATE` knows
//! whether it decides what its statement will hold once the answer is
//! over, so the tracker's index of unanswered changes follows them one
//! confirmation at a time.

use std::collections::HashSet;

use super::super::sql_commands::SqlCommand;

/// One namespace-changing command of an answer.
#[derive(Debug)]
pub(super) struct SqlChange<S> {
    pub(super) command: SqlCommand,
    /// For `PREPARE`: the annotation of the statement it defines.
    pub(super) defines: Option<S>,
    /// The last command of the answer to name its statement, after any
    /// `DEALLOCATE ALL`: what the statement holds once the answer is over.
    pub(super) decides: bool,
}

/// An answer's changes: none for almost every answer, so the queue entry
/// carrying them stays one pointer wide and nothing is allocated.
#[derive(Debug)]
pub(super) struct SqlChanges<S>(Option<Box<Changes<S>>>);

#[derive(Debug)]
struct Changes<S> {
    changes: Vec<SqlChange<S>>,
    /// Changes before this one are applied.
    next: usize,
    /// The last `DEALLOCATE ALL` (or `DISCARD ALL`) among them.
    forget_all_at: Option<usize>,
}

/// A change the server just confirmed.
pub(super) struct Confirmed<S> {
    pub(super) command: SqlCommand,
    pub(super) defines: Option<S>,
    pub(super) decided: bool,
    /// It was the answer's last `DEALLOCATE ALL`.
    pub(super) ended_forget_all: bool,
}

impl<S> Default for SqlChanges<S> {
    fn default() -> Self {
        SqlChanges(None)
    }
}

/// The statement name a command names, if it names one.
fn named(command: &SqlCommand) -> Option<&[u8]> {
    match command {
        SqlCommand::Prepare { name, .. } | SqlCommand::Deallocate { name } => Some(name),
        _ => None,
    }
}

impl<S> SqlChanges<S> {
    /// The namespace-changing commands among `commands`. `resets_unnamed`:
    /// the answer (a simple Query's) drops the unnamed statement whatever
    /// its commands say.
    pub(super) fn new(
        commands: impl IntoIterator<Item = (SqlCommand, Option<S>)>,
        resets_unnamed: bool,
    ) -> Self {
        let mut changes: Vec<SqlChange<S>> = commands
            .into_iter()
            .filter(|(c, _)| c.applies_when_confirmed())
            .map(|(command, defines)| SqlChange {
                command,
                defines,
                decides: false,
            })
            .collect();
        if changes.is_empty() {
            return SqlChanges(None);
        }
        let forget_all_at = changes
            .iter()
            .rposition(|c| c.command == SqlCommand::DeallocateAll);
        let after = forget_all_at.map_or(0, |at| at + 1);
        let mut seen: HashSet<&[u8]> = HashSet::new();
        for change in changes[after..].iter_mut().rev() {
            let Some(name) = named(&change.command) else {
                continue;
            };
            if resets_unnamed && name.is_empty() {
                continue;
            }
            change.decides = seen.insert(name);
        }
        SqlChanges(Some(Box::new(Changes {
            changes,
            next: 0,
            forget_all_at,
        })))
    }

    /// No command of the answer changes statements.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The changes not yet applied.
    pub(super) fn pending(&self) -> &[SqlChange<S>] {
        self.0
            .as_deref()
            .and_then(|c| c.changes.get(c.next..))
            .unwrap_or_default()
    }

    /// Whether a `DEALLOCATE ALL` is still to be applied.
    pub(super) fn forgets_all(&self) -> bool {
        self.0
            .as_deref()
            .is_some_and(|c| c.forget_all_at.is_some_and(|at| at >= c.next))
    }

    /// The statements the pending changes decide: each name, and the
    /// annotation it will be defined with (`None`: it will not exist).
    pub(super) fn decided(&self) -> impl Iterator<Item = (&[u8], Option<&S>)> {
        self.pending().iter().filter(|c| c.decides).filter_map(|c| {
            let defines = match &c.command {
                SqlCommand::Prepare { .. } => c.defines.as_ref(),
                _ => None,
            };
            named(&c.command).map(|name| (name, defines))
        })
    }

    /// Takes the next change if the CommandComplete `tag` confirms it (an
    /// EXECUTE'd statement's own tag can come in between).
    pub(super) fn confirm_next(&mut self, tag: &[u8]) -> Option<Confirmed<S>> {
        let c = self.0.as_deref_mut()?;
        let at = c.next;
        let change = c.changes.get_mut(at)?;
        if !change.command.confirmed_by(tag) {
            return None;
        }
        c.next += 1;
        Some(Confirmed {
            command: std::mem::replace(&mut change.command, SqlCommand::DeallocateAll),
            defines: change.defines.take(),
            decided: change.decides,
            ended_forget_all: c.forget_all_at == Some(at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(name: &str) -> (SqlCommand, Option<u32>) {
        let command = SqlCommand::Prepare {
            name: name.into(),
            inner: "select 1".into(),
        };
        (command, Some(name.len() as u32))
    }

    fn deallocate(name: &str) -> (SqlCommand, Option<u32>) {
        (SqlCommand::Deallocate { name: name.into() }, None)
    }

    fn all() -> (SqlCommand, Option<u32>) {
        (SqlCommand::DeallocateAll, None)
    }

    fn decided(c: &SqlChanges<u32>) -> Vec<(String, Option<u32>)> {
        c.decided()
            .map(|(n, s)| (String::from_utf8_lossy(n).into_owned(), s.copied()))
            .collect()
    }

    #[test]
    fn only_namespace_changes_are_kept_and_the_last_per_name_decides() {
        let execute = (SqlCommand::Execute { name: "a".into() }, None);
        let c = SqlChanges::new(
            vec![prepare("a"), execute, deallocate("a"), prepare("bb")],
            false,
        );
        assert_eq!(c.pending().len(), 3);
        assert_eq!(
            decided(&c),
            [("a".to_owned(), None), ("bb".to_owned(), Some(2))]
        );
        assert!(!c.forgets_all());
    }

    #[test]
    fn nothing_before_the_last_deallocate_all_decides() {
        let c = SqlChanges::new(
            vec![prepare("a"), all(), prepare("bb"), all(), prepare("c")],
            false,
        );
        assert_eq!(decided(&c), [("c".to_owned(), Some(1))]);
        assert!(c.forgets_all());
    }

    #[test]
    fn a_query_decides_nothing_of_the_unnamed_statement() {
        let c = SqlChanges::new(vec![prepare("")], true);
        assert!(decided(&c).is_empty());
        let c = SqlChanges::new(vec![prepare("")], false);
        assert_eq!(decided(&c), [(String::new(), Some(0))]);
    }

    #[test]
    fn confirmations_apply_in_order_and_say_what_they_ended() {
        let mut c = SqlChanges::new(vec![prepare("a"), all(), prepare("bb")], false);
        assert!(
            c.confirm_next(b"DEALLOCATE").is_none(),
            "not the next one's tag"
        );
        let first = c
            .confirm_next(b"PREPARE")
            .expect("PREPARE confirms the first");
        assert!(!first.decided && !first.ended_forget_all);
        assert!(c.forgets_all());
        let second = c
            .confirm_next(b"DISCARD ALL")
            .expect("DISCARD ALL confirms the second");
        assert!(second.ended_forget_all);
        assert!(!c.forgets_all());
        assert_eq!(decided(&c), [("bb".to_owned(), Some(2))]);
        let third = c.confirm_next(b"PREPARE").expect("the third");
        assert!(third.decided);
        assert_eq!(third.defines, Some(2));
        assert!(c.pending().is_empty());
        assert!(c.confirm_next(b"PREPARE").is_none());
    }

    #[test]
    fn no_commands_allocate_nothing() {
        let c = SqlChanges::<u32>::new(Vec::new(), true);
        assert!(c.0.is_none());
        let execute = (SqlCommand::Execute { name: "a".into() }, None);
        assert!(SqlChanges::<u32>::new(vec![execute], false).0.is_none());
    }
}
