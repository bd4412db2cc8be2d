//! Enforcement policy: pure decisions the enforcer applies.
//!
//! - [`fork`]: fork determinism — what a read of a superseded checkpoint
//!   may see of its recorded answers.
//! - [`claims`]: consume-once — what a read of a parked head gets.
//! - [`late_duplicate`]: which answer a resume onto a finished head repeats.
//! - Checkpoint validity: channel-schema rules and the verdict on each
//!   payload a checkpoint write carries. No I/O on the proxy path:
//!   [`ChannelRules::load`] reads and compiles `rules/channels/*.toml` once
//!   at startup (format: `rules/channels/README.md`); the enforcer then
//!   asks [`ChannelRules::check_channel_value`],
//!   [`ChannelRules::check_pending_write`] and
//!   [`ChannelRules::check_checkpoint`] for a [`Verdict`] and turns
//!   [`Verdict::Invalid`] into a `23514` refusal using
//!   [`Violation::describe`]. Blobs are read with [`crate::saver::typed_blob`].

pub mod claims;
pub mod fork;
pub mod late_duplicate;
pub mod write_check;

mod error;
mod rule_file;
mod rules;
mod schema;
mod selector;
mod verdict;
mod violation;
mod write_context;

#[cfg(test)]
mod tests;

pub use error::RuleError;
pub use rules::ChannelRules;
pub use schema::is_special_channel;
pub use verdict::{ChannelPayload, Verdict};
pub use violation::Violation;
pub use write_context::WriteContext;
