//! Rule loading and verdicts end to end, on rule files written to a
//! scratch directory and blobs produced by the real serializer
//! (langgraph-checkpoint 4.3.2 `JsonPlusSerializer().dumps_typed`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

use super::*;

/// A fresh `<tmp>/rg-policy-<pid>-<n>/channels` holding `files`; returns
/// the rules dir (the parent of `channels`).
fn rules_dir(files: &[(&str, &str)]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rg-policy-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let channels = dir.join("channels");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&channels).unwrap();
    for (name, text) in files {
        std::fs::write(channels.join(name), text).unwrap();
    }
    dir
}

fn load(files: &[(&str, &str)]) -> ChannelRules {
    ChannelRules::load(&rules_dir(files)).unwrap()
}

fn load_err(files: &[(&str, &str)]) -> RuleError {
    ChannelRules::load(&rules_dir(files)).unwrap_err()
}

fn ctx(thread: &str) -> WriteContext<'_> {
    WriteContext {
        thread_id: thread,
        checkpoint_ns: "",
        checkpoint_id: "1f0c-ck",
        metadata: None,
    }
}

fn msgpack(hex_blob: &str) -> Vec<u8> {
    hex::decode(hex_blob).unwrap()
}

fn blob<'a>(b: &'a [u8]) -> ChannelPayload<'a> {
    ChannelPayload::Blob {
        type_tag: "msgpack",
        blob: Some(b),
    }
}

fn invalid(v: Verdict) -> Violation {
    match v {
        Verdict::Invalid(v) => v,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

const ITEMS: &str = r#"
[[channel]]
name = "items"
thread_id = "cv-.*"
schema = { type = "array", items = { type = "string" } }
"#;

/// `[None]`, `[1]`, `["a", "b"]` as the serializer writes them.
const NONE_LIST: &str = "91c0";
const INT_LIST: &str = "9101";
const STR_LIST: &str = "92a161a162";

// --- loading and its errors ---

#[test]
fn missing_channels_dir_means_no_rules() {
    let dir = std::env::temp_dir().join(format!("rg-policy-none-{}", std::process::id()));
    let rules = ChannelRules::load(&dir).unwrap();
    assert!(rules.is_empty());
    assert_eq!(rules.describe(), "no channel rules\n");
    assert_eq!(
        rules.check_pending_write(&ctx("cv-1"), "items", blob(&msgpack(NONE_LIST))),
        Verdict::NoRule
    );
}

#[test]
fn non_toml_files_are_ignored() {
    let rules = load(&[("a.toml", ITEMS), ("notes.md", "[[oops"), ("x.json", "{")]);
    assert_eq!(rules.len(), 1);
}

#[test]
fn bad_toml_names_file_and_line() {
    let e = load_err(&[("bad.toml", "[[channel]]\nname = \"items\"\nschema = {\n")]);
    assert!(e.file.ends_with("channels/bad.toml"), "{e}");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.to_string().contains("bad.toml:3: "), "{e}");
}

#[test]
fn unknown_keys_name_file_and_line() {
    let e = load_err(&[(
        "k.toml",
        "[[channel]]\nname = \"items\"\nschema = true\nthred_id = \"x\"\n",
    )]);
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.message.contains("unknown field `thred_id`"), "{e}");

    let e = load_err(&[("top.toml", "\n[[chanel]]\nname = \"items\"\n")]);
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("unknown field `chanel`"), "{e}");

    let e = load_err(&[("s.toml", "[[state]]\nfile = \"s.json\"\nexclud = []\n")]);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("unknown field `exclud`"), "{e}");
}

#[test]
fn invalid_schema_names_line_and_path() {
    let e = load_err(&[(
        "s.toml",
        "[[channel]]\nname = \"a\"\nschema = { type = \"strin\" }\n",
    )]);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("invalid JSON Schema at /type"), "{e}");

    // As a JSON string.
    let e = load_err(&[(
        "s.toml",
        "[[channel]]\nname = \"a\"\n\nwrite_schema = '{\"type\": \"strin\"}'\n",
    )]);
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.message.contains("invalid JSON Schema"), "{e}");

    // In a schema file: the line of `schema_file`, and the file's name.
    let e = load_err(&[
        (
            "s.toml",
            "[[channel]]\nname = \"a\"\nschema_file = \"a.json\"\n",
        ),
        ("a.json", r#"{"type": "strin"}"#),
    ]);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(
        e.message
            .starts_with("a.json: invalid JSON Schema at /type"),
        "{e}"
    );
}

