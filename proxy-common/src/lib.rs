//! Types shared by the eBPF programs and the userspace agent.
//!
//! Everything here crosses the kernel boundary: `#[repr(C)]`, fixed sizes
//! checked at compile time, explicit padding fields that writers must zero
//! (map keys are compared bytewise; a `SERVICES` slots entry's value uses
//! every byte for backend ids, `ServiceValue::slots`). Addresses and ports are stored in network
//! byte order, exactly as the kernel hands them to the programs.
#![no_std]

/// Name of the eBPF global that switches its debug logging on.
pub const LOG_ENABLED: &str = "LOG_ENABLED";
/// Name of the eBPF global that holds the Maglev table size (entries).
pub const MAGLEV_SIZE: &str = "MAGLEV_SIZE";
/// Name of the eBPF global that holds the counters per CPU of
/// `CONNECTIONS` (the frontend maps' size plus one).
pub const CONNECTIONS_STRIDE: &str = "CONNECTIONS_STRIDE";
/// Name of the eBPF global that holds `--nodeport-mode` (`nodeport_mode`).
pub const NODEPORT_MODE: &str = "NODEPORT_MODE";
/// Name of the eBPF global that holds `--dsr-dispatch` (`dsr_dispatch`).
pub const DSR_DISPATCH: &str = "DSR_DISPATCH";
/// Names of the eBPF globals that hold `--cluster-cidr`
/// (`cluster_cidr`).
pub const CLUSTER_CIDR_V4: &str = "CLUSTER_CIDR_V4";
pub const CLUSTER_CIDR_V6: &str = "CLUSTER_CIDR_V6";
/// Name of the eBPF global that is 1 when `--cluster-cidr` set either.
pub const ROUTED_CLUSTER_IPS: &str = "ROUTED_CLUSTER_IPS";
/// Name of the eBPF global that holds `--socket-lb host-namespace`'s
/// network namespace cookie (0: every socket is translated).
pub const SOCKET_LB_NETNS: &str = "SOCKET_LB_NETNS";

/// `--nodeport-mode`: how traffic from outside reaches a backend on another
/// node (the value of the `NODEPORT_MODE` global).
pub mod nodeport_mode {
    /// The entry node rewrites the source to its own address; replies come
    /// back through it.
    pub const SNAT: u8 = 0;
    /// Direct server return: the source is kept, the frontend rides along
    /// in an IPv4 option / IPv6 destination option (`dsr_option`), and the
    /// backend's node answers the client itself.
    pub const DSR: u8 = 1;
    /// DSR for TCP, SNAT for UDP (as Cilium's hybrid mode).
    pub const HYBRID: u8 = 2;
}

/// How a DSR flow's packets reach the backend's node (`--dsr-dispatch`).
pub mod dsr_dispatch {
    /// The frontend in an IP option (`dsr_option`) on the packets that
    /// open a flow; the destination rewritten to the backend.
    pub const OPTION: u8 = 0;
    /// Every packet untouched inside an outer IP header (IPIP, IP6IP6) to
    /// the backend's address; the backend's node takes it off and
    /// translates the inner packet.
    pub const IPIP: u8 = 1;
    /// Bytes the outer header adds: IPv4, IPv6.
    pub const V4_OVERHEAD: u16 = 20;
    pub const V6_OVERHEAD: u16 = 40;
}

/// How the entry node tells the backend's node a DSR flow's frontend
/// (Cilium's encoding, bpf/lib/nodeport.h).
pub mod dsr_option {
    /// IPv4 option type: copied flag set, class 0, number 26.
    pub const V4_TYPE: u8 = 0x9a;
    /// IPv4 option length: type, length, port (2), address (4).
    pub const V4_LEN: u8 = 8;
    /// IPv6 destination option type (the two high bits 00: a node that
    /// does not know it skips it).
    pub const V6_TYPE: u8 = 0x1b;
    /// IPv6 destination option data length: address (16), port (2), pad (2).
    pub const V6_OPT_LEN: u8 = 20;
    /// The whole IPv6 Destination Options header, in bytes.
    pub const V6_HDR_LEN: u8 = 24;
}

/// Indexes of `TAIL_CALLS`: the programs `nodeport_ingress` hands a
/// packet to, each verified on its own.
pub mod tail_call {
    /// `nodeport_dsr_to_snat`: a UDP datagram too long for its DSR flow's
    /// route moves the flow to source NAT.
    pub const DSR_TO_SNAT: u32 = 0;
    /// Entries of `TAIL_CALLS`.
    pub const LEN: u32 = 1;
}

/// Map names, as the eBPF object declares them and as they are pinned.
pub mod map_names {
    pub const SERVICES: &str = "SERVICES";
    pub const BACKENDS: &str = "BACKENDS";
    pub const REVNAT: &str = "REVNAT";
    pub const SOCK_REVNAT: &str = "SOCK_REVNAT";
    pub const SOCK_BACKEND: &str = "SOCK_BACKEND";
    pub const AFFINITY: &str = "AFFINITY";
    pub const CONNECTIONS: &str = "CONNECTIONS";
    pub const CT: &str = "CT";
    pub const MAGLEV: &str = "MAGLEV";
    pub const SOURCE_RANGES: &str = "SOURCE_RANGES";
    pub const EXTERNAL_STATS: &str = "EXTERNAL_STATS";
    pub const OUTSIDE_HANDOVER: &str = "OUTSIDE_HANDOVER";
    /// Programs `nodeport_ingress` hands a packet to by tail call
    /// (`tail_call`).
    pub const TAIL_CALLS: &str = "TAIL_CALLS";
    /// Userspace only (the programs never read it): the service port of
    /// each frontend, for `ebpf-proxy service` with the agent stopped.
    pub const SERVICE_NAMES: &str = "SERVICE_NAMES";
    /// Active connections per backend id (`ACTIVE_CONNS` in the programs).
    pub const ACTIVE_CONNS: &str = "ACTIVE_CONNS";
    /// The backend each translated socket is counted towards (`SockConn`).
    pub const SOCK_CONN: &str = "SOCK_CONN";
}

