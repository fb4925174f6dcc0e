//! `ebpf-proxy service list | get`: what the kernel translates, read from
//! the pinned maps (the agent need not be running).
use anyhow::{Context as _, bail};

use crate::{
    args::{OutputFormat, ServiceArgs, ServiceCommand},
    datapath::{KernelMaps, active::ActiveConns},
    model::Protocol,
    reconcile::{ServiceMaps as _, inspect},
};

/// Runs `ebpf-proxy service`: prints what the maps translate.
pub fn run(args: &ServiceArgs) -> anyhow::Result<()> {
    let dir = crate::paths::current_maps_dir(&args.bpffs_dir)
        .with_context(|| format!("no ebpf-proxy maps pinned in {}", args.bpffs_dir.display()))?;
    let maps = KernelMaps::open_pinned(&dir)
        .with_context(|| format!("no ebpf-proxy maps pinned in {}", args.bpffs_dir.display()))?;
    let mut all = inspect::frontends(&maps.dump()?);
    // Maps pinned by a build before the counts have none: shown without.
    if let Ok(active) = ActiveConns::open_pinned(&dir.join(proxy_common::map_names::ACTIVE_CONNS)) {
        inspect::with_active(&mut all, |id| active.get(id));
    }
    let shown = match &args.command {
        ServiceCommand::List { service: None } => all,
        ServiceCommand::List { service: Some(filter) } => {
            let filter: inspect::ServiceFilter = filter.parse()?;
            all.into_iter().filter(|f| f.is_of(&filter)).collect()
        }
        ServiceCommand::Get { frontend } => {
            let wanted = parse_frontend(frontend)?;
            let found: Vec<_> = all
                .into_iter()
                .filter(|f| {
                    f.key().is_some_and(|k| {
                        k.addr == wanted.0 && k.port == wanted.1 && wanted.2.is_none_or(|p| p == k.protocol)
                    })
                })
                .collect();
            if found.is_empty() {
                bail!("no frontend {frontend} in the maps");
            }
            found
        }
    };
    match args.output {
        OutputFormat::Table => super::output::print(&inspect::table(&shown))?,
        OutputFormat::Json => super::output::line(format_args!("{}", serde_json::to_string_pretty(&shown)?))?,
    }
    Ok(())
}

/// `ADDR:PORT`, `[V6]:PORT`, optionally `/TCP`, `/UDP` or `/SCTP`.
pub(crate) fn parse_frontend(text: &str) -> anyhow::Result<(std::net::IpAddr, u16, Option<Protocol>)> {
    let (addr_port, proto) = match text.rsplit_once('/') {
        Some((a, "TCP" | "tcp")) => (a, Some(Protocol::Tcp)),
        Some((a, "UDP" | "udp")) => (a, Some(Protocol::Udp)),
        Some((a, "SCTP" | "sctp")) => (a, Some(Protocol::Sctp)),
        Some(_) => bail!("{text}: the protocol after / must be TCP, UDP or SCTP"),
        None => (text, None),
    };
    let sock: std::net::SocketAddr =
        addr_port.parse().with_context(|| format!("{text} is not ADDR:PORT (IPv6 as [ADDR]:PORT)"))?;
    Ok((sock.ip(), sock.port(), proto))
}

#[cfg(test)]
mod tests {
    use super::parse_frontend;
    use crate::model::Protocol;

    #[test]
    fn frontends_parse() {
        let (a, p, proto) = parse_frontend("10.96.0.10:80/UDP").unwrap();
        assert_eq!((a.to_string(), p, proto), ("10.96.0.10".to_owned(), 80, Some(Protocol::Udp)));
        let (a, p, proto) = parse_frontend("[fd00::1]:53").unwrap();
        assert_eq!((a.to_string(), p, proto), ("fd00::1".to_owned(), 53, None));
        assert!(parse_frontend("10.96.0.10").is_err());
        assert_eq!(parse_frontend("10.96.0.10:80/SCTP").unwrap().2, Some(Protocol::Sctp));
        assert!(parse_frontend("10.96.0.10:80/DCCP").is_err());
    }
}
