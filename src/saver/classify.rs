//! Statement recognition: what a SQL text does to checkpoint state.
//!
//! Each distinct SQL text is classified once: a cheap case-insensitive
//! search for the profiles' table names rejects ordinary traffic without
//! parsing; texts that mention a checkpoint table are parsed with
//! sqlparser and their shape read off the AST (which table, which
//! parameter feeds which column, how a read selects its rows). Results are
//! cached process-wide by SQL text, so nothing is parsed per execution.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use aho_corasick::AhoCorasick;
use dashmap::DashMap;

use crate::log_text::shown;
use crate::sql_tokens::{lex, LexError, Lexeme};
use crate::wire::multibyte_readings;
use sqlparser::ast::{
    visit_relations, OnConflictAction, OnInsert, SetExpr, Statement, TableFactor, TableObject,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::decode_error::DecodeError;
use super::profile::{SaverProfile, TableRole};
use super::unknown::{Unenforced, UnknownLog, UnknownSaverPolicy, ALL_LEGS, READ_LEGS, WRITE_LEGS};
use ast::{name_parts, placeholder};
use aux_read::aux_read_shape;
pub use housekeeping::RowsDeleted;
use housekeeping::{delete_shape, update_shape};
pub use read::{ReadMode, ReadShape};

mod ast;
mod aux_read;
mod housekeeping;
mod read;

/// An INSERT: the column each Bind parameter feeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertShape {
    /// (column name, 0-based parameter index), in column-list order.
    pub columns: Vec<(String, usize)>,
}

impl InsertShape {
    #[cfg(test)]
    pub fn param_of(&self, column: &str) -> Option<usize> {
        self.columns
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, p)| *p)
    }
}

// Each kind lives once per SQL text, inside the cached `Arc<Classified>`,
// so the size of the largest variant costs nothing per execution.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatementKind {
    /// Not checkpoint traffic: forwarded without a second look.
    Other,
    Read(ReadShape),
    /// A read of pending writes that is not the checkpoint SELECT (the
    /// legacy pending-sends query).
    WritesRead,
    BlobUpsert(InsertShape),
    CheckpointUpsert(InsertShape),
    /// `ON CONFLICT ... DO UPDATE`: special channels only.
    WritesUpsert(InsertShape),
    /// `ON CONFLICT ... DO NOTHING`: a task's writes.
    WritesInsertIgnore(InsertShape),
    DeleteThread {
        table: TableRole,
        thread_param: Option<usize>,
    },
    /// A delete of some of a thread's rows (`prune()`, the shallow saver's
    /// `put`); which rows is in [`RowsDeleted`].
    DeleteRows {
        table: TableRole,
        rows: RowsDeleted,
    },
    /// prune's `UPDATE checkpoints SET parent_checkpoint_id = NULL ...`.
    Unparent,
    /// A read that returns no pending writes and no checkpoint to decode
    /// (thread ids, checkpoint ids, channel versions, inline values): prune's
    /// look-ups, the delta-channel walk's first stage.
    ReadWithoutWrites,
    /// The delta-channel walk's second stage: writes of channels named by
    /// these parameters (0-based), and blobs by version.
    ChannelHistoryRead {
        channel_params: Vec<usize>,
    },
    Migration,
    /// Touches a checkpoint table in a shape the proxy does not know (why:
    /// [`Classified::unenforced`]): logged once at ERROR, counted, and
    /// forwarded or refused as `[enforce] unknown_saver` says.
    Unrecognized,
}

impl StatementKind {
    pub fn is_checkpoint_traffic(&self) -> bool {
        !matches!(self, StatementKind::Other)
    }

    /// A pending write's INSERT (`checkpoint_writes`), upsert or not.
    pub fn is_pending_write(&self) -> bool {
        matches!(
            self,
            StatementKind::WritesUpsert(_) | StatementKind::WritesInsertIgnore(_)
        )
    }

