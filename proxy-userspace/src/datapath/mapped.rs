//! A BPF array of `u64` mapped into the agent's memory (an array made
//! with `BPF_F_MMAPABLE`): its counters are read and zeroed with plain
//! memory accesses, no system call per counter, however many CPUs the
//! counters are kept for (`super::counters`). The `unsafe` of the mapping
//! is here and nowhere else.
use std::{io, num::NonZeroUsize, os::fd::AsFd, ptr::NonNull, sync::atomic::AtomicU64};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

pub struct MappedU64s {
    start: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, accessed only through
// atomics (`as_slice`); it stays valid until `drop`, whichever thread
// holds it.
unsafe impl Send for MappedU64s {}
// SAFETY: as above: shared access goes through `AtomicU64`.
unsafe impl Sync for MappedU64s {}

impl MappedU64s {
    /// Maps the first `len` values of the array `map` (of 8-byte values,
    /// made mmapable), read and write, shared with the kernel.
    pub fn map(map: impl AsFd, len: usize) -> io::Result<Self> {
        let bytes = len.checked_mul(size_of::<u64>()).and_then(NonZeroUsize::new);
        let bytes = bytes.ok_or_else(|| io::Error::other(format!("cannot map {len} counters")))?;
        // SAFETY: a new mapping chosen by the kernel (no address given), of
        // the array's values, which the kernel keeps for as long as the
        // mapping lives; nothing else in this process aliases it.
        let start =
            unsafe { mmap(None, bytes, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, map, 0) }?;
        Ok(Self { start: start.cast(), len })
    }

    /// The counters. The programs write them as the agent reads: hence
    /// atomics (an `AtomicU64` has the layout of a `u64`).
    #[must_use]
    pub fn as_slice(&self) -> &[AtomicU64] {
        // SAFETY: `start` is the start of a live mapping of `len` 8-byte
        // values (page aligned), accessed only through atomics.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl Drop for MappedU64s {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length, unmapped once;
        // no slice of it outlives `self`.
        if let Err(err) = unsafe { munmap(self.start.cast(), self.len * size_of::<u64>()) } {
            tracing::warn!(%err, "cannot unmap the connection counters");
        }
    }
}
