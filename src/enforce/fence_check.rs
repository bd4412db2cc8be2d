//! A write whose fence the server checks in the write's own transaction:
//! fencing arms it, the watch on the write's answer carries it, and the
//! completed statement audits it should the check raise.

use std::sync::Arc;

use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::write_record::WriteRecord;

/// A write the server checks in its transaction: what its audit record
/// needs should the check raise.
#[derive(Debug, Clone)]
pub struct FenceCheck {
    pub continues: CheckpointRef,
    pub statement: &'static str,
    pub record: Arc<WriteRecord>,
    /// The server's error, once it raised one: message, detail, reason.
    pub raised: Option<(String, String, String)>,
}
