//! JSON Schemas as rules hold them: compiled once at load time (an invalid
//! schema is a load error, never a runtime surprise), with a short summary
//! for `rules check`, and the per-channel split of an exported state schema.

use jsonschema::Validator;
use serde_json::{Map, Value};

use crate::saver::msgpack::MsgpackError;

/// A rule's schema that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// jsonschema refused it: where in the schema, and its reason.
    #[error("invalid JSON Schema at {at}: {reason}")]
    Invalid { at: String, reason: String },
    #[error("{0} is not a JSON number")]
    NotANumber(f64),
    #[error("schema string is not JSON: {0}")]
    NotJson(serde_json::Error),
    /// The TOML type of a value that is no schema.
    #[error("schema must be a table, a JSON string or a boolean, got {0}")]
    NotASchema(&'static str),
    /// An exported state schema without the properties it is split by.
    #[error("state schema has no top-level \"properties\" object")]
    NoProperties,
}

/// One compiled schema and where it came from.
#[derive(Debug)]
pub struct Schema {
    pub validator: Validator,
    /// `inline`, or the schema file as written in the rule.
    pub source: String,
    /// Compact text of the schema without `$defs`, titles and defaults.
    pub summary: String,
}

impl Schema {
    /// Compiles `schema` (Draft 2020-12 unless it names a `$schema`).
    /// `format` is an annotation, as the draft's default says: pydantic
    /// emits `date-time` for naive datetimes too, which RFC 3339 rejects.
    pub fn compile(schema: &Value, source: String) -> Result<Schema, SchemaError> {
        let validator = jsonschema::validator_for(schema).map_err(|e| {
            let at = e.instance_path().as_str();
            SchemaError::Invalid {
                at: if at.is_empty() { "/" } else { at }.to_owned(),
                reason: e.to_string(),
            }
        })?;
        Ok(Schema {
            validator,
            source,
            summary: summarize(schema),
        })
    }
}

/// Keys that say nothing about what a value must be.
const NOISE: [&str; 6] = [
    "$defs",
    "definitions",
    "title",
    "description",
    "default",
    "$schema",
];
const SUMMARY_MAX: usize = 80;

