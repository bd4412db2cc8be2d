//! A checkpoint write whose key the server converts, where the proxy
//! would check it against the claim store: the bytes the proxy read are
//! not the thread's characters (see `session::encodings`), so the store
//! would be asked of another key and answer for a thread nobody holds.
//! The write is refused `0A000` before it is forwarded, audited as
//! fenced. A check the server makes inside the write's own transaction
//! is not refused: its arguments are the client's bytes, converted as
//! the write's are.

use super::events::{fenced, FencedWrite};
use crate::audit::{AuditEvent, SessionContext};
use crate::log_text::shown;
use crate::policy::claims::SQLSTATE_CLIENT_ENCODING;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::saver::write_record::WriteRecord;
use crate::wire::tracker::Refusal;

/// Which check could not be made, as the refusal names it.
#[derive(Debug, Clone, Copy)]
pub enum Unchecked {
    /// The fence's lookup of the claim's holder.
    Holder,
    /// The late-duplicate check of whether the interrupt was answered.
    Answered,
}

/// The refusal of a write of `statement` continuing `at`, in a session
/// whose client `encoding` the server converts, and its `write_fenced`
/// record.
pub fn refused(
    ctx: &SessionContext,
    (at, statement, rec): (&CheckpointRef, &str, &WriteRecord),
    encoding: &str,
    unchecked: Unchecked,
) -> (Refusal, AuditEvent) {
    let what = match unchecked {
        Unchecked::Holder => "its claim's holder",
        Unchecked::Answered => "whether its interrupt was answered",
    };
    let message = format!(
        "resumeguard: write continuing thread \"{}\", checkpoint_ns \"{}\", checkpoint \"{}\" \
         refused (fail closed): the server converts this session's client_encoding {encoding} \
         to the database's, so the key's characters outside ASCII are not the bytes the proxy \
         read, and {what} cannot be checked in the claim store; nothing was written",
        at.thread_id, at.checkpoint_ns, at.checkpoint_id
    );
    tracing::warn!(thread = %shown(&at.thread_id), checkpoint = %shown(&at.checkpoint_id), "{}", shown(&message));
    let event = fenced(
        ctx,
        &FencedWrite {
            record: rec,
            continues: at,
            statement,
            sqlstate: SQLSTATE_CLIENT_ENCODING,
            message: &message,
            fence: "client_encoding",
            current: None,
        },
    );
    let refusal = Refusal {
        sqlstate: SQLSTATE_CLIENT_ENCODING,
        message,
        detail: "Write with client_encoding set to the database's encoding (PGCLIENTENCODING, \
                 or options=-c client_encoding=UTF8); threads whose keys are ASCII are written \
                 in any encoding."
            .to_owned(),
    };
    (refusal, event)
}
