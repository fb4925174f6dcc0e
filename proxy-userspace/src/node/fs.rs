//! bpffs and cgroup2: finding them, and mounting them when missing.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use nix::{
    mount::{MsFlags, mount},
    sys::statfs::{CGROUP2_SUPER_MAGIC, FsType, statfs},
};

use crate::paths::{BPFFS_ROOT, MOUNTS, OWN_CGROUP2_MOUNT};

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: FsType = FsType(0xcafe_4a11);

#[derive(Debug, thiserror::Error)]
pub(crate) enum FsError {
    #[error(
        "{path} is not on a bpf filesystem; mount one there with `mount -t bpf bpf {path}` or pick another --bpffs-dir"
    )]
    NotBpffs { path: String },
    #[error("{path} is not a cgroup v2 directory; pass a directory of the cgroup2 hierarchy (see /proc/self/mounts)")]
    NotCgroup2 { path: String },
    #[error("cannot mount {fstype} at {path}: {source}")]
    Mount { fstype: &'static str, path: String, source: nix::Error },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: String, source: io::Error },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FsError {
    let path = path.display().to_string();
    move |source| FsError::Io { what, path, source }
}

fn fs_type(path: &Path) -> Option<FsType> {
    statfs(path).ok().map(|s| s.filesystem_type())
}

/// Makes sure `dir` exists on a bpffs. When `dir` lies under `/sys/fs/bpf`
/// and nothing is mounted there, bpffs is mounted at `/sys/fs/bpf`.
pub(crate) fn ensure_bpffs_dir(dir: &Path) -> Result<(), FsError> {
    let root = Path::new(BPFFS_ROOT);
    if dir.starts_with(root) && fs_type(root) != Some(BPF_FS_MAGIC) {
        fs::create_dir_all(root).map_err(io_err("cannot create", root))?;
        mount(Some("bpf"), root, Some("bpf"), MsFlags::empty(), None::<&str>).map_err(|source| FsError::Mount {
            fstype: "bpf",
            path: BPFFS_ROOT.into(),
            source,
        })?;
        tracing::info!(path = BPFFS_ROOT, "mounted bpffs");
    }
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(root);
    if fs_type(existing) != Some(BPF_FS_MAGIC) {
        return Err(FsError::NotBpffs { path: dir.display().to_string() });
    }
    fs::create_dir_all(dir).map_err(io_err("cannot create", dir))
}

/// The root of the cgroup2 hierarchy: the first cgroup2 mount, or one the
/// agent mounts at `/run/ebpf-proxy/cgroup2` when there is none.
pub(crate) fn cgroup2_root() -> Result<PathBuf, FsError> {
    let mounts = fs::read_to_string(MOUNTS).map_err(io_err("cannot read", Path::new(MOUNTS)))?;
    if let Some(path) = mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, path, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(path))
    }) {
        return Ok(path);
    }
    let path = Path::new(OWN_CGROUP2_MOUNT);
    fs::create_dir_all(path).map_err(io_err("cannot create", path))?;
    mount(Some("cgroup2"), path, Some("cgroup2"), MsFlags::empty(), None::<&str>).map_err(|source| FsError::Mount {
        fstype: "cgroup2",
        path: OWN_CGROUP2_MOUNT.into(),
        source,
    })?;
    tracing::info!(path = OWN_CGROUP2_MOUNT, "no cgroup2 was mounted; mounted one");
    Ok(path.to_owned())
}

/// Checks that `path` is a directory of a cgroup2 hierarchy.
pub(crate) fn check_cgroup2(path: &Path) -> Result<(), FsError> {
    if fs_type(path) == Some(CGROUP2_SUPER_MAGIC) {
        Ok(())
    } else {
        Err(FsError::NotCgroup2 { path: path.display().to_string() })
    }
}
