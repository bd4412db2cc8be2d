//! The shape of a checkpoint SELECT: how it picks its rows, which
//! parameters address it, where the decoded columns sit, and how each row
//! of its `channel_values` and `pending_writes` arrays is laid out — read
//! off the SQL and matched against the profile's declared layouts.

use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions, BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    LimitClause, OrderByKind, OrderBySort, Query, Select, SelectItem, SetExpr, Value,
};

use super::ast::{collect_equalities, column_name, output_name};
use crate::saver::checkpoint_row::RowLayout;
use crate::saver::layout::Element;
use crate::saver::profile::{KnownLayout, SaverProfile};

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

impl ReadMode {
    /// A short name for logs and audit records.
    pub fn label(self) -> &'static str {
        match self {
            ReadMode::Latest => "read_latest",
            ReadMode::ById => "read_by_id",
            ReadMode::List => "read_list",
        }
    }
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
    /// Where the decoded columns sit and how their array rows are laid out.
    pub layout: RowLayout,
    /// The saver generation whose `pending_writes` layout the read has,
    /// as the profile names it (e.g. `3.x`, `2.0.x`, `1.0.x`).
    pub saver: String,
}

impl ReadShape {
    pub fn column(&self, name: &str) -> Option<usize> {
        self.output.iter().position(|c| c == name)
    }
}

/// The columns a checkpoint read must return to be decoded.
const DECODED: [&str; 6] = [
    "thread_id",
    "checkpoint",
    "checkpoint_ns",
    "metadata",
    "channel_values",
    "pending_writes",
];

/// The history saver's identity columns: returned by every checkpoint
/// read but the shallow saver's (whose table keeps one checkpoint per
/// namespace, its id inside the document, and no parent).
const HISTORY_IDS: [&str; 2] = ["checkpoint_id", "parent_checkpoint_id"];

/// The shape of a SELECT from the checkpoints table, or the mode it would
/// have had and why its rows cannot be decoded.
pub(super) fn read_shape(
    query: &Query,
    select: &Select,
    profile: &SaverProfile,
) -> Result<ReadShape, (ReadMode, String)> {
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
    let output: Vec<String> = select.projection.iter().map(output_name).collect();
    let at = |name: &str| output.iter().position(|c| c == name);
    // The shallow read: each row is its namespace's only checkpoint, so a
    // read of one namespace is a read of its head, and there is nothing
    // superseded to fork from.
    let shallow = HISTORY_IDS.iter().all(|c| at(c).is_none())
        && at("pending_writes")
            .and_then(|i| select.projection.get(i))
            .is_some_and(joins_writes_by_document_id);
    let id_param = param("checkpoint_id").filter(|_| !shallow);
    let mode = if shallow {
        if param("thread_id").is_some() && param("checkpoint_ns").is_some() {
            ReadMode::Latest
        } else {
            ReadMode::List
        }
    } else if id_param.is_some() {
        ReadMode::ById
    } else if limit_one && ordered_desc {
        ReadMode::Latest
    } else {
        ReadMode::List
    };
    let mut required = DECODED
        .iter()
        .chain(HISTORY_IDS.iter().filter(|_| !shallow));
    if let Some(missing) = required.find(|c| at(c).is_none()) {
        return Err((mode, format!("the read does not return {missing}")));
    }
    let elements = |column: &str| {
        let item = at(column).and_then(|i| select.projection.get(i));
        array_elements(item).ok_or_else(|| {
            (
                mode,
                format!("{column} is not a subquery of array_agg(array[...])"),
            )
        })
    };
    let values = elements("channel_values")?;
    let writes = elements("pending_writes")?;
    let unknown = |column: &str, found: &[Option<Element>], known: String| {
        (
            mode,
            format!(
                "{column} rows are {}; the profile knows {known}",
                describe(found)
            ),
        )
    };
    let value_rows = matching(&profile.rows.channel_values, &values).ok_or_else(|| {
        unknown(
            "channel_values",
            &values,
            known(&profile.rows.channel_values),
        )
    })?;
    let write_rows = matching(&profile.rows.pending_writes, &writes).ok_or_else(|| {
        unknown(
            "pending_writes",
            &writes,
            known(&profile.rows.pending_writes),
        )
    })?;
    // Every DECODED column was found above.
    let col = |name: &str| at(name).unwrap_or_default();
    Ok(ReadShape {
        mode,
        thread_param: param("thread_id"),
        ns_param: param("checkpoint_ns"),
        id_param,
        layout: RowLayout {
            thread_id: col("thread_id"),
            checkpoint: col("checkpoint"),
            checkpoint_ns: col("checkpoint_ns"),
            checkpoint_id: at("checkpoint_id"),
            parent_checkpoint_id: at("parent_checkpoint_id"),
            metadata: col("metadata"),
            channel_values: col("channel_values"),
            pending_writes: col("pending_writes"),
            value_rows: value_rows.layout,
            write_rows: write_rows.layout,
        },
        saver: write_rows.saver.clone(),
        output,
    })
}

