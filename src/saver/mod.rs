//! Checkpoint-saver traffic: recognition and decoding.

pub mod bind;
pub mod bytea;
pub mod checkpoint_ref;
pub mod checkpoint_row;
pub mod classify;
pub mod decode_error;
pub mod fork_rewrite;
pub mod int_text;
pub mod json_blob;
pub mod layout;
pub mod msgpack;
pub mod pending_tasks;
pub mod pg_array;
pub mod profile;
pub mod reserved;
pub mod typed_blob;
pub mod unknown;
pub mod value;
pub mod write_record;