/// The id of a frontend's reverse translation (`REVNAT`, `SERVICE_NAMES`,
/// `CONNECTIONS` are keyed by it; `SOCK_REVNAT`, `AFFINITY`, `CT` and
/// `SOURCE_RANGES` carry it). 32 bits: a node may hold far more than
/// 65,535 frontends (100,000 services of one port, dual-stack, twice that).
pub type RevNatId = u32;

/// Default sizes of the maps (entries); the agent can override them at load.
pub mod map_sizes {
    /// One entry per frontend plus one per four backend slots
    /// (`SLOTS_PER_ENTRY`): 10,000 services of ten endpoints take 40,000
    /// (and a NodePort or LoadBalancer IP as much again). Allocated as
    /// used, so the headroom costs nothing.
    pub const SERVICES: u32 = 262_144;
    /// An array indexed by backend id (id 0 is never used), allocated up
    /// front: 24 bytes an entry.
    pub const BACKENDS: u32 = 131_072;
    /// One entry per frontend (id 0 is never used). The agent sizes it
    /// from the table with `SERVICE_NAMES` and `CONNECTIONS`; allocated as
    /// used.
    pub const REVNAT: u32 = 65_536;
    /// LRU: one entry per translated socket (and backend).
    pub const SOCK_REVNAT: u32 = 131_072;
    /// LRU: one entry per unconnected UDP socket and service it sends to.
    pub const SOCK_BACKEND: u32 = 65_536;
    /// LRU: one entry per client (network namespace) and affine service.
    pub const AFFINITY: u32 = 65_536;
    /// Counters of new connections, indexed by rev-NAT id: the size of
    /// one CPU's region (the agent sizes the array and sets the region's
    /// size at every load).
    pub const CONNECTIONS: u32 = 65_536;
    /// LRU: two entries per external flow (its two directions).
    pub const CT: u32 = 262_144;
    /// Maglev tables (one per distinct backend list of external frontends).
    pub const MAGLEV: u32 = 65_535;
    /// loadBalancerSourceRanges entries over all frontends.
    pub const SOURCE_RANGES: u32 = 16_384;
    /// Sockets counted as active connections (`SockConn`), one per open
    /// translated socket; allocated as used. A socket that finds it full
    /// is translated but not counted (so never left counted either).
    pub const SOCK_CONN: u32 = 131_072;
}

/// IP protocol numbers as they appear in `bpf_sock_addr.protocol`.
pub mod proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const SCTP: u8 = 132;
}

/// `ServiceKey.scope` values.
pub mod scope {
    /// The frontend every client uses, unless its slot 0 says otherwise
    /// (`TWO_SCOPES`, `EXTERNAL_ONLY`).
    pub const ALL: u8 = 0;
    /// The twin of a `TWO_SCOPES` frontend that traffic from outside the
    /// node uses (externalTrafficPolicy: Local: this node's endpoints).
    pub const EXTERNAL: u8 = 1;
}

/// `ServiceValue.flags` bits (slot 0 only).
pub mod service_flags {
    /// A ClusterIP frontend.
    pub const CLUSTER_IP: u16 = 1 << 0;
    /// sessionAffinity: ClientIP; `affinity_timeout()` holds the seconds.
    pub const AFFINITY: u16 = 1 << 1;
    /// A nodePort on a node address (or 127.0.0.1).
    pub const NODE_PORT: u16 = 1 << 2;
    /// A LoadBalancer ingress IP.
    pub const LOAD_BALANCER: u16 = 1 << 3;
    /// An externalIP.
    pub const EXTERNAL_IP: u16 = 1 << 4;
    /// Traffic from outside the node uses the scope `EXTERNAL` twin of
    /// this frontend; sockets on the node use this one.
    pub const TWO_SCOPES: u16 = 1 << 5;
    /// Only for traffic from outside the node (an externalIP that is not
    /// this node's, with `--external-ips-local-only`): the socket programs
    /// leave it alone (CVE-2020-8554).
    pub const EXTERNAL_ONLY: u16 = 1 << 6;
    /// loadBalancerSourceRanges: traffic from outside is accepted only from
    /// the sources `SOURCE_RANGES` holds for this rev-NAT id.
    pub const SOURCE_RANGES: u16 = 1 << 7;
    /// Any of the kinds traffic from outside the node may reach.
    pub const EXTERNAL_KINDS: u16 = NODE_PORT | LOAD_BALANCER | EXTERNAL_IP;
    /// `lb-algorithm: least-connections`: a new connection goes to the
    /// one of two backends picked at random with fewer active connections
    /// (`ACTIVE_CONNS`).
    pub const LEAST_CONNECTIONS: u16 = 1 << 8;
    /// `lb-algorithm: maglev`, recorded so that the maps say what was
    /// asked: served as the default is (the socket programs pick at
    /// random, traffic from outside by the Maglev table).
    pub const MAGLEV: u16 = 1 << 9;
    /// `nodeport-mode: snat`: traffic from outside to a backend on another
    /// node goes by source NAT, whatever the node's `--nodeport-mode`.
    pub const FORWARD_SNAT: u16 = 1 << 10;
    /// `nodeport-mode: dsr`: traffic from outside to a backend on another
    /// node goes by direct server return (TCP and UDP), whatever the
    /// node's `--nodeport-mode`.
    pub const FORWARD_DSR: u16 = 1 << 11;
}

