//! LangGraph JS's JSON blobs (`type = 'json'`), read back as plain JSON
//! for schema checks.
//!
//! `JsonPlusSerializer` (`@langchain/langgraph-checkpoint` 1.x) stores
//! UTF-8 JSON text; values JSON cannot hold are records its reviver
//! rebuilds. As for msgpack (see `msgpack.rs`), nothing is rebuilt: each
//! record becomes the JSON a schema for the value validates naturally.
//!
//! | stored record | JS value | JSON |
//! | --- | --- | --- |
//! | `{"lc": 1, "type": "constructor", "id": [...], "kwargs": {...}}` | LangChain serializable (messages, documents) | the kwargs object (as a pydantic model is its fields) |
//! | `{"lc": 2, "type": "constructor", "id": ["Set"], "args": [[...]]}` | `Set` | the items array |
//! | the same with `["Map"]`, `args: [[[k, v], ...]]` | `Map` | object; keys as msgpack map keys are stringified |
//! | `["Uint8Array"]`, `args: [[bytes...]]` | `Uint8Array` inside a value | string: UTF-8 text when valid, else base64 |
//! | `["RegExp"]`, `args: [source, flags]` / `["Error"]`, `args: [message]` | `RegExp` / `Error` | the source / the message |
//! | `{"lc": 2, "type": "undefined"}` | `undefined` | member left out of its object; `null` elsewhere |
//! | `{"lc": 2, "type": "delta_snapshot", "value": v}` | `DeltaSnapshot` | `v` |
//!
//! A record that does not have its expected shape stays as stored, as
//! the JS reviver leaves it inert. Python's read-only `json` blobs use the
//! same `lc` records and read the same way.

use serde_json::{Map, Value};

use super::msgpack::{bytes_to_string, MsgpackError};

/// Parses a JSON blob and maps the serializer's records to plain JSON.
pub fn to_json(blob: &[u8]) -> Result<Value, MsgpackError> {
    let parsed: Value =
        serde_json::from_slice(blob).map_err(|e| MsgpackError::Json(e.to_string()))?;
    Ok(plain(parsed).unwrap_or(Value::Null))
}

/// The plain JSON of one value; `None` for `undefined`.
fn plain(v: Value) -> Option<Value> {
    match v {
        Value::Array(items) => Some(Value::Array(
            items
                .into_iter()
                .map(|i| plain(i).unwrap_or(Value::Null))
                .collect(),
        )),
        Value::Object(o) => record(o),
        other => Some(other),
    }
}

/// An object: a serializer record's value, or the object with its members
/// made plain.
fn record(mut o: Map<String, Value>) -> Option<Value> {
    let lc = o.get("lc").and_then(Value::as_i64);
    let kind = o.get("type").and_then(Value::as_str);
    match (lc, kind) {
        (Some(2), Some("undefined")) => return None,
        (Some(2), Some("delta_snapshot")) if o.contains_key("value") => {
            return o.remove("value").and_then(plain);
        }
        (Some(1), Some("constructor")) => {
            if let Some(Value::Object(kwargs)) = o.get("kwargs") {
                return record(kwargs.clone());
            }
        }
        (Some(2), Some("constructor")) => {
            if let Some(v) = constructed(&o) {
                return Some(v);
            }
        }
        _ => {}
    }
    Some(Value::Object(
        o.into_iter()
            .filter_map(|(k, v)| plain(v).map(|v| (k, v)))
            .collect(),
    ))
}

/// The value of a `{"lc": 2, "type": "constructor"}` record of a JS
/// built-in, `None` when it is not one in its expected shape.
fn constructed(o: &Map<String, Value>) -> Option<Value> {
    let [Value::String(class)] = o.get("id")?.as_array()?.as_slice() else {
        return None;
    };
    let args = o.get("args")?.as_array()?;
    match (class.as_str(), args.as_slice()) {
        ("Set", [Value::Array(items)]) => plain(Value::Array(items.clone())),
        ("Map", [Value::Array(entries)]) => entries
            .iter()
            .map(|e| match e.as_array()?.as_slice() {
                [k, v] => Some((key(k), plain(v.clone()).unwrap_or(Value::Null))),
                _ => None,
            })
            .collect::<Option<Map<_, _>>>()
            .map(Value::Object),
        ("Uint8Array", [Value::Array(bytes)]) => bytes
            .iter()
            .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect::<Option<Vec<u8>>>()
            .map(|b| Value::String(bytes_to_string(&b))),
        ("RegExp", [source @ Value::String(_), Value::String(_)])
        | ("Error", [source @ Value::String(_)]) => Some(source.clone()),
        _ => None,
    }
}

