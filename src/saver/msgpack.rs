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

use rmpv::decode::read_value_ref_with_max_depth;
use rmpv::ValueRef;
use serde_json::{Map, Number, Value};

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

/// Decodes a stored `(type, blob)` pair by the saver's type tag.
/// `Ok(None)` means the row holds no value (`empty`); `null` is JSON null.
pub fn blob_to_json(type_tag: &str, blob: Option<&[u8]>) -> Result<Option<Value>, MsgpackError> {
    let missing = || MsgpackError::MissingBlob(type_tag.into());
    match type_tag {
        "msgpack" => to_json(blob.ok_or_else(missing)?).map(Some),
        "null" => Ok(Some(Value::Null)),
        "empty" => Ok(None),
        "json" => serde_json::from_slice(blob.ok_or_else(missing)?)
            .map(Some)
            .map_err(|e| MsgpackError::Json(e.to_string())),
        "bytes" | "bytearray" => Ok(Some(Value::String(bytes_to_string(
            blob.ok_or_else(missing)?,
        )))),
        other => Err(MsgpackError::Undecodable(other.into())),
    }
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
        6 => return numpy(payload, depth),
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

/// Ext 6: `(dtype.str, shape, order, buffer)` → nested arrays.
fn numpy(payload: &[u8], depth: usize) -> Result<Value, MsgpackError> {
    let np = |why: &str| MsgpackError::Numpy(why.into());
    let mut rd = payload;
    let tup = read_value_ref_with_max_depth(&mut rd, 16)
        .map_err(|e| MsgpackError::Numpy(e.to_string()))?;
    let ValueRef::Array(parts) = &tup else {
        return Err(np("meta is not an array"));
    };
    let (Some(dtype), Some(ValueRef::Array(shape)), Some(order), Some(ValueRef::Binary(buf))) = (
        parts.first().and_then(as_str),
        parts.get(1),
        parts.get(2).and_then(as_str),
        parts.get(3),
    ) else {
        return Err(np("expected (dtype, shape, order, buffer)"));
    };
    let shape = shape
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| np("shape is not a list of sizes"))?;
    if shape.len() >= depth {
        return Err(MsgpackError::TooDeep);
    }
    let elem = Elem::parse(dtype).ok_or_else(|| MsgpackError::Numpy(format!("dtype {dtype}")))?;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| np("shape overflows"))?;
    // Zero-size arrays carry no bytes, so bound the nested arrays a shape
    // like (2**60, 0) would otherwise have us build.
    let limit = buf.len().max(1024);
    let mut prefix = 1usize;
    for &d in &shape {
        prefix = prefix.saturating_mul(d);
        if prefix > limit && count == 0 {
            return Err(np("empty array with too many rows"));
        }
    }
    if count.checked_mul(elem.size) != Some(buf.len()) {
        return Err(np("buffer size does not match shape and dtype"));
    }
    // Element strides (in elements) for C (row-major) or F (column-major) order.
    let mut strides = vec![0usize; shape.len()];
    let mut acc = 1usize;
    let dims: Vec<usize> = match order {
        "C" => (0..shape.len()).rev().collect(),
        "F" => (0..shape.len()).collect(),
        _ => return Err(np("order is neither C nor F")),
    };
    for d in dims {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d]);
    }
    Ok(build(&shape, &strides, 0, buf, &elem))
}

fn build(shape: &[usize], strides: &[usize], offset: usize, buf: &[u8], elem: &Elem) -> Value {
    match (shape.split_first(), strides.split_first()) {
        (Some((&n, shape)), Some((&stride, strides))) => Value::Array(
            (0..n)
                .map(|i| build(shape, strides, offset + i * stride, buf, elem))
                .collect(),
        ),
        _ => elem.read(buf, offset),
    }
}

/// A numeric numpy element type: kind, width, byte order.
struct Elem {
    kind: u8,
    size: usize,
    big_endian: bool,
}

