//! Pinned program links: the socket programs stay attached while the agent
//! is stopped or restarting, and a new agent takes the links over by
//! swapping its program into them atomically (`BPF_LINK_UPDATE`), so there
//! is no moment without translation.
//!
//! aya 0.14 can pin a link but not update one or read a link's cgroup, so
//! those three bpf(2) calls are made here, in thin helpers.
use std::{fs::File, io, os::fd::AsFd as _, os::unix::fs::MetadataExt as _, path::Path};

use aya::programs::{CgroupAttachMode, CgroupSockAddr, ProgramError, links::FdLink};

/// What `attach_pinned` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOutcome {
    /// A new link was made and pinned.
    Attached,
    /// A pinned link on the same cgroup now runs the new program.
    Updated,
    /// A pinned link on another cgroup was dropped and a new one made.
    Moved,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot attach {name} to cgroup {cgroup}: {source}")]
    Attach { name: &'static str, cgroup: String, source: ProgramError },
    #[error("cannot turn the link of {name} into a pinnable one: {source}")]
    Convert { name: &'static str, source: aya::programs::links::LinkError },
    #[error("cannot pin the link of {name} at {path}: {source}")]
    Pin { name: &'static str, path: String, source: aya::pin::PinError },
    #[error("pinned link {path}: {op} failed: {source}")]
    Syscall { path: String, op: &'static str, source: io::Error },
    #[error("cannot read cgroup {path}: {source}")]
    Cgroup { path: String, source: io::Error },
}

/// Attaches `program` (loaded) to `cgroup` through the link pinned at
/// `pin`: updates it when it is on that cgroup, else makes a new one.
pub fn attach_pinned(
    program: &mut CgroupSockAddr,
    name: &'static str,
    cgroup_path: &Path,
    pin: &Path,
) -> Result<LinkOutcome, LinkError> {
    let syscall = |op: &'static str| {
        let path = pin.display().to_string();
        move |source| LinkError::Syscall { path, op, source }
    };
    let cgroup_id = std::fs::metadata(cgroup_path)
        .map_err(|source| LinkError::Cgroup { path: cgroup_path.display().to_string(), source })?
        .ino();
    let mut outcome = LinkOutcome::Attached;
    if pin.exists() {
        let link = sys::obj_get(pin).map_err(syscall("BPF_OBJ_GET"))?;
        if sys::link_info(link.as_fd()).map_err(syscall("BPF_OBJ_GET_INFO_BY_FD"))?.2 == cgroup_id {
            let prog = program.fd().map_err(|source| LinkError::Attach {
                name,
                cgroup: cgroup_path.display().to_string(),
                source,
            })?;
            sys::link_update(link.as_fd(), prog.as_fd()).map_err(syscall("BPF_LINK_UPDATE"))?;
            return Ok(LinkOutcome::Updated);
        }
        // On another cgroup: unpinning drops it once our fd closes too.
        std::fs::remove_file(pin).map_err(syscall("unpin"))?;
        outcome = LinkOutcome::Moved;
    }
    let attach_err = |source| LinkError::Attach { name, cgroup: cgroup_path.display().to_string(), source };
    let cgroup = File::open(cgroup_path)
        .map_err(|source| LinkError::Cgroup { path: cgroup_path.display().to_string(), source })?;
    // Through a bpf_link (kernel 5.7+) the kernel takes no attach flags, and
    // links always coexist with other programs on the cgroup (a CNI's, say):
    // `Single` is what passes flags 0.
    let id = program.attach(&cgroup, CgroupAttachMode::Single).map_err(attach_err)?;
    let link = program.take_link(id).map_err(attach_err)?;
    let link = FdLink::try_from(link).map_err(|source| LinkError::Convert { name, source })?;
    link.pin(pin).map_err(|source| LinkError::Pin { name, path: pin.display().to_string(), source })?;
    Ok(outcome)
}

/// A pinned link as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedLinkInfo {
    pub link_id: u32,
    pub program_id: u32,
    /// The cgroup's id (the inode number of its cgroup2 directory).
    pub cgroup_id: u64,
}

/// What the link pinned at `pin` is attached to.
pub fn pinned_link_info(pin: &Path) -> io::Result<PinnedLinkInfo> {
    let link = sys::obj_get(pin)?;
    let (link_id, program_id, cgroup_id) = sys::link_info(link.as_fd())?;
    Ok(PinnedLinkInfo { link_id, program_id, cgroup_id })
}

/// Raw bpf(2) calls aya does not expose. Numbers and layouts are those of
/// `union bpf_attr` and `struct bpf_link_info` in linux/bpf.h.
mod sys {
    use std::{
        ffi::CString,
        io,
        os::{
            fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
            unix::ffi::OsStrExt as _,
        },
        path::Path,
    };

    const BPF_OBJ_GET: libc::c_long = 7;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_LINK_UPDATE: libc::c_long = 29;

    /// bpf(cmd, attr, size): the only `unsafe` of this module.
    fn bpf(cmd: libc::c_long, attr: &mut [u64; 4]) -> io::Result<libc::c_long> {
        // SAFETY: `attr` is a zeroed, 8-byte aligned buffer of the size
        // passed, laid out as the command's part of `union bpf_attr`; the
        // pointers stored in it outlive the call.
        let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of_val(attr)) };
        if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
    }

    fn fd_u64(fd: BorrowedFd<'_>) -> u64 {
        u64::from(u32::try_from(fd.as_raw_fd()).expect("fds are non-negative"))
    }

    /// Opens a pinned object.
    pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
        let path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // { __aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags; ... }
        let mut attr = [path.as_ptr() as u64, 0, 0, 0];
        let fd = bpf(BPF_OBJ_GET, &mut attr)?;
        let fd = i32::try_from(fd).map_err(io::Error::other)?;
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// (link id, program id, cgroup id) of a cgroup link.
    pub fn link_info(link: BorrowedFd<'_>) -> io::Result<(u32, u32, u64)> {
        // struct bpf_link_info { u32 type, id, prog_id; union { struct {
        // u64 cgroup_id; u32 attach_type; } cgroup; ... } } — id at byte 4,
        // prog_id at 8, cgroup_id at 16.
        let mut info = [0u64; 8];
        let info_len = size_of_val(&info) as u64;
        // { __u32 bpf_fd; __u32 info_len; __aligned_u64 info; }
        let mut attr = [fd_u64(link) | (info_len << 32), info.as_mut_ptr() as u64, 0, 0];
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        #[expect(clippy::cast_possible_truncation, reason = "two u32 fields packed in one u64")]
        let (id, prog_id) = ((info[0] >> 32) as u32, info[1] as u32);
        Ok((id, prog_id, info[2]))
    }

    /// Makes `link` run `prog` instead of its current program, atomically.
    pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
        // { __u32 link_fd; __u32 new_prog_fd; __u32 flags; __u32 old_prog_fd; }
        let mut attr = [fd_u64(link) | (fd_u64(prog) << 32), 0, 0, 0];
        bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
    }
}