/// A Map key as an object key: strings as they are, anything else as its
/// compact JSON text (numbers print as numbers do).
fn key(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Blobs from `JsonPlusSerializer().dumpsTyped(value)`,
    /// @langchain/langgraph-checkpoint 1.2.2 (the comment is the value).
    fn read(blob: &str) -> Value {
        to_json(blob.as_bytes()).unwrap()
    }

    #[test]
    fn langchain_messages_are_their_kwargs() {
        // [new HumanMessage({content: "hi", id: "m1"})]
        assert_eq!(
            read(
                r#"[{"lc":1,"type":"constructor","id":["langchain_core","messages","HumanMessage"],"kwargs":{"content":"hi","id":"m1","additional_kwargs":{},"response_metadata":{}}}]"#
            ),
            json!([{"content": "hi", "id": "m1", "additional_kwargs": {}, "response_metadata": {}}])
        );
    }

    #[test]
    fn built_ins() {
        // new Set(["a", "b"])
        assert_eq!(
            read(
                r#"{"lc":2,"type":"constructor","id":["Set"],"method":null,"args":[["a","b"]],"kwargs":{}}"#
            ),
            json!(["a", "b"])
        );
        // new Map([["k", 1], [2, "two"]])
        assert_eq!(
            read(
                r#"{"lc":2,"type":"constructor","id":["Map"],"method":null,"args":[[["k",1],[2,"two"]]],"kwargs":{}}"#
            ),
            json!({"k": 1, "2": "two"})
        );
        // {raw: new Uint8Array([104, 105])}
        assert_eq!(
            read(
                r#"{"raw":{"lc":2,"type":"constructor","id":["Uint8Array"],"method":"from","args":[[104,105]],"kwargs":{}}}"#
            ),
            json!({"raw": "hi"})
        );
        // /ab+c/i and new Error("boom")
        assert_eq!(
            read(
                r#"{"lc":2,"type":"constructor","id":["RegExp"],"method":null,"args":["ab+c","i"],"kwargs":{}}"#
            ),
            json!("ab+c")
        );
        assert_eq!(
            read(
                r#"{"lc":2,"type":"constructor","id":["Error"],"method":null,"args":["boom"],"kwargs":{}}"#
            ),
            json!("boom")
        );
    }

    #[test]
    fn undefined_leaves_objects_and_is_null_elsewhere() {
        // {a: undefined, b: 1}
        assert_eq!(
            read(r#"{"a":{"lc":2,"type":"undefined"},"b":1}"#),
            json!({"b": 1})
        );
        assert_eq!(read(r#"[{"lc":2,"type":"undefined"}]"#), json!([null]));
        assert_eq!(read(r#"{"lc":2,"type":"undefined"}"#), json!(null));
    }

    #[test]
    fn delta_snapshots_are_their_value_and_records_nest() {
        assert_eq!(
            read(
                r#"{"lc":2,"type":"delta_snapshot","value":{"lc":2,"type":"constructor","id":["Set"],"args":[[1]]}}"#
            ),
            json!([1])
        );
    }

    #[test]
    fn malformed_records_stay_as_stored() {
        for stored in [
            r#"{"lc":2,"type":"constructor","id":["Set"],"args":["not a list"]}"#,
            r#"{"lc":2,"type":"constructor","id":["Uint8Array"],"args":[[300]]}"#,
            r#"{"lc":2,"type":"constructor","id":["Map"],"args":[[["k"]]]}"#,
            r#"{"lc":2,"type":"constructor","id":["process","exit"],"args":[]}"#,
            r#"{"lc":1,"type":"constructor","id":["x"]}"#,
        ] {
            assert_eq!(
                read(stored),
                serde_json::from_str::<Value>(stored).unwrap(),
                "{stored}"
            );
        }
    }

    #[test]
    fn invalid_json_is_an_error() {
        assert!(matches!(to_json(b"{"), Err(MsgpackError::Json(_))));
        assert!(matches!(to_json(b"\xff"), Err(MsgpackError::Json(_))));
    }
}
