//! An integer in text form, read as PostgreSQL's integer input reads it,
//! so a value the server accepts is never one the proxy cannot decode.
//!
//! The input skips surrounding whitespace, takes an optional sign, and
//! (from PostgreSQL 16) `0x`, `0o` and `0b` prefixes and `_` between
//! digits. An older server rejects those forms itself, so accepting them
//! whatever the version never lets through a value the server refuses.

use super::decode_error::DecodeError;

/// Decodes an integer as PostgreSQL's `int2`/`int4`/`int8` input does,
/// into the widest of them.
pub(crate) fn decode_int_text(raw: &[u8]) -> Result<i64, DecodeError> {
    let invalid = |why: &str| {
        DecodeError::Int(format!(
            "{:?} is not an integer: {why}",
            String::from_utf8_lossy(raw)
        ))
    };
    let start = raw.iter().position(|&b| !is_space(b)).unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|&b| !is_space(b))
        .map_or(start, |i| i + 1);
    let signed = &raw[start..end];
    let (negative, unsigned) = match signed {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, signed),
    };
    // After a prefix `_` may come first (`0x_1F`); in decimal it may not.
    let (radix, digits, underscore_first) = match unsigned {
        [b'0', b'x' | b'X', rest @ ..] => (16, rest, true),
        [b'0', b'o' | b'O', rest @ ..] => (8, rest, true),
        [b'0', b'b' | b'B', rest @ ..] => (2, rest, true),
        _ => (10, unsigned, false),
    };
    let mut magnitude: u64 = 0;
    let mut seen_digit = false;
    let mut after_underscore = false;
    for &b in digits {
        if b == b'_' {
            if after_underscore || !(seen_digit || underscore_first) {
                return Err(invalid("'_' must stand between digits"));
            }
            after_underscore = true;
            continue;
        }
        let digit = char::from(b)
            .to_digit(radix)
            .ok_or_else(|| invalid("not a digit of its base"))?;
        magnitude = magnitude
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(digit)))
            .ok_or_else(|| invalid("out of range"))?;
        seen_digit = true;
        after_underscore = false;
    }
    if !seen_digit {
        return Err(invalid("no digits"));
    }
    if after_underscore {
        return Err(invalid("'_' must stand between digits"));
    }
    let value = if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    };
    value.ok_or_else(|| invalid("out of range"))
}

/// The whitespace PostgreSQL's integer input skips (C `isspace`).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_postgresql_accepts_decodes() {
        let cases: &[(&[u8], i64)] = &[
            (b"0", 0),
            (b"-4", -4),
            (b"+12", 12),
            (b" 0", 0),
            (b"\t-3 \n", -3),
            (b"\x0b7\x0c", 7),
            (b"007", 7),
            (b"1_000", 1000),
            (b"1_2_3", 123),
            (b"0x1F", 31),
            (b"0X1f", 31),
            (b"-0x10", -16),
            (b"0x_1F", 31),
            (b"0o17", 15),
            (b"0O_7", 7),
            (b"0b101", 5),
            (b"0B1_0", 2),
            (b"9223372036854775807", i64::MAX),
            (b"-9223372036854775808", i64::MIN),
            (b"-0x8000000000000000", i64::MIN),
        ];
        for &(raw, want) in cases {
            let got = decode_int_text(raw);
            assert_eq!(got.ok(), Some(want), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn what_postgresql_rejects_does_not_decode() {
        let cases: &[&[u8]] = &[
            b"",
            b"   ",
            b"-",
            b"- 5",
            b"4.0",
            b"x",
            b"1 2",
            b"_1",
            b"1_",
            b"1__0",
            b"-_1",
            b"0x",
            b"0x_",
            b"0x1__F",
            b"0x1F_",
            b"0xG",
            b"0o8",
            b"0b2",
            b"0b",
            b"1e3",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999",
            b"0x10000000000000000",
            b"\xff",
        ];
        for &raw in cases {
            assert!(
                matches!(decode_int_text(raw), Err(DecodeError::Int(_))),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }
}
