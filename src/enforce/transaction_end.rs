//! Whether a statement text ends the open transaction, and how: a write
//! refusal still waiting in the validity gate is raised before a `COMMIT`,
//! `END` or `PREPARE TRANSACTION`, so the write it refuses never commits,
//! and is dropped at a `ROLLBACK` or `ABORT`, which discards the write
//! itself; either way it never lands on a later statement.

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

/// How a statement ends the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionEnd {
    /// `COMMIT`, `END`, `PREPARE TRANSACTION`: what it wrote is kept.
    Commit,
    /// `ROLLBACK`, `ABORT`: nothing it wrote is kept.
    Rollback,
}

/// Whether `sql` commits (or prepares) or rolls back the open
/// transaction. `ROLLBACK TO SAVEPOINT` stays in it; `COMMIT PREPARED` and
/// `ROLLBACK PREPARED` end another, prepared, one.
pub fn transaction_end(sql: &str) -> Option<TransactionEnd> {
    // Almost every text opens with another word: it is not tokenized.
    let opening = sql
        .trim_start()
        .bytes()
        .next()
        .map(|b| b.to_ascii_lowercase());
    if !matches!(
        opening,
        Some(b'a' | b'c' | b'e' | b'p' | b'r' | b'/' | b'-')
    ) {
        return None;
    }
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize().ok()?;
    let words: Vec<Option<(Keyword, &str)>> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .take(3)
        .map(|t| match t {
            Token::Word(w) if w.quote_style.is_none() => Some((w.keyword, w.value.as_str())),
            _ => None,
        })
        .collect();
    let keyword = |i: usize| words.get(i).copied().flatten().map(|(k, _)| k);
    let end = match keyword(0)? {
        Keyword::COMMIT | Keyword::END => TransactionEnd::Commit,
        Keyword::ROLLBACK | Keyword::ABORT => TransactionEnd::Rollback,
        Keyword::PREPARE => {
            return (keyword(1) == Some(Keyword::TRANSACTION)).then_some(TransactionEnd::Commit)
        }
        _ => return None,
    };
    let after = match keyword(1) {
        Some(Keyword::WORK | Keyword::TRANSACTION) => 2,
        _ => 1,
    };
    let stays = keyword(after) == Some(Keyword::TO);
    let prepared = words
        .get(after)
        .copied()
        .flatten()
        .is_some_and(|(_, value)| value.eq_ignore_ascii_case("prepared"));
    (!(stays || prepared)).then_some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_that_end_the_transaction() {
        use TransactionEnd::{Commit, Rollback};
        for (sql, end) in [
            ("COMMIT", Commit),
            ("commit;", Commit),
            ("  /* psycopg */ COMMIT", Commit),
            ("-- done\nEND", Commit),
            ("END WORK", Commit),
            ("COMMIT TRANSACTION AND CHAIN", Commit),
            ("PREPARE TRANSACTION 'tx-1'", Commit),
            ("ROLLBACK", Rollback),
            ("rollback work", Rollback),
            ("ROLLBACK AND CHAIN", Rollback),
            ("ABORT", Rollback),
        ] {
            assert_eq!(transaction_end(sql), Some(end), "{sql}");
        }
    }

    #[test]
    fn statements_that_do_not() {
        for sql in [
            "",
            "BEGIN",
            "SELECT 1",
            "SAVEPOINT a",
            "RELEASE SAVEPOINT a",
            "ROLLBACK TO SAVEPOINT a",
            "ROLLBACK WORK TO a",
            "COMMIT PREPARED 'tx-1'",
            "ROLLBACK PREPARED 'tx-1'",
            "PREPARE p AS SELECT 1",
            "\"commit\"",
            "ANALYZE checkpoints",
            "/* COMMIT */ SELECT 1",
            "INSERT INTO checkpoint_blobs VALUES ($1)",
        ] {
            assert_eq!(transaction_end(sql), None, "{sql}");
        }
    }
}
