//! LangGraph's msgpack serialization, read back as JSON for schema checks.
//!
//! `JsonPlusSerializer.dumps_typed` (langgraph-checkpoint 4.x) stores plain
//! msgpack for JSON-like data and msgpack *ext* values for Python objects,
//! each ext payload being itself msgpack: `[module, name, arg, ...]`. We
//! never rebuild objects; we map each value to the JSON a schema for the
//! model's *fields* (what pydantic's `model_json_schema()` and LangGraph's
//! `get_input_jsonschema()` describe) validates naturally. The mapping is
//! close to pydantic's JSON mode and to LangGraph's own
//! `_msgpack_ext_hook_to_json`:
//!
//! | stored as | Python values | JSON |
//! | --- | --- | --- |
//! | nil, bool, int, str | `None`, `bool`, `int`, `str` | the same |
//! | float | `float` | number; NaN / ±inf → `"NaN"`, `"Infinity"`, `"-Infinity"` (pydantic's `ser_json_inf_nan='strings'`: JSON has no such numbers) |
//! | bin | `bytes` inside a value | string: the UTF-8 text when valid (pydantic's default `ser_json_bytes='utf8'`), else standard base64 |
//! | array | `list`, `tuple` | array |
//! | map | `dict`, TypedDict | object; non-string keys stringified: ints and floats as numbers print, `true`/`false`, `null`, anything else as its compact JSON text; a later duplicate key wins |
//! | ext 0 constructor, one arg | `set`, `frozenset`, `deque` → the items array; `Enum` → its value; `Decimal`, IP addresses → string; `ZoneInfo` → its key; `SecretStr` → the secret; `UUID` → dashed lowercase string | the argument (UUID re-dashed) |
//! | ext 1 constructor, positional | `date` → `"YYYY-MM-DD"`; `timedelta` → ISO 8601 duration (`"P1DT1H1M1.5S"`, pydantic's form); `Path` → the joined path; `re.compile` → the pattern; `Send` → `{"node", "arg"[, "timeout"]}`; `timezone` → `"+HH:MM"` offset | as listed; any other class → the args array |
//! | ext 2 constructor, keywords | dataclass, namedtuple, `Interrupt`, store `Item` → object of fields; `time` → `"HH:MM:SS[.ffffff][+HH:MM]"` | object of fields |
//! | ext 3 method, one arg | `datetime` (`fromisoformat`) | the argument (the ISO string) |
//! | ext 4 / ext 5 | pydantic v1 / v2 model | object of fields (`.dict()` / `.model_dump()`) |
//! | ext 6 | numpy array of bool / int / uint / float | nested arrays of numbers (scalar for shape `()`); other dtypes are an error |
//! | ext 7 | `DeltaChannel` snapshot | the snapshot's value |
//!
//! Anything else — other ext codes (msgpack timestamps included), a
//! malformed ext payload, invalid UTF-8, truncated or trailing bytes — is a
//! [`MsgpackError`]: the caller treats the payload as undecodable rather than
//! guess. Objects are never constructed, so no value is executed.

use std::fmt::Write as _;

use base64::Engine as _;
use rmpv::decode::read_value_ref_with_max_depth;
use rmpv::ValueRef;
use serde_json::{Map, Number, Value};

mod numpy;

/// Nesting budget shared by plain containers and ext payloads, so a payload
/// nesting ext inside ext cannot recurse without bound.
const MAX_DEPTH: usize = 512;

/// Why a payload could not be read as JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgpackError {
    #[error("malformed msgpack: {0}")]
    Malformed(String),
    #[error("{0} trailing byte(s) after the msgpack value")]
    Trailing(usize),
    #[error("nesting deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("msgpack string is not valid UTF-8")]
    Utf8,
    #[error("unsupported msgpack ext type {0}")]
    UnknownExt(i8),
    #[error("malformed ext {code} payload: {why}")]
    BadExt { code: i8, why: String },
    #[error("numpy array: {0}")]
    Numpy(String),
    #[error("invalid json payload: {0}")]
    Json(String),
    #[error("type `{0}` carries no blob")]
    MissingBlob(String),
    /// `pickle` or an unknown tag (the string).
    #[error(
        "unsupported serialization type (readable: msgpack, json, null, empty, bytes, bytearray)"
    )]
    Undecodable(String),
}

