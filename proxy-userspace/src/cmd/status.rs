//! `ebpf-proxy status`: the datapath left in the kernel, from the pins
//! (the agent need not be running).
use std::fmt::Write as _;

use anyhow::Context as _;

use crate::{
    args::PinDirArgs,
    datapath::{KernelMaps, ServiceMaps as _, inspect, links},
    paths::LINKS_SUBDIR,
};

pub fn run(args: &PinDirArgs) -> anyhow::Result<()> {
    print!("{}", report(&args.bpffs_dir)?);
    Ok(())
}

/// The status text for the pin directory `dir`.
pub fn report(dir: &std::path::Path) -> anyhow::Result<String> {
    let mut out = String::new();
    if !dir.exists() {
        writeln!(out, "no datapath: nothing is pinned in {}", dir.display())?;
        return Ok(out);
    }
    writeln!(out, "pin directory: {}", dir.display())?;
    writeln!(out, "programs (attached through pinned links):")?;
    let mut names: Vec<_> = std::fs::read_dir(dir.join(LINKS_SUBDIR))
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        writeln!(out, "  none: translation is off")?;
    }
    for name in names {
        match links::pinned_link_info(&dir.join(LINKS_SUBDIR).join(&name)) {
            Ok(i) => writeln!(
                out,
                "  {name:<13} link {:<6} program {:<6} cgroup id {}",
                i.link_id, i.program_id, i.cgroup_id
            )?,
            Err(err) => writeln!(out, "  {name:<13} unreadable: {err}")?,
        }
    }
    let maps = KernelMaps::open_pinned(&crate::paths::maps_dir(dir)).context("reading the pinned maps")?;
    let frontends = inspect::frontends(&maps.dump()?);
    let backends: usize = frontends.iter().map(|f| f.backends.len()).sum();
    let empty = frontends.iter().filter(|f| f.backends.is_empty()).count();
    writeln!(out, "frontends: {} ({empty} without backends), backend slots: {backends}", frontends.len())?;
    Ok(out)
}