    /// The column ↔ parameter shape of a blob, checkpoint or pending-write
    /// INSERT.
    pub fn insert_shape(&self) -> Option<&InsertShape> {
        match self {
            StatementKind::BlobUpsert(s)
            | StatementKind::CheckpointUpsert(s)
            | StatementKind::WritesUpsert(s)
            | StatementKind::WritesInsertIgnore(s) => Some(s),
            _ => None,
        }
    }

    /// A short name for logs and audit records.
    pub fn label(&self) -> &'static str {
        match self {
            StatementKind::Other => "other",
            StatementKind::Read(r) => r.mode.label(),
            StatementKind::WritesRead => "writes_read",
            StatementKind::BlobUpsert(_) => "blob_upsert",
            StatementKind::CheckpointUpsert(_) => "checkpoint_upsert",
            StatementKind::WritesUpsert(_) => "writes_upsert",
            StatementKind::WritesInsertIgnore(_) => "writes_insert_ignore",
            StatementKind::DeleteThread { .. } => "delete_thread",
            StatementKind::DeleteRows { rows, .. } => rows.label(),
            StatementKind::Unparent => "unparent",
            StatementKind::ReadWithoutWrites => "read_without_writes",
            StatementKind::ChannelHistoryRead { .. } => "channel_history_read",
            StatementKind::Migration => "migration",
            StatementKind::Unrecognized => "unrecognized",
        }
    }
}

/// A classification result, shared by every session that prepares the
/// same text.
#[derive(Debug, PartialEq, Eq)]
pub struct Classified {
    pub kind: StatementKind,
    /// Name of the saver profile that matched, if any.
    pub profile: Option<String>,
    /// For a read by id: the same read returning the head checkpoint id
    /// as an extra last column (see `fork_rewrite`), computed once here.
    pub fork_sql: Option<String>,
    /// For an unrecognized checkpoint statement: what it is and why it
    /// cannot be enforced.
    pub unenforced: Option<Unenforced>,
    /// The error an unrecognized checkpoint statement fails with under
    /// `[enforce] unknown_saver = "refuse"` (SQLSTATE
    /// [`super::unknown::REFUSAL_SQLSTATE`]); `None` when it is forwarded.
    pub refusal: Option<String>,
}

impl Classified {
    fn new(kind: StatementKind, profile: Option<String>) -> Self {
        Classified {
            kind,
            profile,
            fork_sql: None,
            unenforced: None,
            refusal: None,
        }
    }

    fn unrecognized(profile: &SaverProfile, what: Unenforced) -> Self {
        Classified {
            unenforced: Some(what),
            ..Classified::new(StatementKind::Unrecognized, Some(profile.name.clone()))
        }
    }

    /// Reports a row of this read that does not decode by its layout:
    /// logged at ERROR once per defect, counted in `unknown_total`.
    pub fn report_undecodable_row(&self, error: &DecodeError) {
        let (statement, saver) = match &self.kind {
            StatementKind::Read(r) => (r.mode.label(), r.saver.as_str()),
            other => (other.label(), "unknown"),
        };
        let what = Unenforced {
            statement: statement.to_owned(),
            reason: format!(
                "row not decodable by the {saver} layout: {}",
                super::unknown::shape_of_error(error)
            ),
            legs_off: READ_LEGS,
        };
        let profile = self.profile.as_deref().unwrap_or("none");
        // Rows are forwarded as they are: the read has already run.
        UnknownLog::global().report(profile, &what, UnknownSaverPolicy::Warn);
    }
}

/// Caps the cache so a client inventing SQL texts cannot grow it forever.
const CACHE_LIMIT: usize = 10_000;
/// Caps the bytes of SQL text the cache holds: 200 distinct 1 MB texts
/// must not pin 200 MB. Texts above `CACHE_TEXT_MAX` are classified each
/// time they are prepared (no saver sends one).
const CACHE_BYTES: usize = 8 << 20;
const CACHE_TEXT_MAX: usize = 64 << 10;

