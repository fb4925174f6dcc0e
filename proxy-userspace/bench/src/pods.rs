//! The pods' path: a client in a pod's network namespace reaches ClusterIP
//! services through its node, whose proxy translates them, to backends on
//! another node. Each variant has its own lane of three namespaces on the
//! bench's `lan` bridge:
//!
//! ```text
//! pod (10.244.K.2) -veth-> node (10.244.K.1 on `vpod`, 10.253.K.1 on eth0) -> backend node (10.253.K.2)
//! ```
//!
//! The pod's veth peer (`vpod`) is its pod-facing device; the backend node
//! owns every endpoint address (as in `outside.rs`). The variants: the
//! endpoint addresses with no service (the limit); ebpf-proxy per packet
//! (`--socket-lb host-namespace`: the pod's packets are translated on
//! `vpod`); ebpf-proxy at the socket (`--socket-lb all`); kube-proxy's
//! iptables mode (iptables-nft, iptables-legacy) and nftables mode, whose
//! rules translate the pod's packets in the node's PREROUTING. The pod's
//! client runs in the agent's cgroup for ebpf-proxy (as a pod does, so the
//! socket programs run for it in both modes). Nothing is added to the
//! machine's own namespace; everything goes on drop.
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use proxy_testkit::{AgentProcess, BpfFs, NetNs, TestCgroup, message, unique_name};

use super::{
    Settings,
    datapath::{self, Row, RuleLoad},
    load::Mode,
    net::{attach, sysctl},
    report::Report,
    rules,
    server::Servers,
    spec::{self, BACKEND_PORT, ENDPOINTS, SERVICE_PORT},
};

/// How a pod reaches a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Variant {
    /// The endpoint's address routed through the node, no service: the
    /// limit.
    Direct,
    /// ebpf-proxy, `--socket-lb host-namespace`: per packet on `vpod`.
    #[value(name = "per-packet")]
    PerPacket,
    /// ebpf-proxy, `--socket-lb all`: at the pod's socket.
    Socket,
    /// kube-proxy iptables mode, on iptables-nft.
    IptablesNft,
    /// kube-proxy iptables mode, on iptables-legacy.
    IptablesLegacy,
    /// kube-proxy nftables mode.
    Nftables,
}

impl Variant {
    pub const ALL: [Self; 6] =
        [Self::Direct, Self::PerPacket, Self::Socket, Self::IptablesNft, Self::IptablesLegacy, Self::Nftables];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::PerPacket => "ebpf-proxy per packet",
            Self::Socket => "ebpf-proxy socket",
            Self::IptablesNft => "iptables-nft",
            Self::IptablesLegacy => "iptables-legacy",
            Self::Nftables => "nftables",
        }
    }

    /// For an ebpf-proxy variant: its `--socket-lb`.
    const fn socket_lb(self) -> Option<&'static str> {
        match self {
            Self::PerPacket => Some("host-namespace"),
            Self::Socket => Some("all"),
            _ => None,
        }
    }

    /// The rule loader of a kube-proxy variant: tool, arguments, and its
    /// name in the load table.
    const fn loader(self) -> Option<(&'static str, &'static [&'static str], &'static str)> {
        match self {
            Self::IptablesNft => Some(("iptables-nft-restore", &[], "iptables-nft-restore (pods' path)")),
            Self::IptablesLegacy => Some(("iptables-legacy-restore", &[], "iptables-legacy-restore (pods' path)")),
            Self::Nftables => Some(("nft", &["-f", "-"], "nft (pods' path)")),
            _ => None,
        }
    }
}

/// The pod-facing device, the node's end of the pod's veth.
const POD_DEVICE: &str = "vpod";
/// Every endpoint address of `spec` (as `outside.rs`).
const ENDPOINT_NETS: &str = "10.128.0.0/10";

/// One variant's lane, the `k`-th (1-based).
struct Lane {
    variant: Variant,
    k: u8,
}

impl Lane {
    /// Inside kube-proxy's cluster CIDR (`rules::CLUSTER_CIDR`), as a
    /// pod's: its rules do not masquerade it.
    fn pod_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.k, 2)
    }

    fn pod_gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.k, 1)
    }

    fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 253, self.k, 1)
    }

    fn backend_node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 253, self.k, 2)
    }
}

/// The namespaces of every lane. Fields drop in order: the lan goes last.
struct PodNet {
    lanes: Vec<Lane>,
    pods: Vec<NetNs>,
    nodes: Vec<NetNs>,
    backends: Vec<NetNs>,
    lan: NetNs,
}

