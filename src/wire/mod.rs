//! The wire layer: framing, relaying, protocol state. It routes what the
//! saver layer recognizes; it decides nothing about checkpoints itself.

pub mod backend;
pub mod claims_gate;
pub mod frame;
pub mod listener;
pub mod proxy;
pub mod read_buffer;
pub mod registry;
pub mod reject;
pub mod response_queue;
pub mod row_rewrite;
pub mod session;
pub mod session_state;
pub mod startup;
pub mod upstream;
pub mod watch;
