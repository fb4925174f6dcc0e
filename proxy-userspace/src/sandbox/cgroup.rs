//! A cgroup child made for a test, removed on drop: a v2 child for the
//! programs to attach to, or one that limits the memory of what runs in it.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

/// A cgroup child, removed on drop.
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// Creates `NAME` under the cgroup2 root.
    pub fn create(name: &str) -> io::Result<Self> {
        Self::make(crate::node::fs::cgroup2_root().map_err(io::Error::other)?.join(name))
    }

    /// Makes the cgroup at `path`, anew (a leftover there is removed).
    fn make(path: PathBuf) -> io::Result<Self> {
        if path.exists() {
            remove(&path);
        }
        fs::create_dir(&path)?;
        Ok(Self { path })
    }

    /// `NAME`, a child of the cgroup that holds this process's memory
    /// controller, whose processes may use `limit` bytes: in the v1 memory
    /// hierarchy on a host that keeps the controller there (a hybrid host),
    /// else under the cgroup2 root when the root hands the controller down.
    /// For a process that reads its cgroup's limit (the agent's `CT`
    /// sized from memory, src/node/memory.rs). Only moving a process in
    /// (`spawn_in`) applies to it: it is no place to attach programs.
    pub fn with_memory_limit(name: &str, limit: u64) -> io::Result<Self> {
        let mounts = fs::read_to_string(crate::paths::MOUNTS)?;
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let v1 = crate::node::memory::limit_files(&mounts, &own)
            .into_iter()
            .find(|f| f.ends_with("memory.limit_in_bytes"))
            .and_then(|f| f.parent().map(Path::to_owned));
        let (parent, file) = if let Some(dir) = v1 {
            (dir, "memory.limit_in_bytes")
        } else {
            let root = crate::node::fs::cgroup2_root().map_err(io::Error::other)?;
            let handed = fs::read_to_string(root.join("cgroup.subtree_control"))?;
            if !handed.split_whitespace().any(|c| c == "memory") {
                return Err(io::Error::other(
                    "no memory controller to limit a test's process with: neither a v1 memory hierarchy \
                     nor `memory` in the cgroup2 root's cgroup.subtree_control",
                ));
            }
            (root, "memory.max")
        };
        let cgroup = Self::make(parent.join(name))?;
        fs::write(cgroup.path.join(file), limit.to_string())?;
        Ok(cgroup)
    }

    /// Its directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs`, written to move a process in.
    #[must_use]
    pub(crate) fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }
}

/// Kills what is left in the cgroup (processes a test moved in), then
/// removes it. A v1 cgroup has no `cgroup.kill`: its processes are killed
/// one by one.
fn remove(path: &Path) {
    if fs::write(path.join("cgroup.kill"), "1").is_err() {
        for pid in fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default().lines() {
            if let Ok(pid) = pid.trim().parse() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
    for _ in 0..100 {
        match fs::remove_dir(path) {
            Ok(()) => return,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    eprintln!("cleanup: cannot remove cgroup {}", path.display());
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove(&self.path);
    }
}
