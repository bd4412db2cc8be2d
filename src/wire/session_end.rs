//! Why a session ended: each relay direction returns it, the session
//! logs it and tells the client what it must know before the close.

use super::sasl_plus::BindingRefusal;

/// Why a session ended, for the log.
#[derive(Debug)]
pub(super) enum End {
    ClientClosed,
    ServerClosed,
    Shutdown,
    /// The other direction ended first.
    Quiet,
    /// The client broke the protocol; it is told why before the close.
    ClientProtocol(String),
    /// The client asked for what cannot pass the proxy; it is told why
    /// before the close.
    ClientRefused(BindingRefusal),
    Error(String),
}
