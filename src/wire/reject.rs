//! Rejecting a statement from inside the server's own transaction.
//!
//! When the proxy refuses a write, nothing of its Sync segment (or of the
//! surrounding explicit transaction) may commit, and the client must see
//! an ErrorResponse exactly where it expects the statement's answer. The
//! proxy gets both from the server: in place of the refused Bind it sends
//! a Parse/Bind/Execute of a `DO` block that raises the error. The server
//! then aborts the transaction, skips the client's remaining messages up to
//! Sync and reports the right transaction status — the same path as any
//! error of its own. The injected Parse and Bind answers are swallowed.
//!
//! The raised texts carry client data (thread ids, values quoted by the
//! validator), so none of it is ever SQL: each text travels as lowercase
//! hex digits that the server decodes with
//! `convert_from(decode('…','hex'),'UTF8')`. The statement is a fixed
//! template plus `[0-9a-f]` runs, whatever the text and whatever
//! `standard_conforming_strings` or any other setting says. Where the
//! database's encoding, or the client's the server converts the error to,
//! cannot hold a character of the text, the same text is raised with its
//! non-ASCII characters written as `\u{…}` escapes, so the raised SQLSTATE
//! is the requested one there too (the server would otherwise report its
//! failure to convert the message, 22P05, in its place).

use bytes::BytesMut;

use super::messages::bind::write_bind;
use super::messages::extended_query::{write_execute, write_parse, NO_PARAM_TYPES};
use super::messages::query::write_query;
use super::messages::write::EncodeError;

/// Parse + Bind + Execute (unnamed statement and portal) of a statement
/// that fails with `sqlstate`, `message` and `detail`.
pub fn raising_statement(
    sqlstate: &str,
    message: &str,
    detail: &str,
) -> Result<Vec<u8>, EncodeError> {
    let sql = raising_sql(sqlstate, message, detail);
    let mut out = BytesMut::with_capacity(sql.len() + 64);
    write_parse(&mut out, b"", sql.as_bytes(), NO_PARAM_TYPES)?;
    // No parameters, default formats.
    write_bind(&mut out, b"", b"", &[], std::iter::empty(), &[])?;
    write_execute(&mut out, b"", 0)?;
    Ok(Vec::from(out))
}

/// A simple Query of a statement that fails with `sqlstate`, `message`
/// and `detail`: what the server gets in place of a refused query text.
pub fn raising_query(sqlstate: &str, message: &str, detail: &str) -> Result<Vec<u8>, EncodeError> {
    let sql = raising_sql(sqlstate, message, detail);
    let mut out = BytesMut::with_capacity(sql.len() + 6);
    write_query(&mut out, sql.as_bytes())?;
    Ok(Vec::from(out))
}

/// The `DO` block: the texts are decoded into variables and converted to
/// the client's encoding first (falling back to their ASCII form when the
/// database's or the client's encoding lacks a character), then raised.
fn raising_sql(sqlstate: &str, message: &str, detail: &str) -> String {
    format!(
        "DO $resumeguard$ DECLARE m text; d text; BEGIN \
         BEGIN m := {}; d := {}; \
         PERFORM convert_to(m, pg_client_encoding()), convert_to(d, pg_client_encoding()); \
         EXCEPTION WHEN untranslatable_character OR character_not_in_repertoire THEN \
         m := {}; d := {}; END; \
         RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = m, DETAIL = d; \
         END $resumeguard$",
        server_text(message),
        server_text(detail),
        server_text(&ascii(message)),
        server_text(&ascii(detail)),
        server_text(&ascii(sqlstate)),
    )
}

/// A SQL expression the server evaluates to `text`, spelled with nothing
/// of `text` but hex digits. PostgreSQL text cannot hold NUL, which
/// `convert_from` would refuse: each becomes U+FFFD.
fn server_text(text: &str) -> String {
    let text = text.replace('\0', "\u{fffd}");
    format!("convert_from(decode('{}','hex'),'UTF8')", hex::encode(text))
}

/// `text` with every non-ASCII character (and NUL) as a `\u{…}` escape:
/// valid in every server encoding.
fn ascii(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\0' => "\\u{0}".to_owned(),
            c if c.is_ascii() => c.to_string(),
            c => c.escape_unicode().to_string(),
        })
        .collect()
}

