//! Who answered an interrupt, as the application said it: the identity keys
//! of the run's checkpoint metadata, attributed to the answer.
//!
//! LangGraph copies a run's `config["metadata"]` and the scalar entries of
//! `config["configurable"]` (such as a `user_id`) into the metadata of every
//! checkpoint the run saves. A checkpoint put therefore records the values of
//! the keys `[audit] approver_keys` names (only those) as `detail.approver`.
//! The answer itself is a pending write (`__resume__`) that carries no
//! metadata; the checkpoint of the resumed run comes after it, as the answered
//! checkpoint's child, possibly from another pooled connection or after the
//! claim was consumed. So the answer's approver is read off that child when
//! the trail is read ([`attribute`]): the first checkpoint put of the same
//! thread and namespace whose parent is the answered checkpoint, written
//! after the answer. A run that never saved its next checkpoint has no
//! approver on record.
//!
//! An application can also name the approver in the answer itself, for any
//! saver (LangGraph.js copies no configuration into checkpoint metadata):
//! `[audit] approver_pointers` are JSON pointers into the resume value, read
//! off the `__resume__` write ([`stamp_answer`]) and recorded as
//! `detail.approver` under the key `resume<pointer>`.

use serde_json::{json, Map, Value};

use crate::audit_event::{AuditEvent, Operation};

/// The metadata keys recorded when `[audit] approver_keys` is not set: the
/// names applications commonly pass a person's identity under.
pub fn default_keys() -> Vec<String> {
    ["user_id", "user", "approver", "email"]
        .into_iter()
        .map(String::from)
        .collect()
}

/// Moves the event's run metadata, if any, into `detail.approver`: the
/// entries whose key is one of `keys`, and nothing else of it.
pub fn stamp(ev: &mut AuditEvent, keys: &[String]) {
    let Some(metadata) = ev.run_metadata.take() else {
        return;
    };
    let found = found(&metadata, keys);
    if found.is_empty() {
        return;
    }
    if !ev.detail.is_object() {
        ev.detail = json!({});
    }
    ev.detail["approver"] = Value::Object(found);
}

/// The entries of a checkpoint's `metadata` whose key is one of `keys`.
fn found(metadata: &Value, keys: &[String]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|k| {
            metadata
                .get(k)
                .filter(|v| !v.is_null())
                .map(|v| (k.clone(), v.clone()))
        })
        .collect()
}

/// The approver a checkpoint's `metadata` (its JSON text) names under
/// `keys`, as [`describe`] shows it (`user_id=alice`).
pub fn named_in(metadata_json: &str, keys: &[String]) -> Option<String> {
    let metadata: Value = serde_json::from_str(metadata_json).ok()?;
    describe(&json!({ "approver": found(&metadata, keys) }))
}

/// Records in `detail.approver` the first of `pointers` that names a
/// value in the event's resume value: the answer itself (the bare form's
/// run-level write) or, in a task's list of the answers it consumed, the
/// first answer that has it. The value is taken off the event either way.
pub fn stamp_answer(ev: &mut AuditEvent, pointers: &[String]) {
    let Some(value) = ev.answer.take() else {
        return;
    };
    let answers: Vec<&Value> = match &value {
        Value::Array(consumed) if ev.detail.get("run_level") == Some(&json!(false)) => {
            consumed.iter().collect()
        }
        one => vec![one],
    };
    let found = pointers.iter().find_map(|p| {
        answers
            .iter()
            .find_map(|a| a.pointer(p).filter(|v| !v.is_null()))
            .map(|v| (format!("resume{p}"), v.clone()))
    });
    let Some((key, v)) = found else {
        return;
    };
    if !ev.detail.is_object() {
        ev.detail = json!({});
    }
    ev.detail["approver"] = json!({ key: v });
}

