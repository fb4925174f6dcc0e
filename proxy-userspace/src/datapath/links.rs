//! Pinned program links: the programs stay attached while the agent is
//! stopped or restarting, and a new agent takes the links over by swapping
//! its program into them atomically (`BPF_LINK_UPDATE`), so there is no
//! moment without translation. The socket programs hang on cgroup links,
//! the TC programs on tcx links of the node's devices, the XDP program
//! (`--nodeport-acceleration`) on XDP links of those devices in native
//! (driver) mode.
//!
//! aya 0.14 can pin a link but not update one or read its target, so those
//! calls are made through `sys`.
use std::{fs::File, io, os::fd::AsFd as _, os::unix::fs::MetadataExt as _, path::Path};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode, links::FdLink, tc::TcAttachOptions,
};

use super::{
    programs::SocketProgram,
    sys::{self, LINK_TYPE_CGROUP, LINK_TYPE_TCX},
};

/// What `attach_cgroup` / `attach_tc` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkOutcome {
    /// A new link was made and pinned.
    Attached,
    /// A pinned link on the same target now runs the new program.
    Updated,
    /// A pinned link on another target was dropped and a new one made.
    Moved,
}

/// Attaching, pinning or reading a link failed.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's #[error] message")]
pub enum LinkError {
    /// A program cannot be attached.
    #[error("cannot attach {name} to {target}: {source}")]
    Attach { name: &'static str, target: String, source: ProgramError },
    /// A program known by its fd cannot be linked (`BPF_LINK_CREATE`).
    #[error("cannot attach {name} to {target}: BPF_LINK_CREATE failed: {source}")]
    Create { name: &'static str, target: String, source: io::Error },
    /// A link cannot be made pinnable.
    #[error("cannot turn the link of {name} into a pinnable one: {source}")]
    Convert { name: &'static str, source: aya::programs::links::LinkError },
    /// A link cannot be pinned.
    #[error("cannot pin the link of {name} at {path}: {source}")]
    Pin { name: &'static str, path: String, source: aya::pin::PinError },
    /// A syscall on a pinned link failed.
    #[error("pinned link {path}: {op} failed: {source}")]
    Syscall { path: String, op: &'static str, source: io::Error },
    /// The cgroup cannot be opened.
    #[error("cannot read cgroup {path}: {source}")]
    Cgroup { path: String, source: io::Error },
    /// The device cannot be found.
    #[error("no network device {name}: {source}")]
    Device { name: String, source: io::Error },
    /// The device has no native XDP (`--nodeport-acceleration=native`).
    #[error(
        "device {device} has no native XDP (its driver cannot run XDP programs): XDP is not attached and the TC \
         programs alone serve it; use --nodeport-acceleration=best-effort to make this a warning"
    )]
    NoNativeXdp { device: String },
}

/// `BPF_LINK_TYPE_XDP` of `enum bpf_link_type`.
const LINK_TYPE_XDP: u32 = 6;

/// `BPF_TCX_INGRESS` / `BPF_TCX_EGRESS` of `enum bpf_attach_type`.
const TCX_INGRESS: u64 = 46;
const TCX_EGRESS: u64 = 47;

/// Attaches `program` (loaded) to `cgroup_path` through the link pinned at
/// `pin`: updates it when it is on that cgroup, else makes a new one. By
/// the program's fd alone: the socket programs are attached while the
/// object that holds them still loads the per-packet ones on its thread
/// (`super::programs`).
pub(crate) fn attach_cgroup(program: &SocketProgram, cgroup_path: &Path, pin: &Path) -> Result<LinkOutcome, LinkError> {
    let name = program.name;
    let cgroup_err = |source| LinkError::Cgroup { path: cgroup_path.display().to_string(), source };
    let cgroup_id = std::fs::metadata(cgroup_path).map_err(cgroup_err)?.ino();
    attach_pinned(program.fd.as_fd(), name, (LINK_TYPE_CGROUP, cgroup_id), pin, || {
        let cgroup = File::open(cgroup_path).map_err(cgroup_err)?;
        let link = sys::link_create(program.fd.as_fd(), cgroup.as_fd(), program.attach_type).map_err(|source| {
            LinkError::Create { name, target: format!("cgroup {}", cgroup_path.display()), source }
        })?;
        Ok(NewLink::Fd(link))
    })
}

/// Attaches `program` (loaded) to the ingress or egress of device `device`
/// through a tcx link (kernel 6.6+) pinned at `pin`: updates it when it is
/// on that device and direction, else makes a new one. tcx links run
/// beside other programs on the device (a CNI's), appended after them.
pub(crate) fn attach_tc(
    program: &mut SchedClassifier,
    name: &'static str,
    device: &str,
    direction: TcAttachType,
    pin: &Path,
) -> Result<LinkOutcome, LinkError> {
    let target = format!("{device} {direction:?}");
    let attach_err = |source| LinkError::Attach { name, target: target.clone(), source };
    let ifindex = nix::net::if_::if_nametoindex(device)
        .map_err(|e| LinkError::Device { name: device.to_owned(), source: e.into() })?;
    let attach_type = if direction == TcAttachType::Ingress { TCX_INGRESS } else { TCX_EGRESS };
    let prog = program.fd().map_err(attach_err)?.as_fd().try_clone_to_owned().map_err(|source| LinkError::Syscall {
        path: pin.display().to_string(),
        op: "dup",
        source,
    })?;
    attach_pinned(prog.as_fd(), name, (LINK_TYPE_TCX, u64::from(ifindex) | (attach_type << 32)), pin, || {
        let options = TcAttachOptions::TcxOrder(LinkOrder::default());
        let id = program.attach_with_options(device, direction, options).map_err(attach_err)?;
        let link = program.take_link(id).map_err(attach_err)?;
        FdLink::try_from(link).map(NewLink::Aya).map_err(|source| LinkError::Convert { name, source })
    })
}

/// Attaches `program` (loaded) to device `device` in native (driver) mode
/// through an XDP link pinned at `pin`: updates it when it is on that
/// device, else makes a new one. A device whose driver has no native XDP
/// gives `NoNativeXdp` (never the generic mode, which would be slower than
/// TC alone).
pub(crate) fn attach_xdp(
    program: &mut Xdp,
    name: &'static str,
    device: &str,
    pin: &Path,
) -> Result<LinkOutcome, LinkError> {
    let target = format!("{device} XDP");
    let attach_err = |source| LinkError::Attach { name, target: target.clone(), source };
    let ifindex = nix::net::if_::if_nametoindex(device)
        .map_err(|e| LinkError::Device { name: device.to_owned(), source: e.into() })?;
    let prog = program.fd().map_err(attach_err)?.as_fd().try_clone_to_owned().map_err(|source| LinkError::Syscall {
        path: pin.display().to_string(),
        op: "dup",
        source,
    })?;
    attach_pinned(prog.as_fd(), name, (LINK_TYPE_XDP, u64::from(ifindex)), pin, || {
        let id = program.attach_to_if_index(ifindex, XdpMode::Driver).map_err(|source| {
            if no_native_xdp(&source) {
                LinkError::NoNativeXdp { device: device.to_owned() }
            } else {
                attach_err(source)
            }
        })?;
        let link = program.take_link(id).map_err(attach_err)?;
        FdLink::try_from(link).map(NewLink::Aya).map_err(|source| LinkError::Convert { name, source })
    })
}

/// Whether an XDP attach failed because the driver has no native XDP
/// (the kernel's EOPNOTSUPP: "Underlying driver does not support XDP in
/// native mode").
fn no_native_xdp(err: &ProgramError) -> bool {
    matches!(err, ProgramError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::EOPNOTSUPP))
}

/// The shared part: a pinned link of type and target `wanted` runs `prog`
/// from now on; any other pinned link is dropped and `attach` makes one.
fn attach_pinned(
    prog: std::os::fd::BorrowedFd<'_>,
    name: &'static str,
    wanted: (u32, u64),
    pin: &Path,
    attach: impl FnOnce() -> Result<NewLink, LinkError>,
) -> Result<LinkOutcome, LinkError> {
    let syscall = |op: &'static str| {
        let path = pin.display().to_string();
        move |source| LinkError::Syscall { path, op, source }
    };
    let mut outcome = LinkOutcome::Attached;
    if pin.exists() {
        let link = sys::obj_get(pin).map_err(syscall("BPF_OBJ_GET"))?;
        let info = sys::link_info(link.as_fd()).map_err(syscall("BPF_OBJ_GET_INFO_BY_FD"))?;
        if (info.link_type, info.target) == wanted {
            sys::link_update(link.as_fd(), prog).map_err(syscall("BPF_LINK_UPDATE"))?;
            return Ok(LinkOutcome::Updated);
        }
        // Elsewhere (or a device that is gone): unpinning drops it once our
        // fd closes too.
        std::fs::remove_file(pin).map_err(syscall("unpin"))?;
        outcome = LinkOutcome::Moved;
    }
    match attach()? {
        NewLink::Aya(link) => {
            link.pin(pin).map_err(|source| LinkError::Pin { name, path: pin.display().to_string(), source })?;
        }
        NewLink::Fd(link) => sys::obj_pin(link.as_fd(), pin).map_err(syscall("BPF_OBJ_PIN"))?,
    }
    Ok(outcome)
}

/// A link `attach_pinned`'s caller made: through aya, or by a raw
/// `BPF_LINK_CREATE` (`sys::link_create`).
enum NewLink {
    Aya(FdLink),
    Fd(std::os::fd::OwnedFd),
}

/// What a pinned link is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkTarget {
    /// A cgroup, by id (the inode number of its cgroup2 directory).
    Cgroup(u64),
    /// A device's ingress or egress (tcx).
    Tc {
        /// The device's interface index.
        ifindex: u32,
        /// Ingress (else egress).
        ingress: bool,
    },
    /// A device's XDP hook.
    Xdp {
        /// The device's interface index.
        ifindex: u32,
    },
    /// Another kind of link.
    Other {
        /// The kernel's link type number.
        link_type: u32,
    },
}

/// A pinned link as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedLinkInfo {
    /// The link's id.
    pub link_id: u32,
    /// The attached program's id.
    pub program_id: u32,
    /// What it is attached to.
    pub target: LinkTarget,
}

/// What the link pinned at `pin` is attached to.
pub fn pinned_link_info(pin: &Path) -> io::Result<PinnedLinkInfo> {
    let link = sys::obj_get(pin)?;
    let info = sys::link_info(link.as_fd())?;
    #[expect(clippy::cast_possible_truncation, reason = "the ifindex is the low 32 bits")]
    let target = match info.link_type {
        LINK_TYPE_CGROUP => LinkTarget::Cgroup(info.target),
        LINK_TYPE_TCX => LinkTarget::Tc { ifindex: info.target as u32, ingress: info.target >> 32 == TCX_INGRESS },
        LINK_TYPE_XDP => LinkTarget::Xdp { ifindex: info.target as u32 },
        link_type => LinkTarget::Other { link_type },
    };
    Ok(PinnedLinkInfo { link_id: info.id, program_id: info.prog_id, target })
}
