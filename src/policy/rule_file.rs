//! One `rules/channels/*.toml` file: its TOML shape and how each entry
//! becomes compiled [`Rule`]s. Every error carries the file and the line
//! of the offending key (from toml's spans).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use super::error::{line_of, RuleError};
use super::schema::{inline_schema, split_state, toml_to_json, Schema};
use super::selector::{Pattern, Selector};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    channel: Vec<Spanned<ChannelEntry>>,
    #[serde(default)]
    state: Vec<Spanned<StateEntry>>,
}

/// The selector keys, borrowed from either entry kind. (They are spelled
/// out in both entries rather than `#[serde(flatten)]`ed: flattening loses
/// toml's spans and `deny_unknown_fields`.)
struct Selectors<'a> {
    thread_id: &'a Option<Spanned<String>>,
    checkpoint_ns: &'a Option<Spanned<String>>,
    metadata: &'a Option<Spanned<toml::Table>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelEntry {
    name: Spanned<String>,
    thread_id: Option<Spanned<String>>,
    checkpoint_ns: Option<Spanned<String>>,
    metadata: Option<Spanned<toml::Table>>,
    schema: Option<Spanned<toml::Value>>,
    schema_file: Option<Spanned<String>>,
    write_schema: Option<Spanned<toml::Value>>,
    write_schema_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateEntry {
    file: Spanned<String>,
    #[serde(default)]
    exclude: Vec<String>,
    thread_id: Option<Spanned<String>>,
    checkpoint_ns: Option<Spanned<String>>,
    metadata: Option<Spanned<toml::Table>>,
}

impl ChannelEntry {
    fn selectors(&self) -> Selectors<'_> {
        Selectors {
            thread_id: &self.thread_id,
            checkpoint_ns: &self.checkpoint_ns,
            metadata: &self.metadata,
        }
    }
}

impl StateEntry {
    fn selectors(&self) -> Selectors<'_> {
        Selectors {
            thread_id: &self.thread_id,
            checkpoint_ns: &self.checkpoint_ns,
            metadata: &self.metadata,
        }
    }
}

/// One compiled channel rule.
#[derive(Debug)]
pub struct Rule {
    pub channel: String,
    /// `file:line` of the entry, as violations cite it.
    pub origin: String,
    /// For rules derived from a `[[state]]` import: `file#/properties/name`.
    pub derived_from: Option<String>,
    pub selector: Selector,
    /// Checked against checkpoint channel values.
    pub value_schemas: Vec<Schema>,
    /// Checked against pending writes instead of `value_schemas` when set.
    pub write_schemas: Vec<Schema>,
}

/// Reads and compiles one rule file.
pub fn load_file(path: &Path) -> Result<Vec<Rule>, RuleError> {
    let src = std::fs::read_to_string(path)
        .map_err(|e| RuleError::file(path, format!("cannot read rule file: {e}")))?;
    let file: RuleFile = toml::from_str(&src)
        .map_err(|e| RuleError::at(path, &src, e.span(), e.message().trim_end().to_owned()))?;
    let cx = FileCx { path, src: &src };
    let mut rules = Vec::new();
    for entry in &file.channel {
        rules.push(cx.channel(entry)?);
    }
    for entry in &file.state {
        rules.extend(cx.state(entry)?);
    }
    Ok(rules)
}

struct FileCx<'a> {
    path: &'a Path,
    src: &'a str,
}

