//! The SQL text a Parse or a simple Query carries, read for the commands
//! that change or use the statement namespace (`PREPARE`, `DEALLOCATE`,
//! `EXECUTE`, `DECLARE`): each checked by the hooks, and an `EXECUTE` of
//! a statement the proxy never saw prepared refused. A Bind checks the
//! `EXECUTE`s its statement's text carries. Text in any client encoding
//! is read as [`client_text`] decodes it.

use std::sync::Arc;

use super::super::client_text;
use super::super::guard::{ClientError, ClientStep};
use super::super::reject::raising_query;
use super::super::response_queue::{Expect, Route};
use super::super::sql_commands::{scan, SqlCommand, Unreadable};
use super::names::{Change, Executes, Lookup, Statement};
use super::sql_changes::SqlChanges;
use super::{
    never_prepared, unsendable, BehindRefusable, Hooks, Refusal, Tracker, FEATURE_NOT_SUPPORTED,
};

impl<H: Hooks> Tracker<H> {
    /// A Parse's text (as [`client_text`] decodes it): its statement
    /// (annotation, SQL-level commands, refusal) and the replacement
    /// text, in the client's bytes.
    pub(super) fn prepare_text(
        &mut self,
        text: &str,
    ) -> (Statement<H::Statement>, Option<Vec<u8>>) {
        let (annotation, replacement) = self.hooks.parse(text);
        let replacement = replacement.map(|r| client_text::encode(&r).into_owned());
        let mut statement = Statement::new(annotation);
        match self.commands_in(text) {
            Ok(found) if found.is_empty() => {}
            Ok(found) => {
                // One statement per Parse; its EXECUTEs are checked when a
                // portal of it is bound.
                let mut commands = Vec::with_capacity(found.len());
                for command in found {
                    match self.definition(&command) {
                        Ok(defines) => commands.push((command, defines)),
                        Err(refusal) => {
                            statement.refused = Some(Box::new(refusal));
                            break;
                        }
                    }
                }
                statement.commands = Some(Arc::new(commands));
            }
            Err(e) => statement.refused = Some(Box::new(unreadable(&e.0))),
        }
        (statement, replacement)
    }

    /// The SQL-level commands of a Parse's `text`; a text found to have
    /// none is remembered, and not scanned again when it is sent again
    /// next.
    fn commands_in(&mut self, text: &str) -> Result<Vec<SqlCommand>, Unreadable> {
        if self.plain_text.get(text).is_some() || self.hooks.ordinary(text) {
            return Ok(Vec::new());
        }
        let found = scan(text);
        if found.as_ref().is_ok_and(Vec::is_empty) {
            self.plain_text.remember(text, ());
        }
        found
    }

    /// Checks a PREPARE or DECLARE body: for PREPARE, the annotation of
    /// the statement it defines.
    fn definition(&mut self, command: &SqlCommand) -> Result<Option<H::Statement>, Refusal> {
        match command {
            SqlCommand::Prepare { inner, .. } => self.hooks.sql_prepare(inner).map(Some),
            SqlCommand::Declare { inner, .. } => self.hooks.sql_declare(inner).map(|_| None),
            _ => Ok(None),
        }
    }

    /// Checks the SQL `EXECUTE`s and `FETCH`es among `commands`: refused
    /// when they run a statement the hooks refuse, or one the proxy never
    /// saw prepared, or read a watched portal. `defined`: names
    /// (re)defined earlier in the same text.
    pub(super) fn executes(
        &mut self,
        commands: &[(SqlCommand, Option<H::Statement>)],
        defined: &[(Vec<u8>, Option<H::Statement>)],
    ) -> Executes {
        for (command, _) in commands {
            let name = match command {
                SqlCommand::Execute { name } => name,
                SqlCommand::Fetch { name } => match self.fetch(name) {
                    Executes::Allowed => continue,
                    outcome => return outcome,
                },
                _ => continue,
            };
            let annotation = match defined.iter().rev().find(|(n, _)| n == name) {
                Some((_, s)) => s.clone(),
                None => match self.statement(name) {
                    Lookup::Known(s) => s.map(|s| s.annotation),
                    Lookup::Ambiguous => return Executes::Ambiguous,
                },
            };
            let Some(annotation) = annotation else {
                return Executes::Refused(never_prepared(&String::from_utf8_lossy(name)));
            };
            if let Err(refusal) = self.hooks.sql_execute(&annotation) {
                return Executes::Refused(refusal);
            }
        }
        Executes::Allowed
    }