/// What opens a `U&"…"` identifier, whose escapes can spell a table's
/// name without writing it.
const UNICODE_NAME: &str = "u&\"";

/// The profile whose table a text names.
enum Naming<'a> {
    /// Written out: the parse reads the statement's shape.
    Written(&'a SaverProfile),
    /// In a way the parse cannot read as the server will: only through
    /// `U&"…"` escapes, or in a text whose strings end elsewhere when
    /// `standard_conforming_strings` is off. Never enforced, so made loud
    /// as unrecognized.
    Unreadable(&'a SaverProfile, Unenforced),
}

/// Classifies SQL texts against the loaded saver profiles.
pub struct Classifier {
    profiles: Vec<SaverProfile>,
    /// Any profile's table name, and [`UNICODE_NAME`], ASCII
    /// case-insensitively: one SIMD literal search decides that ordinary
    /// traffic is not checkpoint traffic.
    prefilter: Option<AhoCorasick>,
    cache: DashMap<String, Arc<Classified>>,
    /// Bytes of SQL text held by `cache`.
    cached_bytes: AtomicUsize,
    other: Arc<Classified>,
    unknown_policy: UnknownSaverPolicy,
}

impl Classifier {
    /// A classifier that forwards unrecognized checkpoint statements.
    pub fn new(profiles: Vec<SaverProfile>) -> Self {
        let mut names: Vec<&str> = profiles
            .iter()
            .flat_map(|p| p.table_names())
            .filter(|t| !t.is_empty())
            .collect();
        if !names.is_empty() {
            names.push(UNICODE_NAME);
        }
        // Literals always build; without a prefilter every text would go
        // through the per-profile search below (slower, not blind).
        let prefilter = (!names.is_empty())
            .then(|| {
                AhoCorasick::builder()
                    .ascii_case_insensitive(true)
                    .build(&names)
                    .ok()
            })
            .flatten();
        Classifier {
            profiles,
            prefilter,
            cache: DashMap::new(),
            cached_bytes: AtomicUsize::new(0),
            other: Arc::new(Classified::new(StatementKind::Other, None)),
            unknown_policy: UnknownSaverPolicy::Warn,
        }
    }

    /// Sets what happens to unrecognized checkpoint statements.
    pub fn with_unknown_policy(mut self, policy: UnknownSaverPolicy) -> Self {
        self.unknown_policy = policy;
        self
    }

    pub fn unknown_policy(&self) -> UnknownSaverPolicy {
        self.unknown_policy
    }

    /// Every profile's table names (some may be empty).
    pub fn table_names(&self) -> impl Iterator<Item = &str> {
        self.profiles.iter().flat_map(|p| p.table_names())
    }

    /// Whether `sql` may name a table of a saver profile, written out or
    /// through a `U&"…"` escape (the test before every classification, so
    /// a text it is false for is ordinary traffic).
    pub fn names_saver_tables(&self, sql: &str) -> bool {
        match &self.prefilter {
            Some(p) => p.is_match(sql),
            None => {
                self.profiles.iter().any(|p| names_table_of(p, sql))
                    || (!self.profiles.is_empty() && contains_ignore_case(sql, UNICODE_NAME))
            }
        }
    }

    /// The shared result for ordinary traffic (no allocation).
    pub fn other(&self) -> Arc<Classified> {
        Arc::clone(&self.other)
    }

    /// Whether `class` is [`Classifier::other`]'s shared result, which
    /// classifying a text yields with no other effect (nothing cached,
    /// logged or counted).
    pub fn is_other(&self, class: &Arc<Classified>) -> bool {
        Arc::ptr_eq(class, &self.other)
    }

    /// Takes room for a text of `len` bytes in the cache, if it fits.
    fn reserve_cache_bytes(&self, len: usize) -> bool {
        len <= CACHE_TEXT_MAX
            && self
                .cached_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    (held + len <= CACHE_BYTES).then_some(held + len)
                })
                .is_ok()
    }

    /// Bytes of SQL text the cache holds.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Relaxed)
    }

    /// Classifies one SQL text, from cache when seen before.
    pub fn classify(&self, sql: &str) -> Arc<Classified> {
        if self.prefilter.as_ref().is_some_and(|p| !p.is_match(sql)) {
            return self.other();
        }
        let Some(naming) = self.naming(sql) else {
            return self.other();
        };
        let result = match self.cache.get(sql) {
            Some(hit) => Arc::clone(hit.value()),
            None => {
                let mut result = match naming {
                    Naming::Written(profile) => self.classify_uncached(sql, profile),
                    Naming::Unreadable(profile, what) => Classified::unrecognized(profile, what),
                };
                if let Some(what) = &result.unenforced {
                    tracing::debug!(sql = %shown(sql.trim()), statement = %shown(&what.statement), "unrecognized checkpoint statement");
                    if self.unknown_policy == UnknownSaverPolicy::Refuse {
                        result.refusal =
                            Some(what.refusal_message(result.profile.as_deref().unwrap_or("none")));
                    }
                }
                let result = Arc::new(result);
                if self.cache.len() < CACHE_LIMIT && self.reserve_cache_bytes(sql.len()) {
                    self.cache.insert(sql.to_owned(), Arc::clone(&result));
                }
                result
            }
        };
        if let Some(what) = &result.unenforced {
            let profile = result.profile.as_deref().unwrap_or("none");
            UnknownLog::global().report(profile, what, self.unknown_policy);
        }
        result
    }

    /// The first profile whose table `sql` names, and how.
    fn naming(&self, sql: &str) -> Option<Naming<'_>> {
        let unreadable = |reason: &str| Unenforced {
            statement: "unparsed".into(),
            reason: reason.into(),
            legs_off: ALL_LEGS,
        };
        if let Some(profile) = self.profiles.iter().find(|p| names_table_of(p, sql)) {
            // The parse reads strings as with the setting on; with it off,
            // a name the parse finds in a string may be a table's.
            if sql.contains('\\') && matches!(lex(sql), Err(LexError::Ambiguous)) {
                return Some(Naming::Unreadable(
                    profile,
                    unreadable(
                        "a string that ends elsewhere when standard_conforming_strings is off",
                    ),
                ));
            }
            // In SJIS, BIG5 and the like a backslash may be part of the
            // character before it, and a string end elsewhere.
            if !multibyte_readings::readings(sql).is_empty() {
                return Some(Naming::Unreadable(
                    profile,
                    unreadable(
                        "a backslash that is part of the character before it in a client \
                         encoding such as SJIS, BIG5 or GBK",
                    ),
                ));
            }
            return Some(Naming::Written(profile));
        }
        if !contains_ignore_case(sql, UNICODE_NAME) {
            return None;
        }
        let Ok(lexemes) = lex(sql) else {
            // The names the server will read cannot be known: loud, as a
            // text that does not parse is.
            return self.profiles.first().map(|p| {
                Naming::Unreadable(
                    p,
                    unreadable("a U&\"…\" name in a text that cannot be read"),
                )
            });
        };
        let names = lexemes
            .iter()
            .filter_map(Lexeme::name)
            .collect::<Vec<_>>()
            .join(" ");
        self.profiles
            .iter()
            .find(|p| names_table_of(p, &names))
            .map(|p| {
                Naming::Unreadable(
                    p,
                    unreadable("a checkpoint table named through a U&\"…\" escape"),
                )
            })
    }

    fn classify_uncached(&self, sql: &str, first: &SaverProfile) -> Classified {
        // The prefilter picked the first profile that mentions a table name;
        // the parse decides which profile really owns the statement.
        let whole = |reason: &str| Unenforced {
            statement: "unparsed".into(),
            reason: reason.into(),
            legs_off: ALL_LEGS,
        };
        let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
            return Classified::unrecognized(first, whole("the SQL does not parse"));
        };
        let [statement] = statements.as_slice() else {
            return Classified::unrecognized(first, whole("several statements in one text"));
        };
        // Every profile that owns one of the statement's tables, best first:
        // recognized before unrecognized, then the profile whose way of
        // naming tables (qualified or not, its schema) the statement uses.
        let mut candidates: Vec<(bool, bool, &SaverProfile, Shape)> = self
            .profiles
            .iter()
            .filter_map(|p| {
                let (shape, exact) = shape_of(statement, p)?;
                Some((shape.is_ok(), exact, p, shape))
            })
            .collect();
        candidates.sort_by_key(|(ok, exact, _, _)| (!ok, !exact));
        let Some((_, _, profile, shape)) = candidates.into_iter().next() else {
            return Classified::new(StatementKind::Other, None);
        };
        match shape {
            Ok(kind) => {
                let fork_sql = match &kind {
                    StatementKind::Read(r) if r.mode == ReadMode::ById => {
                        super::fork_rewrite::add_head_column(sql)
                    }
                    _ => None,
                };
                Classified {
                    fork_sql,
                    ..Classified::new(kind, Some(profile.name.clone()))
                }
            }
            Err(what) => Classified::unrecognized(profile, what),
        }
    }
}