/// Gives each `resume_recorded` and `claim_consumed` event without an
/// approver the one of the checkpoint its resumed run saved next (see the
/// module doc), and says which checkpoint that was (`approver_from`).
/// `events` are one thread's, in the order written.
pub fn attribute(events: &mut [AuditEvent]) {
    for i in 0..events.len() {
        let op = events[i].operation;
        if !matches!(op, Operation::ResumeRecorded | Operation::ClaimConsumed)
            || events[i].detail.get("approver").is_some()
        {
            continue;
        }
        // A task's own record of an answer belongs to the run-level answer
        // recorded just before it (the same resume), and a consumed claim to
        // the answer recorded just before it: each names the same approver,
        // however the writes and the child checkpoint interleave.
        let same_answer = match op {
            Operation::ResumeRecorded
                if events[i].detail.get("run_level") == Some(&json!(false)) =>
            {
                run_level_answer_before(events, i)
            }
            Operation::ClaimConsumed => answer_before(events, i),
            _ => None,
        }
        .filter(|&a| events[a].detail.get("approver").is_some());
        let found = match same_answer {
            Some(a) => Some((
                events[a].detail["approver"].clone(),
                events[a].detail["approver_from"].clone(),
            )),
            None => {
                let start = match op {
                    Operation::ResumeRecorded => i + 1,
                    // Consumption is recorded when the child is already
                    // saved: look from the answer it consumed.
                    _ => answer_before(events, i).map_or(0, |a| a + 1),
                };
                child_put(events, start, &events[i]).map(|child| {
                    (
                        events[child].detail["approver"].clone(),
                        json!(events[child].checkpoint_id),
                    )
                })
            }
        };
        if let Some((approver, from)) = found {
            let ev = &mut events[i];
            if !ev.detail.is_object() {
                ev.detail = json!({});
            }
            ev.detail["approver"] = approver;
            ev.detail["approver_from"] = from;
        }
    }
}

/// The latest run-level answer on the same checkpoint before `i`, when no
/// other answer of that checkpoint lies between.
fn run_level_answer_before(events: &[AuditEvent], i: usize) -> Option<usize> {
    let a = answer_before(events, i)?;
    (events[a].detail.get("run_level") == Some(&json!(true))).then_some(a)
}

/// The latest answer recorded on the same checkpoint before `i`.
fn answer_before(events: &[AuditEvent], i: usize) -> Option<usize> {
    let target = &events[i];
    (0..i).rev().find(|&j| {
        let e = &events[j];
        e.operation == Operation::ResumeRecorded
            && e.thread_id == target.thread_id
            && same_ns(e, target)
            && e.checkpoint_id == target.checkpoint_id
    })
}

/// The first checkpoint put from `start` on whose parent is the checkpoint
/// `of` is about, and which names an approver.
fn child_put(events: &[AuditEvent], start: usize, of: &AuditEvent) -> Option<usize> {
    let parent = of.checkpoint_id.as_ref()?;
    (start..events.len()).find(|&j| {
        let e = &events[j];
        e.operation == Operation::CheckpointPut
            && e.thread_id == of.thread_id
            && same_ns(e, of)
            && e.parent_checkpoint_id.as_ref() == Some(parent)
            && e.detail.get("approver").is_some()
    })
}

fn same_ns(a: &AuditEvent, b: &AuditEvent) -> bool {
    a.checkpoint_ns.as_deref().unwrap_or("") == b.checkpoint_ns.as_deref().unwrap_or("")
}

