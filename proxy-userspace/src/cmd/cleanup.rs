//! `ebpf-proxy cleanup`: removes the datapath the agent leaves in place.
//! Unpinning the links detaches the programs (translation stops at once);
//! unpinning the maps frees them. The NodePort range the agent reserved
//! in `ip_local_reserved_ports` is taken out again (recorded in the pin
//! directory, `crate::node::port_reservation`): run it in the agent's
//! network namespace (the node's).
use std::{fs, io, path::Path};

use anyhow::Context as _;
use tracing::{info, warn};

use crate::{args::PinDirArgs, node::port_reservation, paths::LINKS_SUBDIR};

/// Runs `ebpf-proxy cleanup`: removes the pinned links and maps.
pub fn run(args: &PinDirArgs) -> anyhow::Result<()> {
    let dir = &args.bpffs_dir;
    if !dir.exists() {
        info!(pin_dir = %dir.display(), "nothing to clean up");
        return Ok(());
    }
    // A failure leaves the record (and so the pin directory) for another
    // try; the programs and maps go anyway.
    let restored = match port_reservation::restore(dir) {
        Ok(Some((old, new))) => {
            info!(old = %old, new = %new, "took the NodePorts the agent reserved out of net.ipv4.ip_local_reserved_ports");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(err) => {
            warn!(%err, "cannot take the NodePorts the agent reserved out of net.ipv4.ip_local_reserved_ports");
            Err(err)
        }
    };
    // Links first, so no program runs against maps that are going away.
    let links = remove_pins(&dir.join(LINKS_SUBDIR))?;
    let mut maps = remove_pins(dir)?;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != port_reservation::RECORD_SUBDIR) {
            maps.extend(remove_pins(&path)?);
            fs::remove_dir(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    restored.with_context(|| format!("programs detached and maps unpinned, but {} stays", dir.display()))?;
    fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    info!(pin_dir = %dir.display(), ?links, ?maps, "cleaned up: programs detached, maps unpinned");
    Ok(())
}

/// Removes every pin (file) in `dir`, then `dir` if it is a subdirectory.
fn remove_pins(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(err) => return Err(err).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            continue;
        }
        fs::remove_file(entry.path()).with_context(|| format!("unpinning {}", entry.path().display()))?;
        removed.push(entry.file_name().to_string_lossy().into_owned());
    }
    if dir.file_name().is_some_and(|n| n == LINKS_SUBDIR) {
        fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    removed.sort();
    Ok(removed)
}
