//! The outside path: a client outside the cluster reaches NodePort
//! services through an entry node whose proxy sends the connections on to
//! backends on another node. Each variant has its own path of three
//! namespaces on the bench's `lan` bridge, so each variant's rules or
//! programs sit only in its own entry node:
//!
//! ```text
//! client (10.252.K.2) -> entry node (10.252.K.1, 10.250.K.1) -> backend node (10.250.K.2)
//! ```
//!
//! The backend node owns every endpoint address (`local` 10.128.0.0/10, as
//! the endpoints of `spec`), so one echo server there answers them all; its
//! route back to the client goes through the entry node (DSR excepted,
//! whose replies go straight to the client). The entry node forwards
//! (`ip_forward`) on its one device, `eth0`. The variants: the backend
//! address routed through the entry node with no service at all (the
//! limit); ebpf-proxy's TC programs with SNAT (today's datapath), with
//! DSR, and with XDP (each where the agent has it: its `run --help` lists
//! the flag, else the report says it is not available); kube-proxy's
//! iptables mode (on iptables-nft and iptables-legacy) and nftables mode
//! with their NodePort rules (`nodeport_rules`). Nothing is added to the
//! machine's own namespace; everything goes on drop.
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use proxy_testkit::{AgentProcess, BpfFs, NetNs, TestCgroup, message, unique_name, veth_xdp};

use super::{
    Settings,
    datapath::{self, Row, RuleLoad},
    load::Mode,
    net::{attach, sysctl},
    nodeport_rules::{self, BACKEND_NODE, node_port},
    report::Report,
    server::Servers,
    spec::{self, BACKEND_PORT, ENDPOINTS},
};

/// How a client outside reaches a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Variant {
    /// The backend's address routed through the entry node, no service at
    /// all: the limit.
    Direct,
    /// ebpf-proxy's TC programs, source NAT to the entry node.
    #[value(name = "tc-snat")]
    TcSnat,
    /// ebpf-proxy's TC programs, direct server return.
    #[value(name = "tc-dsr")]
    TcDsr,
    /// ebpf-proxy's TC programs, direct server return by IPIP
    /// (`--dsr-dispatch ipip`).
    #[value(name = "tc-dsr-ipip")]
    TcDsrIpip,
    /// ebpf-proxy's XDP program (TC for what it passes up).
    Xdp,
    /// kube-proxy iptables mode, on iptables-nft.
    IptablesNft,
    /// kube-proxy iptables mode, on iptables-legacy.
    IptablesLegacy,
    /// kube-proxy nftables mode.
    Nftables,
}

impl Variant {
    pub const ALL: [Self; 8] = [
        Self::Direct,
        Self::TcSnat,
        Self::TcDsr,
        Self::TcDsrIpip,
        Self::Xdp,
        Self::IptablesNft,
        Self::IptablesLegacy,
        Self::Nftables,
    ];

