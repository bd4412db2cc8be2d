//! `bytea` in text form, as the server prints it under either
//! `bytea_output` setting; shared by single values and array elements.

use bytes::Bytes;

use super::decode_error::DecodeError;

/// Decodes bytea text: hex (`\x6869`) or the older escape format
/// (`hi\000\\`), as the server prints it under `bytea_output` and reads
/// it as input.
pub fn decode_bytea_text(raw: &[u8]) -> Result<Bytes, DecodeError> {
    if let Some(hex_text) = raw.strip_prefix(b"\\x") {
        return decode_hex(hex_text).map(Bytes::from);
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

/// Hex digit pairs as PostgreSQL's bytea input reads them: whitespace may
/// stand between pairs, never inside one.
fn decode_hex(hex_text: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::with_capacity(hex_text.len() / 2);
    let mut offset = 0;
    for run in hex_text.split(|&b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        let at = out.len();
        out.resize(at + run.len() / 2, 0);
        hex::decode_to_slice(run, &mut out[at..]).map_err(|e| {
            DecodeError::Bytea(format!("bad hex in the digits at byte {offset}: {e}"))
        })?;
        offset += run.len() + 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_reads_as_postgresql_reads_it() {
        let accepted: &[(&[u8], &[u8])] = &[
            (b"\\x", b""),
            (b"\\x6869", b"hi"),
            (b"\\x6A6b", b"jk"),
            (b"\\x 68 69", b"hi"),
            (b"\\x68\t69\n", b"hi"),
            (b"\\x\r\n6869  ", b"hi"),
            (b"\\x  ", b""),
        ];
        for &(raw, want) in accepted {
            let got = decode_bytea_text(raw);
            assert_eq!(got.ok().as_deref(), Some(want), "{raw:?}");
        }
        let rejected: &[&[u8]] = &[
            b"\\x6",
            b"\\x6 869",
            b"\\x68 6 9",
            b"\\x68\x0b69",
            b"\\x68\x0c69",
            b"\\xzz",
            b"\\x68-69",
        ];
        for &raw in rejected {
            assert!(
                matches!(decode_bytea_text(raw), Err(DecodeError::Bytea(_))),
                "{raw:?}"
            );
        }
    }
}
