//! A private bpffs instance mounted on a temporary directory: pins made in
//! it vanish with the unmount, and /sys/fs/bpf is never touched.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// A private bpffs mount, unmounted on drop.
pub struct BpfFs {
    path: PathBuf,
}

impl BpfFs {
    /// Mounts a new bpffs at `path` (created if missing).
    /// A bpffs already mounted there (left by a killed run) is unmounted
    /// first.
    pub(crate) fn mount_at(path: &Path) -> io::Result<Self> {
        fs::create_dir_all(path)?;
        while nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 == 0xcafe_4a11) {
            umount2(path, MntFlags::MNT_DETACH).map_err(io::Error::from)?;
        }
        mount(Some("bpf"), path, Some("bpf"), MsFlags::empty(), None::<&str>).map_err(io::Error::from)?;
        Ok(Self { path: path.to_owned() })
    }

    /// Mounts a new bpffs on a fresh directory under the system temp dir.
    pub fn mount_temp(name: &str) -> io::Result<Self> {
        Self::mount_at(&std::env::temp_dir().join(name))
    }

    /// Where it is mounted.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        if let Err(err) = umount2(&self.path, MntFlags::MNT_DETACH) {
            eprintln!("cleanup: cannot unmount {}: {err}", self.path.display());
        }
        let _ = fs::remove_dir(&self.path);
    }
}