/// Decodes one msgpack blob as written by `JsonPlusSerializer`.
pub fn to_json(blob: &[u8]) -> Result<Value, MsgpackError> {
    decode(blob, MAX_DEPTH)
}

/// Reads exactly one msgpack value from `buf` and converts it.
fn decode(buf: &[u8], depth: usize) -> Result<Value, MsgpackError> {
    let mut rd = buf;
    let value = read_value_ref_with_max_depth(&mut rd, depth).map_err(|e| match e {
        rmpv::decode::Error::DepthLimitExceeded => MsgpackError::TooDeep,
        other => MsgpackError::Malformed(other.to_string()),
    })?;
    if !rd.is_empty() {
        return Err(MsgpackError::Trailing(rd.len()));
    }
    convert(&value, depth)
}

fn convert(v: &ValueRef<'_>, depth: usize) -> Result<Value, MsgpackError> {
    let depth = depth.checked_sub(1).ok_or(MsgpackError::TooDeep)?;
    Ok(match v {
        ValueRef::Nil => Value::Null,
        ValueRef::Boolean(b) => Value::Bool(*b),
        ValueRef::Integer(n) => integer(n),
        ValueRef::F32(f) => float(f64::from(*f)),
        ValueRef::F64(f) => float(*f),
        ValueRef::String(s) => Value::String(s.as_str().ok_or(MsgpackError::Utf8)?.to_owned()),
        ValueRef::Binary(b) => Value::String(bytes_to_string(b)),
        ValueRef::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| convert(i, depth))
                .collect::<Result<_, _>>()?,
        ),
        ValueRef::Map(pairs) => {
            let mut map = Map::with_capacity(pairs.len());
            for (k, val) in pairs {
                map.insert(key(k, depth)?, convert(val, depth)?);
            }
            Value::Object(map)
        }
        ValueRef::Ext(code, payload) => ext(*code, payload, depth)?,
    })
}

fn integer(n: &rmpv::Integer) -> Value {
    match (n.as_i64(), n.as_u64()) {
        (Some(i), _) => Value::from(i),
        (None, Some(u)) => Value::from(u),
        // msgpack integers are at most 64 bits, one of the two always fits.
        (None, None) => Value::Null,
    }
}

