//! The loaded channel rules: every rule file under `rules/channels/`,
//! compiled once and indexed by channel name so a write to a channel with
//! no rule costs one hash lookup.

use std::collections::HashMap;
use std::path::Path;

use super::error::RuleError;
use super::rule_file::{load_file, Rule};
use super::schema::undecodable_checkpoint_message;
use super::violation::Violation;
use super::write_context::WriteContext;

/// All channel-schema rules, immutable after [`ChannelRules::load`];
/// share it behind an `Arc`.
#[derive(Debug, Default)]
pub struct ChannelRules {
    pub(crate) rules: Vec<Rule>,
    /// Channel name → indexes into `rules`, in file order.
    pub(crate) by_channel: HashMap<String, Vec<usize>>,
}

impl ChannelRules {
    /// Loads `dir/channels/*.toml` (in name order). `dir` is the rules
    /// directory whose top-level `*.toml` are saver profiles; a missing
    /// `channels` directory means no channel rules.
    pub fn load(dir: &Path) -> Result<ChannelRules, RuleError> {
        let channels = dir.join("channels");
        if !channels.exists() {
            return Ok(ChannelRules::default());
        }
        let listing = std::fs::read_dir(&channels)
            .map_err(|e| RuleError::file(&channels, format!("cannot list rule directory: {e}")))?;
        let mut files = Vec::new();
        for entry in listing {
            let path = entry
                .map_err(|e| {
                    RuleError::file(&channels, format!("cannot list rule directory: {e}"))
                })?
                .path();
            if path.extension().is_some_and(|x| x == "toml") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut rules = Vec::new();
        for file in &files {
            rules.extend(load_file(file)?);
        }
        Ok(ChannelRules::from_rules(rules))
    }

    pub(crate) fn from_rules(rules: Vec<Rule>) -> ChannelRules {
        let mut by_channel: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            by_channel.entry(rule.channel.clone()).or_default().push(i);
        }
        ChannelRules { rules, by_channel }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Number of rules (state imports count one per derived channel).
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The violation for a checkpoint whose JSON cannot be read: its
    /// `channel_values` may hold any channel, so the first rule with a
    /// channel schema that selects this write refuses it. `None` when no
    /// rule selects it.
    pub fn undecodable_checkpoint(&self, ctx: &WriteContext<'_>, why: &str) -> Option<Violation> {
        let rule = self
            .rules
            .iter()
            .find(|r| !r.value_schemas.is_empty() && r.selector.matches(ctx))?;
        Some(Violation {
            channel: rule.channel.clone(),
            rule: rule.origin.clone(),
            schema_path: String::new(),
            instance_path: String::new(),
            message: undecodable_checkpoint_message(why),
        })
    }

    /// One line per rule for `resumeguard rules check`:
    /// `file:line  channel "items"  [selectors]  value: …  write: …`.
    pub fn describe(&self) -> String {
        if self.rules.is_empty() {
            return "no channel rules\n".into();
        }
        let mut out = String::new();
        for rule in &self.rules {
            let derived = rule
                .derived_from
                .as_ref()
                .map(|d| format!(" (from {d})"))
                .unwrap_or_default();
            let schemas = |list: &[super::schema::Schema]| {
                list.iter()
                    .map(|s| match s.source.as_str() {
                        "inline" => s.summary.clone(),
                        _ if rule.derived_from.is_some() => s.summary.clone(),
                        src => format!("{src} {}", s.summary),
                    })
                    .collect::<Vec<_>>()
                    .join(" and ")
            };
            let value = if rule.value_schemas.is_empty() {
                "(not checked)".to_owned()
            } else {
                schemas(&rule.value_schemas)
            };
            let write = if rule.write_schemas.is_empty() {
                "(value schema)".to_owned()
            } else {
                schemas(&rule.write_schemas)
            };
            out.push_str(&format!(
                "{}  channel \"{}\"{}  [{}]  value: {}  write: {}\n",
                rule.origin,
                rule.channel,
                derived,
                rule.selector.describe(),
                value,
                write
            ));
        }
        out
    }
}
