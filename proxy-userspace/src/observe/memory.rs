//! The agent's allocator: jemalloc, set up to hand freed memory back to
//! the kernel as soon as it is free.
//!
//! A first sync or a relist at 10,000 services allocates and frees tens of
//! megabytes (list pages, API objects being made compact, the whole-table
//! comparison) while the objects that live on are being made. glibc's
//! malloc keeps what is freed between live objects in its heap, where
//! `malloc_trim` can return only whole free pages: after a relist the freed
//! memory stays scattered in small pieces between live objects, and the
//! resident size stays above the steady one for good. jemalloc groups
//! objects by size in page runs and returns a run's pages once they are
//! free, so a relist leaves little behind (the control plane benchmark's
//! RSS after a relist, docs/performance.md). tikv-jemallocator is the
//! maintained binding (TiKV's), with jemalloc's symbols prefixed so C code
//! keeps glibc's malloc.

/// jemalloc's settings (its `malloc_conf`, read at its first allocation):
/// one arena, as the agent does little allocation in parallel (objects of
/// one list spread over several arenas cannot be returned together); one
/// background thread; freed
/// pages not sent through the lazy `MADV_FREE` stage (`muzzy_decay_ms:0`),
/// so the resident size drops when the memory is free, not when the kernel
/// runs short.
///
/// Freed pages are kept for a tenth of a second (`dirty_decay_ms:100`)
/// only until the initial lists are in, then returned at once (`settle`).
/// The lists pass every page of JSON through freshly allocated buffers:
/// returning each as soon as it was freed had the next one fault its pages
/// in again and flush the other core's TLB, which made the lists slower. A
/// tenth of a second is enough to reuse them (longer keeps more resident
/// for no gain); the cost is a higher resident size while the lists
/// arrive. Not kept through the first sync: what the translation and the
/// write free would stay resident beside what they build, at the start's
/// peak.
pub const JEMALLOC_CONF: &[u8; 94] =
    b"narenas:1,background_thread:true,max_background_threads:1,dirty_decay_ms:100,muzzy_decay_ms:0\0";

/// jemalloc refused a setting or command.
#[derive(Debug, thiserror::Error)]
#[error("jemalloc's {name} failed (mallctl returned {code}); freed memory is returned to the kernel a moment late")]
pub(crate) struct ControlError {
    name: String,
    code: i32,
}

/// From now on freed pages go back to the kernel at once, in every arena
/// there is and in those made later; what is kept now is returned. Called
/// once the initial lists are in (see `JEMALLOC_CONF`). (jemalloc's arena
/// for huge allocations purges at once from the start.)
///
/// # Errors
///
/// When jemalloc refuses the setting (it does not, unless built without
/// its control interface).
pub(crate) fn settle() -> Result<(), ControlError> {
    // Arenas made from now on.
    let made_later = control::<(), isize>(c"arenas.dirty_decay_ms", None, Some(0));
    // Each arena index there can be; an index never initialised answers
    // EFAULT. (`arena.4096`, jemalloc's "all arenas", is not one for this
    // setting: it read past jemalloc's table of arenas.)
    let mut narenas: u32 = 0;
    control::<u32, ()>(c"arenas.narenas", Some(&mut narenas), None)?;
    for i in 0..narenas {
        let name = std::ffi::CString::new(format!("arena.{i}.dirty_decay_ms")).expect("no NUL");
        match control::<(), isize>(&name, None, Some(0)) {
            Err(e) if e.code == libc::EFAULT => {}
            other => other?,
        }
    }
    made_later
}

/// Returns to the kernel now the pages freed and kept (see
/// `JEMALLOC_CONF`): after something large is freed while they are kept
/// (a restart's read-back of the pinned maps), so that it does not add
/// to the lists' peak.
///
/// # Errors
///
/// When jemalloc refuses (it does not, unless built without its control
/// interface).
pub(crate) fn purge() -> Result<(), ControlError> {
    // `MALLCTL_ARENAS_ALL`, 4096: every arena, as this command takes it.
    control::<(), ()>(c"arena.4096.purge", None, None)
}

/// jemalloc's `mallctl`: reads setting `name` into `read` and/or writes
/// `write` to it (a command takes neither). `R` and `W` must be the
/// setting's type.
fn control<R, W>(name: &std::ffi::CStr, read: Option<&mut R>, write: Option<W>) -> Result<(), ControlError> {
    let mut read_len = size_of::<R>();
    let (old, old_len) = match read {
        Some(r) => (std::ptr::from_mut(r).cast(), &raw mut read_len),
        None => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    let mut write = write;
    let (new, new_len) = match write.as_mut() {
        Some(w) => (std::ptr::from_mut(w).cast(), size_of::<W>()),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `name` is NUL-terminated; each pointer is null or points at
    // a live value of the setting's type with its size beside it (the
    // callers pass the type jemalloc documents for the name).
    let code = unsafe { tikv_jemalloc_sys::mallctl(name.as_ptr(), old, old_len, new, new_len) };
    if code == 0 { Ok(()) } else { Err(ControlError { name: name.to_string_lossy().into_owned(), code }) }
}

#[cfg(test)]
mod tests {
    use super::control;

    fn decay(name: &std::ffi::CStr) -> isize {
        let mut value: isize = -2;
        control::<isize, ()>(name, Some(&mut value), None).unwrap();
        value
    }

    #[test]
    fn settling_returns_freed_pages_at_once_in_every_arena() {
        // The test binary's jemalloc runs with its defaults (10 s, and an
        // arena per CPU, made as used), not the agent's settings.
        assert_ne!(decay(c"arenas.dirty_decay_ms"), 0);
        super::settle().unwrap();
        assert_eq!(decay(c"arenas.dirty_decay_ms"), 0, "arenas made later");
        assert_eq!(decay(c"arena.0.dirty_decay_ms"), 0, "the first arena");
    }

    #[test]
    fn purging_is_a_command_jemalloc_knows() {
        super::purge().unwrap();
    }
}
