//! Terminate: how the proxy ends a session of its own politely.

use bytes::BytesMut;

use super::write::{write_message, EncodeError};

/// Appends a Terminate.
pub fn write_terminate(out: &mut BytesMut) -> Result<(), EncodeError> {
    write_message(out, b'X', |_| Ok(()))
}
