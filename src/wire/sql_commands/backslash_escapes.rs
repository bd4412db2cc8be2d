//! How the server tokenizes a text while `standard_conforming_strings` is
//! off: PostgreSQL's rules, except that a backslash in a `'…'` string
//! escapes the next character, so a string may end elsewhere than the
//! standard reading says. A client may turn the setting off, and the
//! server's report of it can arrive after the client's next texts, so the
//! command scanner reads a text with a backslash both ways.

use sqlparser::dialect::{Dialect, PostgreSqlDialect};

/// PostgreSQL's dialect with backslash escapes in `'…'` strings; every
/// other rule the tokenizer asks a dialect about is PostgreSQL's.
#[derive(Debug)]
pub(super) struct BackslashEscapes;

const PG: PostgreSqlDialect = PostgreSqlDialect {};

impl Dialect for BackslashEscapes {
    fn supports_string_literal_backslash_escape(&self) -> bool {
        true
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        PG.is_identifier_start(ch)
    }
    fn is_identifier_part(&self, ch: char) -> bool {
        PG.is_identifier_part(ch)
    }
    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        PG.is_delimited_identifier_start(ch)
    }
    fn is_custom_operator_part(&self, ch: char) -> bool {
        PG.is_custom_operator_part(ch)
    }
    fn ignores_wildcard_escapes(&self) -> bool {
        PG.ignores_wildcard_escapes()
    }
    fn requires_hash_comment_space(&self) -> bool {
        PG.requires_hash_comment_space()
    }
    fn requires_single_line_comment_whitespace(&self) -> bool {
        PG.requires_single_line_comment_whitespace()
    }
    fn supports_copy_from_stdin_data(&self) -> bool {
        PG.supports_copy_from_stdin_data()
    }
    fn supports_dollar_as_money_prefix(&self) -> bool {
        PG.supports_dollar_as_money_prefix()
    }
    fn supports_dollar_placeholder(&self) -> bool {
        PG.supports_dollar_placeholder()
    }
    fn supports_geometric_types(&self) -> bool {
        PG.supports_geometric_types()
    }
    fn supports_hash_comment(&self) -> bool {
        PG.supports_hash_comment()
    }
    fn supports_literal_prefix_in_qualified_name(&self) -> bool {
        PG.supports_literal_prefix_in_qualified_name()
    }
    fn supports_multiline_comment_hints(&self) -> bool {
        PG.supports_multiline_comment_hints()
    }
    fn supports_national_string_literal(&self) -> bool {
        PG.supports_national_string_literal()
    }
    fn supports_nested_comments(&self) -> bool {
        PG.supports_nested_comments()
    }
    fn supports_non_decimal_integer_literals(&self) -> bool {
        PG.supports_non_decimal_integer_literals()
    }
    fn supports_numeric_literal_underscores(&self) -> bool {
        PG.supports_numeric_literal_underscores()
    }
    fn supports_numeric_prefix(&self) -> bool {
        PG.supports_numeric_prefix()
    }
    fn supports_pipe_operator(&self) -> bool {
        PG.supports_pipe_operator()
    }
    fn supports_quote_delimited_string(&self) -> bool {
        PG.supports_quote_delimited_string()
    }
    fn supports_string_escape_constant(&self) -> bool {
        PG.supports_string_escape_constant()
    }
    fn supports_tilde_like_match_operator(&self) -> bool {
        PG.supports_tilde_like_match_operator()
    }
    fn supports_triple_quoted_string(&self) -> bool {
        PG.supports_triple_quoted_string()
    }
    fn supports_tuple_element_access(&self) -> bool {
        PG.supports_tuple_element_access()
    }
    fn supports_unicode_string_literal(&self) -> bool {
        PG.supports_unicode_string_literal()
    }
    fn supports_unterminated_block_comments(&self) -> bool {
        PG.supports_unterminated_block_comments()
    }
}