/// `Backend.flags` bits.
pub mod backend_flags {
    /// The endpoint runs on this node: traffic from outside reaches it
    /// without source NAT (its replies pass this node anyway).
    pub const LOCAL: u8 = 1 << 0;
}

/// `CtKey.dir` values.
pub mod ct_dir {
    /// Client to frontend, as the packet arrives at the node.
    pub const ORIGINAL: u8 = 0;
    /// Backend to client (or to the node's SNAT address), as the reply
    /// arrives or leaves.
    pub const REPLY: u8 = 1;
}

/// `CtValue.flags` bits.
pub mod ct_flags {
    /// The source was rewritten to the node's address (`nat_addr`,
    /// `nat_port`): the backend is on another node.
    pub const SNAT: u8 = 1 << 0;
    /// A FIN or RST was seen: the entry expires soon.
    pub const CLOSING: u8 = 1 << 1;
    /// An RST was seen: the connection is gone at both ends (no TIME_WAIT),
    /// so its SNAT port is free at once.
    pub const RESET: u8 = 1 << 2;
    /// A FIN was seen from the client (the original direction).
    pub const FIN_ORIGINAL: u8 = 1 << 3;
    /// A FIN was seen from the backend (the reply direction).
    pub const FIN_REPLY: u8 = 1 << 4;
    /// Both ends sent their FIN: the connection is closed, only its last
    /// ACK (and a lost FIN's retransmission) may still pass.
    pub const FIN_BOTH: u8 = FIN_ORIGINAL | FIN_REPLY;
    /// The flow is netfilter's (kube-proxy's DNAT translated it before this
    /// node's programs took over, see `OutsideHandover`): its packets go to
    /// the kernel untouched. Only an original-direction entry, no backend.
    pub const KERNEL: u8 = 1 << 5;
    /// Direct server return. On the entry node (original direction): the
    /// flow goes to a backend on another node with its source kept and
    /// the frontend in an option. On the backend's node (reply direction,
    /// made from that option): its replies leave from the frontend.
    pub const DSR: u8 = 1 << 6;
    /// The flow counts as an active connection of its backend
    /// (`ACTIVE_CONNS`); cleared by whoever takes the count back when the
    /// flow ends. Only an original-direction entry.
    pub const COUNTED: u8 = 1 << 7;
}

/// `OutsideHandover.mode`: how the programs on the node's devices (TC and
/// XDP) share traffic from outside with netfilter while the agent takes
/// over from a running kube-proxy (docs/design.md, "Taking over from
/// kube-proxy").
pub mod handover_mode {
    /// Every packet is the programs' (no kube-proxy, or takeover is over);
    /// flows marked `ct_flags::KERNEL` still go to the kernel until they end.
    pub const OFF: u32 = 0;
    /// Every packet to a frontend goes to the kernel untouched (kube-proxy
    /// serves it); each flow seen is marked `ct_flags::KERNEL`.
    pub const DEFER: u32 = 1;
    /// New flows are the programs'; flows marked `ct_flags::KERNEL`, and
    /// TCP packets without SYN of a flow the programs do not know (one
    /// netfilter set up before), go to the kernel untouched.
    pub const HANDOVER: u32 = 2;
}

/// The cluster's pod CIDRs (`--cluster-cidr`, kube-proxy's `clusterCIDR`),
/// one per family, as the programs' `CLUSTER_CIDR_V4` and
/// `CLUSTER_CIDR_V6` globals: each the network's words then the mask's
/// (`Addr::words` order; IPv4 the last word only), all-zero mask: unset.
/// With one set, packets routed to the node for a ClusterIP are translated
/// too, with source NAT when their source is outside it (kube-proxy's
/// `detectLocalMode: ClusterCIDR`).
pub mod cluster_cidr {
    use super::{Addr, as_v4};

    /// The global of an IPv4 CIDR (`prefix` 1 to 32).
    #[must_use]
    pub const fn v4(network: [u8; 4], prefix: u8) -> [u32; 2] {
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        let mask = u32::from_ne_bytes(mask.to_be_bytes());
        [u32::from_ne_bytes(network) & mask, mask]
    }

    /// The global of an IPv6 CIDR (`prefix` 1 to 128).
    #[must_use]
    pub const fn v6(network: [u8; 16], prefix: u8) -> [u32; 8] {
        let net = Addr(network).words();
        let mut out = [0u32; 8];
        let mut i = 0;
        while i < 4 {
            #[expect(clippy::cast_possible_truncation, reason = "i is below 4")]
            let start = (i as u8) * 32;
            let mask = if prefix >= start + 32 {
                u32::MAX
            } else if prefix <= start {
                0
            } else {
                u32::MAX << (32 - (prefix - start))
            };
            let mask = u32::from_ne_bytes(mask.to_be_bytes());
            out[i] = net[i] & mask;
            out[4 + i] = mask;
            i += 1;
        }
        out
    }

