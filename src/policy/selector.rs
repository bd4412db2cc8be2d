//! Which writes a rule applies to: thread and namespace patterns, and a
//! metadata subset. A rule without selectors applies to every thread.

use regex::Regex;
use serde_json::Value;

use super::write_context::WriteContext;

/// A selector pattern that is no regex: the pattern as written, and the
/// last line of regex's error (`unclosed group`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad regex `{pattern}`: {reason}")]
pub struct PatternError {
    pub pattern: String,
    pub reason: String,
}

/// A whole-string regex (`cv-.*` matches `cv-1`, not `xcv-1`): anchoring
/// implicitly keeps a short pattern from silently selecting more threads.
#[derive(Debug, Clone)]
pub struct Pattern {
    source: String,
    re: Regex,
}

impl Pattern {
    pub fn new(source: &str) -> Result<Pattern, PatternError> {
        // Compile the user's text first so the error quotes what they wrote.
        Regex::new(source).map_err(|e| regex_error(source, &e))?;
        let re = Regex::new(&format!("^(?:{source})$")).map_err(|e| regex_error(source, &e))?;
        Ok(Pattern {
            source: source.to_owned(),
            re,
        })
    }

    pub fn is_match(&self, s: &str) -> bool {
        self.re.is_match(s)
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// regex's parse errors draw a caret diagram over several lines; a rule
/// error is one line, so keep its last line (`error: unclosed group`).
fn regex_error(source: &str, e: &regex::Error) -> PatternError {
    let text = e.to_string();
    let last = text.lines().last().unwrap_or_default().trim();
    let last = last.strip_prefix("error: ").unwrap_or(last);
    PatternError {
        pattern: source.to_owned(),
        reason: last.to_owned(),
    }
}

/// The optional selectors of one rule.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    pub thread_id: Option<Pattern>,
    pub checkpoint_ns: Option<Pattern>,
    /// Must be contained in the checkpoint's metadata (see [`contains`]).
    pub metadata: Option<Value>,
}

impl Selector {
    /// Whether the rule applies to this write. Metadata that the caller does
    /// not know (`None`, e.g. a pending write whose checkpoint was not seen)
    /// matches: the gate fails closed rather than let a write escape.
    pub fn matches(&self, ctx: &WriteContext<'_>) -> bool {
        self.thread_id
            .as_ref()
            .is_none_or(|p| p.is_match(ctx.thread_id))
            && self
                .checkpoint_ns
                .as_ref()
                .is_none_or(|p| p.is_match(ctx.checkpoint_ns))
            && match (&self.metadata, ctx.metadata) {
                (Some(want), Some(have)) => contains(have, want),
                _ => true,
            }
    }

    /// `thread_id ~ cv-.*, metadata ⊇ {...}`, or `every thread`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.thread_id {
            parts.push(format!("thread_id ~ /{}/", p.as_str()));
        }
        if let Some(p) = &self.checkpoint_ns {
            parts.push(format!("checkpoint_ns ~ /{}/", p.as_str()));
        }
        if let Some(m) = &self.metadata {
            parts.push(format!("metadata ⊇ {m}"));
        }
        if parts.is_empty() {
            "every thread".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Containment like jsonb `@>` for objects: every key of `want` is in `have`
/// with a contained value; other values must be equal (numbers by value, so
/// TOML `1` matches JSON `1.0`).
pub fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        (Value::Number(h), Value::Number(w)) => h == w || h.as_f64() == w.as_f64(),
        _ => have == want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx<'a>(thread: &'a str, ns: &'a str, meta: Option<&'a Value>) -> WriteContext<'a> {
        WriteContext {
            thread_id: thread,
            checkpoint_ns: ns,
            checkpoint_id: "c",
            metadata: meta,
        }
    }

    #[test]
    fn patterns_match_the_whole_string() {
        let p = Pattern::new("cv-.*").unwrap();
        assert!(p.is_match("cv-1"));
        assert!(!p.is_match("xcv-1"));
        // Alternation is anchored as a group.
        let p = Pattern::new("a|b").unwrap();
        assert!(p.is_match("a") && !p.is_match("ab"));
        assert_eq!(
            Pattern::new("(").unwrap_err().to_string(),
            "bad regex `(`: unclosed group"
        );
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(Selector::default().matches(&ctx("t", "", None)));
    }

    #[test]
    fn ns_pattern_selects_root_or_subgraphs() {
        let root = Selector {
            checkpoint_ns: Some(Pattern::new("").unwrap()),
            ..Selector::default()
        };
        assert!(root.matches(&ctx("t", "", None)));
        assert!(!root.matches(&ctx("t", "sub:1", None)));
        let sub = Selector {
            checkpoint_ns: Some(Pattern::new("sub:.*").unwrap()),
            ..Selector::default()
        };
        assert!(sub.matches(&ctx("t", "sub:abc", None)));
        assert!(!sub.matches(&ctx("t", "", None)));
    }

    #[test]
    fn metadata_subset() {
        let sel = Selector {
            metadata: Some(json!({"source": "loop", "tags": {"env": "prod"}, "step": 1})),
            ..Selector::default()
        };
        let yes =
            json!({"source": "loop", "step": 1.0, "tags": {"env": "prod", "x": 1}, "other": 2});
        let no = json!({"source": "input", "step": 1, "tags": {"env": "prod"}});
        let missing = json!({"source": "loop", "step": 1});
        assert!(sel.matches(&ctx("t", "", Some(&yes))));
        assert!(!sel.matches(&ctx("t", "", Some(&no))));
        assert!(!sel.matches(&ctx("t", "", Some(&missing))));
        // Unknown metadata fails closed: the rule applies.
        assert!(sel.matches(&ctx("t", "", None)));
    }

    #[test]
    fn describes_selectors() {
        let sel = Selector {
            thread_id: Some(Pattern::new("cv-.*").unwrap()),
            metadata: Some(json!({"a": 1})),
            ..Selector::default()
        };
        assert_eq!(sel.describe(), r#"thread_id ~ /cv-.*/, metadata ⊇ {"a":1}"#);
        assert_eq!(Selector::default().describe(), "every thread");
    }
}