fn summarize(schema: &Value) -> String {
    let text = match schema {
        Value::Object(map) => {
            let kept: Map<String, Value> = map
                .iter()
                .filter(|(k, _)| !NOISE.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Value::Object(kept).to_string()
        }
        other => other.to_string(),
    };
    match text.char_indices().nth(SUMMARY_MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// A TOML schema table as JSON. Datetimes become their text; TOML has no
/// null, so every JSON Schema keyword value is representable.
pub fn toml_to_json(v: &toml::Value) -> Result<Value, SchemaError> {
    Ok(match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .ok_or(SchemaError::NotANumber(*f))?,
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => {
            Value::Array(items.iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(t) => Value::Object(
            t.iter()
                .map(|(k, v)| Ok((k.clone(), toml_to_json(v)?)))
                .collect::<Result<_, SchemaError>>()?,
        ),
    })
}

/// An inline `schema`: a TOML table, a JSON string, or a boolean schema.
pub fn inline_schema(v: &toml::Value) -> Result<Value, SchemaError> {
    match v {
        toml::Value::Table(_) | toml::Value::Boolean(_) => toml_to_json(v),
        toml::Value::String(text) => serde_json::from_str(text).map_err(SchemaError::NotJson),
        other => Err(SchemaError::NotASchema(other.type_str())),
    }
}

/// Channels LangGraph itself writes; a rule reaches them only by naming
/// one exactly, never through a state import.
pub fn is_special_channel(name: &str) -> bool {
    matches!(
        name,
        "__interrupt__"
            | "__resume__"
            | "__error__"
            | "__scheduled__"
            | "__pregel_tasks"
            | "__start__"
            | "__end__"
    ) || name.starts_with("branch:to:")
}

/// Splits a graph-state schema (`get_input_jsonschema()` /
/// `model_json_schema()`) into one schema per top-level property. The
/// root's `$defs` / `definitions` / `$schema` travel with each property so
/// its `$ref`s resolve; a non-object property schema (`true`) is wrapped in
/// `allOf`. The root's `required` is dropped: a checkpoint stores only the
/// channels that have values.
pub fn split_state(root: &Value) -> Result<Vec<(String, Value)>, SchemaError> {
    let Some(props) = root.get("properties").and_then(Value::as_object) else {
        return Err(SchemaError::NoProperties);
    };
    let carried: Vec<(&str, &Value)> = ["$defs", "definitions", "$schema"]
        .into_iter()
        .filter_map(|k| root.get(k).map(|v| (k, v)))
        .collect();
    let mut out = Vec::with_capacity(props.len());
    for (name, prop) in props {
        if is_special_channel(name) {
            continue;
        }
        let mut schema = match prop {
            Value::Object(map) => map.clone(),
            other => {
                let mut m = Map::new();
                m.insert("allOf".into(), Value::Array(vec![other.clone()]));
                m
            }
        };
        for (k, v) in &carried {
            if !schema.contains_key(*k) {
                schema.insert((*k).into(), (*v).clone());
            }
        }
        out.push((name.clone(), Value::Object(schema)));
    }
    Ok(out)
}

/// Text for a violation when a payload could not be decoded.
pub fn undecodable_message(type_tag: &str, err: &MsgpackError) -> String {
    format!("{type_tag} payload could not be decoded: {err}")
}

/// Text for a violation when a checkpoint's JSON could not be parsed.
pub fn undecodable_checkpoint_message(why: &str) -> String {
    format!("checkpoint JSON could not be decoded, so its channel values cannot be checked: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_invalid_schemas() {
        let e = Schema::compile(&json!({"type": "strin"}), "inline".into())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid JSON Schema at /type"), "{e}");
        assert!(Schema::compile(&json!({"type": "string"}), "inline".into()).is_ok());
    }

    #[test]
    fn numbers_are_compared_exactly_past_f64() {
        let big = format!("1{}", "0".repeat(400));
        let cases = [
            (json!({"type": "integer"}), big.clone(), true),
            (json!({"type": "integer"}), format!("-{big}"), true),
            (json!({"type": "integer"}), "1e400".to_owned(), true),
            (json!({"type": "integer"}), "1e-400".to_owned(), false),
            (json!({"type": "integer"}), "2.5".to_owned(), false),
            (json!({"type": "string"}), big.clone(), false),
            (json!({"maximum": 10}), big.clone(), false),
            (json!({"minimum": 0}), format!("-{big}"), false),
            (json!({"exclusiveMinimum": 0}), "1e-400".to_owned(), true),
            (json!({"multipleOf": 2}), big.clone(), true),
            (json!({"multipleOf": 2}), format!("{big}1"), false),
            (json!({"enum": [1, 2]}), "2.0".to_owned(), true),
            (json!({"enum": [1, 2]}), big.clone(), false),
        ];
        for (schema, instance, valid) in cases {
            let s = Schema::compile(&schema, "inline".into()).unwrap();
            let value: Value = serde_json::from_str(&instance).unwrap();
            assert_eq!(
                s.validator.is_valid(&value),
                valid,
                "{schema} {instance:.20}"
            );
        }
    }

    #[test]
    fn summary_drops_noise_and_truncates() {
        let s = Schema::compile(
            &json!({"type": "array", "title": "Items", "$defs": {"A": {}}}),
            "inline".into(),
        )
        .unwrap();
        assert_eq!(s.summary, r#"{"type":"array"}"#);
        let long = json!({"enum": (0..100).collect::<Vec<_>>()});
        assert!(summarize(&long).ends_with('…'));
    }

    #[test]
    fn toml_tables_become_json() {
        let t: toml::Table = toml::from_str(
            r#"
            type = "array"
            items = { type = "string" }
            maxItems = 3
            "$comment" = 1979-05-27
            "#,
        )
        .unwrap();
        let v = toml_to_json(&toml::Value::Table(t)).unwrap();
        assert_eq!(
            v,
            json!({"type": "array", "items": {"type": "string"}, "maxItems": 3, "$comment": "1979-05-27"})
        );
    }

    #[test]
    fn inline_schema_forms() {
        assert_eq!(
            inline_schema(&toml::Value::String(r#"{"type": "integer"}"#.into())).unwrap(),
            json!({"type": "integer"})
        );
        assert_eq!(
            inline_schema(&toml::Value::Boolean(true)).unwrap(),
            json!(true)
        );
        assert!(inline_schema(&toml::Value::String("{".into()))
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
        assert!(inline_schema(&toml::Value::Integer(1))
            .unwrap_err()
            .to_string()
            .contains("got integer"));
    }

    #[test]
    fn specials() {
        for s in [
            "__interrupt__",
            "__resume__",
            "__error__",
            "__scheduled__",
            "__pregel_tasks",
            "__start__",
            "branch:to:gate",
        ] {
            assert!(is_special_channel(s), "{s}");
        }
        assert!(!is_special_channel("items"));
    }

    #[test]
    fn split_carries_defs_and_skips_specials() {
        let root = json!({
            "$defs": {"A": {"type": "object"}},
            "properties": {
                "a": {"$ref": "#/$defs/A"},
                "free": true,
                "__interrupt__": {"type": "array"}
            },
            "required": ["a"]
        });
        let parts = split_state(&root).unwrap();
        let names: Vec<_> = parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "free"]);
        assert_eq!(
            parts[0].1,
            json!({"$ref": "#/$defs/A", "$defs": {"A": {"type": "object"}}})
        );
        assert_eq!(
            parts[1].1,
            json!({"allOf": [true], "$defs": {"A": {"type": "object"}}})
        );
        assert!(split_state(&json!({"type": "object"})).is_err());
    }
}