/// Whether `text` holds one of `profile`'s table names, in any case.
fn names_table_of(profile: &SaverProfile, text: &str) -> bool {
    profile
        .table_names()
        .iter()
        .any(|t| !t.is_empty() && contains_ignore_case(text, t))
}

/// Case-insensitive substring search without allocating.
fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    if n.is_empty() || h.len() < n.len() {
        return n.is_empty();
    }
    let first = n[0].to_ascii_lowercase();
    (0..=h.len() - n.len())
        .any(|i| h[i].to_ascii_lowercase() == first && h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// A statement's kind under one profile, or why it cannot be enforced.
type Shape = Result<StatementKind, Unenforced>;

/// The kind of one parsed statement under one profile, and whether its
/// table names are written the profile's way; `None` when it touches none
/// of the profile's tables.
fn shape_of(statement: &Statement, profile: &SaverProfile) -> Option<(Shape, bool)> {
    let unknown = |statement: String, reason: &str, legs_off| {
        Err(Unenforced {
            statement,
            reason: reason.into(),
            legs_off,
        })
    };
    match statement {
        Statement::Query(query) => {
            let single = match query.body.as_ref() {
                SetExpr::Select(select) if query.with.is_none() => match select.from.as_slice() {
                    [from] if from.joins.is_empty() => match &from.relation {
                        TableFactor::Table { name, .. } => Some((select, name)),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            };
            let Some((select, name)) = single else {
                return aux_read_shape(query, profile);
            };
            let parts = name_parts(name);
            let exact = profile.fits_exactly(&parts);
            let shape = match profile.role_of(&parts) {
                None => return aux_read_shape(query, profile),
                Some(TableRole::Checkpoints) => match read::read_shape(query, select, profile) {
                    Ok(shape) => Ok(StatementKind::Read(shape)),
                    // Not the checkpoint read: one of the savers' other
                    // reads of the table, or a read it cannot decode.
                    Err((mode, reason)) => match aux_read_shape(query, profile) {
                        Some((Ok(kind), _)) => Ok(kind),
                        _ => unknown(mode.label().into(), &reason, READ_LEGS),
                    },
                },
                Some(TableRole::Writes) => Ok(StatementKind::WritesRead),
                Some(TableRole::Migrations) => Ok(StatementKind::Migration),
                Some(TableRole::Blobs) => return aux_read_shape(query, profile),
            };
            Some((shape, exact))
        }
        Statement::Insert(insert) => {
            let TableObject::TableName(name) = &insert.table else {
                return mentions(statement, profile);
            };
            let parts = name_parts(name);
            let role = profile.role_of(&parts)?;
            let shape = insert_shape(insert);
            let conflict = match &insert.on {
                Some(OnInsert::OnConflict(c)) => Some(&c.action),
                _ => None,
            };
            let shape = match (role, shape, conflict) {
                (TableRole::Migrations, _, _) => Ok(StatementKind::Migration),
                (TableRole::Blobs, Some(s), _) => Ok(StatementKind::BlobUpsert(s)),
                (TableRole::Checkpoints, Some(s), _) => Ok(StatementKind::CheckpointUpsert(s)),
                (TableRole::Writes, Some(s), Some(OnConflictAction::DoUpdate(_))) => {
                    Ok(StatementKind::WritesUpsert(s))
                }
                (TableRole::Writes, Some(s), Some(OnConflictAction::DoNothing)) => {
                    Ok(StatementKind::WritesInsertIgnore(s))
                }
                (_, None, _) => unknown(
                    format!("insert into {name}"),
                    "not one VALUES row of $n parameters",
                    WRITE_LEGS,
                ),
                (_, Some(_), _) => unknown(
                    format!("insert into {name}"),
                    "pending writes are inserted with ON CONFLICT DO UPDATE or DO NOTHING",
                    WRITE_LEGS,
                ),
            };
            Some((shape, profile.fits_exactly(&parts)))
        }
        Statement::Delete(delete) => delete_shape(delete, profile),
        Statement::Update(update) => update_shape(
            &update.table,
            &update.assignments,
            update.selection.as_ref(),
            profile,
        ),
        Statement::CreateTable(_) | Statement::CreateIndex(_) | Statement::AlterTable(_) => {
            mentions(statement, profile).map(|(_, exact)| (Ok(StatementKind::Migration), exact))
        }
        _ => mentions(statement, profile),
    }
}

/// Whether a statement (or part of one) names a table of the profile
/// anywhere, and if so whether any name is written the profile's way.
fn names_a_table_of<V: sqlparser::ast::Visit>(node: &V, profile: &SaverProfile) -> Option<bool> {
    let mut found: Option<bool> = None;
    let _ = visit_relations(node, |name| {
        let parts = name_parts(name);
        if profile.role_of(&parts).is_some() {
            found = Some(found.unwrap_or(false) || profile.fits_exactly(&parts));
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Fallback for shapes the proxy does not model: a statement that names a
/// table of the profile anywhere (subqueries, CTEs, joins) is unrecognized
/// checkpoint traffic; a mention inside a string literal is not.
fn mentions(statement: &Statement, profile: &SaverProfile) -> Option<(Shape, bool)> {
    let exact = names_a_table_of(statement, profile)?;
    let verb = statement
        .to_string()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let what = Unenforced {
        statement: verb,
        reason: "not a statement shape of the saver".into(),
        legs_off: ALL_LEGS,
    };
    Some((Err(what), exact))
}

fn insert_shape(insert: &sqlparser::ast::Insert) -> Option<InsertShape> {
    let source = insert.source.as_ref()?;
    let SetExpr::Values(values) = source.body.as_ref() else {
        return None;
    };
    let [row] = values.rows.as_slice() else {
        return None;
    };
    if row.content.len() != insert.columns.len() {
        return None;
    }
    let columns = insert
        .columns
        .iter()
        .zip(&row.content)
        .map(|(col, expr)| {
            let name = col
                .0
                .last()?
                .to_string()
                .trim_matches('"')
                .to_ascii_lowercase();
            Some((name, placeholder(expr)?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(InsertShape { columns })
}

// The Python saver's statements, shared by the library's tests with the
// benchmarks and integration tests, which cannot see `cfg(test)` modules.
#[cfg(test)]
#[path = "../../benches/common/saver_sql.rs"]
pub(crate) mod saver_sql;
#[cfg(test)]
pub(crate) mod tests;