    /// Whether its replies leave the backend's node straight to the client.
    const fn is_dsr(self) -> bool {
        matches!(self, Self::TcDsr | Self::TcDsrIpip)
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::TcSnat => "ebpf-proxy TC/SNAT",
            Self::TcDsr => "ebpf-proxy TC/DSR",
            Self::TcDsrIpip => "ebpf-proxy TC/DSR (IPIP)",
            Self::Xdp => "ebpf-proxy XDP",
            Self::IptablesNft => "iptables-nft",
            Self::IptablesLegacy => "iptables-legacy",
            Self::Nftables => "nftables",
        }
    }

    /// For an ebpf-proxy variant: the flag its agent needs (which `run
    /// --help` must list; none for today's TC/SNAT) and its arguments.
    const fn agent_flags(self) -> Option<(Option<&'static str>, &'static [&'static str])> {
        match self {
            Self::TcSnat => Some((None, &[])),
            Self::TcDsr => Some((Some("--nodeport-mode"), &["--nodeport-mode", "dsr"])),
            Self::TcDsrIpip => Some((Some("--dsr-dispatch"), &["--nodeport-mode", "dsr", "--dsr-dispatch", "ipip"])),
            Self::Xdp => Some((Some("--nodeport-acceleration"), &["--nodeport-acceleration", "native"])),
            _ => None,
        }
    }

    /// The rule loader of a kube-proxy variant: tool, arguments, and its
    /// name in the load table.
    const fn loader(self) -> Option<(&'static str, &'static [&'static str], &'static str)> {
        match self {
            Self::IptablesNft => Some(("iptables-nft-restore", &[], "iptables-nft-restore (NodePort)")),
            Self::IptablesLegacy => Some(("iptables-legacy-restore", &[], "iptables-legacy-restore (NodePort)")),
            Self::Nftables => Some(("nft", &["-f", "-"], "nft (NodePort)")),
            _ => None,
        }
    }
}

/// The variants of `chosen` (default: all) this agent can run, direct
/// always first; and why each other chosen one cannot, from the agent's
/// `run --help` text.
#[must_use]
pub fn available(chosen: Option<&[Variant]>, agent_help: &str) -> (Vec<Variant>, Vec<String>) {
    let mut notes = Vec::new();
    let variants = Variant::ALL
        .into_iter()
        .filter(|v| *v == Variant::Direct || chosen.is_none_or(|c| c.contains(v)))
        .filter(|v| match v.agent_flags() {
            Some((Some(flag), _)) if !agent_help.contains(flag) => {
                notes.push(format!(
                    "{} (the outside path): not available, this ebpf-proxy has no {flag} (see `ebpf-proxy run --help`)",
                    v.name()
                ));
                false
            }
            _ => true,
        })
        .collect();
    (variants, notes)
}

/// The agent's `run --help` text.
pub fn agent_help(agent: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(agent)
        .args(["run", "--help"])
        .output()
        .with_context(|| format!("running {} run --help", agent.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One variant's path: client, entry node and backend node, the `k`-th
/// (1-based) on the lan.
struct Lane {
    variant: Variant,
    k: u8,
}

impl Lane {
    /// The entry node's external address: the NodePorts' address.
    fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 252, self.k, 1)
    }

    fn entry_inside(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.k, 1)
    }

    fn backend_node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.k, 2)
    }

    fn client_net(&self) -> String {
        format!("10.252.{}.0/24", self.k)
    }
}

/// The namespaces of every lane. Fields drop in order: the lan goes last.
struct OutsideNet {
    /// XDP pass programs on the XDP lane's veth peer (dropped first).
    xdp_pass: Vec<veth_xdp::PassAll>,
    lanes: Vec<Lane>,
    clients: Vec<NetNs>,
    entries: Vec<NetNs>,
    backends: Vec<NetNs>,
    lan: NetNs,
}

/// Every endpoint address of `spec` (10.128.0.0/14 to 10.164.0.0/14).
const ENDPOINT_NETS: &str = "10.128.0.0/10";

