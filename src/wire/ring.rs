//! An event loop's io_uring: its sockets' reads and writes, and its
//! wake-ups, as requests on one ring, so one `io_uring_enter` a turn both
//! submits every read and write the turn asked for and waits for what
//! happened next. On epoll the same turn makes a `recvfrom` per read, a
//! `sendto` per write and an `epoll_wait` (docs/performance.md, "The
//! readiness model priced").
//!
//! A read lands in a buffer the kernel picks from the ring's own when the
//! bytes arrive (see `provided_buffers.rs`), so a socket waiting for its
//! peer pins none.
//!
//! The ring is made with the flags liburing recommends for a networking
//! loop (completions' work runs when the loop waits for them, and only
//! the loop's thread submits); a kernel without them (before 6.1) makes
//! no ring, and the loop waits on epoll instead.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use rustix::event::{eventfd, EventfdFlags, PollFlags};
use rustix::io::Errno;

use super::provided_buffers::{ProvidedBuffers, GROUP};

/// Requests the submission queue holds before a turn's are submitted.
const ENTRIES: u32 = 1024;
/// The tag of the loop's wake-up watch.
const WAKE: u64 = u64::MAX;
/// The tag of a cancellation's own completion.
const CANCEL: u64 = u64::MAX - 1;
/// A read waits for bytes before trying the socket
/// (`IORING_RECVSEND_POLL_FIRST`): the loop asks for one when the last
/// read emptied the socket, so a first try would find nothing.
const RECV_POLL_FIRST: u16 = 1;
/// A request's completion, as the loop acts on it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Done {
    pub tag: u64,
    pub result: i32,
    /// The buffer a read's bytes are in (see [`Ring::received`]).
    pub buffer: Option<u16>,
}

impl Done {
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
    /// Registered with `ring`; freed once unregistered (see `Drop`).
    buffers: ManuallyDrop<ProvidedBuffers>,
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
        let buffers = ProvidedBuffers::new()?;
        let (addr, count) = buffers.address();
        // Safety: the entries stay where they are, and the buffers they
        // name, until unregistered (see `Drop`).
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(addr, count, GROUP, 0)?
        };
        let mut made = Ring {
            ring,
            wake: Arc::new(wake),
            buffers: ManuallyDrop::new(buffers),
        };
        made.watch(made.wake.as_raw_fd(), WAKE)?;
        Ok(made)
    }

    pub fn waker(&self) -> RingWaker {
        RingWaker(Arc::clone(&self.wake))
    }

    /// Watches `fd` for bytes: a completion tagged `tag` each time it
    /// becomes readable, until the kernel ends the watch.
    fn watch(&mut self, fd: RawFd, tag: u64) -> io::Result<()> {
        let entry = opcode::PollAdd::new(types::Fd(fd), u32::from(PollFlags::IN.bits()))
            .multi(true)
            .build()
            .user_data(tag);
        // Safety: a watch points at no memory.
        unsafe { self.push(&entry) }
    }

    /// Reads `fd` once its bytes arrive, into a buffer of the ring's: the
    /// completion, tagged `tag`, has the count (0 at the peer's end) or
    /// the error, and the buffer ([`Ring::received`]).
    pub fn recv(&mut self, fd: RawFd, tag: u64) -> io::Result<()> {
        let entry = opcode::Recv::new(types::Fd(fd), std::ptr::null_mut(), 0)
            .buf_group(GROUP)
            .ioprio(RECV_POLL_FIRST)
            .build()
            .flags(squeue::Flags::BUFFER_SELECT)
            .user_data(tag);
        // Safety: the kernel writes into the ring's buffers only, which
        // stay registered as long as the ring is.
        unsafe { self.push(&entry) }
    }

    /// The bytes a read's completion brought (none for one that brought
    /// none); the buffer is offered to the kernel again once `take` has
    /// had them.
    pub fn received<T>(&mut self, done: &Done, take: impl FnOnce(&[u8]) -> T) -> T {
        let Some(bid) = done.buffer else {
            return take(&[]);
        };
        let len = usize::try_from(done.result).unwrap_or(0);
        let taken = take(self.buffers.bytes(bid, len).unwrap_or(&[]));
        self.buffers.give_back(bid);
        taken
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
            let (tag, result, flags) = (c.user_data(), c.result(), c.flags());
            match tag {
                WAKE => (woke, rewatch) = (true, rewatch || !cqueue::more(flags)),
                CANCEL => {}
                _ => done.push(Done {
                    tag,
                    result,
                    buffer: cqueue::buffer_select(flags),
                }),
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

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel picks no more of the buffers once this returns (a
        // read copies into one only on this thread's own entry into the
        // ring): they can go. Else they stay, never freed.
        match self.ring.submitter().unregister_buf_ring(GROUP) {
            // Safety: not used again; the kernel no longer knows them.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.buffers) },
            Err(e) => {
                tracing::error!(error = %e, "an event loop cannot unregister its read buffers: they stay");
            }
        }
    }
}

/// A write to a peer that closed is an error, never a SIGPIPE.
fn libc_msg_nosignal() -> i32 {
    rustix::net::SendFlags::NOSIGNAL.bits() as i32
}

#[cfg(test)]
mod tests;
