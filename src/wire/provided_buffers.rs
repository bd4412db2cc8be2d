//! The buffers an event loop's ring reads into. The kernel picks one when
//! a socket's bytes arrive, not when the read is asked for, so a session
//! waiting for its peer holds none; the loop copies what came into the
//! session's read buffer (as a read through the thread's scratch room
//! does) and gives the buffer back at once.
//!
//! The ring of buffer entries is shared with the kernel: it takes entries
//! from the head, and the loop appends given-back buffers at the tail.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;

/// Buffers in the ring (a power of two). A read that finds none free
/// fails with `ENOBUFS` and is asked for again.
pub(super) const COUNT: u16 = 64;
/// Bytes per buffer: one read brings at most this much.
pub(super) const SIZE: usize = 8 * 1024;
/// The buffer group the ring's reads name.
pub(super) const GROUP: u16 = 0;

/// The entries' ring is page-aligned, as the kernel requires.
const PAGE: usize = 4096;

pub(super) struct ProvidedBuffers {
    entries: NonNull<BufRingEntry>,
    layout: Layout,
    data: Box<[u8]>,
    /// The tail as the loop last published it.
    tail: u16,
}

impl ProvidedBuffers {
    /// Every buffer, offered to the kernel (once registered: see
    /// [`ProvidedBuffers::address`]).
    pub fn new() -> io::Result<ProvidedBuffers> {
        let size = usize::from(COUNT) * std::mem::size_of::<BufRingEntry>();
        let layout = Layout::from_size_align(size.max(PAGE), PAGE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // Safety: the layout is not zero-sized.
        let entries = NonNull::new(unsafe { alloc_zeroed(layout) }.cast::<BufRingEntry>())
            .ok_or(io::ErrorKind::OutOfMemory)?;
        let mut buffers = ProvidedBuffers {
            entries,
            layout,
            data: vec![0u8; usize::from(COUNT) * SIZE].into_boxed_slice(),
            tail: 0,
        };
        for bid in 0..COUNT {
            buffers.give_back(bid);
        }
        Ok(buffers)
    }

    /// Where the entries' ring is, and how many entries it has, for its
    /// registration.
    pub fn address(&self) -> (u64, u16) {
        (self.entries.as_ptr() as u64, COUNT)
    }

    /// The first `len` bytes of buffer `bid` (None for a buffer that is
    /// not one of these).
    pub fn bytes(&self, bid: u16, len: usize) -> Option<&[u8]> {
        let start = usize::from(bid).checked_mul(SIZE)?;
        self.data.get(start..start.checked_add(len.min(SIZE))?)
    }

    /// Offers buffer `bid` to the kernel again (its bytes were taken).
    pub fn give_back(&mut self, bid: u16) {
        if bid >= COUNT {
            return;
        }
        let slot = usize::from(self.tail & (COUNT - 1));
        let addr = self.data[usize::from(bid) * SIZE..].as_ptr() as u64;
        // Safety: `slot` is inside the entries' ring (COUNT entries); the
        // kernel reads an entry only once the tail published below
        // covers it, and it covers it only from here.
        unsafe {
            let entry = &mut *self.entries.as_ptr().add(slot);
            entry.set_addr(addr);
            entry.set_len(SIZE as u32);
            entry.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // Safety: the tail lives in the first entry's reserved field,
        // which the kernel reads and only the loop writes.
        let tail = unsafe { &*BufRingEntry::tail(self.entries.as_ptr()).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }
}

impl Drop for ProvidedBuffers {
    fn drop(&mut self) {
        // Safety: allocated in `new` with this layout. The ring that owns
        // these buffers unregisters them before they are dropped.
        unsafe { dealloc(self.entries.as_ptr().cast(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_buffer_is_offered_and_one_given_back_is_offered_again() {
        let mut buffers = ProvidedBuffers::new().unwrap();
        let tail = |b: &ProvidedBuffers| unsafe {
            (*BufRingEntry::tail(b.entries.as_ptr()).cast::<AtomicU16>()).load(Ordering::Acquire)
        };
        assert_eq!(tail(&buffers), COUNT);
        let entry = |b: &ProvidedBuffers, slot: usize| unsafe {
            let e = &*b.entries.as_ptr().add(slot);
            (e.bid(), e.len(), e.addr())
        };
        let first = buffers.data.as_ptr() as u64;
        assert_eq!(
            entry(&buffers, 3),
            (3, SIZE as u32, first + 3 * SIZE as u64)
        );
        // Given back in another order: the next slot names it.
        buffers.give_back(5);
        assert_eq!(tail(&buffers), COUNT.wrapping_add(1));
        assert_eq!(
            entry(&buffers, 0),
            (5, SIZE as u32, first + 5 * SIZE as u64)
        );
        assert_eq!(buffers.bytes(5, 3).map(<[u8]>::len), Some(3));
        assert_eq!(buffers.bytes(COUNT, 1), None);
    }
}