/// `user_id=alice` (several keys separated by spaces) for the timeline.
pub fn describe(detail: &Value) -> Option<String> {
    let found = detail.get("approver")?.as_object()?;
    let parts: Vec<String> = found
        .iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => format!("{k}={s}"),
            None => format!("{k}={v}"),
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_event::SessionContext;

    fn ev(op: Operation, ckpt: &str, parent: Option<&str>) -> AuditEvent {
        let mut e = AuditEvent::new(&SessionContext::default(), op)
            .with_thread("t")
            .with_checkpoint("", ckpt);
        e.parent_checkpoint_id = parent.map(String::from);
        e
    }

    fn put(ckpt: &str, parent: &str, metadata: Value) -> AuditEvent {
        let mut e = ev(Operation::CheckpointPut, ckpt, Some(parent));
        e.detail = json!({"statement": "checkpoint_upsert"});
        e.run_metadata = Some(metadata);
        stamp(&mut e, &default_keys());
        e
    }

    /// The record of an answer on c1, at run level or the task's own.
    fn answer_record(run_level: bool) -> AuditEvent {
        let mut e = ev(Operation::ResumeRecorded, "c1", None);
        e.detail = json!({ "run_level": run_level });
        e
    }

    fn answer(run_level: bool, value: Value) -> AuditEvent {
        let mut e = answer_record(run_level);
        e.answer = Some(value);
        e
    }

    #[test]
    fn a_pointer_into_the_answer_names_its_approver() {
        let pointers = ["/who".to_string(), "/by".to_string()];
        // The bare form's run-level write carries the answer itself.
        let mut bare = answer(true, json!({"approved": true, "by": "alice"}));
        stamp_answer(&mut bare, &pointers);
        assert_eq!(bare.detail["approver"], json!({"resume/by": "alice"}));
        assert!(bare.answer.is_none());
        // A task's write carries the list of the answers it consumed.
        let mut task = answer(false, json!([{"by": null}, {"who": {"sub": 7}}]));
        stamp_answer(&mut task, &pointers);
        assert_eq!(task.detail["approver"], json!({"resume/who": {"sub": 7}}));
        // An answer that is itself a list, in a run-level write.
        let mut list = answer(true, json!([{"by": "bob"}]));
        stamp_answer(&mut list, &["/0/by".to_string()]);
        assert_eq!(list.detail["approver"], json!({"resume/0/by": "bob"}));
        // Nothing named, or no pointers configured: no approver, and the
        // value is dropped either way.
        for (value, pointers) in [
            (json!(true), pointers.to_vec()),
            (json!({"by": "carol"}), Vec::new()),
        ] {
            let mut e = answer(true, value);
            stamp_answer(&mut e, &pointers);
            assert!(e.detail.get("approver").is_none(), "{:?}", e.detail);
            assert!(e.answer.is_none());
        }
    }

    #[test]
    fn only_the_configured_keys_are_recorded() {
        let e = put(
            "c2",
            "c1",
            json!({"source": "loop", "step": 2, "user_id": "alice", "secret": "s", "email": null}),
        );
        assert_eq!(e.detail["approver"], json!({"user_id": "alice"}));
        assert_eq!(e.detail["statement"], json!("checkpoint_upsert"));
        assert!(e.run_metadata.is_none());
        let none = put("c2", "c1", json!({"source": "loop", "secret": "s"}));
        assert!(none.detail.get("approver").is_none());
        let mut custom = ev(Operation::CheckpointPut, "c2", Some("c1"));
        custom.run_metadata = Some(json!({"user_id": "alice", "tenant": 7}));
        stamp(&mut custom, &["tenant".to_string()]);
        assert_eq!(custom.detail, json!({"approver": {"tenant": 7}}));
    }

    #[test]
    fn an_answer_takes_the_approver_of_the_checkpoint_its_run_saved_next() {
        let mut events = vec![
            put("c1", "c0", json!({"source": "loop", "user_id": "bob"})),
            ev(Operation::ResumeRecorded, "c1", None),
            ev(Operation::ClaimConsumed, "c1", None),
            put("c2", "c1", json!({"source": "loop", "user_id": "alice"})),
            // A fork of c1 answered again later, by carol.
            ev(Operation::ResumeRecorded, "c1", None),
            put("c3", "c1", json!({"source": "loop", "user_id": "carol"})),
            ev(Operation::ClaimConsumed, "c1", None),
            // An answer whose run never saved a checkpoint.
            ev(Operation::ResumeRecorded, "c3", None),
        ];
        attribute(&mut events);
        let who = |i: usize| events[i].detail.get("approver").cloned();
        assert_eq!(who(1), Some(json!({"user_id": "alice"})));
        assert_eq!(events[1].detail["approver_from"], json!("c2"));
        assert_eq!(who(2), Some(json!({"user_id": "alice"})));
        assert_eq!(who(4), Some(json!({"user_id": "carol"})));
        assert_eq!(who(6), Some(json!({"user_id": "carol"})));
        assert_eq!(who(7), None);
        assert_eq!(
            describe(&events[1].detail).as_deref(),
            Some("user_id=alice")
        );
    }

    #[test]
    fn a_task_level_answer_written_after_the_child_names_its_run_level_answer_s_approver() {
        let mut events = vec![
            answer_record(true),
            put("c2", "c1", json!({"source": "loop", "user_id": "alice"})),
            // The task's own record lands after the child checkpoint.
            answer_record(false),
            // A later fork of c1 by carol: not the task's approver.
            answer_record(true),
            put("c3", "c1", json!({"source": "loop", "user_id": "carol"})),
        ];
        attribute(&mut events);
        let who = |i: usize| events[i].detail.get("approver").cloned();
        assert_eq!(who(0), Some(json!({"user_id": "alice"})));
        assert_eq!(who(2), Some(json!({"user_id": "alice"})));
        assert_eq!(events[2].detail["approver_from"], json!("c2"));
        assert_eq!(who(3), Some(json!({"user_id": "carol"})));
    }

    #[test]
    fn a_claim_consumed_after_the_task_level_answer_names_that_answer_s_approver() {
        let mut events = vec![
            answer_record(true),
            // The child checkpoint was saved before the task's own record
            // (LangGraph saves checkpoints in the background) ...
            put("c2", "c1", json!({"source": "loop", "user_id": "alice"})),
            answer_record(false),
            put("c3", "c2", json!({"source": "loop", "user_id": "alice"})),
            // ... and the claim's consumption was recorded last.
            ev(Operation::ClaimConsumed, "c1", None),
        ];
        attribute(&mut events);
        assert_eq!(events[4].detail["approver"], json!({"user_id": "alice"}));
        assert_eq!(events[4].detail["approver_from"], json!("c2"));
    }
}