#[test]
fn unreadable_schema_file_names_line() {
    let e = load_err(&[(
        "m.toml",
        "# c\n[[channel]]\nname = \"a\"\nschema_file = \"missing.json\"\n",
    )]);
    assert_eq!(e.line, Some(4), "{e}");
    assert!(
        e.message.contains("cannot read schema_file `missing.json`"),
        "{e}"
    );

    let e = load_err(&[
        (
            "m.toml",
            "[[channel]]\nname = \"a\"\nschema_file = \"a.json\"\n",
        ),
        ("a.json", "{\n  \"type\": \n}"),
    ]);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("is not valid JSON"), "{e}");

    let e = load_err(&[("m.toml", "[[state]]\nfile = \"nope.json\"\n")]);
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("cannot read file `nope.json`"), "{e}");
}

#[test]
fn bad_regex_names_line() {
    let e = load_err(&[(
        "r.toml",
        "[[channel]]\nname = \"a\"\nschema = true\ncheckpoint_ns = \"sub:(\"\n",
    )]);
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.message.contains("bad regex `sub:(`"), "{e}");
}

#[test]
fn entry_without_schema_is_an_error() {
    let e = load_err(&[("n.toml", "\n\n[[channel]]\nname = \"a\"\n")]);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("has no schema"), "{e}");
}

#[test]
fn state_file_without_properties_is_an_error() {
    let e = load_err(&[
        ("s.toml", "[[state]]\nfile = \"s.json\"\n"),
        ("s.json", r#"{"type": "object"}"#),
    ]);
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("no top-level \"properties\""), "{e}");
}

// --- verdicts ---

