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

/// `col = $n` predicates joined by AND (either operand order).
pub(super) fn collect_equalities(expr: &Expr, out: &mut Vec<(String, usize)>) {
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
    let mut out = Vec::new();
    push_predicates(expr, &mut out)?;
    Some(out)
}

fn push_predicates(expr: &Expr, out: &mut Vec<Predicate>) -> Option<()> {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            push_predicates(left, out)?;
            push_predicates(right, out)
        }
        Expr::Nested(inner) => push_predicates(inner, out),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => {
            out.push(Predicate::Eq(column_name(left)?, placeholder(right)?));
            Some(())
        }
        Expr::AnyOp {
            left,
            compare_op: BinaryOperator::Eq,
            right,
            ..
        } => {
            out.push(Predicate::AnyOf(column_name(left)?, placeholder(right)?));
            Some(())
        }
        Expr::AllOp {
            left,
            compare_op: BinaryOperator::NotEq,
            right,
        } => {
            out.push(Predicate::NoneOf(
                column_name(left)?,
                vec![placeholder(right)?],
            ));
            Some(())
        }
        Expr::In {
            expr,
            target: InTarget::List(list),
            negated: true,
            ..
        } => {
            let params = list.iter().map(placeholder).collect::<Option<Vec<_>>>()?;
            out.push(Predicate::NoneOf(column_name(expr)?, params));
            Some(())
        }
        _ => None,
    }
}
