//! The SQLSTATEs of the errors the proxy itself answers with.

/// A client or server broke the protocol.
pub const PROTOCOL_VIOLATION: &str = "08P01";
/// The proxy refuses the connection (sqlserver rejected establishment
/// of sqlconnection): what the client asks for cannot pass it.
pub const REJECTED_CONNECTION: &str = "08004";
/// The upstream server could not be reached.
pub const CONNECTION_FAILURE: &str = "08006";
/// The proxy is shutting down.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// The proxy cannot follow the session's protocol state any more.
pub const INTERNAL_ERROR: &str = "XX000";
/// The proxy cannot start another session (threads or memory).
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// A statement name the proxy never saw prepared.
pub const INVALID_STATEMENT_NAME: &str = "26000";
/// A portal that does not exist (undefined_cursor).
pub const UNDEFINED_CURSOR: &str = "34000";
/// A form the proxy refuses to pass unchecked, or a frontend protocol it
/// does not speak.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
