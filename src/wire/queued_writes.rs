//! The bytes a session on a ring loop handed to the kernel to write, per
//! side, until their send completes. They leave the session's pending
//! bytes whole when the send is queued (the buffers trade places, nothing
//! is copied), and nothing touches them until the completion says how
//! much went: the kernel reads them meanwhile. What did not go is sent
//! again before anything routed since.

use std::io;

use bytes::{Buf, BytesMut};

use super::server_relay::SHRINK_ABOVE;

/// One side's bytes in the kernel's hands.
#[derive(Default)]
pub(super) struct QueuedWrite {
    bytes: BytesMut,
    in_flight: bool,
}

impl QueuedWrite {
    /// The bytes to hand to the kernel now, taken from `pending` when
    /// none are left from the last send: none while a send is in flight
    /// or nothing waits. The caller queues a send of exactly these.
    pub fn next(&mut self, pending: &mut BytesMut) -> Option<&[u8]> {
        if self.in_flight {
            return None;
        }
        if self.bytes.is_empty() {
            std::mem::swap(&mut self.bytes, pending);
        }
        if self.bytes.is_empty() {
            return None;
        }
        self.in_flight = true;
        Some(&self.bytes)
    }

    /// The send completed with `result` (a count, or a negated error
    /// number); a cancelled send wrote nothing and is no error.
    pub fn sent(&mut self, result: i32, cancelled: bool) -> io::Result<()> {
        self.in_flight = false;
        let n = match usize::try_from(result) {
            Ok(0) if !self.bytes.is_empty() => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n.min(self.bytes.len()),
            Err(_) if cancelled => 0,
            Err(_) => return Err(io::Error::from_raw_os_error(result.saturating_neg())),
        };
        self.bytes.advance(n);
        if self.bytes.is_empty() && self.bytes.capacity() > SHRINK_ABOVE {
            self.bytes = BytesMut::new();
        }
        Ok(())
    }

    /// Bytes routed to this side are still to be written by the kernel.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// Puts what the kernel did not write back in front of `pending`, for
    /// the session's own writes from here (no send is in flight). A send
    /// still in flight cannot be taken back: its bytes are left to the
    /// kernel for good, and nothing after them is written.
    pub fn settle(&mut self, pending: &mut BytesMut) -> bool {
        if self.in_flight {
            std::mem::forget(std::mem::take(&mut self.bytes));
            pending.clear();
            return false;
        }
        if !self.bytes.is_empty() {
            self.bytes.extend_from_slice(pending);
            std::mem::swap(&mut self.bytes, pending);
            self.bytes.clear();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_bytes_are_handed_over_whole_and_what_did_not_go_goes_first() {
        let mut queued = QueuedWrite::default();
        let mut pending = BytesMut::from(&b"hello"[..]);
        let at = pending.as_ptr();
        let handed = queued.next(&mut pending).unwrap();
        assert_eq!((handed, handed.as_ptr()), (&b"hello"[..], at));
        assert!(pending.is_empty());
        pending.extend_from_slice(b" world");
        assert!(queued.next(&mut pending).is_none(), "one send at a time");
        queued.sent(2, false).unwrap();
        assert_eq!(queued.next(&mut pending).unwrap(), b"llo");
        queued.sent(3, false).unwrap();
        assert!(queued.is_empty());
        assert_eq!(queued.next(&mut pending).unwrap(), b" world");
    }

    /// `bytes` handed to the kernel, and the session's pending bytes
    /// emptied by the handover.
    fn sending(bytes: &[u8]) -> (QueuedWrite, BytesMut) {
        let mut queued = QueuedWrite::default();
        let mut pending = BytesMut::from(bytes);
        queued.next(&mut pending).unwrap();
        (queued, pending)
    }

    #[test]
    fn a_cancelled_send_settles_its_bytes_in_front_of_the_pending_ones() {
        let (mut queued, mut pending) = sending(b"first");
        pending.extend_from_slice(b" then");
        queued.sent(-libc_canceled(), true).unwrap();
        assert!(queued.settle(&mut pending));
        assert_eq!(&pending[..], b"first then");
        assert!(queued.is_empty());
    }

    #[test]
    fn a_failed_send_is_its_error_and_a_send_of_nothing_is_no_progress() {
        let (mut queued, mut pending) = sending(b"x");
        let e = queued.sent(-32, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        queued.next(&mut pending).unwrap();
        let e = queued.sent(0, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
    }

    #[test]
    fn bytes_still_in_the_kernels_hands_are_never_freed_under_it() {
        let (mut queued, mut pending) = sending(b"x");
        pending.extend_from_slice(b"after");
        assert!(!queued.settle(&mut pending));
        assert!(
            pending.is_empty(),
            "nothing goes after bytes whose fate is unknown"
        );
    }

    fn libc_canceled() -> i32 {
        rustix::io::Errno::CANCELED.raw_os_error()
    }
}
