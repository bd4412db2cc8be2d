//! Whether a statement text ends the open transaction (`COMMIT`, `END`,
//! `ROLLBACK`, `ABORT`, `PREPARE TRANSACTION`): a write refusal still
//! waiting in the validity gate is raised before one, so the write it
//! refuses never commits and the refusal never lands on a later statement.

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

/// Whether `sql` commits, rolls back or prepares the open transaction.
/// `ROLLBACK TO SAVEPOINT` stays in it; `COMMIT PREPARED` and `ROLLBACK
/// PREPARED` end another, prepared, one.
pub fn ends_transaction(sql: &str) -> bool {
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
        return false;
    }
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return false;
    };
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
    match keyword(0) {
        Some(Keyword::COMMIT | Keyword::END | Keyword::ROLLBACK | Keyword::ABORT) => {
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
            !(stays || prepared)
        }
        Some(Keyword::PREPARE) => keyword(1) == Some(Keyword::TRANSACTION),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_that_end_the_transaction() {
        for sql in [
            "COMMIT",
            "commit;",
            "  /* psycopg */ COMMIT",
            "-- done\nEND",
            "END WORK",
            "COMMIT TRANSACTION AND CHAIN",
            "ROLLBACK",
            "rollback work",
            "ROLLBACK AND CHAIN",
            "ABORT",
            "PREPARE TRANSACTION 'tx-1'",
        ] {
            assert!(ends_transaction(sql), "{sql}");
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
            assert!(!ends_transaction(sql), "{sql}");
        }
    }
}
