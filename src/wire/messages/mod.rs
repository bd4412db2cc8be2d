//! The PostgreSQL protocol codec: every message the proxy reads or writes.
//! Reads borrow from the framed bytes and are checked (a short or lying
//! message is an error, never a panic). Every length word is written by
//! [`write::write_counted`], which reserves it and patches it once the
//! body is in (typed messages through [`write::write_message`]); strings
//! go through [`write::write_cstr`], which refuses an embedded NUL. The
//! relay forwards untouched messages as framed and re-encodes only what
//! it changes.

pub mod authentication;
pub mod backend;
pub mod bind;
pub mod data_row;
pub mod error_response;
pub mod extended_query;
#[cfg(test)]
mod framing_outside;
pub mod frontend;
pub mod query;
pub mod read;
pub mod row_description;
pub mod sqlstate;
pub mod startup;
pub mod terminate;
pub mod write;