    /// Whether `addr`, IPv4(-mapped), is in the IPv4 CIDR `v4`.
    #[must_use]
    #[inline]
    pub fn contains_v4(v4: [u32; 2], addr: &Addr) -> bool {
        let [net, mask] = v4;
        mask != 0 && as_v4(addr).is_some() && addr.words()[3] & mask == net
    }

    /// Whether `addr`, IPv6, is in the IPv6 CIDR `v6`.
    #[must_use]
    #[inline]
    pub fn contains_v6(v6: [u32; 8], addr: &Addr) -> bool {
        let a = addr.words();
        let set = v6[4] | v6[5] | v6[6] | v6[7] != 0;
        set && as_v4(addr).is_none()
            && a[0] & v6[4] == v6[0]
            && a[1] & v6[5] == v6[1]
            && a[2] & v6[6] == v6[2]
            && a[3] & v6[7] == v6[3]
    }
}

/// The one value of the `OUTSIDE_HANDOVER` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutsideHandover {
    /// `handover_mode`.
    pub mode: u32,
    pub pad: u32,
    /// `HANDOVER` counts as `OFF` from this `bpf_ktime_get_ns()` on
    /// (CLOCK_MONOTONIC); 0: no end.
    pub handover_until_ns: u64,
}

/// Lifetimes of connection-tracking entries, in seconds since last use.
pub mod ct_lifetime {
    pub const TCP: u64 = 21_600;
    pub const TCP_CLOSING: u64 = 10;
    pub const UDP: u64 = 60;
    /// A source-NATed TCP flow closed by both FINs gives its SNAT port to a
    /// new flow after this long (its entries stay `TCP_CLOSING` for late
    /// packets); one closed by an RST gives it at once, and a half-closed
    /// one (a FIN one way only) keeps it. Linux conntrack, which
    /// kube-proxy's masquerade relies on, lets a new SYN take over a tuple
    /// in TIME_WAIT or CLOSE right away (`nf_conntrack_proto_tcp.c`, after
    /// RFC 1122 4.2.2.13); the short grace here lets the last ACK, or a
    /// lost one's retransmitted FIN, reach the right client first.
    pub const TCP_PORT_AFTER_FINS: u64 = 2;

    /// How long an entry of protocol `proto` with `ct_flags` `flags` lives
    /// after its last use, in seconds.
    #[must_use]
    pub const fn of(proto: u8, flags: u8) -> u64 {
        // An SCTP association lives as long as a TCP connection (its
        // heartbeats come every 30 s by default); its end is not tracked.
        if proto == super::proto::UDP {
            UDP
        } else if flags & super::ct_flags::CLOSING != 0 {
            TCP_CLOSING
        } else {
            TCP
        }
    }
}

/// Source ports the TC programs use for source NAT towards backends on other
/// nodes: above Linux's default `ip_local_port_range` (32768-60999), so they
/// never collide with the node's own connections. The range is not wider on
/// purpose: the programs do not see the node's own connections, and the
/// node does connect to backends from its ephemeral ports (the kubelet's
/// probes to pod addresses), so a port inside that range could give a
/// source-NATed flow the very tuple of one of them; below it lie the
/// NodePort range (30000-32767) and the node's listening ports. Ports come
/// back quickly instead (`ct_lifetime::TCP_PORT_AFTER_FINS`, `ct_flags::RESET`).
pub mod snat_ports {
    pub const MIN: u16 = 61_000;
    pub const MAX: u16 = 65_535;
}