#[test]
fn none_appended_as_pending_write_is_invalid() {
    let rules = load(&[("items.toml", ITEMS)]);
    let c = ctx("cv-1");
    let v = invalid(rules.check_pending_write(&c, "items", blob(&msgpack(NONE_LIST))));
    assert_eq!(v.channel, "items");
    assert!(v.rule.ends_with("channels/items.toml:2"), "{}", v.rule);
    assert_eq!(v.schema_path, "/items/type");
    assert_eq!(v.instance_path, "/0");
    assert_eq!(v.message, r#"null is not of type "string""#);
    let text = v.describe(&c);
    assert!(
        text.starts_with(r#"channel "items" of thread "cv-1" (checkpoint_ns "", checkpoint 1f0c-ck) violates rule "#),
        "{text}"
    );
    assert!(
        text.ends_with(r#"at schema path /items/type (value at /0): null is not of type "string""#),
        "{text}"
    );
}

#[test]
fn none_appended_in_checkpoint_blob_is_invalid() {
    let rules = load(&[("items.toml", ITEMS)]);
    // The next checkpoint's blob holds the accumulated list.
    let b = msgpack("92a470726570c0"); // ["prep", None]
    let v = invalid(rules.check_channel_value(&ctx("cv-1"), "items", blob(&b)));
    assert_eq!(
        (v.schema_path.as_str(), v.instance_path.as_str()),
        ("/items/type", "/1")
    );
}

#[test]
fn int_appended_is_invalid() {
    let rules = load(&[("items.toml", ITEMS)]);
    let v = invalid(rules.check_pending_write(&ctx("cv-1"), "items", blob(&msgpack(INT_LIST))));
    assert_eq!(
        (v.schema_path.as_str(), v.instance_path.as_str()),
        ("/items/type", "/0")
    );
    assert_eq!(v.message, r#"1 is not of type "string""#);
    // ["a", 1] in a checkpoint blob.
    let v = invalid(rules.check_channel_value(&ctx("cv-1"), "items", blob(&msgpack("92a16101"))));
    assert_eq!(v.instance_path, "/1");
}

#[test]
fn valid_values_pass_and_other_writes_have_no_rule() {
    let rules = load(&[("items.toml", ITEMS)]);
    let good = msgpack(STR_LIST);
    assert_eq!(
        rules.check_pending_write(&ctx("cv-1"), "items", blob(&good)),
        Verdict::Valid
    );
    assert_eq!(
        rules.check_channel_value(&ctx("cv-1"), "items", blob(&good)),
        Verdict::Valid
    );
    // Other threads, other channels: untouched.
    let bad = msgpack(NONE_LIST);
    assert_eq!(
        rules.check_pending_write(&ctx("other"), "items", blob(&bad)),
        Verdict::NoRule
    );
    assert_eq!(
        rules.check_pending_write(&ctx("cv-1"), "count", blob(&bad)),
        Verdict::NoRule
    );
}

#[test]
fn null_write_is_json_null_and_empty_has_no_value() {
    let rules = load(&[("items.toml", ITEMS)]);
    // `None` written to the channel: type "null", empty blob.
    let v = invalid(rules.check_pending_write(
        &ctx("cv-1"),
        "items",
        ChannelPayload::Blob {
            type_tag: "null",
            blob: Some(b""),
        },
    ));
    assert_eq!(
        (v.schema_path.as_str(), v.instance_path.as_str()),
        ("/type", "")
    );
    assert!(v.describe(&ctx("cv-1")).contains("(the value)"));
    assert_eq!(
        rules.check_channel_value(
            &ctx("cv-1"),
            "items",
            ChannelPayload::Blob {
                type_tag: "empty",
                blob: None
            }
        ),
        Verdict::Valid
    );
}

#[test]
fn undecodable_payload_is_invalid_only_under_a_rule() {
    let rules = load(&[("items.toml", ITEMS)]);
    let pickle = ChannelPayload::Blob {
        type_tag: "pickle",
        blob: Some(b"\x80\x04\x95"),
    };
    let v = invalid(rules.check_pending_write(&ctx("cv-1"), "items", pickle));
    assert!(v.message.contains("could not be decoded"), "{}", v.message);
    assert_eq!(v.schema_path, "");
    assert!(v.describe(&ctx("cv-1")).contains("could not be decoded"));
    let garbage = msgpack("92c0");
    let v = invalid(rules.check_channel_value(&ctx("cv-1"), "items", blob(&garbage)));
    assert!(v.message.contains("malformed msgpack"), "{}", v.message);
    // No rule: passes without being decoded.
    assert_eq!(
        rules.check_pending_write(&ctx("x"), "items", pickle),
        Verdict::NoRule
    );
}

#[test]
fn selectors_pick_the_right_rules() {
    let rules = load(&[(
        "sel.toml",
        r#"
[[channel]]
name = "v"
thread_id = "a-.*"
schema = { type = "string" }

[[channel]]
name = "v"
checkpoint_ns = "sub:.*"
schema = { type = "integer" }

[[channel]]
name = "v"
metadata = { source = "loop", tags = { env = "prod" } }
schema = { type = "boolean" }
"#,
    )]);
    let s = json!("x");
    let i = json!(1);
    let b = json!(true);
    let prod = json!({"source": "loop", "step": 2, "tags": {"env": "prod"}});
    let dev = json!({"source": "loop", "tags": {"env": "dev"}});
    let at = |thread, ns, meta| WriteContext {
        thread_id: thread,
        checkpoint_ns: ns,
        checkpoint_id: "c",
        metadata: meta,
    };
    let check = |c: &WriteContext<'_>, v: &Value| {
        rules.check_channel_value(c, "v", ChannelPayload::Json(v))
    };
    // Thread pattern only.
    assert_eq!(check(&at("a-1", "", Some(&dev)), &s), Verdict::Valid);
    assert!(matches!(
        check(&at("a-1", "", Some(&dev)), &i),
        Verdict::Invalid(_)
    ));
    // Namespace only.
    assert_eq!(check(&at("z", "sub:9", Some(&dev)), &i), Verdict::Valid);
    // Metadata only.
    assert_eq!(check(&at("z", "", Some(&prod)), &b), Verdict::Valid);
    assert_eq!(check(&at("z", "", Some(&dev)), &b), Verdict::NoRule);
    // Several match: all must pass; the failing one is cited by line.
    let v = invalid(check(&at("a-1", "sub:9", Some(&dev)), &s));
    assert!(v.rule.ends_with("sel.toml:7"), "{}", v.rule);
    assert_eq!(v.schema_path, "/type");
    // Unknown metadata: the metadata rule applies too (fail closed).
    let v = invalid(check(&at("z", "", None), &s));
    assert!(v.rule.ends_with("sel.toml:12"), "{}", v.rule);
}

#[test]
fn write_schema_is_for_pending_writes() {
    let rules = load(&[(
        "w.toml",
        r#"
[[channel]]
name = "msgs"
schema = { type = "array", items = { type = "string" } }
write_schema = { type = "string" }

[[channel]]
name = "only_writes"
write_schema = { type = "string" }
"#,
    )]);
    let one = json!("hi");
    let list = json!(["hi"]);
    let c = ctx("t");
    let j = ChannelPayload::Json;
    assert_eq!(
        rules.check_pending_write(&c, "msgs", j(&one)),
        Verdict::Valid
    );
    assert!(matches!(
        rules.check_pending_write(&c, "msgs", j(&list)),
        Verdict::Invalid(_)
    ));
    assert_eq!(
        rules.check_channel_value(&c, "msgs", j(&list)),
        Verdict::Valid
    );
    assert!(matches!(
        rules.check_channel_value(&c, "msgs", j(&one)),
        Verdict::Invalid(_)
    ));
    // A rule with only a write schema does not check channel values.
    assert_eq!(
        rules.check_channel_value(&c, "only_writes", j(&list)),
        Verdict::NoRule
    );
    assert!(matches!(
        rules.check_pending_write(&c, "only_writes", j(&list)),
        Verdict::Invalid(_)
    ));
}

#[test]
fn schema_and_schema_file_must_both_pass() {
    let rules = load(&[
        (
            "b.toml",
            "[[channel]]\nname = \"n\"\nschema = { type = \"integer\" }\nschema_file = \"min.json\"\n",
        ),
        ("min.json", r#"{"minimum": 10}"#),
    ]);
    let c = ctx("t");
    assert_eq!(
        rules.check_channel_value(&c, "n", ChannelPayload::Json(&json!(11))),
        Verdict::Valid
    );
    let v = invalid(rules.check_channel_value(&c, "n", ChannelPayload::Json(&json!(3))));
    assert_eq!(v.schema_path, "/minimum");
    assert!(
        rules.describe().contains("min.json {\"minimum\":10}"),
        "{}",
        rules.describe()
    );
}

#[test]
fn check_checkpoint_validates_inline_values() {
    let rules = load(&[(
        "c.toml",
        r#"
[[channel]]
name = "count"
schema = { type = "integer" }

[[channel]]
name = "name"
schema = { type = "string" }
"#,
    )]);
    let ck = json!({
        "v": 4,
        "channel_values": {"count": "one", "name": "rg", "flag": true, "branch:to:gate": null},
        "channel_versions": {}
    });
    let violations = rules.check_checkpoint(&ctx("t"), &ck);
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].channel, "count");
    assert_eq!(violations[0].schema_path, "/type");
    let ok = json!({"channel_values": {"count": 2, "name": "rg"}});
    assert!(rules.check_checkpoint(&ctx("t"), &ok).is_empty());
    assert!(rules
        .check_checkpoint(&ctx("t"), &json!({"v": 4}))
        .is_empty());
}

#[test]
fn special_channels_only_when_named() {
    let rules = load(&[
        (
            "s.toml",
            r#"
[[state]]
file = "st.json"

[[channel]]
name = "__resume__"
schema = { type = "boolean" }
"#,
        ),
        (
            "st.json",
            r#"{"properties": {"__interrupt__": {"type": "string"}, "branch:to:x": false, "a": {}}}"#,
        ),
    ]);
    let list = msgpack("91c3"); // [True]
    assert_eq!(
        rules.check_pending_write(&ctx("t"), "__interrupt__", blob(&list)),
        Verdict::NoRule
    );
    assert_eq!(
        rules.check_pending_write(&ctx("t"), "branch:to:x", blob(&list)),
        Verdict::NoRule
    );
    assert!(matches!(
        rules.check_pending_write(&ctx("t"), "__resume__", blob(&list)),
        Verdict::Invalid(_)
    ));
    assert!(is_special_channel("__pregel_tasks"));
}

/// `Profile.model_json_schema()` from pydantic 2 (probe venv):
/// `class Address(BaseModel): city: str; zip: Optional[str] = None` and
/// `class Profile(BaseModel): items: Annotated[list[str], operator.add] = [];
/// owner: Optional[Address] = None; count: int = 0`.
const PROFILE_SCHEMA: &str = r##"{
  "$defs": {
    "Address": {
      "properties": {
        "city": {"title": "City", "type": "string"},
        "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Zip"}
      },
      "required": ["city"],
      "title": "Address",
      "type": "object"
    }
  },
  "properties": {
    "items": {"default": [], "items": {"type": "string"}, "title": "Items", "type": "array"},
    "owner": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": null},
    "count": {"default": 0, "title": "Count", "type": "integer"}
  },
  "title": "Profile",
  "type": "object"
}"##;