impl OutsideNet {
    fn new(variants: &[Variant]) -> anyhow::Result<Self> {
        let lan = NetNs::create(&unique_name("ebpf-proxy-bench-olan"))?;
        lan.ip(&["link", "add", "br0", "type", "bridge"])?;
        lan.ip(&["link", "set", "br0", "up"])?;
        let mut net = Self {
            xdp_pass: Vec::new(),
            lanes: Vec::new(),
            clients: Vec::new(),
            entries: Vec::new(),
            backends: Vec::new(),
            lan,
        };
        let mut xdp_pass = Vec::new();
        for (j, variant) in variants.iter().enumerate() {
            let lane = Lane { variant: *variant, k: u8::try_from(j + 1)? };
            let k = lane.k;
            let tag = variant.name().replace([' ', '/'], "-").to_lowercase();
            let client = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-oc-{tag}")))?;
            let entry = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-oe-{tag}")))?;
            let backend = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-ob-{tag}")))?;
            // Pushed at once, so a failure below still removes them.
            net.clients.push(client);
            net.entries.push(entry);
            net.backends.push(backend);
            let (client, entry, backend) = (&net.clients[j], &net.entries[j], &net.backends[j]);
            let lan = &net.lan;

            attach(lan, entry, &format!("oe{k}"), &format!("{}/24", lane.node_ip()))?;
            entry.ip(&["addr", "add", &format!("{}/24", lane.entry_inside()), "dev", "eth0"])?;
            entry.ip(&["route", "add", ENDPOINT_NETS, "via", &lane.backend_node_ip().to_string()])?;
            sysctl(entry, "net.ipv4.ip_forward", "1")?;
            // It forwards out of the device it received on: no redirects
            // telling the client to go around it.
            sysctl(entry, "net.ipv4.conf.all.send_redirects", "0")?;
            sysctl(entry, "net.ipv4.conf.eth0.send_redirects", "0")?;

            attach(lan, backend, &format!("ob{k}"), &format!("{}/24", lane.backend_node_ip()))?;
            backend.ip(&["route", "add", "local", ENDPOINT_NETS, "dev", "lo"])?;
            if variant.is_dsr() {
                // Replies go to the client directly, never through the
                // entry node: the client is on the same lan.
                backend.ip(&["route", "add", &lane.client_net(), "dev", "eth0"])?;
                // A node forwards (every Kubernetes node does, for its
                // pods); the agent's check of a DSR option asks the route
                // back to the client as the kernel would forward it.
                sysctl(backend, "net.ipv4.ip_forward", "1")?;
            } else {
                backend.ip(&["route", "add", &lane.client_net(), "via", &lane.entry_inside().to_string()])?;
            }
            sysctl(backend, "net.core.somaxconn", "4096")?;

            attach(lan, client, &format!("oc{k}"), &format!("10.252.{k}.2/24"))?;
            client.ip(&["route", "add", "default", "via", &lane.node_ip().to_string()])?;
            if *variant == Variant::Xdp {
                // The entry node's eth0 as a NIC for XDP
                // (`proxy_testkit::veth_xdp`): whole checksums from the
                // senders towards it, an XDP program on its peer for the
                // frames it sends back out with XDP_TX.
                veth_xdp::tx_checksum(client, "eth0", false)?;
                veth_xdp::tx_checksum(backend, "eth0", false)?;
                xdp_pass.push(veth_xdp::pass_all(lan, &[&format!("oe{k}")])?);
            }
            sysctl(client, "net.ipv4.ip_local_port_range", "1024 65535")?;
            net.lanes.push(lane);
        }
        net.xdp_pass = xdp_pass;
        Ok(net)
    }

    fn index(&self, variant: Variant) -> usize {
        self.lanes.iter().position(|l| l.variant == variant).expect("a lane per variant")
    }
}

/// Runs the outside path at each of `sizes` (default 1, 1000 and 10000;
/// 100 in a quick run) through the `chosen` variants the agent has, into
/// `report`.
pub fn run_all(
    settings: &Settings,
    sizes: Option<Vec<u32>>,
    chosen: Option<&[Variant]>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let sizes = sizes.unwrap_or_else(|| if report.quick { vec![100] } else { vec![1, 1000, 10_000] });
    let (variants, unavailable) = available(chosen, &agent_help(&settings.agent)?);
    report.unavailable.extend(unavailable);
    for n in sizes {
        let run = run(settings, n, &variants).with_context(|| format!("the outside path at {n} services"))?;
        report.outside.extend(run.rows);
        report.rule_loads.extend(run.loads);
        report.unavailable.extend(run.left_out);
    }
    Ok(())
}

/// What the outside path at one service count measured.
pub struct Run {
    pub rows: Vec<Row>,
    pub loads: Vec<RuleLoad>,
    /// Variants left out at this count, each with why.
    pub left_out: Vec<String>,
}

