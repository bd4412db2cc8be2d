//! A client's SQL text read as a `str` whatever its encoding, and back.
//!
//! The server runs text that is not UTF-8 when the client encoding is
//! another one (LATIN1 and the like) or the database is SQL_ASCII. Every
//! keyword and table name the proxy looks for is ASCII, which all those
//! encodings share, so the text reads as UTF-8 where it is, and each
//! other byte as a private-use character of its own. The mapping is one
//! to one: statement and cursor names come back as the client's bytes
//! (what a protocol Parse or Bind names them by), and text built from
//! the decoded one encodes to what the client meant.

use std::borrow::Cow;

/// Byte `b` read as a character is `ESCAPED_BYTES + b`: U+F780 to U+F7FF
/// for the bytes 0x80 to 0xFF (only bytes of that range are ever outside
/// UTF-8), and [`HELD_BACKSLASH`] for a backslash.
const ESCAPED_BYTES: u32 = 0xF700;

/// A backslash byte read as part of the character before it, as the
/// server reads it in a client encoding such as SJIS (see
/// [`super::multibyte_readings`]): a character of its own, so that it
/// escapes nothing, and the client's backslash again when encoded.
pub const HELD_BACKSLASH: char = '\u{F75C}';

/// The first byte of every escape character in UTF-8: a text without it
/// holds none.
const ESCAPE_LEAD: u8 = 0xEF;

/// `sql` as text: as it is when it is UTF-8 without escape characters,
/// otherwise with every byte outside UTF-8, and every byte of a genuine
/// escape character, read as its escape.
pub fn decode(sql: &[u8]) -> Cow<'_, str> {
    // ASCII, the usual statement, holds no escape lead byte: the search
    // for one is skipped.
    if sql.is_ascii() {
        if let Ok(text) = std::str::from_utf8(sql) {
            return Cow::Borrowed(text);
        }
    }
    if let Ok(text) = std::str::from_utf8(sql) {
        if !sql.contains(&ESCAPE_LEAD) || !text.chars().any(is_escape) {
            return Cow::Borrowed(text);
        }
    }
    let mut out = String::with_capacity(sql.len() + sql.len() / 2);
    for chunk in sql.utf8_chunks() {
        for c in chunk.valid().chars() {
            if is_escape(c) {
                let mut utf8 = [0; 4];
                c.encode_utf8(&mut utf8)
                    .bytes()
                    .for_each(|b| out.push(escape(b)));
            } else {
                out.push(c);
            }
        }
        chunk.invalid().iter().for_each(|&b| out.push(escape(b)));
    }
    Cow::Owned(out)
}

/// The client's bytes of `text` read by [`decode`].
pub fn encode(text: &str) -> Cow<'_, [u8]> {
    if !text.chars().any(is_escape) {
        return Cow::Borrowed(text.as_bytes());
    }
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match escaped_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    Cow::Owned(out)
}

fn escape(b: u8) -> char {
    // Every value of the range is a character (private use).
    char::from_u32(ESCAPED_BYTES + u32::from(b)).unwrap_or(char::REPLACEMENT_CHARACTER)
}

fn escaped_byte(c: char) -> Option<u8> {
    u32::from(c)
        .checked_sub(ESCAPED_BYTES)
        .and_then(|b| u8::try_from(b).ok())
        .filter(|b| *b >= 0x80 || *b == b'\\')
}

fn is_escape(c: char) -> bool {
    escaped_byte(c).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_text_reads_as_it_is() {
        let sql = "select 'é' -- ✓".as_bytes();
        assert!(matches!(decode(sql), Cow::Borrowed(t) if t.as_bytes() == sql));
        assert!(matches!(encode("select 'é'"), Cow::Borrowed(_)));
    }

    #[test]
    fn bytes_outside_utf8_read_apart_and_come_back() {
        let latin1 = b"PREPARE \"\xe9\" AS SELECT '\xe8' -- \xff";
        let text = decode(latin1);
        assert!(text.starts_with("PREPARE \""), "{text}");
        assert_ne!(decode(b"\xe9"), decode(b"\xe8"));
        assert_eq!(&encode(&text)[..], latin1);
    }

    #[test]
    fn genuine_escape_characters_come_back_as_themselves() {
        // U+F7E9 in UTF-8, beside a byte outside UTF-8 and alone.
        for sql in [&b"a \xef\x9f\xa9 \xe9"[..], b"a \xef\x9f\xa9"] {
            let text = decode(sql);
            assert_eq!(&encode(&text)[..], sql);
            assert_ne!(text, decode(b"a \xe9 \xe9"));
        }
    }
}
