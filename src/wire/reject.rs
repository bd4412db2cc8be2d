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

use bytes::{BufMut, BytesMut};

/// The dollar-quote tag around the raised text.
const TAG: &str = "$resumeguard$";

/// Parse + Bind + Execute (unnamed statement and portal) of a statement
/// that fails with `sqlstate`, `message` and `detail`.
pub fn raising_statement(sqlstate: &str, message: &str, detail: &str) -> Vec<u8> {
    let sql = raising_sql(sqlstate, message, detail);
    let mut out = BytesMut::with_capacity(sql.len() + 64);
    // Parse: unnamed statement, no parameter types.
    out.put_u8(b'P');
    out.put_i32((4 + 1 + sql.len() + 1 + 2) as i32);
    out.put_u8(0);
    out.put_slice(sql.as_bytes());
    out.put_u8(0);
    out.put_i16(0);
    // Bind: unnamed portal and statement, no parameters, default formats.
    out.put_u8(b'B');
    out.put_i32(4 + 1 + 1 + 2 + 2 + 2);
    out.put_u8(0);
    out.put_u8(0);
    out.put_i16(0);
    out.put_i16(0);
    out.put_i16(0);
    // Execute: unnamed portal, all rows.
    out.put_u8(b'E');
    out.put_i32(4 + 1 + 4);
    out.put_u8(0);
    out.put_i32(0);
    out.to_vec()
}

/// A simple Query of a statement that fails with `sqlstate`, `message`
/// and `detail`: what the server gets in place of a refused query text.
pub fn raising_query(sqlstate: &str, message: &str, detail: &str) -> Vec<u8> {
    let sql = raising_sql(sqlstate, message, detail);
    let mut out = BytesMut::with_capacity(sql.len() + 6);
    out.put_u8(b'Q');
    out.put_i32((4 + sql.len() + 1) as i32);
    out.put_slice(sql.as_bytes());
    out.put_u8(0);
    out.to_vec()
}

fn raising_sql(sqlstate: &str, message: &str, detail: &str) -> String {
    format!(
        "DO {TAG} BEGIN RAISE EXCEPTION USING ERRCODE = '{}', MESSAGE = '{}', DETAIL = '{}'; END {TAG}",
        literal(sqlstate),
        literal(message),
        literal(detail)
    )
}

/// Text safe inside a single-quoted literal inside the dollar quote.
fn literal(s: &str) -> String {
    s.replace(TAG, "$ resumeguard$")
        .replace('\'', "''")
        .replace('\0', "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::peek_frame;

    #[test]
    fn frames_parse_bind_execute() {
        let bytes = raising_statement("23514", "it's bad", "d");
        let mut at = 0;
        let mut tags = Vec::new();
        while let Some(h) = peek_frame(&bytes[at..], 1 << 20).unwrap() {
            tags.push(h.tag);
            at += h.total_len;
        }
        assert_eq!(tags, b"PBE");
        assert_eq!(at, bytes.len());
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("MESSAGE = 'it''s bad'"), "{text}");
        assert!(text.contains("ERRCODE = '23514'"), "{text}");
    }

    #[test]
    fn the_quote_tag_cannot_be_closed_from_inside() {
        let bytes = raising_statement("23514", "x $resumeguard$; DROP TABLE t; --", "");
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(text.matches(TAG).count(), 2, "{text}");
    }
}