impl PodNet {
    fn new(variants: &[Variant]) -> anyhow::Result<Self> {
        let lan = NetNs::create(&unique_name("ebpf-proxy-bench-plan"))?;
        lan.ip(&["link", "add", "br0", "type", "bridge"])?;
        lan.ip(&["link", "set", "br0", "up"])?;
        let mut net = Self { lanes: Vec::new(), pods: Vec::new(), nodes: Vec::new(), backends: Vec::new(), lan };
        for (j, variant) in variants.iter().enumerate() {
            let lane = Lane { variant: *variant, k: u8::try_from(j + 1)? };
            let k = lane.k;
            let tag = variant.name().replace(' ', "-");
            let pod = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-pp-{tag}")))?;
            let node = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-pn-{tag}")))?;
            let backend = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-pb-{tag}")))?;
            // Pushed at once, so a failure below still removes them.
            net.pods.push(pod);
            net.nodes.push(node);
            net.backends.push(backend);
            let (pod, node, backend) = (&net.pods[j], &net.nodes[j], &net.backends[j]);

            attach(&net.lan, node, &format!("pn{k}"), &format!("{}/24", lane.node_ip()))?;
            node.ip(&["route", "add", ENDPOINT_NETS, "via", &lane.backend_node_ip().to_string()])?;
            sysctl(node, "net.ipv4.ip_forward", "1")?;

            attach(&net.lan, backend, &format!("pb{k}"), &format!("{}/24", lane.backend_node_ip()))?;
            backend.ip(&["route", "add", "local", ENDPOINT_NETS, "dev", "lo"])?;
            backend.ip(&["route", "add", &format!("10.244.{k}.0/24"), "via", &lane.node_ip().to_string()])?;
            sysctl(backend, "net.core.somaxconn", "4096")?;

            // The pod: a veth into the node, as a CNI makes it.
            pod.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", POD_DEVICE, "netns", node.name()])?;
            pod.ip(&["addr", "add", &format!("{}/24", lane.pod_ip()), "dev", "eth0"])?;
            pod.ip(&["link", "set", "eth0", "up"])?;
            pod.ip(&["link", "set", "lo", "up"])?;
            pod.ip(&["route", "add", "default", "via", &lane.pod_gateway().to_string()])?;
            node.ip(&["addr", "add", &format!("{}/24", lane.pod_gateway()), "dev", POD_DEVICE])?;
            node.ip(&["link", "set", POD_DEVICE, "up"])?;
            sysctl(pod, "net.ipv4.ip_local_port_range", "1024 65535")?;
            net.lanes.push(lane);
        }
        Ok(net)
    }

    fn index(&self, variant: Variant) -> usize {
        self.lanes.iter().position(|l| l.variant == variant).expect("a lane per variant")
    }
}

/// Runs the pods' path at each of `sizes` (default 1, 1000 and 10000; 100
/// in a quick run) through the `chosen` variants (default all), into
/// `report`.
pub fn run_all(
    settings: &Settings,
    sizes: Option<Vec<u32>>,
    chosen: Option<&[Variant]>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let sizes = sizes.unwrap_or_else(|| if report.quick { vec![100] } else { vec![1, 1000, 10_000] });
    let variants: Vec<Variant> =
        Variant::ALL.into_iter().filter(|v| *v == Variant::Direct || chosen.is_none_or(|c| c.contains(v))).collect();
    for n in sizes {
        let run = run(settings, n, &variants).with_context(|| format!("the pods' path at {n} services"))?;
        report.pods.extend(run.rows);
        report.rule_loads.extend(run.loads);
        report.unavailable.extend(run.left_out);
    }
    Ok(())
}

/// What the pods' path at one service count measured.
pub struct Run {
    pub rows: Vec<Row>,
    pub loads: Vec<RuleLoad>,
    /// Variants left out at this count, each with why.
    pub left_out: Vec<String>,
}

