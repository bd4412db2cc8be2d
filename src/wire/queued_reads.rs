//! A side's read on a ring loop, between the session asking for it and
//! the session taking what it brought. The session asks only when it
//! would read now (nothing it routed from that side waits to be written),
//! so a read in the kernel's hands keeps the backpressure rule: at most
//! one read per direction is buffered.
//!
//! What a read brought is in the side's read buffer when its completion
//! is acted on; the session routes it at its next step.

use std::io;

use rustix::io::Errno;

/// What one read of a side brought.
#[derive(Debug)]
pub(super) enum Got {
    Bytes,
    /// Nothing yet: the next bytes come with a readiness event, or with
    /// the read asked for.
    Nothing,
    /// A signal came first: read again.
    Again,
    /// The peer's end.
    End,
    Failed(io::Error),
}

/// A side's read on a ring loop.
#[derive(Debug, Default)]
pub(super) enum QueuedRead {
    /// The session reads the socket itself (a loop on epoll, threads).
    #[default]
    Own,
    /// Nothing asked for.
    Idle,
    /// The session would read: the loop asks the kernel with its next
    /// wait.
    Wanted,
    InFlight,
    /// The read completed; its bytes are buffered.
    Came(Got),
}

impl QueuedRead {
    /// What the session's read gets now: None when it reads the socket
    /// itself; else what came, or nothing yet (and a read is asked for).
    pub fn take(&mut self) -> Option<Got> {
        match self {
            QueuedRead::Own => None,
            QueuedRead::InFlight | QueuedRead::Wanted => Some(Got::Nothing),
            QueuedRead::Idle => {
                *self = QueuedRead::Wanted;
                Some(Got::Nothing)
            }
            QueuedRead::Came(_) => match std::mem::replace(self, QueuedRead::Idle) {
                QueuedRead::Came(got) => Some(got),
                _ => Some(Got::Nothing),
            },
        }
    }

    /// Whether a read is to be asked for now (it is in flight from here).
    pub fn ask(&mut self) -> bool {
        if matches!(self, QueuedRead::Wanted) {
            *self = QueuedRead::InFlight;
            return true;
        }
        false
    }

    pub fn in_flight(&self) -> bool {
        matches!(self, QueuedRead::InFlight)
    }

    /// The read completed with `result` (a count, or a negated error
    /// number) and `bytes` (what it brought), which `keep` buffers.
    pub fn completed(&mut self, result: i32, bytes: &[u8], keep: impl FnOnce(&[u8])) {
        *self = match result {
            0 => QueuedRead::Came(Got::End),
            n if n > 0 && !bytes.is_empty() => {
                keep(bytes);
                QueuedRead::Came(Got::Bytes)
            }
            n if n > 0 => QueuedRead::Came(Got::Failed(io::ErrorKind::InvalidData.into())),
            e => match Errno::from_raw_os_error(e.saturating_neg()) {
                // Every buffer was taken at that moment (they are given
                // back as their completions are acted on): asked again.
                Errno::NOBUFS | Errno::INTR | Errno::AGAIN => QueuedRead::Wanted,
                Errno::CANCELED => QueuedRead::Idle,
                errno => QueuedRead::Came(Got::Failed(errno.into())),
            },
        };
    }

    /// The session reads for itself from here (it ends, or goes to
    /// threads): whether bytes a read brought are buffered and not yet
    /// routed.
    pub fn settle(&mut self) -> bool {
        matches!(std::mem::take(self), QueuedRead::Came(Got::Bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_asked_for_once_and_what_came_is_taken_once() {
        let mut read = QueuedRead::Idle;
        assert!(matches!(read.take(), Some(Got::Nothing)));
        assert!(read.ask());
        assert!(!read.ask(), "one read in flight at a time");
        assert!(matches!(read.take(), Some(Got::Nothing)));
        let mut kept = Vec::new();
        read.completed(3, b"abc", |b| kept.extend_from_slice(b));
        assert_eq!(kept, b"abc");
        assert!(matches!(read.take(), Some(Got::Bytes)));
        assert!(matches!(read.take(), Some(Got::Nothing)), "asked again");
        assert!(read.ask());
    }

    #[test]
    fn completions_without_bytes() {
        let mut read = QueuedRead::InFlight;
        read.completed(0, &[], |_| panic!("nothing to keep"));
        assert!(matches!(read.take(), Some(Got::End)));
        // No buffer free then: the read is asked for again.
        let mut read = QueuedRead::InFlight;
        read.completed(-Errno::NOBUFS.raw_os_error(), &[], |_| {});
        assert!(read.ask());
        let mut read = QueuedRead::InFlight;
        read.completed(-Errno::CANCELED.raw_os_error(), &[], |_| {});
        assert!(!read.ask() && !read.in_flight());
        let mut read = QueuedRead::InFlight;
        read.completed(-Errno::CONNRESET.raw_os_error(), &[], |_| {});
        match read.take() {
            Some(Got::Failed(e)) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
            other => panic!("{other:?}"),
        }
        assert!(QueuedRead::Own.take().is_none(), "the session reads itself");
    }

    #[test]
    fn settling_says_whether_unrouted_bytes_came() {
        let mut read = QueuedRead::Came(Got::Bytes);
        assert!(read.settle());
        assert!(matches!(read, QueuedRead::Own));
        assert!(!QueuedRead::Came(Got::End).settle());
        assert!(!QueuedRead::Wanted.settle());
    }
}