impl FileCx<'_> {
    fn err<T>(&self, span: std::ops::Range<usize>, msg: impl Into<String>) -> Result<T, RuleError> {
        Err(RuleError::at(self.path, self.src, Some(span), msg))
    }

    fn origin<T>(&self, entry: &Spanned<T>) -> String {
        format!(
            "{}:{}",
            self.path.display(),
            line_of(self.src, entry.span().start)
        )
    }

    /// A path written in the rule, relative to the rule file's directory.
    fn resolve(&self, rel: &str) -> PathBuf {
        self.path
            .parent()
            .unwrap_or_else(|| Path::new(""))
            .join(rel)
    }

    fn read_json(&self, key: &str, rel: &Spanned<String>) -> Result<Value, RuleError> {
        let resolved = self.resolve(rel.get_ref());
        let text = std::fs::read_to_string(&resolved).or_else(|e| {
            self.err(
                rel.span(),
                format!(
                    "cannot read {key} `{}` ({}): {e}",
                    rel.get_ref(),
                    resolved.display()
                ),
            )
        })?;
        serde_json::from_str(&text).or_else(|e| {
            self.err(
                rel.span(),
                format!("{key} `{}` is not valid JSON: {e}", rel.get_ref()),
            )
        })
    }

    fn compile(
        &self,
        span: std::ops::Range<usize>,
        schema: &Value,
        source: String,
    ) -> Result<Schema, RuleError> {
        Schema::compile(schema, source.clone()).or_else(|e| {
            let what = if source == "inline" {
                String::new()
            } else {
                format!("{source}: ")
            };
            self.err(span, format!("{what}{e}"))
        })
    }

    fn inline(&self, v: &Spanned<toml::Value>) -> Result<Schema, RuleError> {
        let json = inline_schema(v.get_ref()).or_else(|e| self.err(v.span(), e.to_string()))?;
        self.compile(v.span(), &json, "inline".into())
    }

    fn file_schema(&self, key: &str, rel: &Spanned<String>) -> Result<Schema, RuleError> {
        let json = self.read_json(key, rel)?;
        self.compile(rel.span(), &json, rel.get_ref().clone())
    }

    fn selector(&self, s: &Selectors<'_>) -> Result<Selector, RuleError> {
        let pattern = |p: &Option<Spanned<String>>| {
            p.as_ref()
                .map(|p| Pattern::new(p.get_ref()).or_else(|e| self.err(p.span(), e.to_string())))
                .transpose()
        };
        let metadata = match s.metadata {
            Some(m) => Some(
                toml_to_json(&toml::Value::Table(m.get_ref().clone()))
                    .or_else(|e| self.err(m.span(), format!("metadata: {e}")))?,
            ),
            None => None,
        };
        Ok(Selector {
            thread_id: pattern(s.thread_id)?,
            checkpoint_ns: pattern(s.checkpoint_ns)?,
            metadata,
        })
    }

    fn channel(&self, entry: &Spanned<ChannelEntry>) -> Result<Rule, RuleError> {
        let e = entry.get_ref();
        let name = e.name.get_ref();
        if name.is_empty() {
            return self.err(e.name.span(), "channel name is empty");
        }
        let mut value_schemas = Vec::new();
        if let Some(s) = &e.schema {
            value_schemas.push(self.inline(s)?);
        }
        if let Some(f) = &e.schema_file {
            value_schemas.push(self.file_schema("schema_file", f)?);
        }
        let mut write_schemas = Vec::new();
        if let Some(s) = &e.write_schema {
            write_schemas.push(self.inline(s)?);
        }
        if let Some(f) = &e.write_schema_file {
            write_schemas.push(self.file_schema("write_schema_file", f)?);
        }
        if value_schemas.is_empty() && write_schemas.is_empty() {
            return self.err(
                entry.span(),
                format!(
                    "channel `{name}` has no schema (set schema, schema_file, write_schema or write_schema_file)"
                ),
            );
        }
        Ok(Rule {
            channel: name.clone(),
            origin: self.origin(entry),
            derived_from: None,
            selector: self.selector(&e.selectors())?,
            value_schemas,
            write_schemas,
        })
    }

    /// One rule per top-level property of an exported state schema.
    fn state(&self, entry: &Spanned<StateEntry>) -> Result<Vec<Rule>, RuleError> {
        let e = entry.get_ref();
        let root = self.read_json("file", &e.file)?;
        let parts = split_state(&root)
            .or_else(|msg| self.err(e.file.span(), format!("`{}`: {msg}", e.file.get_ref())))?;
        let selector = self.selector(&e.selectors())?;
        let mut rules = Vec::with_capacity(parts.len());
        for (name, schema) in parts {
            if e.exclude.contains(&name) {
                continue;
            }
            let pointer = format!("{}#/properties/{}", e.file.get_ref(), pointer_escape(&name));
            let compiled = self.compile(e.file.span(), &schema, pointer.clone())?;
            rules.push(Rule {
                channel: name,
                origin: self.origin(entry),
                derived_from: Some(pointer),
                selector: selector.clone(),
                value_schemas: vec![compiled],
                write_schemas: Vec::new(),
            });
        }
        Ok(rules)
    }
}

/// JSON Pointer escaping of one reference token.
fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}
