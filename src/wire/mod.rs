//! The wire layer: framing, relaying, protocol state. It routes what a
//! session's guard decides; it knows nothing of checkpoints itself.

mod client_relay;
pub mod client_stream;
pub mod client_text;
pub mod connection;
mod deadline_socket;
pub mod draining;
pub mod event_loop;
pub mod first_packet;
pub mod guard;
pub mod hooks;
pub mod injected;
pub mod keepalive;
pub mod last_text;
pub mod listener;
mod loop_session;
pub mod messages;
pub mod proxy;
pub mod refusal;
pub mod registry;
pub mod reject;
mod relayed;
pub mod response_queue;
pub mod sasl_plus;
pub mod server_cert_verifier;
mod server_relay;
pub mod session;
mod session_end;
pub mod sql_commands;
pub mod text_screen;
pub mod tls_config;
pub mod tls_stream;
pub mod tracker;
mod unsupported_protocol;
pub mod upstream;
pub mod upstream_probe;
pub mod upstream_tls;
