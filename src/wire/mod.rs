//! The wire layer: framing, relaying, protocol state.

pub mod frame;
pub mod response_queue;
pub mod startup;
