//! The channel and task names LangGraph reserves, in one place: what the
//! proxy reads interrupts, answers and pending tasks off.

/// The channel an `interrupt()` parks on.
pub const INTERRUPT: &str = "__interrupt__";
/// The channel answers to interrupts are recorded on.
pub const RESUME: &str = "__resume__";
/// A task's failure.
pub const ERROR: &str = "__error__";
/// A task scheduled for later.
pub const SCHEDULED: &str = "__scheduled__";
/// The task id of a run-level `__resume__` write (not tied to one task).
pub const NULL_TASK: &str = "00000000-0000-0000-0000-000000000000";
/// Channel-name prefixes of trigger channels: an edge, a join.
pub const TRIGGER_PREFIXES: &[&str] = &["branch:to:", "join:"];
/// Whole channel names of trigger channels: input, `Send`s.
pub const TRIGGER_NAMES: &[&str] = &["__start__", "__pregel_tasks"];
