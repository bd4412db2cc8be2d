//! Small readers of sqlparser expressions shared by the statement shapes:
//! table names, bare column names, `$n` placeholders, `col = $n` predicates.

use sqlparser::ast::{
    BinaryOperator, Expr, InTarget, ObjectName, ObjectNamePart, SelectItem, Value,
};

/// The parts of a possibly qualified name, each with whether it was quoted.
pub(super) fn name_parts(name: &ObjectName) -> Vec<(String, bool)> {
    name.0
        .iter()
        .map(|part| match part {
            ObjectNamePart::Identifier(id) => (id.value.clone(), id.quote_style.is_some()),
            other => (other.to_string(), false),
        })
        .collect()
}

/// The bare column name of `col`, `alias.col` or `"col"`.
pub(super) fn column_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Identifier(id) => Some(id.value.to_ascii_lowercase()),
        Expr::CompoundIdentifier(parts) => parts.last().map(|p| p.value.to_ascii_lowercase()),
        Expr::Nested(inner) => column_name(inner),
        _ => None,
    }
}

/// The 0-based parameter index of `$n`.
pub(super) fn placeholder(expr: &Expr) -> Option<usize> {
    match expr {
        Expr::Value(v) => match &v.value {
            Value::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1),
            _ => None,
        },
        Expr::Cast { expr, .. } | Expr::Nested(expr) => placeholder(expr),
        _ => None,
    }
}

/// The conjuncts of `expr`: its terms joined by AND, parentheses dropped.
fn conjuncts(expr: &Expr) -> Vec<&Expr> {
    fn walk<'a>(expr: &'a Expr, out: &mut Vec<&'a Expr>) {
        match expr {
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            } => {
                walk(left, out);
                walk(right, out);
            }
            Expr::Nested(inner) => walk(inner, out),
            other => out.push(other),
        }
    }
    let mut out = Vec::new();
    walk(expr, &mut out);
    out
}

/// `col = $n` predicates joined by AND (either operand order).
pub(super) fn collect_equalities(expr: &Expr, out: &mut Vec<(String, usize)>) {
    out.extend(conjuncts(expr).into_iter().filter_map(|term| match term {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => match (column_name(left), placeholder(right)) {
            (Some(c), Some(p)) => Some((c, p)),
            _ => column_name(right).zip(placeholder(left)),
        },
        _ => None,
    }));
}

/// The name a projection item has in the result.
pub(super) fn output_name(item: &SelectItem) -> String {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => alias.value.to_ascii_lowercase(),
        SelectItem::UnnamedExpr(e) => column_name(e).unwrap_or_default(),
        _ => String::new(),
    }
}

/// One conjunct of a housekeeping statement's WHERE clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Predicate {
    /// `col = $n`
    Eq(String, usize),
    /// `col = ANY($n)`: one of an array parameter's elements.
    AnyOf(String, usize),
    /// `col <> ALL($n)` or `col NOT IN ($a, $b, ...)`: none of them.
    NoneOf(String, Vec<usize>),
}

impl Predicate {
    pub(super) fn column(&self) -> &str {
        match self {
            Predicate::Eq(c, _) | Predicate::AnyOf(c, _) | Predicate::NoneOf(c, _) => c,
        }
    }
}

/// The conjuncts of `expr` (joined by AND), each a [`Predicate`] on a
/// bare column and parameters; `None` when any conjunct is of another form.
pub(super) fn predicates(expr: &Expr) -> Option<Vec<Predicate>> {
    conjuncts(expr).into_iter().map(predicate).collect()
}

/// One conjunct as a [`Predicate`]; `None` when it is of another form.
fn predicate(expr: &Expr) -> Option<Predicate> {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => Some(Predicate::Eq(column_name(left)?, placeholder(right)?)),
        Expr::AnyOp {
            left,
            compare_op: BinaryOperator::Eq,
            right,
            ..
        } => Some(Predicate::AnyOf(column_name(left)?, placeholder(right)?)),
        Expr::AllOp {
            left,
            compare_op: BinaryOperator::NotEq,
            right,
        } => Some(Predicate::NoneOf(
            column_name(left)?,
            vec![placeholder(right)?],
        )),
        Expr::In {
            expr,
            target: InTarget::List(list),
            negated: true,
            ..
        } => {
            let params = list.iter().map(placeholder).collect::<Option<Vec<_>>>()?;
            Some(Predicate::NoneOf(column_name(expr)?, params))
        }
        _ => None,
    }
}
