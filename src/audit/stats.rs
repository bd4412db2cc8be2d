//! The counters of the audit trail's outputs, kept apart from the sink
//! and its lanes so both read them without importing each other.

/// Counters for metrics and tests: of one output ([`AuditSink::output_stats`](super::AuditSink::output_stats))
/// or of the whole sink ([`AuditSink::stats`](super::AuditSink::stats): summed over the outputs, an
/// event counted once per output, except `lost`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Events accepted into the output's queue.
    pub enqueued: u64,
    /// Accepted events the output's writer has processed (written, kept
    /// for a retry, or given up).
    pub written: u64,
    /// Events refused because the output's queue was full or its writer
    /// was gone.
    pub dropped: u64,
    /// Failed write attempts.
    pub write_errors: u64,
    /// Events the output lost (refused, given up, or left with a writer
    /// that did not exit at shutdown); for the sink,
    /// [`AuditSink::dropped_total`](super::AuditSink::dropped_total).
    pub lost: u64,
}

impl AuditStats {
    /// Events waiting for the writer.
    pub fn queue_depth(&self) -> u64 {
        self.enqueued.saturating_sub(self.written)
    }
}
