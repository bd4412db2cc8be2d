//! Statement recognition: what a SQL text does to checkpoint state.
//!
//! Each distinct SQL text is classified once: a cheap case-insensitive
//! search for the profiles' table names rejects ordinary traffic without
//! parsing; texts that mention a checkpoint table are parsed with
//! sqlparser and their shape read off the AST (which table, which
//! parameter feeds which column, how a read selects its rows). Results are
//! cached process-wide by SQL text, so nothing is parsed per execution.

use std::ops::ControlFlow;
use std::sync::Arc;

use dashmap::DashMap;
use sqlparser::ast::{
    visit_relations, BinaryOperator, Expr, FromTable, LimitClause, ObjectName, ObjectNamePart,
    OnConflictAction, OnInsert, OrderByKind, OrderBySort, SelectItem, SetExpr, Statement,
    TableFactor, TableObject, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::profile::{SaverProfile, TableRole};

/// How a checkpoint read picks its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// `ORDER BY checkpoint_id DESC LIMIT 1`: the head of a namespace.
    Latest,
    /// `checkpoint_id = $n`: an explicit checkpoint (a fork address).
    ById,
    /// Anything else: history listing.
    List,
}

/// A checkpoint SELECT: which parameters address it and where the columns
/// the proxy decodes sit in its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadShape {
    pub mode: ReadMode,
    /// 0-based Bind parameter indexes of the `col = $n` predicates.
    pub thread_param: Option<usize>,
    pub ns_param: Option<usize>,
    pub id_param: Option<usize>,
    /// Output column names in order.
    pub output: Vec<String>,
}

impl ReadShape {
    pub fn column(&self, name: &str) -> Option<usize> {
        self.output.iter().position(|c| c == name)
    }
}

/// An INSERT: the column each Bind parameter feeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertShape {
    /// (column name, 0-based parameter index), in column-list order.
    pub columns: Vec<(String, usize)>,
}

impl InsertShape {
    pub fn param_of(&self, column: &str) -> Option<usize> {
        self.columns
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, p)| *p)
    }
}

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
    Migration,
    /// Touches a checkpoint table in a shape the proxy does not know:
    /// forwarded, and logged once.
    Unrecognized,
}

impl StatementKind {
    pub fn is_checkpoint_traffic(&self) -> bool {
        !matches!(self, StatementKind::Other)
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
            StatementKind::Read(r) => match r.mode {
                ReadMode::Latest => "read_latest",
                ReadMode::ById => "read_by_id",
                ReadMode::List => "read_list",
            },
            StatementKind::WritesRead => "writes_read",
            StatementKind::BlobUpsert(_) => "blob_upsert",
            StatementKind::CheckpointUpsert(_) => "checkpoint_upsert",
            StatementKind::WritesUpsert(_) => "writes_upsert",
            StatementKind::WritesInsertIgnore(_) => "writes_insert_ignore",
            StatementKind::DeleteThread { .. } => "delete_thread",
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
}

/// Caps the cache so a client inventing SQL texts cannot grow it forever.
const CACHE_LIMIT: usize = 10_000;

/// Classifies SQL texts against the loaded saver profiles.
pub struct Classifier {
    profiles: Vec<SaverProfile>,
    cache: DashMap<String, Arc<Classified>>,
    other: Arc<Classified>,
}

impl Classifier {
    pub fn new(profiles: Vec<SaverProfile>) -> Self {
        Classifier {
            profiles,
            cache: DashMap::new(),
            other: Arc::new(Classified {
                kind: StatementKind::Other,
                profile: None,
                fork_sql: None,
            }),
        }
    }

    /// The shared result for ordinary traffic (no allocation).
    pub fn other(&self) -> Arc<Classified> {
        Arc::clone(&self.other)
    }