/// `Address(city="Oslo")` and `Address.model_construct(city=5)` (ext 5).
const ADDRESS_OK: &str = "c7360594a85f5f6d61696e5f5fa74164647265737382a463697479a44f736c6fa37a6970c0b36d6f64656c5f76616c69646174655f6a736f6e";
const ADDRESS_BAD: &str = "c7320594a85f5f6d61696e5f5fa74164647265737382a46369747905a37a6970c0b36d6f64656c5f76616c69646174655f6a736f6e";

#[test]
fn state_import_derives_rules_and_resolves_refs() {
    let rules = load(&[
        (
            "p.toml",
            "# pydantic state\n[[state]]\nfile = \"profile.schema.json\"\nthread_id = \"p-.*\"\nexclude = [\"count\"]\n",
        ),
        ("profile.schema.json", PROFILE_SCHEMA),
    ]);
    assert_eq!(rules.len(), 2, "{}", rules.describe());
    let c = ctx("p-1");
    // items: list[str]
    let v = invalid(rules.check_pending_write(&c, "items", blob(&msgpack(NONE_LIST))));
    assert_eq!(
        (v.schema_path.as_str(), v.instance_path.as_str()),
        ("/items/type", "/0")
    );
    assert!(v.rule.ends_with("p.toml:2"), "{}", v.rule);
    // owner: Optional[Address] through $ref into $defs.
    let ok = msgpack(ADDRESS_OK);
    assert_eq!(
        rules.check_channel_value(&c, "owner", blob(&ok)),
        Verdict::Valid
    );
    assert_eq!(
        rules.check_channel_value(&c, "owner", ChannelPayload::Json(&Value::Null)),
        Verdict::Valid
    );
    let bad = msgpack(ADDRESS_BAD);
    let v = invalid(rules.check_channel_value(&c, "owner", blob(&bad)));
    assert_eq!(v.schema_path, "/anyOf");
    assert_eq!(v.instance_path, "");
    // Excluded and unselected channels are unchecked.
    let s = json!("x");
    assert_eq!(
        rules.check_channel_value(&c, "count", ChannelPayload::Json(&s)),
        Verdict::NoRule
    );
    assert_eq!(
        rules.check_channel_value(&ctx("q"), "owner", blob(&bad)),
        Verdict::NoRule
    );
    let text = rules.describe();
    assert!(
        text.contains("channel \"owner\" (from profile.schema.json#/properties/owner)"),
        "{text}"
    );
}

