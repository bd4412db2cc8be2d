//! `bytea` in text form, as the server prints it under either
//! `bytea_output` setting; shared by single values and array elements.

use bytes::Bytes;

use super::decode_error::DecodeError;

/// Decodes bytea text output: hex (`\x6869`) or the older escape format
/// (`hi\000\\`), as chosen by the server's `bytea_output`.
pub fn decode_bytea_text(raw: &[u8]) -> Result<Bytes, DecodeError> {
    if let Some(hex_digits) = raw.strip_prefix(b"\\x") {
        return hex::decode(hex_digits)
            .map(Bytes::from)
            .map_err(|e| DecodeError::Bytea(format!("bad hex: {e}")));
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some((&b, tail)) = rest.split_first() {
        if b != b'\\' {
            out.push(b);
            rest = tail;
            continue;
        }
        match tail {
            [b'\\', more @ ..] => {
                out.push(b'\\');
                rest = more;
            }
            [a @ b'0'..=b'3', o @ b'0'..=b'7', c @ b'0'..=b'7', more @ ..] => {
                out.push(((a - b'0') << 6) | ((o - b'0') << 3) | (c - b'0'));
                rest = more;
            }
            _ => {
                return Err(DecodeError::Bytea(format!(
                    "invalid escape at byte {}",
                    raw.len() - rest.len()
                )))
            }
        }
    }
    Ok(Bytes::from(out))
}