/// Indexes of `EXTERNAL_STATS`: what the TC programs did with traffic from
/// outside the node.
pub mod external_stat {
    /// A new flow to a frontend was translated.
    pub const NEW_FLOW: u32 = 0;
    /// Dropped: the frontend has no (local) endpoints.
    pub const NO_BACKEND: u32 = 1;
    /// Dropped: the source is not in loadBalancerSourceRanges.
    pub const SOURCE_DENIED: u32 = 2;
    /// Dropped: no route to the backend or back to the client.
    pub const NO_ROUTE: u32 = 3;
    /// Dropped: every source NAT port towards that backend is in use.
    pub const NO_SNAT_PORT: u32 = 4;
    /// Dropped: the packet could not be rewritten.
    pub const REWRITE_FAILED: u32 = 5;
    /// Answered with a TCP reset or an ICMP port unreachable: the frontend
    /// has no endpoints at all (kube-proxy's REJECT).
    pub const REJECTED: u32 = 6;
    /// Dropped instead of answered: over the rate of `reject_limit`.
    pub const REJECT_LIMITED: u32 = 7;
    /// Packets the XDP program (`--nodeport-acceleration`) translated and
    /// sent, or passed to the stack, itself.
    pub const XDP_TRANSLATED: u32 = 8;
    /// Packets to a frontend, or replies, the XDP program left untouched to
    /// the TC programs (a rejection, a next hop without a link-layer address).
    pub const XDP_TO_TC: u32 = 9;
    /// Packets to a frontend left to the kernel untouched while taking over
    /// from kube-proxy (`handover_mode`): netfilter's flows, and everything
    /// in `DEFER`. Counted by the TC program only (XDP passes them to it).
    pub const LEFT_TO_KERNEL: u32 = 10;
    /// Dropped: a packet carrying a DSR option that names no frontend
    /// with this node's backend at its destination (`dsr_option`).
    pub const DSR_REFUSED: u32 = 11;
    /// Dropped: a UDP datagram of a DSR flow that its DSR option or outer
    /// header would make larger than the route's MTU, and that could not go
    /// by source NAT instead (`DSR_TO_SNAT`; the device would drop it where
    /// nothing counts it).
    pub const DSR_TOO_BIG: u32 = 12;
    /// Answered with ICMP fragmentation needed (ICMPv6 packet too big): a
    /// TCP segment of a DSR flow the outer header (`dsr_dispatch::IPIP`)
    /// would make larger than the route's MTU; the client's path MTU
    /// discovery then sends smaller ones.
    pub const DSR_FRAG_NEEDED: u32 = 13;
    /// A UDP datagram of a DSR flow that its DSR option or outer header
    /// would make larger than the route's MTU: the flow went by source NAT
    /// from then on, this datagram with it (`dsr_too_big` counts those
    /// dropped when that failed).
    pub const DSR_TO_SNAT: u32 = 14;
    /// Number of counters of one path.
    pub const COUNT: u32 = 15;
    /// The pods' own traffic, translated per packet on pod-facing devices
    /// (`--socket-lb host-namespace`, VMs, meshes), is counted in a second
    /// set of the same counters from here (`POD_BASE + NEW_FLOW`, ...).
    pub const POD_BASE: u32 = COUNT;
    /// Entries of `EXTERNAL_STATS`: both sets.
    pub const LEN: u32 = 2 * COUNT;
    /// Names, by index, for metrics.
    pub const NAMES: [&str; COUNT as usize] = [
        "new_flow",
        "no_backend",
        "source_denied",
        "no_route",
        "no_snat_port",
        "rewrite_failed",
        "rejected",
        "reject_limited",
        "xdp_translated",
        "xdp_to_tc",
        "left_to_kernel",
        "dsr_refused",
        "dsr_too_big",
        "dsr_frag_needed",
        "dsr_to_snat",
    ];
}

/// How many rejections (TCP resets, ICMP port unreachable) the TC programs
/// send for traffic from outside to frontends without endpoints: a token
/// bucket per CPU, so a flood of packets to such a frontend cannot make the
/// node flood replies (the kernel limits its own ICMP errors alike:
/// `icmp_msgs_per_sec`, `icmp_msgs_burst`). Over it, packets are dropped.
pub mod reject_limit {
    /// Replies per second, per CPU.
    pub const PER_SECOND: u64 = 1_000;
    /// Replies a CPU may send at once after a quiet time.
    pub const BURST: u64 = 100;
}

/// `Backend.state` values.
pub mod backend_state {
    /// Ready endpoint.
    pub const ACTIVE: u8 = 0;
    /// Serving but terminating: used only when a service has no ready endpoint.
    pub const TERMINATING: u8 = 1;
}

/// An IPv6 address, or an IPv4 address as IPv4-mapped IPv6
/// (`::ffff:a.b.c.d`), in network byte order. One form for both families
/// lets one set of maps serve IPv4, IPv6 and IPv4-mapped IPv6 sockets.
///
/// 4-byte aligned (every field of this type sits at such an offset): BPF
/// has no unaligned loads, so an aligned address is read, compared and
/// copied a word at a time instead of a byte at a time.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, Eq, Hash, PartialOrd, Ord)]
#[expect(clippy::derived_hash_with_manual_eq, reason = "equal words are equal bytes, so the hashes agree")]
pub struct Addr(pub [u8; 16]);

/// By words (byte-wise equality compiles to byte loads for BPF).
impl PartialEq for Addr {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.words(), other.words());
        a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
    }
}

/// The prefix of IPv4-mapped IPv6 addresses, as the third word.
const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

impl Addr {
    /// The address as four network-order words.
    #[must_use]
    #[inline]
    pub const fn words(&self) -> [u32; 4] {
        let a = &self.0;
        [
            u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
            u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
            u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
            u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
        ]
    }

    /// The address of four network-order words.
    #[must_use]
    #[inline]
    pub const fn from_words(words: [u32; 4]) -> Self {
        let (w0, w1, w2, w3) =
            (words[0].to_ne_bytes(), words[1].to_ne_bytes(), words[2].to_ne_bytes(), words[3].to_ne_bytes());
        Self([
            w0[0], w0[1], w0[2], w0[3], w1[0], w1[1], w1[2], w1[3], w2[0], w2[1], w2[2], w2[3], w3[0], w3[1], w3[2],
            w3[3],
        ])
    }
}

/// The IPv4-mapped form of an IPv4 address given as its four bytes.
#[must_use]
#[inline]
pub const fn mapped_v4(octets: [u8; 4]) -> Addr {
    Addr::from_words([0, 0, V4_MAPPED_WORD, u32::from_ne_bytes(octets)])
}

/// The IPv4 address of an IPv4-mapped one.
#[must_use]
#[inline]
pub const fn as_v4(addr: &Addr) -> Option<[u8; 4]> {
    let w = addr.words();
    if w[0] == 0 && w[1] == 0 && w[2] == V4_MAPPED_WORD { Some(w[3].to_ne_bytes()) } else { None }
}

