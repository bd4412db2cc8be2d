//! Why a checkpoint write breaks a channel rule, and the text the client
//! and the audit log get for it.

use super::write_context::WriteContext;

/// Why a payload was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub channel: String,
    /// `file:line` of the rule entry.
    pub rule: String,
    /// JSON Pointer of the failing keyword in the rule's schema, through
    /// `$ref`s as evaluated (e.g. `/items/type`); empty when undecodable.
    pub schema_path: String,
    /// JSON Pointer into the value (e.g. `/0`); empty for the whole value.
    pub instance_path: String,
    pub message: String,
}

impl Violation {
    /// The text for the client's ErrorResponse and the audit log, with the
    /// validator's message (which quotes the failing value).
    pub fn describe(&self, ctx: &WriteContext<'_>) -> String {
        self.describe_as(ctx, true)
    }

    /// As [`Violation::describe`]; without `show_value`, the validator's
    /// message (which quotes the value) is replaced by the keyword that
    /// failed. The rule is named by its file and line, never its path.
    pub fn describe_as(&self, ctx: &WriteContext<'_>, show_value: bool) -> String {
        let at = if self.schema_path.is_empty() {
            String::new()
        } else {
            let value_at = if self.instance_path.is_empty() {
                "the value".to_owned()
            } else {
                format!("value at {}", self.instance_path)
            };
            format!(" at schema path {} ({value_at})", self.schema_path)
        };
        let reason = match self.schema_path.rsplit('/').next() {
            Some(keyword) if !show_value && !keyword.is_empty() => {
                format!("fails its \"{keyword}\" keyword (the value is not shown)")
            }
            _ => self.message.clone(),
        };
        format!(
            "channel \"{}\" of thread \"{}\" (checkpoint_ns \"{}\", checkpoint {}) violates rule {}{}: {}",
            self.channel,
            ctx.thread_id,
            ctx.checkpoint_ns,
            ctx.checkpoint_id,
            self.rule_name(),
            at,
            reason
        )
    }

    /// The rule's file name and line, without the directories above it.
    pub fn rule_name(&self) -> &str {
        self.rule.rsplit('/').next().unwrap_or(&self.rule)
    }
}
