//! A statement the proxy refuses, and the SQLSTATEs it answers with: the
//! tracker raises it, the guard's factory refuses a startup with it, and
//! the hooks above the tracker produce it.

/// Why the proxy refuses a statement: raised by the server itself, so the
/// error lands where the client expects the statement's answer and the
/// transaction aborts as for any error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub sqlstate: &'static str,
    pub message: String,
    pub detail: String,
}

/// SQLSTATE for a statement name the proxy never saw prepared.
pub const INVALID_STATEMENT_NAME: &str = "26000";
/// SQLSTATE for a form the proxy refuses to pass unchecked.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