/// The hash of a flow from outside the node that picks its Maglev entry:
/// the client's address and port, the frontend port and the protocol. The
/// frontend address is left out, so one client flow hashes alike on every
/// node's address. The same on every node and build (murmur3's mixing).
#[must_use]
#[inline]
pub fn flow_hash(src: &Addr, sport: u16, dport: u16, proto: u8) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    /// murmur3 finishes with the length of what it hashed.
    const HASHED_BYTES: u32 = 6 * 4;
    const C2: u32 = 0x1b87_3593;
    let mut h: u32 = 0x9747_b28c;
    let w = src.words();
    let words = [
        u32::from_be(w[0]),
        u32::from_be(w[1]),
        u32::from_be(w[2]),
        u32::from_be(w[3]),
        (u32::from(u16::from_be(sport)) << 16) | u32::from(u16::from_be(dport)),
        u32::from(proto),
    ];
    let mut i = 0;
    while i < words.len() {
        let k = words[i].wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h = (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
        i += 1;
    }
    h ^= HASHED_BYTES;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The Maglev table entry (below `size`) a flow hash selects: `hash * size
/// / 2^32`, a uniform reduction that, unlike `%`, the BPF verifier can
/// bound (it tracks the ranges of a multiplication and a shift).
#[must_use]
#[inline]
pub fn maglev_index(hash: u32, size: u32) -> u32 {
    ((u64::from(hash) * u64::from(size)) >> 32) as u32
}

/// Backend slots per `SERVICES` entry: the entry at key slot `n >= 1` holds
/// the backend ids of slots `4n - 3 ..= 4n` (the 0-based backend indexes
/// `4(n - 1) .. 4n`), one in each of its value's four words. Four to an
/// entry, a frontend of 10 backends takes 4 entries instead of 11: the
/// first sync at 100,000 services inserts 400,000 entries, not 1,100,000,
/// and the map needs a quarter of the buckets and elements.
pub const SLOTS_PER_ENTRY: u16 = 4;

/// Key of `SERVICES`. Slot 0 is the frontend entry; slots `1..` each hold
/// `SLOTS_PER_ENTRY` backends (`ServiceValue::slot_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Frontend address.
    pub addr: Addr,
    /// Frontend port, network byte order.
    pub port: u16,
    pub slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub pad: [u8; 2],
}

impl ServiceKey {
    /// A scope `ALL` key with every padding byte zeroed; `port` in network
    /// byte order.
    #[must_use]
    pub const fn new(addr: Addr, port: u16, proto: u8, slot: u16) -> Self {
        Self { addr, port, slot, proto, scope: scope::ALL, pad: [0; 2] }
    }

    /// The key of the entry holding the frontend's backend `index`
    /// (0-based, below slot 0's `count`); its id is the value's
    /// `slot_id(index)`.
    #[must_use]
    #[inline]
    pub const fn slots_of(&self, index: u16) -> Self {
        Self { slot: index / SLOTS_PER_ENTRY + 1, ..*self }
    }
}

/// Value of `SERVICES`.
///
/// In slot 0 `count` is the number of backend slots, `rev_nat` the id of the
/// frontend's reverse translation, `flags` its kind, `maglev` the id of its
/// Maglev table (0: none) and the first word the session affinity timeout
/// (read it with `affinity_timeout()`). In slots `1..` the four 32-bit
/// words are four backend ids (`slots`, `slot_id`; 0: none), so that a
/// frontend's `count` backends take `count.div_ceil(SLOTS_PER_ENTRY)`
/// entries. The first word serves both (as Cilium's `lb4_service` shares
/// it), which keeps the value at 16 bytes with a 32-bit `rev_nat`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    /// Slot 0: the session affinity timeout in seconds (0: no affinity).
    /// A slots entry: its first backend id (`slot_id`: all four).
    pub backend_id: u32,
    pub rev_nat: RevNatId,
    pub count: u16,
    pub flags: u16,
    /// Key of the frontend's table in `MAGLEV` (traffic from outside).
    pub maglev: u16,
    pub pad: u16,
}

impl ServiceValue {
    /// A slot 0 value; padding zeroed.
    #[must_use]
    pub const fn frontend(count: u16, rev_nat: RevNatId, flags: u16, maglev: u16, affinity_timeout: u32) -> Self {
        Self { backend_id: affinity_timeout, rev_nat, count, flags, maglev, pad: 0 }
    }

    /// A value of a slots entry: backend ids `ids` (0: no backend), the
    /// first in `backend_id`, the others in the next three words (in
    /// memory, the value's four 32-bit words in order on a little-endian
    /// host, as the programs' `bpfel` target is).
    #[must_use]
    #[expect(clippy::cast_possible_truncation, reason = "each word's halves, split on purpose")]
    pub const fn slots(ids: [u32; SLOTS_PER_ENTRY as usize]) -> Self {
        Self {
            backend_id: ids[0],
            rev_nat: ids[1],
            count: ids[2] as u16,
            flags: (ids[2] >> 16) as u16,
            maglev: ids[3] as u16,
            pad: (ids[3] >> 16) as u16,
        }
    }

    /// A slots entry: the backend id in word `i % SLOTS_PER_ENTRY` (0: none).
    #[must_use]
    #[inline]
    pub const fn slot_id(&self, i: u16) -> u32 {
        match i % SLOTS_PER_ENTRY {
            0 => self.backend_id,
            1 => self.rev_nat,
            2 => self.count as u32 | (self.flags as u32) << 16,
            _ => self.maglev as u32 | (self.pad as u32) << 16,
        }
    }