/// Runs the outside path for `n` NodePort services through `variants`
/// (those `available` found).
pub fn run(settings: &Settings, n: u32, variants: &[Variant]) -> anyhow::Result<Run> {
    anyhow::ensure!(
        n <= nodeport_rules::MAX_SERVICES,
        "the outside path holds at most {} services (one node port each)",
        nodeport_rules::MAX_SERVICES
    );
    let mut variants = variants.to_vec();
    let net = OutsideNet::new(&variants).context("making the outside path's namespaces")?;
    let _servers = Servers::start(&net.backends).context("starting the backends")?;
    let dir = tempfile::tempdir()?;

    let (mut loads, left_out) = datapath::load_kube_proxy_rules(
        settings,
        (n, "the outside path"),
        dir.path(),
        [nodeport_rules::iptables(n), nodeport_rules::nftables(n)],
        &mut variants,
        |v| &net.entries[net.index(v)],
    )?;

    // ebpf-proxy: an agent per variant on its entry node (and, for DSR,
    // one on its backend node too), each with its own cgroup and pins.
    let services = dir.path().join("services.yaml");
    std::fs::write(&services, nodeport_rules::services_yaml(n))?;
    let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-bench-outside"))?;
    let mut cgroups = Vec::new();
    let mut agents = Vec::new();
    for variant in variants.iter().copied() {
        let Some((_, flags)) = variant.agent_flags() else { continue };
        let lane = &net.lanes[net.index(variant)];
        let mut nodes = vec![(&net.entries[net.index(variant)], "entry-node", lane.node_ip())];
        if variant.is_dsr() {
            nodes.push((&net.backends[net.index(variant)], BACKEND_NODE, lane.backend_node_ip()));
        }
        for (ns, node, ip) in nodes {
            eprintln!("bench: outside, {n} services: starting ebpf-proxy ({}) on {node}", variant.name());
            let cgroup = TestCgroup::create(&unique_name("ebpf-proxy-bench-outside"))?;
            let pins = bpffs.path().join(format!("{}-{node}", lane.k));
            let started = Instant::now();
            let agent = start_agent(settings, ns, &services, &cgroup, &pins, node, ip, flags)?;
            cgroups.push(cgroup);
            if node == "entry-node" {
                loads.push(RuleLoad {
                    services: n,
                    tool: agent_label(variant),
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            agents.push(agent);
        }
    }

    let targets: Vec<PathBuf> = net
        .lanes
        .iter()
        .map(|lane| {
            let path = dir.path().join(format!("targets-{}.txt", lane.k));
            let lines: Box<dyn Iterator<Item = String>> = if lane.variant == Variant::Direct {
                Box::new(
                    (0..n)
                        .flat_map(|s| (0..ENDPOINTS).map(move |i| format!("{}:{BACKEND_PORT}", spec::endpoint(s, i)))),
                )
            } else {
                let ip = lane.node_ip();
                Box::new((0..n).map(move |s| format!("{ip}:{}", node_port(s))))
            };
            datapath::write_targets(&path, lines).map(|()| path)
        })
        .collect::<Result<_, _>>()?;
    let load = |variant: Variant, mode: Mode, seconds: f64| {
        let i = net.index(variant);
        datapath::load_in(&net.clients[i], None, &targets[i], mode, seconds, settings.threads)
            .with_context(|| format!("the outside path's load client in {}", variant.name()))
    };
    // Warm up every path once (ARP, caches), then measure.
    for variant in &variants {
        load(*variant, Mode::Short, settings.seconds.min(0.5))?;
    }
    let results =
        datapath::interleave(n, settings, &variants, &[Mode::Short, Mode::Keep, Mode::Bulk], Variant::name, load)?;
    drop(agents);
    Ok(Run { rows: datapath::rows(n, &results, Variant::Direct, Variant::name), loads, left_out })
}

const fn agent_label(variant: Variant) -> &'static str {
    match variant {
        Variant::TcDsr => "ebpf-proxy TC/DSR (services file, NodePort)",
        Variant::TcDsrIpip => "ebpf-proxy TC/DSR by IPIP (services file, NodePort)",
        Variant::Xdp => "ebpf-proxy XDP (services file, NodePort)",
        _ => "ebpf-proxy TC/SNAT (services file, NodePort)",
    }
}

/// Starts an agent on node `node` (namespace `ns`, address `ip`) serving
/// traffic from outside on its `eth0`, and waits until it applied the
/// services and attached its TC programs.
#[expect(clippy::too_many_arguments, reason = "one call site, each argument a different thing")]
fn start_agent(
    settings: &Settings,
    ns: &NetNs,
    services: &Path,
    cgroup: &TestCgroup,
    pins: &Path,
    node: &str,
    ip: Ipv4Addr,
    flags: &[&str],
) -> anyhow::Result<AgentProcess> {
    let (services, cgroup, pins, ip) = (
        services.display().to_string(),
        cgroup.path().display().to_string(),
        pins.display().to_string(),
        ip.to_string(),
    );
    let mut args = vec![
        "--services-file",
        &services,
        "--cgroup",
        &cgroup,
        "--bpffs-dir",
        &pins,
        "--node-name",
        node,
        "--node-ip",
        &ip,
        "--devices",
        "eth0",
        // 1021 entries: over 100 per backend (10), Maglev's spread; the
        // default 16381 would take 64 KiB per frontend (640 MiB at 10,000).
        "--maglev-table-size",
        "1021",
        // Inside the node's namespace: its own loopback.
        "--healthz-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(flags);
    let agent = AgentProcess::start_in_with_filter(
        ns,
        &settings.agent,
        &args,
        "warn,ebpf_proxy::agent=info",
        settings.agent_log,
    )?;
    super::control::first_applied(&agent, &format!("ebpf-proxy on {node}"))?;
    agent
        .wait_for(0, Duration::from_secs(30), |r| {
            message(r).is_some_and(|m| m.starts_with("serving traffic from outside"))
        })
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("ebpf-proxy on {node} did not attach its TC programs"))?;
    Ok(agent)
}

impl datapath::LaneVariant for Variant {
    fn name(self) -> &'static str {
        Self::name(self)
    }

    fn loader(self) -> Option<(&'static str, &'static [&'static str], &'static str)> {
        Self::loader(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_the_agent_lacks_are_reported_not_run() {
        let help = "--devices <DEV>\n--maglev-table-size <N>\n";
        let (variants, notes) = available(None, help);
        assert_eq!(
            variants,
            [Variant::Direct, Variant::TcSnat, Variant::IptablesNft, Variant::IptablesLegacy, Variant::Nftables]
        );
        assert_eq!(notes.len(), 3);
        assert!(notes[0].contains("TC/DSR") && notes[0].contains("--nodeport-mode"), "{notes:?}");
        assert!(notes[1].contains("IPIP") && notes[1].contains("--dsr-dispatch"), "{notes:?}");
        assert!(notes[2].contains("XDP") && notes[2].contains("--nodeport-acceleration"), "{notes:?}");

        let help = "--nodeport-mode <MODE>\n--nodeport-acceleration <MODE>\n";
        let (variants, notes) = available(Some(&[Variant::TcDsr, Variant::Xdp]), help);
        assert_eq!(variants, [Variant::Direct, Variant::TcDsr, Variant::Xdp]);
        assert!(notes.is_empty());
    }

    #[test]
    fn lanes_have_their_own_addresses() {
        let lanes: Vec<Lane> = (1..=8).map(|k| Lane { variant: Variant::Direct, k }).collect();
        let mut all: Vec<Ipv4Addr> =
            lanes.iter().flat_map(|l| [l.node_ip(), l.entry_inside(), l.backend_node_ip()]).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 24);
        // None of them is an endpoint address (owned by the backend nodes).
        assert!(all.iter().all(|a| !(128..192).contains(&a.octets()[1])));
    }
}