/// The SQL text of the Parse message [`raising_statement`] starts with.
#[cfg(test)]
fn sql_of(bytes: &[u8]) -> String {
    let h = crate::wire::connection::peek_frame(bytes, 1 << 20)
        .unwrap()
        .unwrap();
    assert_eq!(h.tag, b'P');
    // tag, length, empty statement name; then the NUL-terminated SQL.
    let body = &bytes[6..h.total_len];
    let end = body.iter().position(|&b| b == 0).unwrap();
    String::from_utf8(body[..end].to_vec()).unwrap()
}

/// The SQL with every hex literal emptied, and the texts they decode to.
#[cfg(test)]
fn skeleton(sql: &str) -> (String, Vec<String>) {
    let mut shape = String::new();
    let mut texts = Vec::new();
    let mut rest = sql;
    while let Some(open) = rest.find("decode('") {
        let start = open + "decode('".len();
        let len = rest[start..].find('\'').unwrap();
        let digits = &rest[start..start + len];
        assert!(
            digits
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{digits}"
        );
        texts.push(String::from_utf8(hex::decode(digits).unwrap()).unwrap());
        shape.push_str(&rest[..start]);
        rest = &rest[start + len..];
    }
    shape.push_str(rest);
    (shape, texts)
}

/// What a [`raising_statement`] raises, for tests to read: the SQL
/// followed by the decoded texts, one per line.
#[cfg(test)]
pub(crate) fn readable(bytes: &[u8]) -> String {
    let sql = sql_of(bytes);
    let (_, texts) = skeleton(&sql);
    format!("{sql}\n{}", texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::connection::{messages, peek_frame};

    #[test]
    fn frames_parse_bind_execute() {
        let bytes = raising_statement("23514", "it's bad", "d").unwrap();
        let tags: Vec<u8> = messages(&bytes).iter().map(|m| m[0]).collect();
        assert_eq!(tags, b"PBE");
        let (_, texts) = skeleton(&sql_of(&bytes));
        assert_eq!(texts, ["it's bad", "d", "it's bad", "d", "23514"]);
    }

    #[test]
    fn no_client_byte_reaches_the_sql() {
        let (empty, _) = skeleton(&sql_of(&raising_statement("", "", "").unwrap()));
        let hostile = [
            "x\\'; PERFORM nextval($c$canary$c$); --\nEND $resumeguard$",
            "$resumeguard$resumeguard$",
            "$resume\0guard$",
            "'\\\\''\"\"\u{0};--/*",
            "E'\\x27' || chr(39) $$ $ $a$",
            "thread \u{7f} \u{2028} é 💥",
        ];
        for text in hostile {
            let sql = sql_of(&raising_statement("23514", text, text).unwrap());
            let (shape, texts) = skeleton(&sql);
            // Same statement as for empty texts, but for the hex digits.
            assert_eq!(shape, empty, "{text:?}");
            assert_eq!(sql.matches("$resumeguard$").count(), 2, "{sql}");
            assert!(!sql.contains('\\') && !sql.contains('\0'), "{sql}");
            assert!(sql.is_ascii(), "{sql}");
            let kept = text.replace('\0', "\u{fffd}");
            assert_eq!(texts[0], kept);
            assert_eq!(texts[1], kept);
            assert!(texts.iter().all(|t| !t.contains('\0')), "{texts:?}");
            assert!(texts[2].is_ascii() && texts[3].is_ascii(), "{texts:?}");
        }
    }

    #[test]
    fn the_raising_query_carries_the_same_statement() {
        let text = "x\\'; PERFORM pg_sleep(4); -- $resumeguard$";
        let q = raising_query("0A000", text, "").unwrap();
        let h = peek_frame(&q, 1 << 20).unwrap().unwrap();
        assert_eq!((h.tag, h.total_len), (b'Q', q.len()));
        let sql = String::from_utf8(q[5..q.len() - 1].to_vec()).unwrap();
        assert_eq!(sql, sql_of(&raising_statement("0A000", text, "").unwrap()));
        assert!(!sql.contains("pg_sleep"), "{sql}");
    }

    #[test]
    fn the_ascii_form_escapes_only_non_ascii() {
        assert_eq!(ascii("a'\\b"), "a'\\b");
        assert_eq!(ascii("é\0💥"), "\\u{e9}\\u{0}\\u{1f4a5}");
    }
}