impl Elem {
    fn parse(dtype: &str) -> Option<Elem> {
        let b = dtype.as_bytes();
        let (order, kind, size) = (b.first()?, b.get(1)?, dtype.get(2..)?.parse().ok()?);
        let big_endian = match order {
            b'>' => true,
            b'<' | b'|' => false,
            b'=' => cfg!(target_endian = "big"),
            _ => return None,
        };
        let ok = matches!(
            (kind, size),
            (b'b', 1) | (b'i' | b'u', 1 | 2 | 4 | 8) | (b'f', 4 | 8)
        );
        ok.then_some(Elem {
            kind: *kind,
            size,
            big_endian,
        })
    }

    fn read(&self, buf: &[u8], index: usize) -> Value {
        let start = index * self.size;
        let mut raw = [0u8; 8];
        if let Some(src) = buf.get(start..start + self.size) {
            raw[..self.size].copy_from_slice(src);
        }
        if self.big_endian {
            raw[..self.size].reverse();
        }
        let unsigned = u64::from_le_bytes(raw);
        let bits = (self.size * 8) as u32;
        match self.kind {
            b'b' => Value::Bool(unsigned != 0),
            b'u' => Value::from(unsigned),
            b'i' => {
                // Sign-extend from the element width.
                let shift = 64 - bits;
                Value::from(((unsigned << shift) as i64) >> shift)
            }
            _ if self.size == 4 => float(f64::from(f32::from_bits(unsigned as u32))),
            _ => float(f64::from_bits(unsigned)),
        }
    }
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
fn bytes_to_string(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => base64(b),
    }
}