/// Runs the pods' path for `n` ClusterIP services through `variants`.
pub fn run(settings: &Settings, n: u32, variants: &[Variant]) -> anyhow::Result<Run> {
    let mut variants = variants.to_vec();
    let net = PodNet::new(&variants).context("making the pods' path's namespaces")?;
    let _servers = Servers::start(&net.backends).context("starting the backends")?;
    let dir = tempfile::tempdir()?;

    let (mut loads, left_out) = datapath::load_kube_proxy_rules(
        settings,
        (n, "the pods' path"),
        dir.path(),
        [rules::iptables(n), rules::nftables(n)],
        &mut variants,
        |v| &net.nodes[net.index(v)],
    )?;

    // ebpf-proxy: an agent per variant on its node, each with its own
    // cgroup (the pod's client runs in it) and pins.
    let services = dir.path().join("services.yaml");
    std::fs::write(&services, spec::services_yaml(n))?;
    let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-bench-pods"))?;
    let mut cgroups: Vec<(Variant, TestCgroup)> = Vec::new();
    let mut agents = Vec::new();
    for variant in variants.iter().copied() {
        let Some(socket_lb) = variant.socket_lb() else { continue };
        let lane = &net.lanes[net.index(variant)];
        eprintln!("bench: pods, {n} services: starting ebpf-proxy ({})", variant.name());
        let cgroup = TestCgroup::create(&unique_name("ebpf-proxy-bench-pods"))?;
        let pins = bpffs.path().join(format!("{}", lane.k));
        let started = Instant::now();
        let agent = start_agent(settings, &net.nodes[net.index(variant)], &services, &cgroup, &pins, lane, socket_lb)?;
        loads.push(RuleLoad {
            services: n,
            tool: if variant == Variant::PerPacket {
                "ebpf-proxy per packet (services file, pods' path)"
            } else {
                "ebpf-proxy socket (services file, pods' path)"
            },
            seconds: started.elapsed().as_secs_f64(),
        });
        cgroups.push((variant, cgroup));
        agents.push(agent);
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
                Box::new((0..n).map(|s| format!("{}:{SERVICE_PORT}", spec::vip(s))))
            };
            datapath::write_targets(&path, lines).map(|()| path)
        })
        .collect::<Result<_, _>>()?;
    let load = |variant: Variant, mode: Mode, seconds: f64| {
        let i = net.index(variant);
        let cgroup = cgroups.iter().find(|(v, _)| *v == variant).map(|(_, c)| c);
        datapath::load_in(&net.pods[i], cgroup, &targets[i], mode, seconds, settings.threads)
            .with_context(|| format!("the pods' path's load client in {}", variant.name()))
    };
    // Warm up every path once (ARP, caches), then measure.
    for variant in &variants {
        load(*variant, Mode::Short, settings.seconds.min(0.5))?;
    }
    let results = datapath::interleave(n, settings, &variants, &[Mode::Short, Mode::Keep], Variant::name, load)?;
    drop(agents);
    Ok(Run { rows: datapath::rows(n, &results, Variant::Direct, Variant::name), loads, left_out })
}

/// Starts an agent on `lane`'s node (namespace `ns`) with `--socket-lb
/// socket_lb` and its pod-facing device, and waits until it applied the
/// services and attached its programs to that device.
fn start_agent(
    settings: &Settings,
    ns: &NetNs,
    services: &Path,
    cgroup: &TestCgroup,
    pins: &Path,
    lane: &Lane,
    socket_lb: &str,
) -> anyhow::Result<AgentProcess> {
    let (services, cgroup, pins, ip) = (
        services.display().to_string(),
        cgroup.path().display().to_string(),
        pins.display().to_string(),
        lane.node_ip().to_string(),
    );
    let args = [
        "--services-file",
        &services,
        "--cgroup",
        &cgroup,
        "--bpffs-dir",
        &pins,
        "--node-name",
        "node",
        "--node-ip",
        &ip,
        "--devices",
        "eth0",
        "--pod-devices",
        POD_DEVICE,
        "--socket-lb",
        socket_lb,
        // As `outside.rs`: Maglev's tables at 1021 entries.
        "--maglev-table-size",
        "1021",
        "--healthz-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
    ];
    let agent = AgentProcess::start_in_with_filter(
        ns,
        &settings.agent,
        args,
        "warn,ebpf_proxy::agent=info",
        settings.agent_log,
    )?;
    super::control::first_applied(&agent, "ebpf-proxy on the pods' node")?;
    agent
        .wait_for(0, Duration::from_secs(30), |r| message(r).is_some_and(|m| m.starts_with("pod-facing devices")))
        .map_err(anyhow::Error::msg)
        .context("ebpf-proxy did not attach its programs to the pod-facing device")?;
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
    fn lanes_have_their_own_addresses_and_pods_are_in_the_cluster_cidr() {
        let lanes: Vec<Lane> = (1..=6).map(|k| Lane { variant: Variant::Direct, k }).collect();
        let mut all: Vec<Ipv4Addr> =
            lanes.iter().flat_map(|l| [l.pod_ip(), l.pod_gateway(), l.node_ip(), l.backend_node_ip()]).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 24);
        assert!(all.iter().all(|a| !(128..192).contains(&a.octets()[1])), "an endpoint address");
        assert!(lanes.iter().all(|l| l.pod_ip().octets()[..2] == [10, 244]), "kube-proxy masquerades pods outside it");
    }
}