    /// A slots entry: its backend ids, as `slots` took them.
    #[must_use]
    pub const fn slot_ids(&self) -> [u32; SLOTS_PER_ENTRY as usize] {
        [self.slot_id(0), self.slot_id(1), self.slot_id(2), self.slot_id(3)]
    }

    /// Slot 0: the session affinity timeout in seconds (0: no affinity).
    #[must_use]
    #[inline]
    pub const fn affinity_timeout(&self) -> u32 {
        self.backend_id
    }
}

/// Value of `BACKENDS`, keyed by a `u32` backend id that is never 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub state: u8,
    /// `backend_flags` bits.
    pub flags: u8,
    pub pad: [u8; 3],
}

/// Value of `REVNAT`, keyed by the `RevNatId` of a frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNat {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    pub pad: u16,
}

/// Key of `SOCK_REVNAT`: a translated socket and the backend it reached.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockRevNatKey {
    pub cookie: u64,
    /// Backend address.
    pub addr: Addr,
    /// Backend port, network byte order.
    pub port: u16,
    pub pad: [u8; 6],
}

/// Value of `SOCK_REVNAT`: the service address the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockRevNat {
    pub addr: Addr,
    pub port: u16,
    pub pad: u16,
    pub rev_nat: RevNatId,
}

/// Key of `SOCK_BACKEND` (value: backend id): the backend an unconnected
/// UDP socket sends a service's datagrams to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockBackendKey {
    pub cookie: u64,
    /// Service address.
    pub addr: Addr,
    /// Service port, network byte order.
    pub port: u16,
    pub proto: u8,
    pub pad: [u8; 5],
}

/// Key of `AFFINITY`: a client (its network namespace cookie) and a
/// service frontend (its rev-NAT id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub client: u64,
    pub rev_nat: RevNatId,
    pub pad: u32,
}

/// Value of `AFFINITY`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub pad: u32,
    /// `bpf_ktime_get_ns()` of the last connection that used it.
    pub last_used_ns: u64,
}

/// Key of `CT`, the connection tracking of traffic from outside the node:
/// a packet's addresses and ports as it is seen, and which way it goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub src: Addr,
    pub dst: Addr,
    /// Network byte order.
    pub sport: u16,
    /// Network byte order.
    pub dport: u16,
    pub proto: u8,
    /// `ct_dir` value.
    pub dir: u8,
    pub pad: [u8; 2],
}

/// Value of `CT`.
///
/// `ORIGINAL` (client to frontend): the destination becomes `addr`:`port`
/// (the backend); with `SNAT` the source becomes `nat_addr`:`nat_port`.
/// `REPLY` (from the backend): the source becomes `addr`:`port` (the
/// frontend); with `SNAT` the destination becomes `nat_addr`:`nat_port`
/// (the client).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtValue {
    pub addr: Addr,
    pub nat_addr: Addr,
    /// Network byte order.
    pub port: u16,
    /// Network byte order.
    pub nat_port: u16,
    pub rev_nat: RevNatId,
    pub backend_id: u32,
    /// `ct_flags` bits.
    pub flags: u8,
    pub pad: [u8; 3],
    /// `bpf_ktime_get_ns()` when the entry was last refreshed.
    pub last_seen_ns: u64,
}

/// The data part of a `SOURCE_RANGES` LPM key: a frontend and a source
/// prefix. The prefix length counts the 32 bits of `rev_nat` plus the
/// address bits (IPv4 as IPv4-mapped: 96 + its prefix length).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRange {
    /// Network byte order, so that the trie's bytes read in order.
    pub rev_nat: RevNatId,
    pub addr: Addr,
}

/// Value of `SERVICE_NAMES`, keyed by the `RevNatId` of a frontend:
/// the service port it comes from, each part UTF-8 and zero-padded (the
/// limits are Kubernetes': a namespace and a Service name are DNS labels of
/// at most 63 bytes, a port name an IANA service name of at most 15).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceName {
    pub namespace: [u8; 64],
    pub name: [u8; 64],
    pub port: [u8; 16],
}

impl Default for ServiceName {
    fn default() -> Self {
        Self { namespace: [0; 64], name: [0; 64], port: [0; 16] }
    }
}

/// Value of `SOCK_CONN`, keyed by a socket's cookie: the backend the
/// socket is counted towards in `ACTIVE_CONNS`, with its address and port,
/// so that the count is taken back only from that backend (an id freed and
/// handed to another backend meanwhile is left alone).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockConn {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    pub pad: u16,
    pub backend_id: u32,
}

/// Bits of a `SOURCE_RANGES` prefix taken by `rev_nat`.
pub const SOURCE_RANGE_ID_BITS: u32 = 32;

const _: () = assert!(core::mem::size_of::<Addr>() == 16);
const _: () = assert!(core::mem::size_of::<ServiceKey>() == 24);
const _: () = assert!(core::mem::size_of::<ServiceValue>() == 16);
const _: () = assert!(core::mem::size_of::<Backend>() == 24);
const _: () = assert!(core::mem::size_of::<RevNat>() == 20);
const _: () = assert!(core::mem::size_of::<SockRevNatKey>() == 32);
const _: () = assert!(core::mem::size_of::<SockRevNat>() == 24);
const _: () = assert!(core::mem::size_of::<SockBackendKey>() == 32);
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 16);
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 16);
const _: () = assert!(core::mem::size_of::<CtKey>() == 40);
const _: () = assert!(core::mem::size_of::<CtValue>() == 56);
const _: () = assert!(core::mem::size_of::<OutsideHandover>() == 16);
const _: () = assert!(core::mem::size_of::<SourceRange>() == 20);
const _: () = assert!(core::mem::size_of::<ServiceName>() == 144);
const _: () = assert!(core::mem::size_of::<RevNatId>() == 4);
const _: () = assert!(core::mem::size_of::<SockConn>() == 24);

