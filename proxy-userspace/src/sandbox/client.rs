//! Clients run as child processes that join the test's cgroup (optionally)
//! and enter its network namespace between fork and exec, so the programs
//! attached to the cgroup see their sockets and their traffic stays in the
//! namespace.
use std::{
    fs::{File, OpenOptions},
    io,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    process::Command,
};

use super::{NetNs, TestCgroup};

/// A command prepared to run inside a namespace (and cgroup).
pub type ClientCommand = Command;

/// `program` set up to run inside `ns`, and inside `cgroup` when given.
pub fn spawn_in(ns: &NetNs, cgroup: Option<&TestCgroup>, program: &str) -> io::Result<ClientCommand> {
    let netns: File = ns.open()?;
    let procs: Option<File> = cgroup.map(|c| OpenOptions::new().write(true).open(c.procs_file())).transpose()?;
    let mut cmd = Command::new(program);
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes async-signal-safe syscalls (write, setns) on fds opened above.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(procs) = &procs {
                // "0" moves the writing process.
                if libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}
