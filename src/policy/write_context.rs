//! Where a payload is being written: what rules select on.

use serde_json::Value;

/// Where a payload is being written.
#[derive(Debug, Clone, Copy)]
pub struct WriteContext<'a> {
    pub thread_id: &'a str,
    pub checkpoint_ns: &'a str,
    pub checkpoint_id: &'a str,
    /// The checkpoint's metadata when known. `None` (unknown) lets rules
    /// with a metadata selector apply: the gate fails closed.
    pub metadata: Option<&'a Value>,
}
