//! `ebpf-proxy status`: the datapath left in the kernel, from the pins
//! (the agent need not be running).
use std::fmt::Write as _;

use anyhow::Context as _;

use crate::{
    args::PinDirArgs,
    datapath::{KernelMaps, ServiceMaps as _, counters::ExternalStats, inspect, links, links::LinkTarget},
    paths::LINKS_SUBDIR,
};

/// The name of device `ifindex` in this network namespace, or `#N`.
fn device_name(ifindex: u32) -> String {
    nix::net::if_::if_indextoname(ifindex).map_or_else(|_| format!("#{ifindex}"), |n| n.to_string_lossy().into_owned())
}

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
            Ok(i) => {
                let target = match i.target {
                    LinkTarget::Cgroup(id) => format!("cgroup id {id}"),
                    LinkTarget::Tc { ifindex, ingress } => {
                        format!("device {} {}", device_name(ifindex), if ingress { "ingress" } else { "egress" })
                    }
                    LinkTarget::Other { link_type } => format!("link type {link_type}"),
                };
                writeln!(out, "  {name:<24} link {:<6} program {:<6} {target}", i.link_id, i.program_id)?;
            }
            Err(err) => writeln!(out, "  {name:<24} unreadable: {err}")?,
        }
    }
    let maps_dir = crate::paths::current_maps_dir(dir).context("no pinned maps")?;
    let maps = KernelMaps::open_pinned(&maps_dir).context("reading the pinned maps")?;
    let dump = maps.dump()?;
    let frontends = inspect::frontends(&dump);
    let backends: usize = frontends.iter().map(|f| f.backends.len()).sum();
    let empty = frontends.iter().filter(|f| f.backends.is_empty()).count();
    writeln!(out, "frontends: {} ({empty} without backends), backend slots: {backends}", frontends.len())?;
    writeln!(
        out,
        "Maglev tables: {} of {} entries, source ranges: {}",
        dump.maglev.len(),
        maps.maglev_size(),
        dump.source_ranges.len()
    )?;
    match ExternalStats::open_pinned(&maps_dir.join(proxy_common::map_names::EXTERNAL_STATS)).and_then(|s| {
        s.read().map_err(|source| crate::datapath::MapError::Syscall {
            map: crate::datapath::maps::MapName::Maglev,
            op: "read",
            source,
        })
    }) {
        Ok(stats) => {
            let text: Vec<String> = stats.iter().map(|(name, n)| format!("{name}={n}")).collect();
            writeln!(out, "traffic from outside: {}", text.join(" "))?;
        }
        Err(err) => writeln!(out, "traffic from outside: unreadable: {err}")?,
    }
    Ok(out)
}
