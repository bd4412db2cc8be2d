//! Which checkpoint a read returned or a write continues: the thread, the
//! namespace within it and the checkpoint id always travel together, so
//! they are one value rather than three strings side by side.

use std::fmt;

use crate::log_text::shown;

/// A checkpoint of a thread, as the saver's tables key it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointRef {
    pub thread_id: String,
    /// `""` for the root graph; a subgraph's path otherwise.
    pub checkpoint_ns: String,
    pub checkpoint_id: String,
}

impl CheckpointRef {
    pub fn new(
        thread_id: impl Into<String>,
        checkpoint_ns: impl Into<String>,
        checkpoint_id: impl Into<String>,
    ) -> Self {
        CheckpointRef {
            thread_id: thread_id.into(),
            checkpoint_ns: checkpoint_ns.into(),
            checkpoint_id: checkpoint_id.into(),
        }
    }

    /// Another checkpoint of the same thread and namespace (a parent, a
    /// child).
    pub fn sibling(&self, checkpoint_id: impl Into<String>) -> CheckpointRef {
        CheckpointRef {
            checkpoint_id: checkpoint_id.into(),
            ..self.clone()
        }
    }
}

/// For messages and logs: client text, escaped and cut.
impl fmt::Display for CheckpointRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "thread \"{}\", checkpoint_ns \"{}\", checkpoint \"{}\"",
            shown(&self.thread_id),
            shown(&self.checkpoint_ns),
            shown(&self.checkpoint_id)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sibling_keeps_thread_and_namespace() {
        let at = CheckpointRef::new("t", "sub:1", "c1");
        assert_eq!(at.sibling("c0"), CheckpointRef::new("t", "sub:1", "c0"));
    }

    #[test]
    fn shown_escaped() {
        let at = CheckpointRef::new("t\"\n", "", "c1");
        assert_eq!(
            at.to_string(),
            format!(
                "thread \"{}\", checkpoint_ns \"\", checkpoint \"c1\"",
                shown("t\"\n")
            )
        );
    }
}
