//! Keeping the NodePort range out of the node's ephemeral ports
//! (`--node-port-range`): at start the agent adds it to
//! `net.ipv4.ip_local_reserved_ports` of its network namespace when it
//! overlaps `net.ipv4.ip_local_port_range`, so no connection the node
//! opens takes a NodePort as its local port (the reply would arrive at the
//! NodePort); `ebpf-proxy cleanup` takes out again what the agent added.
//! The lists are `crate::node::reserved_ports`'s.
//!
//! Where the old value is kept: as the ports the agent added, one empty
//! directory per range named after it (`30000-32767`), under
//! `<pin dir>/reserved-ports/`. The pin directory is the agent's one
//! piece of state that outlives it: `ebpf-proxy cleanup` already takes
//! it (`--bpffs-dir`), it is per agent (a node's tests run one per
//! network namespace, each with its own), the DaemonSet keeps it across
//! pod restarts (a hostPath), and it goes at a reboot exactly when the
//! sysctl returns to the kernel's default. bpffs holds no regular file,
//! but it holds directories, and the name says it all. `/run/ebpf-proxy`
//! would be lost with the container's filesystem at a pod restart, and
//! the next start would take the reserved range for the operator's.
//! Recording what was added (the NodePorts that were not reserved),
//! rather than the old text, means cleanup removes only those ports:
//! an entry the operator had before is never in the record, and one they
//! add meanwhile outside the range stays.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use super::reserved_ports::{self, PortRange, Ports};

/// The reserved ports of the agent's network namespace.
const RESERVED: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
/// The ephemeral ports of the agent's network namespace.
const EPHEMERAL: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// The pin directory's subdirectory that records the ports the agent
/// reserved, one empty directory per range.
pub(crate) const RECORD_SUBDIR: &str = "reserved-ports";

/// What `reserve` did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reserved {
    /// The ranges do not overlap, or the NodePorts are reserved already.
    Unchanged { ephemeral: PortRange, reserved: Ports },
    /// The sysctl was `old` and is `new`.
    Changed { old: Ports, new: Ports },
}

/// A failure to read or write the sysctls or the record.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub(crate) struct Error {
    what: &'static str,
    path: PathBuf,
    source: io::Error,
}

fn error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error { what, path, source }
}

fn invalid(text: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, text)
}

fn read_ports(path: &Path) -> Result<Ports, Error> {
    let text = fs::read_to_string(path).map_err(error("reading", path))?;
    Ports::parse(&text).map_err(invalid).map_err(error("reading", path))
}

fn write_ports(path: &Path, ports: &Ports) -> Result<(), Error> {
    // A newline alone clears the list (the kernel ignores an empty write).
    fs::write(path, format!("{ports}\n")).map_err(error("writing", path))
}

/// Adds `node_ports` to the reserved ports when they overlap the
/// ephemeral ones and are not all reserved, recording under `pin_dir`
/// what was added first (so cleanup can take out exactly that).
///
/// # Errors
///
/// When a sysctl cannot be read or written, or the record cannot be
/// made; the sysctl is then as it was.
pub(crate) fn reserve(node_ports: PortRange, pin_dir: &Path) -> Result<Reserved, Error> {
    let ephemeral = fs::read_to_string(EPHEMERAL).map_err(error("reading", Path::new(EPHEMERAL)))?;
    let ephemeral =
        reserved_ports::parse_ephemeral(&ephemeral).map_err(invalid).map_err(error("reading", Path::new(EPHEMERAL)))?;
    let old = read_ports(Path::new(RESERVED))?;
    let Some(new) = reserved_ports::reserve(node_ports, ephemeral, &old) else {
        return Ok(Reserved::Unchanged { ephemeral, reserved: old });
    };
    let made = record(pin_dir, &new.minus(&old))?;
    if let Err(err) = write_ports(Path::new(RESERVED), &new) {
        for dir in made.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
        return Err(err);
    }
    Ok(Reserved::Changed { old, new })
}

/// Makes the record's directory for each range of `added` (one already
/// there is kept); returns the directories it made.
fn record(pin_dir: &Path, added: &Ports) -> Result<Vec<PathBuf>, Error> {
    let dir = pin_dir.join(RECORD_SUBDIR);
    let mut made = Vec::new();
    for path in std::iter::once(dir.clone()).chain(added.ranges().iter().map(|r| dir.join(r.to_string()))) {
        match fs::create_dir(&path) {
            Ok(()) => made.push(path),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => {
                for dir in made.iter().rev() {
                    let _ = fs::remove_dir(dir);
                }
                return Err(error("recording the reserved ports in", &path)(err));
            }
        }
    }
    Ok(made)
}

/// The ports recorded under `pin_dir` (none if there is no record).
fn recorded(pin_dir: &Path) -> Result<Ports, Error> {
    let dir = pin_dir.join(RECORD_SUBDIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Ports::default()),
        Err(err) => return Err(error("reading", &dir)(err)),
    };
    let mut ports = Ports::default();
    for entry in entries {
        let entry = entry.map_err(error("reading", &dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let one = Ports::parse(&name).map_err(invalid).map_err(error("reading", &entry.path()))?;
        ports = ports.union(&one);
    }
    Ok(ports)
}

/// `ebpf-proxy cleanup`: takes the ports recorded under `pin_dir` out of
/// the reserved ports, then removes the record. `None`: no record
/// (nothing was added); else the sysctl's (old, new) value.
///
/// # Errors
///
/// When the record or the sysctl cannot be read or written; the record
/// then stays, for another try.
pub(crate) fn restore(pin_dir: &Path) -> Result<Option<(Ports, Ports)>, Error> {
    let dir = pin_dir.join(RECORD_SUBDIR);
    if !dir.exists() {
        return Ok(None);
    }
    let added = recorded(pin_dir)?;
    let current = read_ports(Path::new(RESERVED))?;
    let restored = current.minus(&added);
    if restored != current {
        write_ports(Path::new(RESERVED), &restored)?;
    }
    fs::remove_dir_all(&dir).map_err(error("removing", &dir))?;
    Ok(Some((current, restored)))
}
