//! A client text as the server reads it in the client encodings whose
//! characters may end in a backslash byte: SJIS, BIG5, GBK, UHC, GB18030
//! and JOHAB (client-only encodings, for that reason).
//!
//! PostgreSQL converts a text to the database's encoding before lexing
//! it, so a backslash that is the second byte of such a character escapes
//! nothing. The proxy reads texts as [`client_text`] decodes them, where
//! that byte is a backslash: in an `E'…'` string, or any `'…'` string with
//! `standard_conforming_strings` off, it moves where the string ends, and
//! what the server runs as a statement the proxy reads as a string. Which
//! bytes pair up depends on the encoding and is read from the text's
//! start, as the server's conversion reads it. The encoding a text will
//! be read in is not known when the proxy reads it (a pipelined `SET
//! client_encoding` is answered after the texts behind it arrive), so a
//! reader compares its reading with each of these.

use super::client_text::{self, HELD_BACKSLASH};

/// How each encoding measures a character: PostgreSQL's `mblen` for it.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    /// SJIS and SHIFT_JIS_2004: 0xA1–0xDF are characters of one byte,
    /// every other byte above 0x7F starts one of two.
    Sjis,
    /// BIG5, GBK, UHC: every byte above 0x7F starts a character of two.
    TwoByte,
    /// GB18030: of four when the second byte is a digit, else of two.
    Gb18030,
    /// JOHAB, measured as EUC is: 0x8F starts a character of three.
    Johab,
}

const ENCODINGS: [Encoding; 4] = [
    Encoding::Sjis,
    Encoding::TwoByte,
    Encoding::Gb18030,
    Encoding::Johab,
];

impl Encoding {
    /// The length of the character that starts with `lead`, `next` after it.
    fn char_len(self, lead: u8, next: Option<u8>) -> usize {
        if lead < 0x80 {
            return 1;
        }
        match self {
            Encoding::Sjis if (0xA1..=0xDF).contains(&lead) => 1,
            Encoding::Gb18030 if next.is_some_and(|b| b.is_ascii_digit()) => 4,
            Encoding::Johab if lead == 0x8F => 3,
            _ => 2,
        }
    }
}

/// `text` as each of the encodings reads it where that differs from the
/// proxy's reading: each backslash the encoding takes into a character as
/// [`HELD_BACKSLASH`]. None for almost every text (those with no byte
/// above 0x7F right before a backslash), at the cost of one search.
pub fn readings(text: &str) -> Vec<String> {
    if text.is_ascii() || !text.contains('\\') {
        return Vec::new();
    }
    let bytes = client_text::encode(text);
    if !bytes.windows(2).any(|w| w[0] > 0x7F && w[1] == b'\\') {
        return Vec::new();
    }
    let mut out: Vec<String> = Vec::new();
    for encoding in ENCODINGS {
        let held = held_backslashes(&bytes, encoding);
        if held.is_empty() {
            continue;
        }
        let reading = with_held(&bytes, &held);
        if !out.contains(&reading) {
            out.push(reading);
        }
    }
    out
}

/// Where `encoding` reads a backslash as a later byte of a character.
fn held_backslashes(bytes: &[u8], encoding: Encoding) -> Vec<usize> {
    let mut held = Vec::new();
    let mut at = 0;
    while let Some(&lead) = bytes.get(at) {
        let end = bytes
            .len()
            .min(at + encoding.char_len(lead, bytes.get(at + 1).copied()));
        held.extend((at + 1..end).filter(|&i| bytes[i] == b'\\'));
        at = end;
    }
    held
}

/// `bytes` decoded, the backslashes at `held` as [`HELD_BACKSLASH`].
fn with_held(bytes: &[u8], held: &[usize]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2 * held.len());
    let mut from = 0;
    for &at in held {
        // A backslash is never inside a UTF-8 sequence: each piece
        // decodes as it does within the whole.
        out.push_str(&client_text::decode(&bytes[from..at]));
        out.push(HELD_BACKSLASH);
        from = at + 1;
    }
    out.push_str(&client_text::decode(&bytes[from..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SJIS 表 (0x95 0x5C) and ソ (0x83 0x5C).
    const HYO: &[u8] = b"\x95\\";

    fn read(bytes: &[u8]) -> Vec<String> {
        readings(&client_text::decode(bytes))
    }

    #[test]
    fn texts_without_a_backslash_after_a_high_byte_have_no_other_reading() {
        assert!(read(b"select E'a\\'' -- \x95").is_empty());
        assert!(readings("select E'é' , '\\'").is_empty());
        // é (0xC3 0xA9) then a backslash: 0xC3 0xA9 pair up, or read one
        // byte each (SJIS), in every encoding.
        assert!(readings("select E'é\\n'").is_empty());
    }

    #[test]
    fn a_backslash_a_character_holds_is_held_and_encodes_back() {
        let mut sql = b"select E'".to_vec();
        sql.extend_from_slice(HYO);
        sql.extend_from_slice(b"' ; execute r7 ; --'");
        let readings = read(&sql);
        assert_eq!(readings.len(), 1, "{readings:?}");
        assert!(readings[0].contains(HELD_BACKSLASH));
        assert!(!readings[0].contains('\\'));
        assert_eq!(&client_text::encode(&readings[0])[..], &sql[..]);
    }

    #[test]
    fn which_backslash_is_held_depends_on_the_encoding() {
        // 0xB0 is a character of one byte in SJIS, so 0xB0 0x81 0x5C holds
        // the backslash there; in the two-byte encodings 0xB0 0x81 pair up
        // and the backslash stands alone.
        let sjis_only = read(b"select E'\xb0\x81\\'");
        assert_eq!(sjis_only.len(), 1, "{sjis_only:?}");
        // And UTF-8's ぁ (0xE3 0x81 0x81): SJIS and BIG5 read 0xE3 0x81,
        // then 0x81 0x5C.
        assert_eq!(readings("select E'ぁ\\'").len(), 1);
        // GB18030: 0x81 0x30 0x81 0x30 is one character, then 0x81 0x5C.
        let gb = read(b"E'\x81\x30\x81\x30\x81\\'");
        assert!(!gb.is_empty());
    }

    #[test]
    fn a_genuine_private_use_character_stays_apart_from_a_held_backslash() {
        let genuine = "select '\u{F75C}'";
        assert_eq!(
            &client_text::encode(&client_text::decode(genuine.as_bytes()))[..],
            genuine.as_bytes()
        );
        assert_ne!(
            client_text::decode(genuine.as_bytes()),
            format!("select '{HELD_BACKSLASH}'")
        );
    }
}
