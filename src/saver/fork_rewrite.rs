//! The fork-intent rewrite of a read-by-id.
//!
//! Whether the checkpoint a read addresses is still the head of its
//! (thread_id, checkpoint_ns) must be decided atomically with the read, so
//! the database decides it: the statement's SQL is rewritten once, at
//! Parse, to return one more column, the head's checkpoint_id, computed in
//! the same snapshot as the row. The wire layer strips that column before
//! the client sees the result and hands it to the fork policy.

use sqlparser::ast::{SelectItem, SetExpr, Statement, TableFactor};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// Name of the column the rewrite appends (never reaches the client).
pub const HEAD_COLUMN: &str = "__resumeguard_head";

/// Rewrites a checkpoint read so it also returns the head checkpoint id of
/// the row's namespace as its last column. `None` when the SQL is not a
/// single plain SELECT from one table (then no fork filter applies).
pub fn add_head_column(sql: &str) -> Option<String> {
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let [Statement::Query(query)] = statements.as_mut_slice() else {
        return None;
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return None;
    };
    let [from] = select.from.as_slice() else {
        return None;
    };
    let TableFactor::Table { name, alias, .. } = &from.relation else {
        return None;
    };
    let outer = match alias {
        Some(a) => a.name.to_string(),
        None => name.to_string(),
    };
    let head = format!(
        "SELECT (SELECT max(rg_h.checkpoint_id) FROM {name} AS rg_h \
         WHERE rg_h.thread_id = {outer}.thread_id AND rg_h.checkpoint_ns = {outer}.checkpoint_ns) \
         AS {HEAD_COLUMN}"
    );
    let mut parsed = Parser::parse_sql(&PostgreSqlDialect {}, &head).ok()?;
    let Some(Statement::Query(head_query)) = parsed.pop() else {
        return None;
    };
    let SetExpr::Select(mut head_select) = *head_query.body else {
        return None;
    };
    let item: SelectItem = head_select.projection.pop()?;
    select.projection.push(item);
    Some(statements.pop()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saver::classify::{Classifier, ReadMode, StatementKind};
    use crate::saver::profile::SaverProfile;

    /// The Python saver's read by id, verbatim.
    fn read_by_id() -> String {
        format!(
            "{}WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3",
            crate::saver::classify::saver_sql::SELECT_SQL
        )
    }

    #[test]
    fn appends_the_head_as_last_column_and_keeps_the_read() {
        let sql = add_head_column(&read_by_id()).unwrap();
        assert!(
            sql.contains("max(rg_h.checkpoint_id) FROM checkpoints AS rg_h"),
            "{sql}"
        );
        assert!(
            sql.contains("rg_h.thread_id = checkpoints.thread_id"),
            "{sql}"
        );
        assert!(sql.trim_end().ends_with("checkpoint_id = $3"), "{sql}");
        // Still the same read, with the head column last.
        let c = Classifier::new(vec![SaverProfile::langgraph_python()]);
        let StatementKind::Read(shape) = &c.classify(&sql).kind else {
            panic!("rewritten SQL is no longer a read: {sql}")
        };
        assert_eq!(shape.mode, ReadMode::ById);
        assert_eq!(shape.output.last().map(String::as_str), Some(HEAD_COLUMN));
        assert_eq!(shape.id_param, Some(2));
    }

    #[test]
    fn aliased_and_qualified_tables_reference_the_alias() {
        let sql = add_head_column(
            "SELECT cp.thread_id FROM \"public\".\"checkpoints\" cp WHERE cp.thread_id = $1 AND cp.checkpoint_id = $2",
        )
        .unwrap();
        assert!(
            sql.contains("FROM \"public\".\"checkpoints\" AS rg_h"),
            "{sql}"
        );
        assert!(
            sql.contains("rg_h.checkpoint_ns = cp.checkpoint_ns"),
            "{sql}"
        );
    }

    #[test]
    fn other_shapes_are_left_alone() {
        assert_eq!(add_head_column("select 1; select 2"), None);
        assert_eq!(add_head_column("insert into checkpoints values (1)"), None);
        assert_eq!(add_head_column("select * from a join b on true, c"), None);
    }
}
