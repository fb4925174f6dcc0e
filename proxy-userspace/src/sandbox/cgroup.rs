//! A cgroup v2 child made for a test, removed on drop.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

/// A cgroup v2 child, removed on drop.
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// Creates `NAME` under the cgroup2 root.
    pub fn create(name: &str) -> io::Result<Self> {
        let root = crate::node::fs::cgroup2_root().map_err(io::Error::other)?;
        let path = root.join(name);
        if path.exists() {
            remove(&path);
        }
        fs::create_dir(&path)?;
        Ok(Self { path })
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

/// Kills what is left in the cgroup, then removes it.
fn remove(path: &Path) {
    let _ = fs::write(path.join("cgroup.kill"), "1");
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