/// Conversions between the maps' 16-byte addresses and `std::net`.
#[cfg(feature = "user")]
pub mod net {
    extern crate std;
    use std::net::{IpAddr, Ipv6Addr};

    use super::{Addr, mapped_v4};

    /// The maps' form of an address (IPv4 as IPv4-mapped IPv6).
    #[must_use]
    pub fn encode(addr: IpAddr) -> Addr {
        match addr {
            IpAddr::V4(v4) => mapped_v4(v4.octets()),
            IpAddr::V6(v6) => Addr(v6.octets()),
        }
    }

    /// An address of the maps (IPv4-mapped comes back as IPv4).
    #[must_use]
    pub fn decode(addr: &Addr) -> IpAddr {
        Ipv6Addr::from(addr.0).to_canonical()
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are `#[repr(C)]`, made only of integers, with every
    // padding spelled out as a field, so any bit pattern is valid.
    unsafe impl aya::Pod for super::Addr {}
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceValue {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::RevNat {}
    unsafe impl aya::Pod for super::SockRevNatKey {}
    unsafe impl aya::Pod for super::SockRevNat {}
    unsafe impl aya::Pod for super::SockBackendKey {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
    unsafe impl aya::Pod for super::CtKey {}
    unsafe impl aya::Pod for super::CtValue {}
    unsafe impl aya::Pod for super::SourceRange {}
    unsafe impl aya::Pod for super::ServiceName {}
    unsafe impl aya::Pod for super::OutsideHandover {}
    unsafe impl aya::Pod for super::SockConn {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefix matches at every length that splits a word, both families.
    #[test]
    fn cluster_cidrs_contain_their_addresses_only() {
        use cluster_cidr::{contains_v4, contains_v6, v4, v6};
        let six = |s: &str| s.parse::<core::net::Ipv6Addr>().unwrap().octets();
        let (c4, c6) = (v4([10, 244, 0, 0], 16), v6(six("fd00:244::"), 48));
        for (addr, inside) in [
            (mapped_v4([10, 244, 3, 7]), true),
            (mapped_v4([10, 245, 0, 1]), false),
            (mapped_v4([192, 0, 2, 1]), false),
            (Addr(six("fd00:244:0:9::1")), true),
            (Addr(six("fd00:245::1")), false),
        ] {
            assert_eq!(contains_v4(c4, &addr) || contains_v6(c6, &addr), inside, "{addr:?}");
        }
        for prefix in [1, 4, 24, 31, 32] {
            assert!(contains_v4(v4([10, 244, 3, 7], prefix), &mapped_v4([10, 244, 3, 7])), "/{prefix}");
            assert!(!contains_v4(v4([10, 244, 3, 7], prefix), &mapped_v4([138, 244, 3, 6])), "/{prefix}");
        }
        for prefix in [1, 33, 64, 100, 128] {
            let net = six("fd00:244:1:2:3:4:5:6");
            assert!(contains_v6(v6(net, prefix), &Addr(net)), "/{prefix}");
            assert!(!contains_v6(v6(net, prefix), &Addr(six("7d00:244:1:2:3:4:5:7"))), "/{prefix}");
        }
        assert!(!contains_v4([0, 0], &mapped_v4([10, 244, 3, 7])), "unset");
        assert!(!contains_v6([0; 8], &Addr(six("fd00::1"))), "unset");
        assert!(!contains_v6(c6, &mapped_v4([10, 244, 3, 7])), "an IPv4 address is never in the IPv6 CIDR");
    }

    #[test]
    fn ipv4_mapped_round_trips() {
        let a = mapped_v4([10, 96, 0, 10]);
        assert_eq!(a.0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 10]);
        assert_eq!(as_v4(&a), Some([10, 96, 0, 10]));
        assert_eq!(as_v4(&Addr([0xfd; 16])), None);
        assert_eq!(Addr::from_words(a.words()), a);
    }

    #[test]
    fn maglev_index_stays_below_the_size() {
        for hash in [0, 1, u32::MAX / 2, u32::MAX - 1, u32::MAX] {
            assert!(maglev_index(hash, 16_381) < 16_381);
        }
        assert_eq!(maglev_index(u32::MAX, 251), 250);
    }

    #[test]
    fn a_slots_entry_gives_back_each_of_its_four_ids() {
        for ids in [[1, 2, 3, 4], [u32::MAX, 0x1_0000, 0xffff, 0xdead_beef], [7, 0, 0, 0]] {
            let value = ServiceValue::slots(ids);
            assert_eq!(value.slot_ids(), ids);
            for (i, id) in (0..8).zip(ids.iter().cycle()) {
                assert_eq!(value.slot_id(i), *id, "index {i}");
            }
        }
        let key = ServiceKey::new(mapped_v4([10, 96, 0, 1]), 80, 6, 0);
        let slots: [u16; 6] = [0, 3, 4, 7, 8, 65_534].map(|i| key.slots_of(i).slot);
        assert_eq!(slots, [1, 1, 2, 2, 3, 16_384]);
    }
}
