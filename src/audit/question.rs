//! An interrupt's question in the trail: the value the node passed to
//! `interrupt()`, recorded as `detail.question` only where `[audit]
//! log_values` allows values, and cut to [`MAX_QUESTION_CHARS`]; without
//! it the trail keeps only the write's digest.

use serde_json::{json, Value};

use crate::audit_event::AuditEvent;

/// The longest question kept, in characters of its JSON text.
pub const MAX_QUESTION_CHARS: usize = 2000;

/// Records the question of `written` (the `__interrupt__` write decoded:
/// LangGraph writes a list of interrupts, each with its `value`).
pub fn stamp(ev: &mut AuditEvent, written: Option<Value>) {
    let Some(written) = written else {
        return;
    };
    let value_of = |i: &Value| i.get("value").cloned().unwrap_or_else(|| i.clone());
    let question = match &written {
        Value::Array(items) if items.len() == 1 => value_of(&items[0]),
        Value::Array(items) => Value::Array(items.iter().map(value_of).collect()),
        one => value_of(one),
    };
    let text = question.to_string();
    let question = if text.chars().count() > MAX_QUESTION_CHARS {
        let cut: String = text.chars().take(MAX_QUESTION_CHARS).collect();
        Value::String(format!("{cut}…"))
    } else {
        question
    };
    if !ev.detail.is_object() {
        ev.detail = json!({});
    }
    ev.detail["question"] = question;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_event::{Operation, SessionContext};

    #[test]
    fn the_question_is_each_interrupts_value_cut_to_the_limit() {
        let mut ev = AuditEvent::new(&SessionContext::default(), Operation::InterruptParked);
        ev.detail = json!({"run_level": false});
        stamp(
            &mut ev,
            Some(json!([{"value": {"question": "approve?"}, "id": "i1"}])),
        );
        assert_eq!(ev.detail["question"], json!({"question": "approve?"}));
        assert_eq!(ev.detail["run_level"], json!(false));
        stamp(&mut ev, Some(json!("x".repeat(MAX_QUESTION_CHARS + 10))));
        let kept = ev.detail["question"].as_str().unwrap();
        assert!(kept.ends_with('…') && kept.chars().count() == MAX_QUESTION_CHARS + 1);
    }
}
