//! The agent's allocator: jemalloc, set up to hand freed memory back to
//! the kernel as soon as it is free.
//!
//! A first sync or a relist at 10,000 services allocates and frees tens of
//! megabytes (list pages, API objects being made compact, the whole-table
//! comparison) while the objects that live on are being made. glibc's
//! malloc keeps what is freed between live objects in its heap, where
//! `malloc_trim` can return only whole free pages: after a relist 55 MiB
//! stayed free but scattered in 82,000 pieces, and the resident size stayed
//! ~45 MiB above the steady one for good. jemalloc groups objects by size
//! in page runs and returns a run's pages once they are free: measured with
//! the control plane benchmark at 10,000 services (README, Performance),
//! 94 MiB after the changes against 118 MiB with glibc (one heap, a fixed
//! mmap threshold), 114-117 MiB at the relist's peak against 171 MiB, and
//! 98-99 MiB after it against 162-165 MiB. tikv-jemallocator is the
//! maintained binding (TiKV's), with jemalloc's symbols prefixed so C code
//! keeps glibc's malloc.

/// jemalloc's settings (its `malloc_conf`, read at its first allocation):
/// one arena, as the agent does little allocation in parallel (glibc's one
/// heap measured the same way: objects of one list spread over several
/// arenas cannot be returned together); one background thread; freed
/// pages returned at once (`dirty_decay_ms:0`) rather than a second later,
/// and not through the lazy `MADV_FREE` stage (`muzzy_decay_ms:0`), so
/// the resident size drops when the memory is free, not when the kernel
/// runs short. A decay of one second kept what the first sync frees while
/// it runs (list pages, translation scratch) resident on top of what it
/// builds: the start's peak was 4-6 MiB higher at 10,000 services (README,
/// Performance), the steady size the same.
pub const JEMALLOC_CONF: &[u8; 92] =
    b"narenas:1,background_thread:true,max_background_threads:1,dirty_decay_ms:0,muzzy_decay_ms:0\0";
