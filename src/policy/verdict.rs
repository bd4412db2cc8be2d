//! The validity verdict for one channel payload of a checkpoint write.
//!
//! Pure and cheap on the common path: a channel nobody wrote a rule for is
//! one hash lookup and no allocation; a payload is decoded only once a rule
//! actually selects it, and at most once however many rules apply.

use serde_json::Value;

use super::rules::ChannelRules;
use super::schema::{undecodable_message, Schema};
use super::violation::Violation;
use super::write_context::WriteContext;
use crate::saver::typed_blob::blob_to_json;

/// A channel value as the saver stores it.
#[derive(Debug, Clone, Copy)]
pub enum ChannelPayload<'a> {
    /// Inline in the checkpoint's `channel_values` (primitives).
    Json(&'a Value),
    /// A `checkpoint_blobs` / `checkpoint_writes` `(type, blob)` pair.
    Blob {
        type_tag: &'a str,
        blob: Option<&'a [u8]>,
    },
}

/// The outcome for one payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// At least one rule applied and every applicable schema passed.
    Valid,
    /// No rule selects this channel for this write.
    NoRule,
    Invalid(Violation),
}

/// Longest validator message kept: the message quotes the failing value,
/// which may be a whole channel.
const MESSAGE_MAX: usize = 300;

fn bounded(message: String) -> String {
    match message.char_indices().nth(MESSAGE_MAX) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message,
    }
}

/// Which schema list of a rule a payload is held to.
#[derive(Clone, Copy)]
enum Kind {
    ChannelValue,
    PendingWrite,
}

impl ChannelRules {
    /// Checks a checkpoint channel value (inline or a `checkpoint_blobs` row).
    pub fn check_channel_value(
        &self,
        ctx: &WriteContext<'_>,
        channel: &str,
        value: ChannelPayload<'_>,
    ) -> Verdict {
        self.check(ctx, channel, value, Kind::ChannelValue)
    }

    /// Checks a pending write (`checkpoint_writes`): a rule's
    /// `write_schema` when it has one, else its channel schema.
    pub fn check_pending_write(
        &self,
        ctx: &WriteContext<'_>,
        channel: &str,
        payload: ChannelPayload<'_>,
    ) -> Verdict {
        self.check(ctx, channel, payload, Kind::PendingWrite)
    }

    /// Checks every inline `channel_values` entry of a checkpoint's JSON
    /// (blob-held channels arrive as separate `checkpoint_blobs` rows).
    pub fn check_checkpoint(
        &self,
        ctx: &WriteContext<'_>,
        checkpoint_json: &Value,
    ) -> Vec<Violation> {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        let Some(values) = checkpoint_json
            .get("channel_values")
            .and_then(Value::as_object)
        else {
            return out;
        };
        for (channel, value) in values {
            if let Verdict::Invalid(v) =
                self.check_channel_value(ctx, channel, ChannelPayload::Json(value))
            {
                out.push(v);
            }
        }
        out
    }

    fn check(
        &self,
        ctx: &WriteContext<'_>,
        channel: &str,
        payload: ChannelPayload<'_>,
        kind: Kind,
    ) -> Verdict {
        let Some(indexes) = self.by_channel.get(channel) else {
            return Verdict::NoRule;
        };
        let mut applied = false;
        // Decoded once, on the first rule that applies.
        let mut decoded: Option<Option<Value>> = None;
        for &i in indexes {
            let Some(rule) = self.rules.get(i) else {
                continue;
            };
            let schemas: &[Schema] = match kind {
                Kind::ChannelValue => &rule.value_schemas,
                Kind::PendingWrite if rule.write_schemas.is_empty() => &rule.value_schemas,
                Kind::PendingWrite => &rule.write_schemas,
            };
            if schemas.is_empty() || !rule.selector.matches(ctx) {
                continue;
            }
            applied = true;
            let value = match payload {
                ChannelPayload::Json(v) => Some(v),
                ChannelPayload::Blob { type_tag, blob } => {
                    if decoded.is_none() {
                        match blob_to_json(type_tag, blob) {
                            Ok(v) => decoded = Some(v),
                            Err(e) => {
                                return Verdict::Invalid(Violation {
                                    channel: channel.to_owned(),
                                    rule: rule.origin.clone(),
                                    schema_path: String::new(),
                                    instance_path: String::new(),
                                    message: undecodable_message(type_tag, &e),
                                })
                            }
                        }
                    }
                    decoded.as_ref().and_then(Option::as_ref)
                }
            };
            // `empty`: the row holds no value, so there is nothing to check.
            let Some(value) = value else {
                continue;
            };
            for schema in schemas {
                if let Err(e) = schema.validator.validate(value) {
                    return Verdict::Invalid(Violation {
                        channel: channel.to_owned(),
                        rule: rule.origin.clone(),
                        schema_path: e.evaluation_path().as_str().to_owned(),
                        instance_path: e.instance_path().as_str().to_owned(),
                        message: bounded(e.to_string()),
                    });
                }
            }
        }
        if applied {
            Verdict::Valid
        } else {
            Verdict::NoRule
        }
    }
}
