//! Whether a checkpoint still has tasks to run, read off the checkpoint
//! itself (no graph needed).
//!
//! LangGraph records in each checkpoint the channels its last step updated
//! (`updated_channels`, only channels that hold a value). A node runs next
//! when one of its trigger channels is among them, and a graph's trigger
//! channels follow fixed names: `branch:to:<node>` for an edge,
//! `join:<a+b>:<node>` for a join, `__start__` for input, and
//! `__pregel_tasks` for `Send`s. A checkpoint whose last step wrote none of
//! them is where its run ended (or parked).
//!
//! A run's intermediate checkpoints have tasks to run; a completed run's
//! last checkpoint has none. The consume-once run lease uses this to tell a
//! read that would continue someone else's run from one that only looks at
//! its outcome.

use serde::Deserialize;
use serde_json::Value;

use super::reserved::{TRIGGER_NAMES, TRIGGER_PREFIXES};

/// Whether the checkpoint (its JSON text, as the saver stores it) has
/// tasks to run. `None`: it does not say (no `updated_channels`, e.g. an
/// older LangGraph, or not JSON).
pub fn has_pending_tasks(checkpoint_json: &str) -> Option<bool> {
    // Only this field is built; the rest of the checkpoint (inline channel
    // values included) is skipped, not turned into a JSON tree.
    #[derive(Deserialize)]
    struct Updated {
        updated_channels: Option<Vec<Value>>,
    }
    let cp: Updated = serde_json::from_str(checkpoint_json).ok()?;
    Some(
        cp.updated_channels?
            .iter()
            .filter_map(Value::as_str)
            .any(is_trigger_channel),
    )
}

/// Whether a channel of this name triggers a node.
pub fn is_trigger_channel(name: &str) -> bool {
    TRIGGER_NAMES.contains(&name) || TRIGGER_PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intermediate_checkpoint_has_tasks() {
        let cp = r#"{"v":4,"id":"c2","channel_versions":{"items":"2","branch:to:after":"3"},
                     "versions_seen":{"gate":{"branch:to:gate":"2"}},
                     "updated_channels":["items","branch:to:after"]}"#;
        assert_eq!(has_pending_tasks(cp), Some(true));
    }

    #[test]
    fn final_checkpoint_has_none() {
        let cp = r#"{"v":4,"id":"c3","updated_channels":["items"]}"#;
        assert_eq!(has_pending_tasks(cp), Some(false));
        let empty = r#"{"v":4,"id":"c3","updated_channels":[]}"#;
        assert_eq!(has_pending_tasks(empty), Some(false));
    }

    #[test]
    fn joins_input_and_sends_are_triggers() {
        for ch in ["join:a+b:c", "__start__", "__pregel_tasks", "branch:to:x"] {
            let cp = format!(r#"{{"updated_channels":["{ch}"]}}"#);
            assert_eq!(has_pending_tasks(&cp), Some(true), "{ch}");
        }
        assert!(!is_trigger_channel("branch"));
        assert!(!is_trigger_channel("__start"));
    }

    #[test]
    fn unknown_when_the_checkpoint_does_not_say() {
        assert_eq!(has_pending_tasks(r#"{"v":1,"id":"c"}"#), None);
        assert_eq!(has_pending_tasks(r#"{"updated_channels":null}"#), None);
        assert_eq!(has_pending_tasks("not json"), None);
    }
}