fn float(f: f64) -> Value {
    match Number::from_f64(f) {
        Some(n) => Value::Number(n),
        None if f.is_nan() => Value::String("NaN".into()),
        None if f > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

/// A map key as a JSON object key (Python allows any hashable key).
fn key(k: &ValueRef<'_>, depth: usize) -> Result<String, MsgpackError> {
    Ok(match convert(k, depth)? {
        Value::String(s) => s,
        Value::Null => "null".into(),
        other => other.to_string(),
    })
}

/// One ext value: `[module, name, payload...]` per the table in the module doc.
fn ext(code: i8, payload: &[u8], depth: usize) -> Result<Value, MsgpackError> {
    let bad = |why: &str| MsgpackError::BadExt {
        code,
        why: why.into(),
    };
    match code {
        7 => return decode(payload, depth),
        6 => return numpy::numpy(payload, depth),
        0..=5 => {}
        _ => return Err(MsgpackError::UnknownExt(code)),
    }
    let mut rd = payload;
    let tup = read_value_ref_with_max_depth(&mut rd, depth).map_err(|e| match e {
        rmpv::decode::Error::DepthLimitExceeded => MsgpackError::TooDeep,
        other => bad(&other.to_string()),
    })?;
    if !rd.is_empty() {
        return Err(bad("trailing bytes"));
    }
    let ValueRef::Array(parts) = &tup else {
        return Err(bad("not an array"));
    };
    let min_len = match code {
        3 => 4,
        _ => 3,
    };
    let (Some(module), Some(name), Some(arg)) = (
        parts.first().and_then(as_str),
        parts.get(1).and_then(as_str),
        parts.get(2),
    ) else {
        return Err(bad("expected [module, name, arg, ...]"));
    };
    if parts.len() < min_len {
        return Err(bad("too few elements"));
    }
    match (code, module, name) {
        (0, "uuid", "UUID") => Ok(uuid(convert(arg, depth)?)),
        (1, _, _) => positional(module, name, arg, depth).map_err(|why| match why {
            Positional::Bad(why) => bad(&why),
            Positional::Inner(e) => e,
        }),
        (2, "datetime", "time") => {
            let ValueRef::Map(_) = arg else {
                return Err(bad("time kwargs are not a map"));
            };
            time(arg, depth).ok_or_else(|| bad("unreadable time kwargs"))
        }
        (2 | 4 | 5, _, _) => match arg {
            ValueRef::Map(_) => convert(arg, depth),
            _ => Err(bad("fields are not a map")),
        },
        _ => convert(arg, depth),
    }
}

enum Positional {
    Bad(String),
    Inner(MsgpackError),
}

impl From<MsgpackError> for Positional {
    fn from(e: MsgpackError) -> Self {
        Positional::Inner(e)
    }
}

/// Ext 1: `cls(*args)`. Known classes become their natural JSON form.
fn positional(
    module: &str,
    name: &str,
    args: &ValueRef<'_>,
    depth: usize,
) -> Result<Value, Positional> {
    let ValueRef::Array(items) = args else {
        return Err(Positional::Bad("positional args are not an array".into()));
    };
    let int = |i: usize| items.get(i).and_then(as_i64);
    match (module, name) {
        ("datetime", "date") => match (int(0), int(1), int(2)) {
            (Some(y), Some(m), Some(d)) => Ok(Value::String(format!("{y:04}-{m:02}-{d:02}"))),
            _ => Err(Positional::Bad("date args are not (y, m, d)".into())),
        },
        ("datetime", "timedelta") => match (int(0), int(1), int(2)) {
            (Some(d), Some(s), Some(us)) => Ok(Value::String(iso_duration(d, s, us))),
            _ => Err(Positional::Bad("timedelta args are not (d, s, us)".into())),
        },
        ("datetime", "timezone") => items
            .first()
            .and_then(timedelta_parts)
            .map(|(d, s, us)| Value::String(utc_offset(d, s, us)))
            .ok_or_else(|| Positional::Bad("timezone offset is no timedelta".into())),
        ("pathlib", _) => {
            let mut path = String::new();
            for part in items {
                let part = as_str(part)
                    .ok_or_else(|| Positional::Bad("path part is not a string".into()))?;
                if !(path.is_empty() || path.ends_with('/') || path.ends_with('\\')) {
                    path.push('/');
                }
                path.push_str(part);
            }
            Ok(Value::String(path))
        }
        ("re", "compile") => items
            .first()
            .and_then(as_str)
            .map(|p| Value::String(p.to_owned()))
            .ok_or_else(|| Positional::Bad("pattern is not a string".into())),
        ("langgraph.types", "Send") => {
            let mut send = Map::new();
            let fields = ["node", "arg", "timeout"];
            for (field, item) in fields.iter().zip(items) {
                send.insert((*field).into(), convert(item, depth)?);
            }
            Ok(Value::Object(send))
        }
        _ => Ok(convert(args, depth)?),
    }
}

/// `uuid.UUID(hex)`: the stored arg is 32 hex digits; JSON uses the dashed form.
fn uuid(arg: Value) -> Value {
    match arg {
        Value::String(h) if h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            let h = h.to_ascii_lowercase();
            Value::String(format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        other => other,
    }
}

/// The `(days, seconds, microseconds)` of a nested timedelta ext value.
fn timedelta_parts(v: &ValueRef<'_>) -> Option<(i64, i64, i64)> {
    let ValueRef::Ext(1, payload) = v else {
        return None;
    };
    let mut rd = *payload;
    let ValueRef::Array(parts) = read_value_ref_with_max_depth(&mut rd, 16).ok()? else {
        return None;
    };
    if parts.get(1).and_then(as_str) != Some("timedelta") {
        return None;
    }
    let ValueRef::Array(args) = parts.get(2)? else {
        return None;
    };
    Some((
        as_i64(args.first()?)?,
        as_i64(args.get(1)?)?,
        as_i64(args.get(2)?)?,
    ))
}

fn total_micros(days: i64, secs: i64, micros: i64) -> i128 {
    (i128::from(days) * 86_400 + i128::from(secs)) * 1_000_000 + i128::from(micros)
}

/// ISO 8601 duration as pydantic writes a `timedelta`, e.g. `P1DT1H1M1.5S`.
fn iso_duration(days: i64, secs: i64, micros: i64) -> String {
    let total = total_micros(days, secs, micros);
    let mut out = String::from(if total < 0 { "-P" } else { "P" });
    let t = total.unsigned_abs();
    let (d, rest) = (t / 86_400_000_000, t % 86_400_000_000);
    let (h, rest) = (rest / 3_600_000_000, rest % 3_600_000_000);
    let (m, rest) = (rest / 60_000_000, rest % 60_000_000);
    let (s, us) = (rest / 1_000_000, rest % 1_000_000);
    if d > 0 {
        let _ = write!(out, "{d}D");
    }
    if h > 0 || m > 0 || s > 0 || us > 0 || d == 0 {
        out.push('T');
        if h > 0 {
            let _ = write!(out, "{h}H");
        }
        if m > 0 {
            let _ = write!(out, "{m}M");
        }
        if s > 0 || us > 0 || (h == 0 && m == 0) {
            let _ = write!(out, "{s}");
            if us > 0 {
                let frac = format!("{us:06}");
                let _ = write!(out, ".{}", frac.trim_end_matches('0'));
            }
            out.push('S');
        }
    }
    out
}

/// A fixed UTC offset as `+HH:MM` (`+HH:MM:SS` when seconds are present).
fn utc_offset(days: i64, secs: i64, micros: i64) -> String {
    let total = total_micros(days, secs, micros) / 1_000_000;
    let sign = if total < 0 { '-' } else { '+' };
    let t = total.unsigned_abs();
    let (h, m, s) = (t / 3600, (t % 3600) / 60, t % 60);
    if s == 0 {
        format!("{sign}{h:02}:{m:02}")
    } else {
        format!("{sign}{h:02}:{m:02}:{s:02}")
    }
}

/// `datetime.time` kwargs as an ISO time string; a fixed-offset `tzinfo`
/// is appended, a named zone (no fixed offset) is dropped.
fn time(kwargs: &ValueRef<'_>, depth: usize) -> Option<Value> {
    let ValueRef::Map(pairs) = kwargs else {
        return None;
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| as_str(k) == Some(name))
            .map(|(_, v)| v)
    };
    let num = |name: &str| field(name).and_then(as_i64);
    let (h, m, s, us) = (
        num("hour")?,
        num("minute")?,
        num("second")?,
        num("microsecond")?,
    );
    let mut out = format!("{h:02}:{m:02}:{s:02}");
    if us != 0 {
        let _ = write!(out, ".{us:06}");
    }
    if let Some(tz) = field("tzinfo") {
        if let Ok(Value::String(offset)) = convert(tz, depth) {
            if offset.starts_with('+') || offset.starts_with('-') {
                out.push_str(&offset);
            }
        }
    }
    Some(Value::String(out))
}

fn as_str<'a>(v: &'a ValueRef<'_>) -> Option<&'a str> {
    match v {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

fn as_i64(v: &ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(n) => n.as_i64(),
        _ => None,
    }
}

/// Bytes as a JSON string: UTF-8 text when valid, else standard base64.
pub(super) fn bytes_to_string(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => base64(b),
    }
}

/// Standard base64 (RFC 4648 alphabet, padded), as Python's `base64.b64encode`.
fn base64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[cfg(test)]
mod tests;
