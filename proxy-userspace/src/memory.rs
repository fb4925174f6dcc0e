//! Handing freed memory back to the kernel.
//!
//! A first sync or a relist at 10,000 services allocates and frees tens of
//! megabytes (list pages, API objects being made compact, the whole-table
//! comparison); glibc keeps freed memory in its heaps, so without this the
//! agent's resident size stays at that peak for good.

/// Makes every thread allocate from one malloc heap (glibc's
/// `M_ARENA_MAX` = 1). glibc gives each thread that contends for the lock a
/// heap (arena) of its own: the watch tasks on the runtime's workers then
/// spread the objects of a list over several heaps, where freed memory
/// stays scattered and cannot be handed back. Measured with the control
/// plane benchmark at 10,000 services (README, Performance): the steady
/// resident size 155-159 MiB with glibc's default, 133 MiB with one heap,
/// and the peak during a relist 224 MiB against 194 MiB. The agent does
/// little allocation in parallel, so the shared lock costs nothing
/// measurable (the same run's change latencies did not move). Must run
/// before any thread is started.
pub fn use_one_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator; called before
    // any other thread exists, nothing allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the free memory of every malloc heap to the kernel; how much
/// the resident size shrank is logged at debug level.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let before = resident_kib();
        // SAFETY: malloc_trim only walks and trims the allocator's own
        // heaps; it is safe to call at any time from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
        tracing::debug!(before_kib = before, after_kib = resident_kib(), "returned free heap memory to the kernel");
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
