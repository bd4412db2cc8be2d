//! Reads of the checkpoint tables that are not the checkpoint read: prune's
//! look-ups (thread ids, namespace heads, checkpoint ids, channel
//! versions), the delta-channel history walk (its stage 1 over
//! `checkpoints`, its stage 2 over one named channel's writes and blobs),
//! and `WITH deleted AS (DELETE ... RETURNING ...) SELECT ...` (prune's
//! delete of unkept checkpoints). The legs act on the checkpoint read's
//! pending writes (where `__interrupt__` and `__resume__` reach a run), so
//! what decides these shapes is where they could return pending writes
//! from: only inside `EXISTS`, or filtered to a channel named by a
//! parameter (checked at Bind: never a reserved one).

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions, Expr, InTarget, Query, Select, SelectItem, SetExpr, Statement, TableFactor,
    TableWithJoins,
};

use super::ast::{collect_equalities, name_parts, output_name};
use super::housekeeping::delete_shape;
use super::{Shape, StatementKind};
use crate::saver::profile::{SaverProfile, TableRole};
use crate::saver::unknown::{Unenforced, ALL_LEGS};

/// Columns whose presence in the result makes a read a checkpoint read
/// (to be decoded by a declared layout), not an auxiliary one.
const CHECKPOINT_READ_OUTPUTS: [&str; 3] = ["checkpoint", "channel_values", "pending_writes"];

/// The shape of a query on the profile's tables that is not the checkpoint
/// read, or `None` when it touches none of them.
pub(super) fn aux_read_shape(query: &Query, profile: &SaverProfile) -> Option<(Shape, bool)> {
    let exact = super::names_a_table_of(query, profile)?;
    Some((classify(query, profile), exact))
}

fn classify(query: &Query, profile: &SaverProfile) -> Shape {
    let unknown = |reason: String| {
        Err(Unenforced {
            statement: "select".into(),
            reason,
            legs_off: ALL_LEGS,
        })
    };
    // A data-modifying CTE: prune's delete of unkept checkpoints,
    // returning their channel versions.
    let mut write: Option<StatementKind> = None;
    for cte in query.with.iter().flat_map(|w| &w.cte_tables) {
        let body = match cte.query.body.as_ref() {
            SetExpr::Delete(Statement::Delete(d)) => d,
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_) => {
                return unknown("a data-modifying CTE other than a delete of checkpoints".into())
            }
            _ => continue,
        };
        match delete_shape(body, profile) {
            Some((Ok(kind @ StatementKind::DeleteRows { table, .. }), _))
                if table == TableRole::Checkpoints && write.is_none() =>
            {
                write = Some(kind)
            }
            Some((Err(what), _)) => return Err(what),
            _ => {
                return unknown("a data-modifying CTE other than one delete of checkpoints".into())
            }
        }
    }
    let mut walk = Walk {
        profile,
        seen: HashSet::new(),
        channel_params: Vec::new(),
        problem: None,
    };
    walk.query(query, false);
    if let Some(problem) = walk.problem {
        return unknown(problem);
    }
    let outputs = first_select(&query.body)
        .map(|s| s.projection.iter().map(output_name).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(column) = outputs
        .iter()
        .find(|o| CHECKPOINT_READ_OUTPUTS.contains(&o.as_str()))
    {
        return unknown(format!(
            "returns {column} but is not a checkpoint read of a declared shape"
        ));
    }
    match (write, walk.channel_params) {
        (Some(kind), params) if params.is_empty() => Ok(kind),
        (Some(_), _) => unknown("a delete that also reads pending writes".into()),
        (None, params) if params.is_empty() => Ok(StatementKind::ReadWithoutWrites),
        (None, channel_params) => Ok(StatementKind::ChannelHistoryRead { channel_params }),
    }
}

/// The leftmost SELECT of a query body: the one naming its result columns.
fn first_select(body: &SetExpr) -> Option<&Select> {
    match body {
        SetExpr::Select(s) => Some(s),
        SetExpr::Query(q) => first_select(&q.body),
        SetExpr::SetOperation { left, .. } => first_select(left),
        _ => None,
    }
}

/// Walks every query of a statement once, noting each SELECT that reads
/// pending writes outside `EXISTS` (it must name its channel by a
/// parameter) and any shape that returns rows the proxy cannot bound.
struct Walk<'a> {
    profile: &'a SaverProfile,
    /// Queries already walked, by address: the expression visitor meets a
    /// nested query again after it was walked from its parent.
    seen: HashSet<*const Query>,
    channel_params: Vec<usize>,
    problem: Option<String>,
}

impl Walk<'_> {
    /// `inside_exists`: the query only decides an `EXISTS`; nothing of its
    /// rows reaches the client.
    fn query(&mut self, query: &Query, inside_exists: bool) {
        if !self.seen.insert(query as *const Query) {
            return;
        }
        for cte in query.with.iter().flat_map(|w| &w.cte_tables) {
            if !matches!(cte.query.body.as_ref(), SetExpr::Delete(_)) {
                self.query(&cte.query, inside_exists);
            }
        }
        self.set_expr(&query.body, inside_exists);
    }

    fn set_expr(&mut self, body: &SetExpr, inside_exists: bool) {
        match body {
            SetExpr::Select(select) => self.select(select, inside_exists),
            SetExpr::Query(q) => self.query(q, inside_exists),
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left, inside_exists);
                self.set_expr(right, inside_exists);
            }
            SetExpr::Values(_) => {}
            _ => self.fail("a data-modifying statement or TABLE inside a read"),
        }
    }

    fn select(&mut self, select: &Select, inside_exists: bool) {
        let mut reads_writes = false;
        for from in &select.from {
            self.joined_tables(from, inside_exists, &mut reads_writes);
        }
        if !inside_exists {
            if select.projection.iter().any(|item| {
                matches!(
                    item,
                    SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
                )
            }) {
                self.fail("selects * from a checkpoint table");
            }
            if reads_writes {
                let mut eqs = Vec::new();
                if let Some(selection) = &select.selection {
                    collect_equalities(selection, &mut eqs);
                }
                match eqs.iter().find(|(c, _)| c == "channel") {
                    Some((_, param)) => self.channel_params.push(*param),
                    None => self
                        .fail("reads pending writes without naming their channel by a parameter"),
                }
            }
        }
        let _ = visit_expressions(select, |expr| {
            match expr {
                Expr::Exists { subquery, .. } => self.query(subquery, true),
                Expr::Subquery(q) => self.query(q, inside_exists),
                Expr::In {
                    target: InTarget::Subquery(subquery),
                    ..
                } => self.query(subquery, inside_exists),
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
    }

    fn joined_tables(&mut self, from: &TableWithJoins, inside_exists: bool, writes: &mut bool) {
        self.factor(&from.relation, inside_exists, writes);
        for join in &from.joins {
            self.factor(&join.relation, inside_exists, writes);
        }
    }

    fn factor(&mut self, factor: &TableFactor, inside_exists: bool, writes: &mut bool) {
        match factor {
            TableFactor::Table { name, .. }
                if self.profile.role_of(&name_parts(name)) == Some(TableRole::Writes) =>
            {
                *writes = true;
            }
            TableFactor::Derived { subquery, .. } => self.query(subquery, inside_exists),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => self.joined_tables(table_with_joins, inside_exists, writes),
            _ => {}
        }
    }

    fn fail(&mut self, why: &str) {
        self.problem.get_or_insert_with(|| why.to_owned());
    }
}
