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

pub use super::messages::sqlstate::{
    FEATURE_NOT_SUPPORTED, INVALID_STATEMENT_NAME, UNDEFINED_CURSOR,
};