    /// Classifies one SQL text, from cache when seen before.
    pub fn classify(&self, sql: &str) -> Arc<Classified> {
        let Some(profile) = self
            .profiles
            .iter()
            .find(|p| p.table_names().iter().any(|t| contains_ignore_case(sql, t)))
        else {
            return self.other();
        };
        if let Some(hit) = self.cache.get(sql) {
            return Arc::clone(hit.value());
        }
        let result = Arc::new(self.classify_uncached(sql, profile));
        if matches!(result.kind, StatementKind::Unrecognized) {
            tracing::warn!(
                profile = %profile.name,
                sql = %sql.trim(),
                "unrecognized statement on checkpoint tables: forwarded unchanged, not enforced"
            );
        }
        if self.cache.len() < CACHE_LIMIT {
            self.cache.insert(sql.to_owned(), Arc::clone(&result));
        }
        result
    }

    fn classify_uncached(&self, sql: &str, first: &SaverProfile) -> Classified {
        // The prefilter picked the first profile that mentions a table name;
        // the parse decides which profile really owns the statement.
        let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
            return Classified {
                kind: StatementKind::Unrecognized,
                profile: Some(first.name.clone()),
                fork_sql: None,
            };
        };
        let [statement] = statements.as_slice() else {
            return Classified {
                kind: StatementKind::Unrecognized,
                profile: Some(first.name.clone()),
                fork_sql: None,
            };
        };
        for profile in &self.profiles {
            if let Some(kind) = shape_of(statement, profile) {
                let fork_sql = match &kind {
                    StatementKind::Read(r) if r.mode == ReadMode::ById => {
                        super::fork_rewrite::add_head_column(sql)
                    }
                    _ => None,
                };
                return Classified {
                    kind,
                    profile: Some(profile.name.clone()),
                    fork_sql,
                };
            }
        }
        Classified {
            kind: StatementKind::Other,
            profile: None,
            fork_sql: None,
        }
    }
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

/// The kind of one parsed statement under one profile, `None` when it
/// touches none of the profile's tables.
fn shape_of(statement: &Statement, profile: &SaverProfile) -> Option<StatementKind> {
    match statement {
        Statement::Query(query) => {
            let SetExpr::Select(select) = query.body.as_ref() else {
                return mentions(statement, profile);
            };
            let [from] = select.from.as_slice() else {
                return mentions(statement, profile);
            };
            let TableFactor::Table { name, .. } = &from.relation else {
                return mentions(statement, profile);
            };
            match profile.role_of(&name_parts(name))? {
                TableRole::Checkpoints => {}
                TableRole::Writes => return Some(StatementKind::WritesRead),
                TableRole::Migrations => return Some(StatementKind::Migration),
                TableRole::Blobs => return Some(StatementKind::Unrecognized),
            }
            let mut eqs = Vec::new();
            if let Some(selection) = &select.selection {
                collect_equalities(selection, &mut eqs);
            }
            let param = |col: &str| eqs.iter().find(|(c, _)| c == col).map(|(_, p)| *p);
            let limit_one = matches!(
                &query.limit_clause,
                Some(LimitClause::LimitOffset { limit: Some(Expr::Value(v)), .. })
                    if matches!(&v.value, Value::Number(n, _) if n == "1")
            );
            let ordered_desc = query.order_by.as_ref().is_some_and(|o| match &o.kind {
                OrderByKind::Expressions(exprs) => exprs.first().is_some_and(|e| {
                    column_name(&e.expr).as_deref() == Some("checkpoint_id")
                        && matches!(e.options.sort, Some(OrderBySort::Desc))
                }),
                OrderByKind::All(_) => false,
            });
            let id_param = param("checkpoint_id");
            let mode = if id_param.is_some() {
                ReadMode::ById
            } else if limit_one && ordered_desc {
                ReadMode::Latest
            } else {
                ReadMode::List
            };
            let output = select.projection.iter().map(output_name).collect();
            Some(StatementKind::Read(ReadShape {
                mode,
                thread_param: param("thread_id"),
                ns_param: param("checkpoint_ns"),
                id_param,
                output,
            }))
        }
        Statement::Insert(insert) => {
            let TableObject::TableName(name) = &insert.table else {
                return mentions(statement, profile);
            };
            let role = profile.role_of(&name_parts(name))?;
            let shape = insert_shape(insert);
            let conflict = match &insert.on {
                Some(OnInsert::OnConflict(c)) => Some(&c.action),
                _ => None,
            };
            Some(match (role, shape, conflict) {
                (TableRole::Migrations, _, _) => StatementKind::Migration,
                (TableRole::Blobs, Some(s), _) => StatementKind::BlobUpsert(s),
                (TableRole::Checkpoints, Some(s), _) => StatementKind::CheckpointUpsert(s),
                (TableRole::Writes, Some(s), Some(OnConflictAction::DoUpdate(_))) => {
                    StatementKind::WritesUpsert(s)
                }
                (TableRole::Writes, Some(s), Some(OnConflictAction::DoNothing)) => {
                    StatementKind::WritesInsertIgnore(s)
                }
                _ => StatementKind::Unrecognized,
            })
        }
        Statement::Delete(delete) => {
            let tables = match &delete.from {
                FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
            };
            let [from] = tables.as_slice() else {
                return mentions(statement, profile);
            };
            let TableFactor::Table { name, .. } = &from.relation else {
                return mentions(statement, profile);
            };
            let table = profile.role_of(&name_parts(name))?;
            let mut eqs = Vec::new();
            if let Some(selection) = &delete.selection {
                collect_equalities(selection, &mut eqs);
            }
            let only_thread = eqs.len() == 1 && eqs[0].0 == "thread_id";
            if table == TableRole::Migrations || !only_thread {
                return Some(StatementKind::Unrecognized);
            }
            Some(StatementKind::DeleteThread {
                table,
                thread_param: Some(eqs[0].1),
            })
        }
        Statement::CreateTable(_) | Statement::CreateIndex(_) | Statement::AlterTable(_) => {
            mentions(statement, profile).map(|_| StatementKind::Migration)
        }
        _ => mentions(statement, profile),
    }
}

/// Fallback for shapes the proxy does not model: a statement that names a
/// table of the profile anywhere (subqueries, CTEs, joins) is unrecognized
/// checkpoint traffic; a mention inside a string literal is not.
fn mentions(statement: &Statement, profile: &SaverProfile) -> Option<StatementKind> {
    let mut found = false;
    let _ = visit_relations(statement, |name| {
        found |= profile.role_of(&name_parts(name)).is_some();
        ControlFlow::<()>::Continue(())
    });
    found.then_some(StatementKind::Unrecognized)
}

fn name_parts(name: &ObjectName) -> Vec<(String, bool)> {
    name.0
        .iter()
        .map(|part| match part {
            ObjectNamePart::Identifier(id) => (id.value.clone(), id.quote_style.is_some()),
            other => (other.to_string(), false),
        })
        .collect()
}

/// The bare column name of `col`, `alias.col` or `"col"`.
fn column_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Identifier(id) => Some(id.value.to_ascii_lowercase()),
        Expr::CompoundIdentifier(parts) => parts.last().map(|p| p.value.to_ascii_lowercase()),
        Expr::Nested(inner) => column_name(inner),
        _ => None,
    }
}

/// The 0-based parameter index of `$n`.
fn placeholder(expr: &Expr) -> Option<usize> {
    match expr {
        Expr::Value(v) => match &v.value {
            Value::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1),
            _ => None,
        },
        Expr::Cast { expr, .. } | Expr::Nested(expr) => placeholder(expr),
        _ => None,
    }
}

/// `col = $n` predicates joined by AND (either operand order).
fn collect_equalities(expr: &Expr, out: &mut Vec<(String, usize)>) {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            collect_equalities(left, out);
            collect_equalities(right, out);
        }
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => {
            let pair = match (column_name(left), placeholder(right)) {
                (Some(c), Some(p)) => Some((c, p)),
                _ => column_name(right).zip(placeholder(left)),
            };
            out.extend(pair);
        }
        Expr::Nested(inner) => collect_equalities(inner, out),
        _ => {}
    }
}

fn output_name(item: &SelectItem) -> String {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => alias.value.to_ascii_lowercase(),
        SelectItem::UnnamedExpr(e) => column_name(e).unwrap_or_default(),
        _ => String::new(),
    }
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

#[cfg(test)]
mod tests;
