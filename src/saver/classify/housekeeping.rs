//! The savers' housekeeping statements: deletes of some of a thread's rows
//! (`prune()`, the shallow saver's `put`) and prune's unparenting UPDATE,
//! recognized by their tables and the exact predicates they filter by.
//! What each means for the legs is in docs/savers.md.

use sqlparser::ast::{Assignment, AssignmentTarget, Delete, Expr, FromTable, TableFactor, Value};

use super::ast::{name_parts, predicates, Predicate};
use super::{Shape, StatementKind};
use crate::saver::profile::{SaverProfile, TableRole};
use crate::saver::unknown::{Unenforced, ALL_LEGS};

/// Which of a thread's rows a housekeeping DELETE removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowsDeleted {
    /// `thread_id = ANY($n)`: every row of several threads (prune, strategy
    /// `delete`).
    Threads { threads_param: usize },
    /// `thread_id = $1 AND checkpoint_ns = ANY($2)`: whole namespaces of a
    /// thread (prune: subgraph calls finished with the root checkpoint
    /// they started from).
    Namespaces,
    /// `thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3)`:
    /// the writes of listed checkpoints (prune: the checkpoints it deletes).
    Listed,
    /// `... AND checkpoint_id <> ALL($3)` or `NOT IN ($3, $4)`: the rows of
    /// every checkpoint of a namespace but the listed ones (prune keeps
    /// each namespace's head; the shallow `put` keeps the new checkpoint
    /// and the one it continues).
    AllBut {
        thread_param: usize,
        ns_param: usize,
        kept_params: Vec<usize>,
    },
    /// `thread_id = $1 AND checkpoint_ns = $2 AND channel = $3 AND
    /// version = ANY($4)`: blob versions no kept checkpoint references.
    BlobVersions,
}

impl RowsDeleted {
    pub fn label(&self) -> &'static str {
        match self {
            RowsDeleted::Threads { .. } => "delete_threads",
            RowsDeleted::Namespaces => "delete_namespaces",
            RowsDeleted::Listed => "delete_listed_checkpoints",
            RowsDeleted::AllBut { .. } => "delete_all_but_kept",
            RowsDeleted::BlobVersions => "delete_blob_versions",
        }
    }
}

/// The shape of a DELETE on one of the profile's tables, or `None` when
/// it deletes from none of them.
pub(super) fn delete_shape(delete: &Delete, profile: &SaverProfile) -> Option<(Shape, bool)> {
    let tables = match &delete.from {
        FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
    };
    let [from] = tables.as_slice() else {
        return None;
    };
    let TableFactor::Table { name, .. } = &from.relation else {
        return None;
    };
    let parts = name_parts(name);
    let table = profile.role_of(&parts)?;
    let exact = profile.fits_exactly(&parts);
    let preds = delete.selection.as_ref().and_then(predicates);
    let unknown = || {
        Err(Unenforced {
            statement: format!("delete from {name}"),
            reason: "not a delete the savers send (by thread, namespaces, checkpoints or \
                     blob versions)"
                .into(),
            legs_off: ALL_LEGS,
        })
    };
    if !from.joins.is_empty() || delete.using.is_some() || table == TableRole::Migrations {
        return Some((unknown(), exact));
    }
    let Some(preds) = preds else {
        return Some((unknown(), exact));
    };
    let kind = match (table, sorted(&preds).as_slice()) {
        (_, [Predicate::Eq(t, p)]) if t == "thread_id" => StatementKind::DeleteThread {
            table,
            thread_param: Some(*p),
        },
        (_, [Predicate::AnyOf(t, p)]) if t == "thread_id" => StatementKind::DeleteRows {
            table,
            rows: RowsDeleted::Threads { threads_param: *p },
        },
        (_, [Predicate::Eq(t, _), Predicate::AnyOf(n, _)])
            if t == "thread_id" && n == "checkpoint_ns" =>
        {
            StatementKind::DeleteRows {
                table,
                rows: RowsDeleted::Namespaces,
            }
        }
        (
            TableRole::Checkpoints | TableRole::Writes,
            [Predicate::Eq(t, thread_param), Predicate::Eq(n, ns_param), id],
        ) if t == "thread_id" && n == "checkpoint_ns" && id.column() == "checkpoint_id" => {
            let rows = match id {
                Predicate::AnyOf(..) if table == TableRole::Writes => RowsDeleted::Listed,
                Predicate::NoneOf(_, kept) => RowsDeleted::AllBut {
                    thread_param: *thread_param,
                    ns_param: *ns_param,
                    kept_params: kept.clone(),
                },
                _ => return Some((unknown(), exact)),
            };
            StatementKind::DeleteRows { table, rows }
        }
        (
            TableRole::Blobs,
            [Predicate::Eq(t, _), Predicate::Eq(n, _), Predicate::Eq(c, _), Predicate::AnyOf(v, _)],
        ) if t == "thread_id" && n == "checkpoint_ns" && c == "channel" && v == "version" => {
            StatementKind::DeleteRows {
                table,
                rows: RowsDeleted::BlobVersions,
            }
        }
        _ => return Some((unknown(), exact)),
    };
    Some((Ok(kind), exact))
}

/// Predicates in a fixed order: thread, namespace, checkpoint id,
/// channel, version (then anything else), each group as written.
fn sorted(preds: &[Predicate]) -> Vec<Predicate> {
    const ORDER: [&str; 5] = [
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
        "channel",
        "version",
    ];
    let rank = |p: &Predicate| {
        ORDER
            .iter()
            .position(|c| *c == p.column())
            .unwrap_or(ORDER.len())
    };
    let mut out = preds.to_vec();
    out.sort_by_key(rank);
    out
}

/// prune's `UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE
/// thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3) AND
/// parent_checkpoint_id <> ALL($4)`: kept checkpoints lose the link to a
/// parent it deleted. Any other UPDATE of a checkpoint table is not a
/// saver's.
pub(super) fn update_shape(
    table: &sqlparser::ast::TableWithJoins,
    assignments: &[Assignment],
    selection: Option<&Expr>,
    profile: &SaverProfile,
) -> Option<(Shape, bool)> {
    let TableFactor::Table { name, .. } = &table.relation else {
        return None;
    };
    let parts = name_parts(name);
    let role = profile.role_of(&parts)?;
    let exact = profile.fits_exactly(&parts);
    let sets_parent_null = matches!(assignments, [a] if assigns_null_to(a, "parent_checkpoint_id"));
    let preds = selection.and_then(predicates).map(|p| sorted(&p));
    let scoped = matches!(
        preds.as_deref(),
        Some([Predicate::Eq(t, _), Predicate::Eq(n, _), Predicate::AnyOf(i, _), Predicate::NoneOf(..)])
            if t == "thread_id" && n == "checkpoint_ns" && i == "checkpoint_id"
    );
    if role == TableRole::Checkpoints && table.joins.is_empty() && sets_parent_null && scoped {
        return Some((Ok(StatementKind::Unparent), exact));
    }
    Some((
        Err(Unenforced {
            statement: format!("update {name}"),
            reason: "the savers update checkpoints only to clear parent_checkpoint_id".into(),
            legs_off: ALL_LEGS,
        }),
        exact,
    ))
}

fn assigns_null_to(a: &Assignment, column: &str) -> bool {
    let target = match &a.target {
        AssignmentTarget::ColumnName(name) => name_parts(name),
        AssignmentTarget::Tuple(_) => return false,
    };
    matches!(target.as_slice(), [(c, _)] if c.eq_ignore_ascii_case(column))
        && matches!(&a.value, Expr::Value(v) if matches!(v.value, Value::Null))
}