/// The declared layout whose elements are exactly `found`.
fn matching<'a, L>(
    known: &'a [KnownLayout<L>],
    found: &[Option<Element>],
) -> Option<&'a KnownLayout<L>> {
    known.iter().find(|k| {
        k.elements.len() == found.len() && k.elements.iter().zip(found).all(|(a, b)| Some(*a) == *b)
    })
}

/// `[a, b] (saver), [c] (saver)` for an error message.
fn known<L>(known: &[KnownLayout<L>]) -> String {
    known
        .iter()
        .map(|k| {
            let found: Vec<_> = k.elements.iter().copied().map(Some).collect();
            format!("{} ({})", describe(&found), k.saver)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `[task_id, channel, ?]`: `?` for an element that is not a known column.
fn describe(elements: &[Option<Element>]) -> String {
    let names: Vec<&str> = elements
        .iter()
        .map(|e| match e {
            Some(Element::TaskId) => "task_id",
            Some(Element::Channel) => "channel",
            Some(Element::Type) => "type",
            Some(Element::Blob) => "blob",
            Some(Element::TaskPath) => "task_path",
            Some(Element::Idx) => "idx",
            None => "?",
        })
        .collect();
    format!("[{}]", names.join(", "))
}

/// The elements of `(select array_agg(array[e1, e2, ...]) ...)`, each as
/// the column it carries; `None` when the item is not of that form.
fn array_elements(item: Option<&SelectItem>) -> Option<Vec<Option<Element>>> {
    let expr = match item? {
        SelectItem::ExprWithAlias { expr, .. } | SelectItem::UnnamedExpr(expr) => expr,
        _ => return None,
    };
    let Expr::Subquery(query) = expr else {
        return None;
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let [SelectItem::UnnamedExpr(Expr::Function(agg))
    | SelectItem::ExprWithAlias {
        expr: Expr::Function(agg),
        ..
    }] = select.projection.as_slice()
    else {
        return None;
    };
    if !agg.name.to_string().eq_ignore_ascii_case("array_agg") {
        return None;
    }
    let FunctionArguments::List(list) = &agg.args else {
        return None;
    };
    let [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Array(array)))] = list.args.as_slice()
    else {
        return None;
    };
    Some(array.elem.iter().map(element_of).collect())
}

/// The column an array element carries through casts (`x::text::bytea`)
/// and the text-to-bytea conversion (`convert_to(x, 'UTF8')`), which keep
/// its value; any other expression is not a column's value.
fn element_of(expr: &Expr) -> Option<Element> {
    match expr {
        Expr::Cast { expr, .. } | Expr::Nested(expr) => element_of(expr),
        Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("convert_to") => {
            let FunctionArguments::List(list) = &f.args else {
                return None;
            };
            match list.args.first()? {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(inner)) => element_of(inner),
                _ => None,
            }
        }
        other => Element::from_column(&column_name(other)?),
    }
}

/// Whether a `pending_writes` subquery picks its checkpoint's writes by the
/// document's id (`cw.checkpoint_id = (checkpoint->>'id')`), as the
/// shallow saver's read does: the mark of a table without a
/// `checkpoint_id` column.
fn joins_writes_by_document_id(item: &SelectItem) -> bool {
    let is_document_id = |e: &Expr| {
        let mut e = e;
        while let Expr::Nested(inner) = e {
            e = inner;
        }
        matches!(e, Expr::BinaryOp { left, op: BinaryOperator::LongArrow, right }
            if column_name(left).as_deref() == Some("checkpoint")
                && matches!(right.as_ref(), Expr::Value(v)
                    if matches!(&v.value, Value::SingleQuotedString(s) if s == "id")))
    };
    let mut found = false;
    let _ = visit_expressions(item, |e| {
        if let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = e
        {
            let id_column = |x: &Expr| column_name(x).as_deref() == Some("checkpoint_id");
            found |= (id_column(left) && is_document_id(right))
                || (id_column(right) && is_document_id(left));
        }
        ControlFlow::<()>::Continue(())
    });
    found
}