    /// Checks a SQL `FETCH` from the portal `name`: a portal the hooks
    /// watch (bound by the protocol; SQL cursors of watched statements
    /// are refused when declared) is theirs to allow.
    fn fetch(&mut self, name: &[u8]) -> Executes {
        let portal = match self
            .unanswered
            .portal(name, self.portals.get(name), self.segment)
        {
            Lookup::Known(portal) => portal.and_then(|p| p.annotation.as_deref()),
            Lookup::Ambiguous => return Executes::Ambiguous,
        };
        match portal.map(|p| self.hooks.sql_fetch(p)) {
            Some(Err(refusal)) => Executes::Refused(refusal),
            Some(Ok(())) | None => Executes::Allowed,
        }
    }

    pub(super) fn query(&mut self, sql: &[u8]) -> Result<ClientStep, ClientError> {
        let text = client_text::decode(sql);
        let mut commands = Vec::new();
        let mut refusal = self.hooks.admit(&text).err();
        let scanned = match refusal {
            Some(_) => Ok(Vec::new()),
            None if self.hooks.ordinary(&text) => Ok(Vec::new()),
            None => scan(&text),
        };
        match scanned {
            Ok(found) => {
                let mut defined: Vec<(Vec<u8>, Option<H::Statement>)> = Vec::new();
                for command in found {
                    let entry = [(command, None)];
                    match self.executes(&entry, &defined) {
                        Executes::Allowed => {}
                        Executes::Refused(r) => {
                            refusal = Some(r);
                            break;
                        }
                        Executes::Ambiguous => return Ok(ClientStep::AwaitServer),
                    }
                    let [(command, _)] = entry;
                    let defines = match self.definition(&command) {
                        Ok(d) => d,
                        Err(r) => {
                            refusal = Some(r);
                            break;
                        }
                    };
                    match &command {
                        SqlCommand::Prepare { name, .. } => {
                            defined.push((name.clone(), defines.clone()))
                        }
                        SqlCommand::Deallocate { name } => defined.push((name.clone(), None)),
                        _ => {}
                    }
                    commands.push((command, defines));
                }
            }
            Err(e) => refusal = Some(unreadable(&e.0)),
        }
        let watched = match refusal {
            Some(r) => {
                self.hooks.query_refused();
                Err(r)
            }
            None => self.hooks.query(&text),
        };
        let (step, watch) = match watched {
            Ok(watch) => (ClientStep::Forward, watch),
            Err(r) => {
                commands.clear();
                let bytes = raising_query(r.sqlstate, &r.message, &r.detail).map_err(unsendable)?;
                (ClientStep::Replace(bytes), None)
            }
        };
        if watch.as_ref().is_some_and(|w| self.hooks.may_refuse(w)) {
            self.behind_refusable = Some(BehindRefusable::at(self.segment));
        }
        // The answer drops the unnamed statement and portal: with neither
        // in use that changes nothing.
        let change = Change::answer(
            watch,
            SqlChanges::new(commands, true),
            self.unnamed_in_use(),
        );
        self.push(Expect::Query, Route::Forward, change);
        self.segment += 1;
        Ok(step)
    }
}

fn unreadable(error: &str) -> Refusal {
    Refusal {
        sqlstate: FEATURE_NOT_SUPPORTED,
        message:
            "resumeguard cannot read this text's PREPARE, EXECUTE, DECLARE, FETCH or savepoint commands"
                .into(),
        detail: format!("tokenizer: {error}"),
    }
}
