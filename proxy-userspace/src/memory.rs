//! Handing freed memory back to the kernel.
//!
//! A first sync or a relist at 10,000 services allocates and frees tens of
//! megabytes (list pages, API objects being made compact, the whole-table
//! comparison); glibc keeps freed memory in its heaps, so without this the
//! agent's resident size stays at that peak for good.

/// Sets up glibc's allocator for the agent: one malloc heap, and a fixed
/// threshold above which allocations get their own mapping. Must run
/// before any thread is started.
///
/// One heap (glibc's `M_ARENA_MAX` = 1): glibc gives each thread that
/// contends for the lock a heap (arena) of its own: the watch tasks on the
/// runtime's workers then spread the objects of a list over several heaps,
/// where freed memory stays scattered and cannot be handed back. Measured
/// with the control plane benchmark at 10,000 services (README,
/// Performance): the steady resident size 155-159 MiB with glibc's default,
/// 133 MiB with one heap, and the peak during a relist 224 MiB against
/// 194 MiB. The agent does little allocation in parallel, so the shared
/// lock costs nothing measurable (the same run's change latencies did not
/// move).
///
/// A fixed mmap threshold (`M_MMAP_THRESHOLD`, [`MMAP_THRESHOLD`]): glibc's
/// threshold starts at 128 KiB but rises to the size of every mapped block
/// freed, up to 32 MiB, so after the first list the big buffers (list
/// pages, the tables' arrays, a whole-table comparison) are carved from the
/// heap, where what lives after them keeps the heap from shrinking. Fixed,
/// they are mapped and unmapped whole: the same benchmark measured 118 MiB
/// against 120-125 MiB after the changes and 162-164 MiB against 168 MiB
/// after a relist.
pub fn configure_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets parameters of the allocator; called before
    // any other thread exists, nothing allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Allocations of this size or more get a mapping of their own, returned
/// to the kernel when freed (glibc's initial threshold, kept fixed).
pub const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Returns the free memory of every malloc heap to the kernel; how much
/// the resident size shrank, and how much of the heap is in use and free
/// (glibc's `mallinfo2`), is logged at debug level.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let before = resident_kib();
        // SAFETY: malloc_trim only walks and trims the allocator's own
        // heaps; it is safe to call at any time from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let info = unsafe { libc::mallinfo2() };
        tracing::debug!(
            before_kib = before,
            after_kib = resident_kib(),
            heap_in_use_kib = info.uordblks / 1024,
            heap_free_kib = info.fordblks / 1024,
            mapped_kib = info.hblkhd / 1024,
            "returned free heap memory to the kernel"
        );
    }
}

/// This process's resident size, KiB (0 when unknown).
#[must_use]
pub fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        })
        .unwrap_or(0)
}