fn base64(b: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &x)| acc | (u32::from(x) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Decodes a hex vector produced by the real serializer.
    fn dec(hex_blob: &str) -> Value {
        to_json(&hex::decode(hex_blob).unwrap()).unwrap()
    }

    // Vectors: langgraph-checkpoint 4.3.2 `JsonPlusSerializer().dumps_typed(obj)`,
    // run in /work/venv-probe; the Python expression is in each comment.

    #[test]
    fn plain_values() {
        // ["a", "b"]
        assert_eq!(dec("92a161a162"), json!(["a", "b"]));
        // [None]
        assert_eq!(dec("91c0"), json!([null]));
        // [1]
        assert_eq!(dec("9101"), json!([1]));
        // 7, -300
        assert_eq!(dec("07"), json!(7));
        assert_eq!(dec("d1fed4"), json!(-300));
        // {"k": 1, "n": None, "l": [True, 1.5]}
        assert_eq!(
            dec("83a16b01a16ec0a16c92c3cb3ff8000000000000"),
            json!({"k": 1, "n": null, "l": [true, 1.5]})
        );
        // (1, "a"): tuples are plain arrays
        assert_eq!(dec("9201a161"), json!([1, "a"]));
        // TD(a=1, b=["z"]) with class TD(TypedDict): a TypedDict is a dict
        assert_eq!(dec("82a16101a16291a17a"), json!({"a": 1, "b": ["z"]}));
    }

    #[test]
    fn pydantic_v2_model_is_its_fields() {
        // Person(name="Ann", age=3, tags=["x"], addr=Addr(city="Oslo"))
        let v = dec("c7510594a85f5f6d61696e5f5fa6506572736f6e84a46e616d65a3416e6ea361676503a47461677391a178a46164647282a463697479a44f736c6fa37a6970c0b36d6f64656c5f76616c69646174655f6a736f6e");
        assert_eq!(
            v,
            json!({"name": "Ann", "age": 3, "tags": ["x"], "addr": {"city": "Oslo", "zip": null}})
        );
    }

    #[test]
    fn pydantic_v1_model_is_its_fields() {
        // class Old(pydantic.v1.BaseModel): a: int; Old(a=1)
        assert_eq!(
            dec("c7120493a85f5f6d61696e5f5fa34f6c6481a16101"),
            json!({"a": 1})
        );
    }

    #[test]
    fn dataclass_and_namedtuple_are_their_fields() {
        // @dataclass Point(x=1, y=2.5)
        assert_eq!(
            dec("c71f0293a85f5f6d61696e5f5fa5506f696e7482a17801a179cb4004000000000000"),
            json!({"x": 1, "y": 2.5})
        );
        // namedtuple("NT", "p q")(1, 2)
        assert_eq!(
            dec("c7140293a85f5f6d61696e5f5fa24e5482a17001a17102"),
            json!({"p": 1, "q": 2})
        );
    }

    #[test]
    fn interrupt_list_is_objects_of_fields() {
        // [Interrupt(value="approve?", id="0123456789abcdef0123456789abcdef")]
        let v = dec("91c7610293af6c616e6767726170682e7479706573a9496e7465727275707483a576616c7565a8617070726f76653fa26964d9203031323334353637383961626364656630313233343536373839616263646566af726573706f6e73655f736368656d61c0");
        assert_eq!(
            v,
            json!([{"value": "approve?", "id": "0123456789abcdef0123456789abcdef", "response_schema": null}])
        );
    }

    #[test]
    fn constructor_single_arg_is_the_argument() {
        // uuid.UUID("12345678-1234-5678-1234-567812345678")
        assert_eq!(
            dec("c72d0093a475756964a455554944d9203132333435363738313233343536373831323334353637383132333435363738"),
            json!("12345678-1234-5678-1234-567812345678")
        );
        // {"only"}, frozenset([1]), deque([1, 2])
        assert_eq!(
            dec("c7140093a86275696c74696e73a373657491a46f6e6c79"),
            json!(["only"])
        );
        assert_eq!(
            dec("c7160093a86275696c74696e73a966726f7a656e7365749101"),
            json!([1])
        );
        assert_eq!(
            dec("c7160093ab636f6c6c656374696f6e73a56465717565920102"),
            json!([1, 2])
        );
        // decimal.Decimal("1.25")
        assert_eq!(
            dec("c7160093a7646563696d616ca7446563696d616ca4312e3235"),
            json!("1.25")
        );
        // Color.RED with class Color(Enum): RED = "red"
        assert_eq!(
            dec("c7140093a85f5f6d61696e5f5fa5436f6c6f72a3726564"),
            json!("red")
        );
        // ipaddress.IPv4Address("10.0.0.1"), ZoneInfo("Europe/Oslo"), SecretStr("pw")
        assert_eq!(
            dec("c7200093a9697061646472657373ab4950763441646472657373a831302e302e302e31"),
            json!("10.0.0.1")
        );
        assert_eq!(
            dec("c71f0093a87a6f6e65696e666fa85a6f6e65496e666fab4575726f70652f4f736c6f"),
            json!("Europe/Oslo")
        );
        assert_eq!(
            dec("c71d0093ae707964616e7469632e7479706573a9536563726574537472a27077"),
            json!("pw")
        );
    }

    #[test]
    fn datetime_family() {
        // datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc): ext 3 fromisoformat
        assert_eq!(
            dec("c73b0394a86461746574696d65a86461746574696d65b9323032342d30352d30315431323a33303a30302b30303a3030ad66726f6d69736f666f726d6174"),
            json!("2024-05-01T12:30:00+00:00")
        );
        // date(2024, 5, 1)
        assert_eq!(
            dec("c7150193a86461746574696d65a46461746593cd07e80501"),
            json!("2024-05-01")
        );
        // time(12, 30, 1, 500)
        assert_eq!(
            dec("c7430293a86461746574696d65a474696d6586a4686f75720ca66d696e7574651ea67365636f6e6401ab6d6963726f7365636f6e64cd01f4a6747a696e666fc0a4666f6c6400"),
            json!("12:30:01.000500")
        );
        // timedelta(days=1, seconds=3661, microseconds=500000)
        assert_eq!(
            dec("c71e0193a86461746574696d65a974696d6564656c74619301cd0e4dce0007a120"),
            json!("P1DT1H1M1.5S")
        );
        // timezone(timedelta(hours=2))
        assert_eq!(
            dec("c7310193a86461746574696d65a874696d657a6f6e6591c71a0193a86461746574696d65a974696d6564656c74619300cd1c2000"),
            json!("+02:00")
        );
    }

    #[test]
    fn iso_durations() {
        assert_eq!(iso_duration(0, 0, 0), "PT0S");
        assert_eq!(iso_duration(2, 0, 0), "P2D");
        assert_eq!(iso_duration(0, 60, 0), "PT1M");
        assert_eq!(iso_duration(-1, 86_399, 0), "-PT1S");
    }

    #[test]
    fn positional_known_classes() {
        // pathlib.Path("/usr/bin")
        assert_eq!(
            dec("c71e0193a7706174686c6962a9506f7369785061746893a12fa3757372a362696e"),
            json!("/usr/bin")
        );
        // re.compile("a+b")
        assert_eq!(
            dec("c7120193a27265a7636f6d70696c6592a3612b6220"),
            json!("a+b")
        );
        // Send("node", {"x": 1})
        assert_eq!(
            dec("c7200193af6c616e6767726170682e7479706573a453656e6492a46e6f646581a17801"),
            json!({"node": "node", "arg": {"x": 1}})
        );
    }

    #[test]
    fn unknown_positional_class_is_its_args() {
        // Ext 1 of ["m", "C", [1, 2]]
        let payload = hex::decode("93a16da143920102").unwrap();
        let mut blob = vec![0xc7, payload.len() as u8, 0x01];
        blob.extend(payload);
        assert_eq!(to_json(&blob).unwrap(), json!([1, 2]));
    }

    #[test]
    fn delta_snapshot_is_its_value() {
        // _DeltaSnapshot(["a"])
        assert_eq!(dec("c7030791a161"), json!(["a"]));
    }

    #[test]
    fn nested_ext_values() {
        // {"when": [date(2020, 1, 2)], "id": UUID(int=1)}
        assert_eq!(
            dec("82a47768656e91c7150193a86461746574696d65a46461746593cd07e40102a26964c72d0093a475756964a455554944d9203030303030303030303030303030303030303030303030303030303030303031"),
            json!({"when": ["2020-01-02"], "id": "00000000-0000-0000-0000-000000000001"})
        );
    }

    #[test]
    fn bytes_nan_and_keys() {
        // {"b": b"hi"}
        assert_eq!(dec("81a162c4026869"), json!({"b": "hi"}));
        // non-UTF-8 bytes inside a value become base64
        assert_eq!(dec("c403fffe00"), json!("//4A"));
        // [nan, inf, -inf]
        assert_eq!(
            dec("93cb7ff8000000000000cb7ff0000000000000cbfff0000000000000"),
            json!(["NaN", "Infinity", "-Infinity"])
        );
        // {1: "a", None: "c", 2.5: "d", (1, 2): "e"}
        assert_eq!(
            dec("8401a161c0a163cb4004000000000000a164920102a165"),
            json!({"1": "a", "null": "c", "2.5": "d", "[1,2]": "e"})
        );
    }

    #[test]
    fn numpy_arrays() {
        // (dtype "<i4", shape (2, 3), "C", 1..=6)
        assert_eq!(
            dec("c7240694a33c6934920203a143c418010000000200000003000000040000000500000006000000"),
            json!([[1, 2, 3], [4, 5, 6]])
        );
        // (dtype "<f8", shape (2, 2), "F", [1.0, 2.0, 3.0, 4.0]) — column-major
        assert_eq!(
            dec("c72c0694a33c6638920202a146c420000000000000f03f000000000000004000000000000008400000000000001040"),
            json!([[1.0, 3.0], [2.0, 4.0]])
        );
        // (dtype "|b1", shape (2,), "C", [1, 0])
        assert_eq!(
            dec("c70d0694a37c62319102a143c4020100"),
            json!([true, false])
        );
    }

    #[test]
    fn numpy_rejects_unknown_dtype_and_bad_size() {
        // dtype "<U1"
        let meta = hex::decode("94a33c55319101a143c40441000000").unwrap();
        let mut blob = vec![0xc7, meta.len() as u8, 0x06];
        blob.extend(meta);
        assert!(matches!(to_json(&blob), Err(MsgpackError::Numpy(_))));
        // "<i4" shape (2,) but 4 bytes
        let meta = hex::decode("94a33c69349102a143c40401000000").unwrap();
        let mut blob = vec![0xc7, meta.len() as u8, 0x06];
        blob.extend(meta);
        assert!(matches!(to_json(&blob), Err(MsgpackError::Numpy(_))));
        // "<i4" shape (2**40, 0), no bytes
        let meta = hex::decode("94a33c693492cf000001000000000000a143c400").unwrap();
        let mut blob = vec![0xc7, meta.len() as u8, 0x06];
        blob.extend(meta);
        assert!(matches!(to_json(&blob), Err(MsgpackError::Numpy(_))));
        // "<i4" shape (3, 0) is fine: three empty rows
        let meta = hex::decode("94a33c6934920300a143c400").unwrap();
        let mut blob = vec![0xc7, meta.len() as u8, 0x06];
        blob.extend(meta);
        assert_eq!(to_json(&blob).unwrap(), json!([[], [], []]));
    }

    #[test]
    fn undecodable_blobs_are_errors() {
        assert!(matches!(to_json(&[]), Err(MsgpackError::Malformed(_))));
        // array of 2 with one element
        assert!(matches!(
            to_json(&[0x92, 0x01]),
            Err(MsgpackError::Malformed(_))
        ));
        assert_eq!(to_json(&[0x01, 0x02]), Err(MsgpackError::Trailing(1)));
        // msgpack timestamp (ext -1)
        assert_eq!(
            to_json(&[0xd6, 0xff, 0, 0, 0, 1]),
            Err(MsgpackError::UnknownExt(-1))
        );
        // ext 42
        assert_eq!(to_json(&[0xd4, 42, 0]), Err(MsgpackError::UnknownExt(42)));
        // ext 2 whose payload is a bare int
        assert!(matches!(
            to_json(&[0xd4, 2, 0x01]),
            Err(MsgpackError::BadExt { code: 2, .. })
        ));
        // ext 5 whose fields are not a map: [m, n, 1, x]
        assert!(matches!(
            to_json(&hex::decode("c7080594a16da16e01a178").unwrap()),
            Err(MsgpackError::BadExt { code: 5, .. })
        ));
        // invalid UTF-8 in a str
        assert_eq!(to_json(&[0xa1, 0xff]), Err(MsgpackError::Utf8));
        // a pickle payload is not msgpack
        assert!(to_json(b"\x80\x04\x95").is_err());
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let mut blob = vec![0x91; 100_000];
        blob.push(0xc0);
        assert_eq!(to_json(&blob), Err(MsgpackError::TooDeep));
    }

    #[test]
    fn type_tags() {
        assert_eq!(
            blob_to_json("msgpack", Some(&[0x91, 0xc0])).unwrap(),
            Some(json!([null]))
        );
        // `None` is stored as type "null" with an empty blob.
        assert_eq!(blob_to_json("null", Some(b"")).unwrap(), Some(json!(null)));
        assert_eq!(blob_to_json("empty", None).unwrap(), None);
        assert_eq!(
            blob_to_json("json", Some(br#"{"a": [1]}"#)).unwrap(),
            Some(json!({"a": [1]}))
        );
        // b"\x00\x01" is stored as type "bytes"
        assert_eq!(
            blob_to_json("bytes", Some(&[0x00, 0x01])).unwrap(),
            Some(json!("\u{0}\u{1}"))
        );
        assert_eq!(
            blob_to_json("bytearray", Some(&[0xff])).unwrap(),
            Some(json!("/w=="))
        );
        assert_eq!(
            blob_to_json("pickle", Some(b"\x80\x04")),
            Err(MsgpackError::Undecodable("pickle".into()))
        );
        assert!(matches!(
            blob_to_json("cbor", Some(b"")),
            Err(MsgpackError::Undecodable(_))
        ));
        assert_eq!(
            blob_to_json("msgpack", None),
            Err(MsgpackError::MissingBlob("msgpack".into()))
        );
        assert!(matches!(
            blob_to_json("json", Some(b"{")),
            Err(MsgpackError::Json(_))
        ));
    }

    #[test]
    fn base64_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
    }
}
