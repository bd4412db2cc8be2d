//! The shutdown flag, shared by the proxy's sessions and by whatever
//! grants them work (the consume-once gate), so that from the moment
//! shutdown begins nothing new is granted to a session about to close.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set once, when shutdown begins; cheap to clone and to read.
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    /// Whether shutdown has begun.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Marks shutdown as begun, for every clone.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}
