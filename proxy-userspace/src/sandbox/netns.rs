//! A network namespace made with `ip netns add`, deleted on drop.
use std::{fs::File, io, os::fd::AsFd as _, path::PathBuf};

use nix::sched::{CloneFlags, setns};

use super::sh;

/// A network namespace, deleted on drop.
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `name` (removing a leftover of the same name first) with
    /// loopback up.
    pub fn create(name: &str) -> io::Result<Self> {
        if PathBuf::from(format!("/var/run/netns/{name}")).exists() {
            sh("ip", &["netns", "del", name])?;
        }
        sh("ip", &["netns", "add", name])?;
        let ns = Self { name: name.to_owned() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/NAME`, for `nsenter --net=`.
    #[must_use]
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    /// Runs `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        sh("ip", &full)
    }

    /// Adds `addr` (e.g. `10.244.0.11/32` or `fd00:244::11/128`) to the
    /// namespace's loopback. An IPv6 address is added `nodad`: otherwise it
    /// stays tentative until the kernel's address work runs (loopback skips
    /// duplicate detection, but only from that work), and a server binding
    /// it at once fails with EADDRNOTAVAIL.
    pub fn add_lo_addr(&self, addr: &str) -> io::Result<()> {
        let mut args = vec!["addr", "add", addr, "dev", "lo"];
        if addr.contains(':') {
            args.push("nodad");
        }
        self.ip(&args).map(drop)
    }

    /// Opens the namespace, for `setns`.
    pub(crate) fn open(&self) -> io::Result<File> {
        File::open(self.path())
    }

    /// Runs `f` on a new thread that has entered the namespace (sockets it
    /// makes belong to the namespace for their whole life).
    pub fn run_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let file = self.open()?;
        std::thread::spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("thread in namespace panicked"))?
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(err) = sh("ip", &["netns", "del", &self.name]) {
            eprintln!("cleanup: {err}");
        }
    }
}