#[test]
fn ref_errors_report_the_path_through_the_ref() {
    let rules = load(&[
        ("r.toml", "[[state]]\nfile = \"s.json\"\n"),
        (
            "s.json",
            r##"{"$defs": {"A": {"type": "object", "properties": {"city": {"type": "string"}}}},
                 "properties": {"owner": {"$ref": "#/$defs/A"}}}"##,
        ),
    ]);
    let v = invalid(rules.check_channel_value(&ctx("t"), "owner", blob(&msgpack(ADDRESS_BAD))));
    assert_eq!(v.schema_path, "/$ref/properties/city/type");
    assert_eq!(v.instance_path, "/city");
}

#[test]
fn describe_lists_each_rule() {
    let rules = load(&[("items.toml", ITEMS)]);
    let text = rules.describe();
    assert_eq!(text.lines().count(), 1);
    assert!(
        text.contains("channels/items.toml:2  channel \"items\"  [thread_id ~ /cv-.*/]"),
        "{text}"
    );
    assert!(
        text.contains(
            r#"value: {"items":{"type":"string"},"type":"array"}  write: (value schema)"#
        ),
        "{text}"
    );
}

#[test]
fn shipped_examples_load_and_select_cv_threads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let rules = ChannelRules::load(&dir).unwrap();
    assert!(!rules.is_empty());
    let bad = msgpack(NONE_LIST);
    assert!(matches!(
        rules.check_pending_write(&ctx("cv-none"), "items", blob(&bad)),
        Verdict::Invalid(_)
    ));
    assert!(matches!(
        rules.check_pending_write(&ctx("cvs-none"), "items", blob(&bad)),
        Verdict::Invalid(_)
    ));
    let prep = msgpack("91a470726570"); // ["prep"]
    assert_eq!(
        rules.check_pending_write(&ctx("cv-ok"), "items", blob(&prep)),
        Verdict::Valid
    );
    // The state import covers the graph's other channels too.
    let c = ctx("cvs-1");
    let j = |v: &Value| rules.check_checkpoint(&c, &json!({"channel_values": v}));
    assert!(j(&json!({"count": 1, "name": "rg", "approved": null})).is_empty());
    assert_eq!(j(&json!({"count": "1", "approved": 3})).len(), 2);
    // Every other thread is untouched.
    assert_eq!(
        rules.check_pending_write(&ctx("thread-1"), "items", blob(&bad)),
        Verdict::NoRule
    );
}

#[test]
fn rules_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChannelRules>();
}

#[test]
fn long_messages_are_bounded() {
    let rules = load(&[(
        "n.toml",
        "[[channel]]\nname = \"n\"\nschema = { type = \"integer\" }\n",
    )]);
    let big = json!(vec!["x"; 10_000]);
    let v = invalid(rules.check_channel_value(&ctx("t"), "n", ChannelPayload::Json(&big)));
    assert!(v.message.chars().count() <= 301, "{}", v.message.len());
    assert!(v.message.ends_with('…'));
}
