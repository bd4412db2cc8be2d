//! An event loop's io_uring: its sockets' readiness, its wake-ups and its
//! writes as requests on one ring, so one `io_uring_enter` a turn both
//! submits every write the turn queued and waits for what happened next.
//! On epoll the same turn makes a `sendto` per write and an `epoll_wait`
//! (docs/performance.md, "The readiness model priced").
//!
//! Reads stay the loop's own non-blocking `recv`, after the ring said a
//! socket is readable: a request per read would need a buffer per idle
//! socket, or buffers the kernel picks from, for little more saved.
//!
//! The ring is made with the flags liburing recommends for a networking
//! loop (completions' work runs when the loop waits for them, and only
//! the loop's thread submits); a kernel without them (before 6.1) makes
//! no ring, and the loop waits on epoll instead.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use rustix::event::{eventfd, EventfdFlags, PollFlags};
use rustix::io::Errno;

/// Requests the submission queue holds before a turn's are submitted.
const ENTRIES: u32 = 1024;
/// The tag of the loop's wake-up watch.
const WAKE: u64 = u64::MAX;
/// The tag of a cancellation's own completion.
const CANCEL: u64 = u64::MAX - 1;
/// What a socket's watch waits for: bytes, the peer's end, and (always
/// reported) errors and hang-ups.
const READABLE: PollFlags = PollFlags::IN.union(PollFlags::RDHUP);

/// A request's completion, as the loop acts on it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Done {
    pub tag: u64,
    pub result: i32,
    /// A watch goes on after this completion (else it ended).
    pub more: bool,
}

impl Done {
    /// A watch's completion: (readable, closed or failed).
    pub fn readiness(&self) -> (bool, bool) {
        let Ok(bits) = u16::try_from(self.result) else {
            // The watch itself failed: the read says why.
            return (true, true);
        };
        let bits = PollFlags::from_bits_retain(bits);
        let read = bits.intersects(PollFlags::IN | PollFlags::PRI);
        let closed = bits.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::RDHUP);
        (read, closed)
    }

    /// The request was cancelled.
    pub fn cancelled(&self) -> bool {
        self.result == -Errno::CANCELED.raw_os_error()
    }
}

/// Wakes a loop waiting on its ring, from any thread.
pub(super) struct RingWaker(Arc<OwnedFd>);

impl RingWaker {
    pub fn wake(&self) -> io::Result<()> {
        match rustix::io::write(&*self.0, &1u64.to_ne_bytes()) {
            // The counter is full: the loop has a wake-up to see already.
            Ok(_) | Err(Errno::AGAIN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

pub(super) struct Ring {
    ring: IoUring,
    wake: Arc<OwnedFd>,
}

impl Ring {
    /// A ring for the calling thread (the only one that may submit to
    /// it), with its wake-up watched.
    pub fn new() -> io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(ENTRIES)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without timed waits",
            ));
        }
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let mut made = Ring {
            ring,
            wake: Arc::new(wake),
        };
        made.watch(made.wake.as_raw_fd(), WAKE)?;
        Ok(made)
    }

    pub fn waker(&self) -> RingWaker {
        RingWaker(Arc::clone(&self.wake))
    }

    /// Watches `fd` for bytes or its peer's end: a completion tagged `tag`
    /// each time it becomes readable, until cancelled (or a completion
    /// says it ended: see [`Done::more`]).
    pub fn watch(&mut self, fd: RawFd, tag: u64) -> io::Result<()> {
        let entry = opcode::PollAdd::new(types::Fd(fd), u32::from(READABLE.bits()))
            .multi(true)
            .build()
            .user_data(tag);
        // Safety: a watch points at no memory.
        unsafe { self.push(&entry) }
    }

    /// Writes `bytes` to `fd`, completing with the count written (or the
    /// error) under `tag`.
    ///
    /// # Safety
    /// `bytes` must stay where they are, unchanged, until that completion
    /// is taken.
    pub unsafe fn send(&mut self, fd: RawFd, bytes: &[u8], tag: u64) -> io::Result<()> {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let entry = opcode::Send::new(types::Fd(fd), bytes.as_ptr(), len)
            .flags(libc_msg_nosignal())
            .build()
            .user_data(tag);
        self.push(&entry)
    }

    /// Cancels the request tagged `tag` (its own completion says so) and
    /// submits at once: the socket it names may be closed next.
    pub fn cancel(&mut self, tag: u64) -> io::Result<()> {
        let entry = opcode::AsyncCancel::new(tag).build().user_data(CANCEL);
        // Safety: a cancellation points at no memory.
        unsafe { self.push(&entry) }?;
        self.ring.submit().map(drop)
    }

    /// Queues `entry`, submitting what is queued first when the queue is
    /// full.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        while self.ring.submission().push(entry).is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Submits what is queued and waits, for at most `timeout` (`None`:
    /// as long as it takes; zero: not at all), for a completion; appends
    /// the completions (those that came meanwhile too) to `done`. A wake-up is taken here: it is seen as
    /// the wait's end.
    pub fn wait(&mut self, timeout: Option<Duration>, done: &mut Vec<Done>) -> io::Result<()> {
        // Even a wait of no time enters with a wait's flag: the work that
        // posts completions runs only then (`DEFER_TASKRUN`).
        let waited = match timeout {
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submit_and_wait(1),
        };
        match waited {
            Ok(_) => {}
            // The timeout passed, or completions overflowed (taken next).
            Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::TIME | Errno::BUSY)) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let (mut woke, mut rewatch) = (false, false);
        for c in self.ring.completion() {
            let (tag, result, more) = (c.user_data(), c.result(), cqueue::more(c.flags()));
            match tag {
                WAKE => (woke, rewatch) = (true, rewatch || !more),
                CANCEL => {}
                _ => done.push(Done { tag, result, more }),
            }
        }
        if woke {
            self.take_wakes();
        }
        if rewatch {
            self.watch(self.wake.as_raw_fd(), WAKE)?;
        }
        Ok(())
    }

    /// Resets the wake-up counter (it stays readable until read).
    fn take_wakes(&self) {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(self.wake.as_fd(), &mut count);
    }
}

/// A write to a peer that closed is an error, never a SIGPIPE.
fn libc_msg_nosignal() -> i32 {
    rustix::net::SendFlags::NOSIGNAL.bits() as i32
}

#[cfg(test)]
mod tests;
