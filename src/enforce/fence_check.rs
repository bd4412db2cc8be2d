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
    /// The server's error, once it raised one.
    pub raised: Option<CheckError>,
}

/// The error the server raised in the check's place: the fence's own
/// (SQLSTATE `RGF01`, its reason in the hint), or any other that stopped
/// the check (a lock or statement timeout, a deadlock).
#[derive(Debug, Clone, Default)]
pub struct CheckError {
    pub sqlstate: String,
    pub message: String,
    pub detail: String,
    /// The fence's reason (`superseded_holder`, `other_proxy`, ...).
    pub hint: String,
}
