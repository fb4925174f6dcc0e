//! The bench's network, all in its own namespaces: a `lan` bridge; one
//! namespace per backend index `i`, owning `spec::backend_net(i)` (a `local`
//! route, so one listening socket answers every endpoint address); one
//! client namespace per variant, so each variant's rules sit only in its
//! own path. Nothing is added to the machine's own namespace; everything
//! goes on drop.
use std::io;

use proxy_testkit::{NetNs, sh, unique_name};

use super::spec::{ENDPOINTS, backend_net};

/// How a client reaches a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Variant {
    /// The backend's address, no service at all: the limit.
    Direct,
    /// ebpf-proxy: the socket programs of the client's cgroup.
    #[value(name = "ebpf-proxy")]
    Ebpf,
    /// kube-proxy iptables mode, on iptables-nft (Debian's default).
    IptablesNft,
    /// kube-proxy iptables mode, on iptables-legacy.
    IptablesLegacy,
    /// kube-proxy nftables mode.
    Nftables,
}

impl Variant {
    pub const ALL: [Self; 5] = [Self::Direct, Self::Ebpf, Self::IptablesNft, Self::IptablesLegacy, Self::Nftables];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Ebpf => "ebpf-proxy",
            Self::IptablesNft => "iptables-nft",
            Self::IptablesLegacy => "iptables-legacy",
            Self::Nftables => "nftables",
        }
    }
}

// Fields drop in order: the lan (held only to be dropped) goes last.
pub struct BenchNet {
    pub clients: Vec<(Variant, NetNs)>,
    pub backends: Vec<NetNs>,
    _lan: NetNs,
}

fn backend_ip(i: u8) -> String {
    format!("10.250.0.{}", 10 + i)
}

pub fn sysctl(ns: &NetNs, key: &str, value: &str) -> io::Result<()> {
    sh("ip", &["netns", "exec", ns.name(), "sysctl", "-qw", &format!("{key}={value}")]).map(drop)
}

/// A veth pair `eth0` in `ns` and `port` on the lan bridge.
pub fn attach(lan: &NetNs, ns: &NetNs, port: &str, addr: &str) -> io::Result<()> {
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", lan.name()])?;
    lan.ip(&["link", "set", port, "master", "br0", "up"])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&["addr", "add", addr, "dev", "eth0"]).map(drop)
}

impl BenchNet {
    pub fn new(variants: &[Variant]) -> io::Result<Self> {
        let lan = NetNs::create(&unique_name("ebpf-proxy-bench-lan"))?;
        lan.ip(&["link", "add", "br0", "type", "bridge"])?;
        lan.ip(&["link", "set", "br0", "up"])?;
        let mut backends = Vec::new();
        for i in 0..ENDPOINTS {
            let ns = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-b{i}")))?;
            attach(&lan, &ns, &format!("vb{i}"), &format!("{}/16", backend_ip(i)))?;
            ns.ip(&["route", "add", "local", &backend_net(i), "dev", "lo"])?;
            sysctl(&ns, "net.core.somaxconn", "4096")?;
            backends.push(ns);
        }
        let mut clients = Vec::new();
        for (j, variant) in variants.iter().enumerate() {
            let ns = NetNs::create(&unique_name(&format!("ebpf-proxy-bench-{}", variant.name())))?;
            attach(&lan, &ns, &format!("vc{j}"), &format!("10.250.1.{}/16", j + 1))?;
            for i in 0..ENDPOINTS {
                ns.ip(&["route", "add", &backend_net(i), "via", &backend_ip(i)])?;
            }
            // Service addresses need a route for connect() to send (the
            // rules then rewrite them); untranslated, they end at backend 0,
            // which drops them (no forwarding).
            ns.ip(&["route", "add", "default", "via", &backend_ip(0)])?;
            sysctl(&ns, "net.ipv4.ip_local_port_range", "1024 65535")?;
            clients.push((*variant, ns));
        }
        Ok(Self { clients, backends, _lan: lan })
    }

    #[must_use]
    pub fn client(&self, variant: Variant) -> &NetNs {
        &self.clients.iter().find(|(v, _)| *v == variant).expect("a client namespace per variant").1
    }
}
