//! Loads the eBPF object, pins its maps and attaches the socket programs to
//! a cgroup v2.
use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{Map, MapError as AyaMapError},
    programs::{ProgramError, SchedClassifier, TcAttachType, Xdp},
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, CONNECTIONS_STRIDE, CtKey, CtValue,
    DSR_DISPATCH, LOG_ENABLED, MAGLEV_SIZE, NODEPORT_MODE, ROUTED_CLUSTER_IPS, RevNat, RevNatId, SOCKET_LB_NETNS,
    ServiceKey, ServiceValue, SockBackendKey, SockConn, SockRevNat, SockRevNatKey, map_names,
};

use super::{
    acceleration::{Acceleration, DeviceXdp, Plan},
    active::ActiveConns,
    counters::{ConnCounters, ExternalStats},
    ct_resize::CtResize,
    handover::{HandoverMap, OutsideHandover},
    links::{self, LinkError, LinkOutcome},
    maglev_map::MaglevMap,
    maps::{KernelMaps, MapError},
    programs::Programs,
    sessions::SessionMaps,
};
use crate::{
    paths::{LINKS_SUBDIR, maps_dir},
    reconcile::sizing::{self, Sizes},
};

/// The eBPF object, built by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf"));

/// The eBPF object this build loads.
pub(super) const fn object() -> &'static [u8] {
    OBJECT
}

/// One loader for every load of the process. aya's `EbpfLoader::new`
/// reads and parses the kernel's BTF (megabytes of heap at once), which
/// these programs do not use: they have no CO-RE relocation (a test below
/// checks the object), so the parse is dropped as soon as it is made
/// (`btf(None)`) and never made again; otherwise a move to bigger maps
/// during the first sync, when the agent holds the whole table, would add
/// it to the agent's peak memory. Every setting is given again at each
/// load.
static LOADER: std::sync::LazyLock<std::sync::Mutex<EbpfLoader<'static>>> = std::sync::LazyLock::new(|| {
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    std::sync::Mutex::new(loader)
});

/// The values a global of one byte can take, for the one loader to refer
/// to (aya's loader borrows a global's value for its lifetime).
static BYTES: [u8; 256] = {
    let mut all = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        #[expect(clippy::cast_possible_truncation, reason = "below 256")]
        {
            all[i] = i as u8;
        }
        i += 1;
    }
    all
};

/// The Maglev table sizes accepted (`crate::reconcile::maglev::SIZES`), as the
/// programs' `MAGLEV_SIZE` global takes them (see `BYTES`).
static MAGLEV_SIZES: [u32; crate::reconcile::maglev::SIZES.len()] = {
    let mut all = [0u32; crate::reconcile::maglev::SIZES.len()];
    let mut i = 0;
    while i < all.len() {
        #[expect(clippy::cast_possible_truncation, reason = "the sizes are below 2^17")]
        {
            all[i] = crate::reconcile::maglev::SIZES[i] as u32;
        }
        i += 1;
    }
    all
};

/// The cgroup socket-address programs, by their function names.
pub(super) const SOCK_PROGRAMS: &[&str] =
    &["connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6", "getpeername4", "getpeername6"];

/// The `cgroup/sock_release` program: takes back a released socket's
/// active connection (`ACTIVE_CONNS`).
pub(super) const SOCK_RELEASE_PROGRAM: &str = "sock_release";

/// The TC programs and the direction each attaches to on a device.
pub(super) const TC_PROGRAMS: &[(&str, TcAttachType)] =
    &[("nodeport_ingress", TcAttachType::Ingress), ("nodeport_egress", TcAttachType::Egress)];

/// The program `nodeport_ingress` hands a UDP datagram too long for its
/// DSR flow's route to (`TAIL_CALLS`, `tail_call::DSR_TO_SNAT`).
pub(super) const DSR_TO_SNAT_PROGRAM: &str = "nodeport_dsr_to_snat";

/// Prefix of the pinned tcx links: `tc-DEVICE-ingress`, `tc-DEVICE-egress`.
const TC_LINK_PREFIX: &str = "tc-";

/// The TC programs of pod-facing devices (the pods' own traffic, per
/// packet: `proxy-ebpf/src/pod.rs`) and the direction each attaches to.
pub(super) const POD_PROGRAMS: &[(&str, TcAttachType)] =
    &[("pod_ingress", TcAttachType::Ingress), ("pod_egress", TcAttachType::Egress)];

/// Prefix of their pinned tcx links: `pod-DEVICE-ingress`, ...
pub(crate) const POD_LINK_PREFIX: &str = "pod-";

/// The XDP program (`--nodeport-acceleration`), in front of
/// `nodeport_ingress`.
pub(super) const XDP_PROGRAM: &str = "nodeport_xdp";

/// Prefix of the pinned XDP links: `xdp-DEVICE`.
const XDP_LINK_PREFIX: &str = "xdp-";

/// How to load and attach the datapath.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Directory (on a bpffs) for the pinned maps.
    pub pin_dir: PathBuf,
    /// cgroup v2 directory the socket programs attach to.
    pub cgroup: PathBuf,
    /// Turn on the programs' debug logging (aya-log).
    pub bpf_log: bool,
    /// Most entries of the services map (`--services-map-size`): the
    /// agent sizes it from the table (see `sizing`), up to this.
    pub services_map_size: u32,
    /// Most entries of the backends map (`--backends-map-size`).
    pub backends_map_size: u32,
    /// Entries of each Maglev table (a prime, see `maglev::SIZES`).
    pub maglev_size: usize,
    /// Entries of the connection-tracking map (traffic from outside).
    pub ct_map_size: u32,
    /// `ct_map_size` is the node's memory's share, not `--ct-map-size`:
    /// the agent grows `CT` when it fills up (`node::memory::grown`).
    pub ct_map_grows: bool,
    /// `--nodeport-acceleration`: the XDP program in front of the TC
    /// ingress program on the devices.
    pub acceleration: Acceleration,
    /// `--outside-handover`: how the programs share traffic from outside
    /// with netfilter (taking over from kube-proxy), written at load.
    pub outside_handover: OutsideHandover,
    /// `--nodeport-mode`: how traffic from outside reaches a backend on
    /// another node.
    pub nodeport_mode: NodePortMode,
    /// `--dsr-dispatch`: how a DSR flow's packets reach the backend's node.
    pub dsr_dispatch: DsrDispatch,
    /// `--socket-lb`: which sockets the socket programs translate.
    pub socket_lb: SocketLb,
    /// `--cluster-cidr`: at most one per family (`settings::check::cluster_cidrs`);
    /// with one, ClusterIPs are served to traffic routed to the node.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
}

/// The programs' globals that follow the agent's settings (not the maps'
/// sizes).
fn settings_globals<'l>(
    loader: &'l mut EbpfLoader<'static>,
    opts: &LoadOptions,
) -> Result<&'l mut EbpfLoader<'static>, LoadError> {
    Ok(loader
        .override_global(LOG_ENABLED, &BYTES[usize::from(u8::from(opts.bpf_log))], true)
        .override_global(NODEPORT_MODE, &BYTES[usize::from(opts.nodeport_mode.value())], true)
        .override_global(DSR_DISPATCH, &BYTES[usize::from(opts.dsr_dispatch.value())], true)
        .override_global(SOCKET_LB_NETNS, opts.socket_lb.global()?, true)
        .override_global(CLUSTER_CIDR_V4, cluster_cidr_globals(&opts.cluster_cidrs).0, true)
        .override_global(CLUSTER_CIDR_V6, cluster_cidr_globals(&opts.cluster_cidrs).1, true)
        .override_global(ROUTED_CLUSTER_IPS, &BYTES[usize::from(!opts.cluster_cidrs.is_empty())], true))
}

/// The programs' `CLUSTER_CIDR_V4` and `CLUSTER_CIDR_V6` globals for
/// `cidrs` (checked), one `'static` copy per distinct value, as `interned`.
fn cluster_cidr_globals(cidrs: &[ipnet::IpNet]) -> (&'static [u32; 2], &'static [u32; 8]) {
    type Globals = ([u32; 2], [u32; 8]);
    static SEEN: std::sync::Mutex<Vec<&'static Globals>> = std::sync::Mutex::new(Vec::new());
    let mut value: Globals = ([0; 2], [0; 8]);
    for cidr in cidrs {
        match cidr {
            ipnet::IpNet::V4(n) => value.0 = proxy_common::cluster_cidr::v4(n.network().octets(), n.prefix_len()),
            ipnet::IpNet::V6(n) => value.1 = proxy_common::cluster_cidr::v6(n.network().octets(), n.prefix_len()),
        }
    }
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let found = if let Some(found) = seen.iter().find(|v| ***v == value) {
        found
    } else {
        let new: &'static Globals = Box::leak(Box::new(value));
        seen.push(new);
        new
    };
    (&found.0, &found.1)
}

/// Which sockets the socket programs translate (`--socket-lb`); the rest
/// of the pods' traffic is translated per packet on the pod-facing
/// devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SocketLb {
    /// Every socket in the cgroup, pods' included.
    #[default]
    All,
    /// Only sockets in the agent's network namespace (the node's): a pod's
    /// socket keeps the service address, as a service mesh's sidecar
    /// needs (`SO_ORIGINAL_DST`).
    HostNamespace,
}

impl SocketLb {
    /// The flag's (and the config field's) value.
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::HostNamespace => "host-namespace",
        }
    }

    /// The value of the programs' `SOCKET_LB_NETNS` global: 0, or the
    /// cookie of the agent's network namespace (read once: a process does
    /// not change namespace).
    fn global(self) -> Result<&'static u64, LoadError> {
        static ALL: u64 = 0;
        static OWN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        match self {
            Self::All => Ok(&ALL),
            Self::HostNamespace => {
                if let Some(cookie) = OWN.get() {
                    return Ok(cookie);
                }
                let cookie = super::sys::own_netns_cookie().map_err(|source| LoadError::NetnsCookie { source })?;
                Ok(OWN.get_or_init(|| cookie))
            }
        }
    }
}

/// How traffic from outside reaches a backend on another node (the
/// programs' `NODEPORT_MODE`; see `proxy-ebpf/src/nodeport.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodePortMode {
    /// Source NAT to the entry node's address; replies come back through it.
    #[default]
    Snat,
    /// Direct server return: the client's address reaches the backend and
    /// the backend's node answers the client itself.
    Dsr,
    /// DSR for TCP, SNAT for UDP.
    Hybrid,
}

impl NodePortMode {
    /// The value of the programs' `NODEPORT_MODE` global.
    #[must_use]
    pub(crate) const fn value(self) -> u8 {
        match self {
            Self::Snat => proxy_common::nodeport_mode::SNAT,
            Self::Dsr => proxy_common::nodeport_mode::DSR,
            Self::Hybrid => proxy_common::nodeport_mode::HYBRID,
        }
    }
}

/// How a DSR flow's packets reach the backend's node (the programs'
/// `DSR_DISPATCH`; see `proxy-ebpf/src/encap.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DsrDispatch {
    /// The frontend in an IP option on the packets that open a flow.
    #[default]
    Option,
    /// Every packet inside an outer IP header to the backend.
    Ipip,
}

impl DsrDispatch {
    /// The value of the programs' `DSR_DISPATCH` global.
    #[must_use]
    pub(crate) const fn value(self) -> u8 {
        match self {
            Self::Option => proxy_common::dsr_dispatch::OPTION,
            Self::Ipip => proxy_common::dsr_dispatch::IPIP,
        }
    }
}

impl LoadOptions {
    /// The size flags, as the bounds of `sizing` (frontends by the
    /// services bound: each takes a `SERVICES` entry).
    #[must_use]
    pub(crate) const fn bounds(&self) -> Sizes {
        Sizes { services: self.services_map_size, backends: self.backends_map_size, frontends: self.services_map_size }
    }
}

/// Loading or attaching the datapath failed.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's #[error] message")]
pub enum LoadError {
    /// The network namespace's cookie cannot be read.
    #[error(
        "cannot read this network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14) for --socket-lb host-namespace: {source}; use --socket-lb all on this kernel"
    )]
    NetnsCookie { source: std::io::Error },
    /// The eBPF object cannot be loaded.
    #[error("cannot load the eBPF object (pinned maps in {pin_dir}): {source}")]
    Load { pin_dir: String, source: Box<EbpfError> },
    /// A pinned map has another layout than this build's.
    #[error(
        "pinned map {path} has {found}, this build needs {wanted}; it was made by an \
         incompatible version: remove the pin directory (or run the matching cleanup) and start again"
    )]
    PinnedLayout { path: String, found: String, wanted: String },
    /// The possible CPUs cannot be counted.
    #[error("cannot count the possible CPUs (/sys/devices/system/cpu/possible): {source}")]
    Cpus { source: std::io::Error },
    /// The connection counters do not fit one array.
    #[error("{stride} connection counters for each of {cpus} CPUs do not fit one array: lower --services-map-size")]
    TooManyCounters { stride: u32, cpus: u32 },
    /// A map is missing from the eBPF object.
    #[error("map {name} is missing from the eBPF object")]
    MissingMap { name: &'static str },
    /// A program is missing from the eBPF object.
    #[error("program {name} is missing from the eBPF object")]
    MissingProgram { name: &'static str },
    /// A program cannot be loaded.
    #[error("program {name}: {source}")]
    Program { name: &'static str, source: ProgramError },
    /// A link cannot be attached or pinned.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// A directory cannot be created.
    #[error("cannot create {path}: {source}")]
    Dir { path: String, source: std::io::Error },
    /// The conntrack map cannot be resized.
    #[error(
        "cannot replace the conntrack map pinned at {path} with one of the --ct-map-size asked for ({source}); start with its size, or remove the pin (its flows are lost)"
    )]
    CtResize { path: String, source: std::io::Error },
    /// A map cannot be pinned.
    #[error("cannot pin {path}: {source}")]
    Pin { path: String, source: aya::pin::PinError },
    /// A map's information cannot be read.
    #[error("cannot read map {name}: {source}")]
    MapInfo { name: &'static str, source: AyaMapError },
    /// A program cannot be put in a program array.
    #[error("cannot put program {name} in map {map}: {source}")]
    TailCall { name: &'static str, map: &'static str, source: AyaMapError },
    /// A map operation failed.
    #[error(transparent)]
    Maps(#[from] MapError),
    /// The pinned links cannot be listed.
    #[error("cannot list {path}: {source}")]
    ListLinks { path: String, source: std::io::Error },
    /// The XDP program cannot be loaded (`--nodeport-acceleration=native`).
    #[error(
        "--nodeport-acceleration=native: the XDP program cannot be loaded ({source}); \
         set --nodeport-acceleration=best-effort or disabled to serve traffic from outside with the TC programs"
    )]
    XdpLoad { source: ProgramError },
    /// The Maglev table size is not one of the sizes accepted.
    #[error(transparent)]
    MaglevSize(#[from] crate::reconcile::maglev::BadSize),
    /// The thread that loads the programs cannot be started.
    #[error("cannot start the thread that loads the programs: {source}")]
    Thread { source: std::io::Error },
    /// A loaded program's fd cannot be duplicated (the process is out of
    /// file descriptors: raise its limit).
    #[error("cannot duplicate the fd of program {name}: {source}; raise the agent's open-file limit")]
    ProgramFd { name: &'static str, source: std::io::Error },
    /// The programs failed to load (reported before).
    #[error("the programs failed to load (the error was logged and returned before)")]
    ProgramsFailed,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MarkFlowsError {
    #[error(transparent)]
    Dump(#[from] super::netfilter_flows::DumpError),
    #[error(transparent)]
    Map(#[from] MapError),
}

/// The loaded datapath. Programs are attached through links pinned under
/// `PIN_DIR/links` and the maps are pinned in `PIN_DIR`: dropping this
/// leaves translation running, and a restarted agent takes both over.
/// `cleanup` removes them.
///
/// Maps are pinned under `PIN_DIR/maps-vN` (N: this build's layout). The
/// programs are loaded by `load` but attached by `attach`, which the agent
/// calls once the first sync has filled the maps: an agent of a new layout
/// fills new maps beside the old ones, then swaps its programs into the
/// pinned links in one step, so no moment exists with services missing.
pub struct Datapath {
    /// The programs (loaded on a thread of their own, see
    /// `super::programs`) and their links. First: the programs are
    /// dropped (a load still running waited for) before the maps whose
    /// descriptors they were loaded with.
    programs: Programs,
    pin_dir: PathBuf,
    cgroup: PathBuf,
    /// The service maps the reconciler writes.
    pub maps: KernelMaps,
    pub(crate) sessions: SessionMaps,
    /// Taken by the agent for the metrics endpoint.
    pub(crate) counters: Option<ConnCounters>,
    /// Taken by the agent for the metrics endpoint.
    pub external_stats: Option<ExternalStats>,
    /// `ACTIVE_CONNS`, mapped (shared with `maps`, which clears a count
    /// with its backend).
    pub active: std::sync::Arc<ActiveConns>,
    /// `OUTSIDE_HANDOVER`: see `set_outside_handover`.
    handover: HandoverMap,
    /// `--nodeport-acceleration`.
    acceleration: Acceleration,
    /// Sizes of the services and backends maps of this set.
    sizes: Sizes,
    /// `CT`'s entries (the options' `ct_map_size` it was loaded with).
    ct_size: u32,
    maglev_size: usize,
    /// Made by this start (none found pinned) or onto such a set's unused
    /// session maps, and never attached: its session maps hold nothing.
    unused: bool,
    /// The TC programs translate packets to ClusterIPs too: the pods'
    /// (`--socket-lb host-namespace`) or those routed to the node
    /// (`--cluster-cidr`).
    cluster_ips_per_packet: bool,
}

/// What `attach_devices` did on one device.
#[derive(Debug)]
pub(crate) struct DeviceAttach {
    pub(crate) device: String,
    /// The TC programs' attach.
    pub(crate) result: Result<(), LinkError>,
    /// Whether the XDP program runs there (in front of TC).
    pub(crate) xdp: bool,
}

impl Datapath {
    /// Makes (or opens) the maps and readies the programs, reusing maps of
    /// this layout already pinned (after checking their key and value sizes), whatever their
    /// sizes: the agent moves to another set once it knows the table (see
    /// `sizing::plan`). With nothing pinned, the maps start small. Nothing
    /// is attached yet: see `attach`.
    ///
    /// The programs start loading (on a thread) at once when the maps were
    /// pinned, beside the read of what they hold, the TC programs only at
    /// the first attach (a previous agent's serve until then); with new small maps they
    /// wait for the first write, which usually goes to bigger maps made
    /// then (`crate::agent::resize::before_first_write`): a load now would be
    /// thrown away, and would take a core from the lists meanwhile. (A
    /// restart whose pinned maps turn out too small, or above a lowered
    /// bound, loads the socket programs twice: the first load, held before
    /// its TC programs, stops there when its datapath is dropped.)
    pub fn load(opts: &LoadOptions) -> Result<Self, LoadError> {
        let pinned = crate::paths::pinned_sizes(&opts.pin_dir, opts.maglev_size);
        let sizes = pinned.map_or_else(
            || sizing::wanted(sizing::Demand::default(), opts.bounds()),
            |(services, backends, frontends)| Sizes { services, backends, frontends },
        );
        let opts = &keeping_grown_ct(opts, &maps_dir(&opts.pin_dir, opts.maglev_size, sizes));
        let mut datapath = Self::load_sized(opts, sizes, &Sessions::New)?;
        datapath.unused = pinned.is_none();
        if pinned.is_some() {
            // The previous agent's TC programs serve until the first sync:
            // only the socket programs load beside the lists and the read.
            datapath.programs.start_holding_tc()?;
        }
        Ok(datapath)
    }

    /// Makes (or opens) maps of `sizes`, pinned in their own directory
    /// beside any other set (reused when that set is pinned), and readies
    /// the programs for them, to load when `start_loading_programs` (or
    /// `attach`) says. Nothing is attached yet: see `attach`.
    ///
    /// `carry`: which session maps it takes over from the set it replaces.
    pub(crate) fn load_sized(opts: &LoadOptions, sizes: Sizes, carry: &Sessions) -> Result<Self, LoadError> {
        let maps_dir = maps_dir(&opts.pin_dir, opts.maglev_size, sizes);
        std::fs::create_dir_all(&maps_dir)
            .map_err(|source| LoadError::Dir { path: maps_dir.display().to_string(), source })?;
        // The Maglev map's value size depends on the table size, which only
        // we know: it is made (or found) here and the programs take the pin.
        let maglev_pin = maps_dir.join(map_names::MAGLEV);
        let maglev = MaglevMap::open_or_create(&maglev_pin, opts.maglev_size)?;
        // A counters map the load makes (none pinned) holds only zeros.
        let counters_made = !maps_dir.join(map_names::CONNECTIONS).exists();
        // Nor does a backends array it makes hold anything.
        let backends_made = !maps_dir.join(map_names::BACKENDS).exists();
        let (mut ebpf, carried, ct_resize) = load_resizing_ct(opts, sizes, &maps_dir, &maglev_pin, carry)?;
        check_layouts(&ebpf, &maps_dir)?;
        if opts.bpf_log {
            start_bpf_log(&mut ebpf);
        }
        let mut maps = take_service_maps(&mut ebpf, &maps_dir, sizes, maglev)?;
        if backends_made {
            maps.backends_made_empty();
        }
        let sessions = take_session_maps(&mut ebpf, &maps_dir, &carried)?;
        if let Some(resize) = ct_resize {
            finish_ct_resize(resize, &sessions);
        }
        log_loaded(&maps_dir, sizes, &carried);
        let active = std::sync::Arc::new(ActiveConns::from_map(take_map(&mut ebpf, map_names::ACTIVE_CONNS)?)?);
        maps.set_active(active.clone());
        let counters = ConnCounters::from_map(take_map(&mut ebpf, map_names::CONNECTIONS)?, counters_made)?;
        let external_stats = ExternalStats::from_map(take_map(&mut ebpf, map_names::EXTERNAL_STATS)?)?;
        let handover = take_handover(&mut ebpf, opts.outside_handover)?;
        let programs = Programs::new(ebpf, opts.acceleration);
        Ok(Self {
            programs,
            pin_dir: opts.pin_dir.clone(),
            cgroup: opts.cgroup.clone(),
            maps,
            sessions,
            counters: Some(counters),
            external_stats: Some(external_stats),
            active,
            handover,
            acceleration: opts.acceleration,
            sizes,
            ct_size: opts.ct_map_size,
            maglev_size: opts.maglev_size,
            unused: matches!(carry, Sessions::Unused(_)),
            cluster_ips_per_packet: opts.socket_lb == SocketLb::HostNamespace || !opts.cluster_cidrs.is_empty(),
        })
    }

    /// Sets how the programs on the node's devices share traffic from
    /// outside with netfilter while taking over from a running kube-proxy
    /// (docs/design.md, "Taking over from kube-proxy"): `Defer` until the
    /// maps hold the table (kube-proxy serves everything), then `Handover`
    /// (new flows are ours, kube-proxy's go on through conntrack) while its
    /// rules are checked and removed; `Off` once its flows are gone. The
    /// programs follow from their next packet.
    pub fn set_outside_handover(&mut self, mode: OutsideHandover) -> Result<(), MapError> {
        self.handover.set(mode)?;
        tracing::info!(?mode, "outside handover mode set");
        Ok(())
    }

    /// The mode the programs follow now (`None`: a value this build does
    /// not write).
    pub fn outside_handover(&self) -> Result<Option<OutsideHandover>, MapError> {
        self.handover.get()
    }

    /// Marks the flows netfilter's conntrack translated (kube-proxy's DNAT,
    /// read over ctnetlink in this network namespace) as netfilter's, so
    /// that they stay with the kernel after the switch to handover even if
    /// they sent nothing while the programs deferred. Call it once the TC
    /// programs are attached in `Defer`, before `Handover`: a flow that
    /// starts after the dump is seen by the programs, one before it is in
    /// the dump. Only flows the programs would see are marked: those to a
    /// NodePort, LoadBalancer IP or externalIP, and to a ClusterIP when
    /// the programs translate ClusterIPs per packet; the node's other
    /// DNATed flows (a busy node's pods to ClusterIPs, translated at the
    /// socket from now on) would only take `CT` entries from live flows.
    /// Returns how many flows were marked (those the programs already saw
    /// keep their entry).
    pub(crate) fn mark_netfilter_flows(&mut self) -> Result<usize, MarkFlowsError> {
        let mut flows = super::netfilter_flows::dump()?;
        let dnat_flows = flows.len();
        flows.retain(|f| {
            self.maps.frontend_flags(f.dst, f.dport, f.proto).is_some_and(|flags| {
                flags & proxy_common::service_flags::EXTERNAL_KINDS != 0 || self.cluster_ips_per_packet
            })
        });
        let marked = self.sessions.mark_netfilter_flows(&flows, super::handover::monotonic_ns())?;
        tracing::info!(
            dnat_flows,
            to_frontends_seen = flows.len(),
            marked,
            "netfilter's flows marked for the handover"
        );
        Ok(marked)
    }

    /// `mark_netfilter_flows` where the TC programs are loaded, a failure
    /// logged as a warning (`why`: what an unmarked flow risks): the agent's
    /// callers go on without the marks.
    pub(crate) fn mark_netfilter_flows_or_warn(&mut self, why: &str) {
        if self.serves_external_traffic()
            && let Err(err) = self.mark_netfilter_flows()
        {
            tracing::warn!(%err, risk = why, "cannot mark netfilter's flows");
        }
    }

    /// Gives `self`'s programs the handover mode of `other` (a set of maps
    /// being replaced), a handover's end included.
    pub(crate) fn copy_outside_handover(&mut self, other: &Self) -> Result<(), MapError> {
        self.handover.set_raw(other.handover.raw()?)
    }

    /// Takes back the active connections of flows from outside whose `CT`
    /// entries ended unseen (`ActiveConns::sweep_ended_flows`).
    pub fn sweep_ended_flows(&self) -> Result<super::active::Sweep, MapError> {
        let maps = &self.maps;
        self.active.sweep_ended_flows(
            self.sessions.ct_fd(),
            |id| maps.backend_value(id),
            super::handover::monotonic_ns(),
        )
    }

    /// The most entries `CT` holds.
    pub(crate) fn ct_capacity(&self) -> Result<u32, MapError> {
        super::sys::map_max_entries(self.sessions.ct_fd()).map_err(|source| MapError::Syscall {
            map: super::maps::MapName::Ct,
            op: "read the size of",
            source,
        })
    }

    /// Starts loading the programs on a thread of their own (see
    /// `super::programs`), to attach them later: beside the first write
    /// into maps just made, beside the read of maps a previous agent
    /// pinned. Attaching starts the load when nothing did.
    pub(crate) fn start_loading_programs(&mut self) -> Result<(), LoadError> {
        self.programs.start()
    }

    /// Sizes of the services and backends maps this datapath writes.
    #[must_use]
    pub(crate) const fn sizes(&self) -> Sizes {
        self.sizes
    }

    /// `opts` for a set replacing this one: with this set's `CT` size,
    /// which may have grown since the start (`crate::agent::resize::grow_ct`).
    #[must_use]
    pub(crate) fn options_for_next(&self, opts: &LoadOptions) -> LoadOptions {
        LoadOptions { ct_map_size: self.ct_size, ..opts.clone() }
    }

    /// Where this set of maps is pinned.
    #[must_use]
    pub fn maps_dir(&self) -> PathBuf {
        maps_dir(&self.pin_dir, self.maglev_size, self.sizes)
    }

    /// Which session maps a set replacing this one takes over.
    #[must_use]
    pub(crate) fn sessions_to_carry(&self) -> Sessions {
        if self.unused { Sessions::Unused(self.maps_dir()) } else { Sessions::Live(self.maps_dir()) }
    }

    /// Attaches the programs through the pinned links (swapping them into
    /// links a previous agent left), then unpins maps of other layouts,
    /// which the programs no longer use.
    pub(crate) fn attach(&mut self) -> Result<(), LoadError> {
        self.unused = false;
        let links_dir = self.links_dir()?;
        for program in self.programs.sockets()? {
            let outcome = links::attach_cgroup(program, &self.cgroup, &links_dir.join(program.name))?;
            tracing::info!(program = program.name, ?outcome, cgroup = %self.cgroup.display(), "program attached");
        }
        // The TC programs a restart held back load now (`load`).
        self.programs.release_tc();
        remove_other_layouts(&self.pin_dir, &self.maps_dir());
        Ok(())
    }

    /// Waits for the programs' load: its error the first time it failed
    /// (a socket program, or the XDP program with
    /// `--nodeport-acceleration=native`).
    pub(crate) fn programs_loaded(&mut self) -> Result<(), LoadError> {
        self.programs.loaded().map(drop)
    }

    /// Before the first attach: whether these maps (or those a set made
    /// before the first write replaces) are a previous agent's, pinned (a
    /// restart), whose TC programs serve traffic from outside until this
    /// agent's are attached. (`unused` says the opposite until `attach`.)
    #[must_use]
    pub(crate) const fn previous_agents(&self) -> bool {
        !self.unused
    }

    /// Ends when the programs' load does (`programs::Programs::done`).
    pub(crate) fn programs_done(&self) -> impl std::future::Future<Output = ()> + use<> {
        self.programs.done()
    }

    /// Whether the programs' load is over (`programs::Programs::finished`):
    /// the TC programs attach without waiting.
    pub(crate) fn programs_finished(&self) -> bool {
        self.programs.finished()
    }

    /// Attaches the TC programs to exactly `devices` (ingress and egress of
    /// each), and the XDP program in front of them when asked
    /// (`--nodeport-acceleration`), through links pinned under
    /// `PIN_DIR/links`: taken over where they exist, made where not; links
    /// on devices no longer listed (or no longer accelerated) are dropped.
    /// A device that fails is reported and the others go on.
    ///
    /// `kind`: each device's kind (`IFLA_INFO_KIND`, empty for a physical
    /// one), which decides where XDP is worth it (`Acceleration::plan`).
    pub(crate) fn attach_devices(
        &mut self,
        devices: &[String],
        kind: impl Fn(&str) -> String,
    ) -> Result<Vec<DeviceAttach>, LoadError> {
        let links_dir = self.links_dir()?;
        let mut results = Vec::new();
        if !self.programs.loaded()?.tc {
            return Ok(results);
        }
        let mut wanted = Vec::new();
        for device in devices {
            let result = self.attach_tc_programs(TC_PROGRAMS, TC_LINK_PREFIX, device, &links_dir, &mut wanted)?;
            // XDP only in front of TC: what it passes up must be served.
            let xdp =
                result.is_ok() && self.attach_xdp(device, &kind(device), &links_dir.join(xdp_link_name(device)))?;
            if xdp {
                wanted.push(xdp_link_name(device));
            }
            results.push(DeviceAttach { device: device.clone(), result, xdp });
        }
        // Links of devices no longer listed (or no longer accelerated).
        unpin_unwanted(&links_dir, &[TC_LINK_PREFIX, XDP_LINK_PREFIX], &wanted)?;
        if results.iter().any(|r| r.result.is_ok()) {
            self.set_tail_calls()?;
        }
        Ok(results)
    }

    /// Loads the programs the TC ingress program tail-calls, once
    /// (`programs::Loaded::set_tail_calls`); `attach_devices` does when it
    /// attached a device.
    pub fn set_tail_calls(&mut self) -> Result<(), LoadError> {
        self.programs.loaded()?.set_tail_calls();
        Ok(())
    }

    /// Attaches the pod-facing TC programs to exactly `devices` (ingress and
    /// egress of each) through links pinned under `PIN_DIR/links` (`pod-`);
    /// links of devices no longer listed (a pod gone) are dropped. A device
    /// that fails is reported and the others go on.
    pub(crate) fn attach_pod_devices(&mut self, devices: &[String]) -> Result<Vec<DeviceAttach>, LoadError> {
        let links_dir = self.links_dir()?;
        let mut results = Vec::new();
        if !self.programs.loaded()?.tc {
            return Ok(results);
        }
        let mut wanted = Vec::new();
        for device in devices {
            let result = self.attach_tc_programs(POD_PROGRAMS, POD_LINK_PREFIX, device, &links_dir, &mut wanted)?;
            results.push(DeviceAttach { device: device.clone(), result, xdp: false });
        }
        unpin_unwanted(&links_dir, &[POD_LINK_PREFIX], &wanted)?;
        Ok(results)
    }

    /// Attaches `programs` to `device` through links pinned as
    /// `PREFIXDEVICE-DIRECTION` in `links_dir` (their names added to
    /// `wanted`): the first that fails ends it (the inner `Err`). Each new
    /// attachment is logged at info for a node device, at debug for a
    /// pod-facing one (pods come and go; the caller sums them up).
    fn attach_tc_programs(
        &mut self,
        programs: &[(&'static str, TcAttachType)],
        prefix: &str,
        device: &str,
        links_dir: &Path,
        wanted: &mut Vec<String>,
    ) -> Result<Result<(), LinkError>, LoadError> {
        wanted.extend(programs.iter().map(|(_, dir)| link_name(prefix, device, *dir)));
        for (name, direction) in programs {
            let program: &mut SchedClassifier = program(&mut self.programs.loaded()?.ebpf, name)?;
            let pin = links_dir.join(link_name(prefix, device, *direction));
            match links::attach_tc(program, name, device, *direction, &pin) {
                Ok(LinkOutcome::Updated) => {}
                Ok(outcome) if prefix == TC_LINK_PREFIX => {
                    tracing::info!(program = name, device = %device, ?outcome, "program attached");
                }
                Ok(outcome) => tracing::debug!(program = name, device = %device, ?outcome, "program attached"),
                Err(err) => return Ok(Err(err)),
            }
        }
        Ok(Ok(()))
    }

    /// Attaches the XDP program to `device` through the link pinned at
    /// `pin` when the acceleration asks for it; whether it runs there. A
    /// device without native XDP is logged: an error for `native`, a
    /// warning for `best-effort`; the TC programs serve it either way.
    fn attach_xdp(&mut self, device: &str, kind: &str, pin: &Path) -> Result<bool, LoadError> {
        let loaded = self.programs.loaded()?;
        if !loaded.xdp {
            return Ok(false);
        }
        match self.acceleration.plan(kind) {
            Plan::No => return Ok(false),
            Plan::TcFaster => {
                tracing::info!(
                    device,
                    kind,
                    "--nodeport-acceleration=best-effort: no XDP on this device, where it is slower than the TC programs alone; TC serves it"
                );
                return Ok(false);
            }
            Plan::TrySlower => tracing::warn!(
                device,
                kind,
                "--nodeport-acceleration=native on a device where XDP is slower than the TC programs alone (docs/services.md, XDP); best-effort would leave it to TC"
            ),
            Plan::Try => {}
        }
        let program: &mut Xdp = program(&mut loaded.ebpf, XDP_PROGRAM)?;
        let attached = match links::attach_xdp(program, XDP_PROGRAM, device, pin) {
            Ok(outcome) => {
                if outcome != LinkOutcome::Updated {
                    tracing::info!(program = XDP_PROGRAM, device, ?outcome, "program attached");
                }
                true
            }
            Err(LinkError::NoNativeXdp { .. }) => false,
            Err(err) => {
                tracing::error!(device, %err, "cannot attach the XDP program: the TC programs alone serve traffic from outside arriving there");
                return Ok(false);
            }
        };
        match self.acceleration.on_device(attached) {
            DeviceXdp::TcOnly => tracing::warn!(
                device,
                "no native XDP on this device: the TC programs alone serve it (--nodeport-acceleration=best-effort)"
            ),
            DeviceXdp::Failed => tracing::error!(
                device,
                err = %LinkError::NoNativeXdp { device: device.to_owned() },
                "--nodeport-acceleration=native: the TC programs alone serve traffic from outside arriving there"
            ),
            DeviceXdp::Attached | DeviceXdp::NotWanted => {}
        }
        Ok(attached)
    }

    /// `PIN_DIR/links`, made if missing.
    fn links_dir(&self) -> Result<PathBuf, LoadError> {
        let links_dir = self.pin_dir.join(LINKS_SUBDIR);
        std::fs::create_dir_all(&links_dir)
            .map_err(|source| LoadError::Dir { path: links_dir.display().to_string(), source })?;
        Ok(links_dir)
    }

    /// Whether the TC programs loaded (waiting for the load; false when
    /// the programs failed to load: the error is returned by the first
    /// caller that asks for it, which is `attach` in the agent).
    pub fn serves_external_traffic(&mut self) -> bool {
        self.programs.loaded().is_ok_and(|loaded| loaded.tc)
    }

    /// A loaded TC program, for tests that run it on crafted packets
    /// (`BPF_PROG_TEST_RUN`): `nodeport_ingress` or `nodeport_egress`.
    /// `None` until the load was waited for (`serves_external_traffic`,
    /// `attach`).
    #[must_use]
    pub fn tc_program(&self, name: &str) -> Option<&SchedClassifier> {
        self.programs.get()?.ebpf.program(name)?.try_into().ok()
    }

    /// The loaded XDP program (`--nodeport-acceleration`), for tests that
    /// run it on crafted packets (`None` until the load was waited for,
    /// as `tc_program`).
    #[must_use]
    pub fn xdp_program(&self) -> Option<&Xdp> {
        self.programs.get()?.ebpf.program(XDP_PROGRAM)?.try_into().ok()
    }
}

/// Program `name` of the object, as its type `T`.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, LoadError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

/// The pin name of a tcx link: `PREFIXDEVICE-ingress` or `PREFIXDEVICE-egress`.
fn link_name(prefix: &str, device: &str, direction: TcAttachType) -> String {
    let dir = if direction == TcAttachType::Ingress { "ingress" } else { "egress" };
    format!("{prefix}{device}-{dir}")
}

/// Unpins the links in `links_dir` named with one of `prefixes` and not
/// `wanted` (their devices are no longer served, or gone).
fn unpin_unwanted(links_dir: &Path, prefixes: &[&str], wanted: &[String]) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(links_dir)
        .map_err(|source| LoadError::ListLinks { path: links_dir.display().to_string(), source })?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if prefixes.iter().any(|p| name.starts_with(p)) && !wanted.contains(&name) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(link = %name, "detached from a device no longer served"),
                Err(err) => tracing::warn!(link = %name, %err, "cannot unpin a link of a device no longer served"),
            }
        }
    }
    Ok(())
}

/// The pin name of the XDP link of `device`.
fn xdp_link_name(device: &str) -> String {
    format!("{XDP_LINK_PREFIX}{device}")
}

/// The maps of sessions (affinity, UDP sockets' memos, flows from
/// outside): neither the table nor its growth sizes them.
const SESSION_MAPS: [&str; 4] = [map_names::AFFINITY, map_names::SOCK_BACKEND, map_names::SOCK_REVNAT, map_names::CT];

/// Which session maps a set of maps being made takes over from the set it
/// replaces (`load_sized`).
#[derive(Clone, Debug)]
pub(crate) enum Sessions {
    /// All made anew (or found pinned with the set).
    New,
    /// All of the set pinned at this path, which holds none: it was made
    /// by this start and nothing was attached to it (a fresh start's move
    /// before its first write). Made once, not twice: making them is a
    /// visible part of a start, most of it the preallocated `CT`.
    Unused(PathBuf),
    /// Of the set pinned at this path, in use, only `SOCK_REVNAT` (a
    /// connected UDP socket's service address and port, which names no
    /// id): the new set hands out frontend and backend ids of its own,
    /// and `AFFINITY`, `SOCK_BACKEND` and `CT` hold the old set's ids, so
    /// they are made anew (`CT`'s flows are then copied over with the new
    /// ids: `agent::resize`, `reconcile::remap`).
    Live(PathBuf),
}

impl Sessions {
    /// The maps taken over, and from where.
    fn carried(&self) -> (&[&'static str], Option<&Path>) {
        match self {
            Self::New => (&[], None),
            Self::Unused(from) => (&SESSION_MAPS, Some(from)),
            Self::Live(from) => (&[map_names::SOCK_REVNAT], Some(from)),
        }
    }
}

/// `opts`, with the size of the `CT` pinned in `maps_dir` when a previous
/// agent grew it (`node::memory::ct_entries_at_start`).
fn keeping_grown_ct(opts: &LoadOptions, maps_dir: &Path) -> LoadOptions {
    use std::os::fd::AsFd as _;
    let pinned = super::sys::obj_get(&maps_dir.join(map_names::CT))
        .and_then(|map| super::sys::map_max_entries(map.as_fd()))
        .ok();
    let ct_map_size = crate::node::memory::ct_entries_at_start(opts.ct_map_size, pinned, opts.ct_map_grows);
    LoadOptions { ct_map_size, ..opts.clone() }
}

/// Sets the conntrack map aside when its size changes, then loads the
/// object (`load_object`); a failed load puts the old map back.
fn load_resizing_ct(
    opts: &LoadOptions,
    sizes: Sizes,
    maps_dir: &Path,
    maglev_pin: &Path,
    carry: &Sessions,
) -> Result<(Ebpf, Vec<&'static str>, Option<CtResize>), LoadError> {
    let (ct_pin, _) = session_pin(maps_dir, carry, map_names::CT);
    let ct_resize = CtResize::set_aside(&ct_pin, opts.ct_map_size)
        .map_err(|source| LoadError::CtResize { path: ct_pin.display().to_string(), source })?;
    match load_object(opts, sizes, maps_dir, maglev_pin, carry) {
        Ok((ebpf, carried)) => Ok((ebpf, carried, ct_resize)),
        Err(err) => {
            if let Some(resize) = ct_resize {
                resize.undo();
            }
            Err(err)
        }
    }
}

/// Takes map `name` out of the loaded object.
fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::MissingMap { name })
}

/// The maps the reconciler writes, the names map (made or opened in
/// `maps_dir` here: the object does not hold it) and the Maglev map.
fn take_service_maps(
    ebpf: &mut Ebpf,
    maps_dir: &Path,
    sizes: Sizes,
    maglev: MaglevMap,
) -> Result<KernelMaps, LoadError> {
    let services = take_map(ebpf, map_names::SERVICES)?;
    let backends = take_map(ebpf, map_names::BACKENDS)?;
    let rev_nat = take_map(ebpf, map_names::REVNAT)?;
    let source_ranges = take_map(ebpf, map_names::SOURCE_RANGES)?;
    let names = super::names::open_or_create(&maps_dir.join(map_names::SERVICE_NAMES), sizes.frontends)?;
    Ok(KernelMaps::from_maps(services, backends, rev_nat, source_ranges, maglev, names)?)
}

/// The session maps; the `carried` ones are pinned in this set too, so
/// that it keeps them once the set they came from is removed.
fn take_session_maps(ebpf: &mut Ebpf, maps_dir: &Path, carried: &[&'static str]) -> Result<SessionMaps, LoadError> {
    let mut session = |name: &'static str| -> Result<Map, LoadError> {
        let map = take_map(ebpf, name)?;
        if carried.contains(&name) {
            let path = maps_dir.join(name);
            map.pin(&path).map_err(|source| LoadError::Pin { path: path.display().to_string(), source })?;
        }
        Ok(map)
    };
    Ok(SessionMaps::from_maps(
        session(map_names::AFFINITY)?,
        session(map_names::SOCK_BACKEND)?,
        session(map_names::SOCK_REVNAT)?,
        session(map_names::CT)?,
    )?)
}

/// Copies the old conntrack map's entries into the resized one.
fn finish_ct_resize(resize: CtResize, sessions: &SessionMaps) {
    // The flows are lost, not the start.
    if let Err(err) = resize.finish(sessions.ct_fd()) {
        tracing::warn!(%err, "cannot copy the conntrack map's entries into the resized one; flows from outside may be balanced anew");
    }
}

fn log_loaded(maps_dir: &Path, sizes: Sizes, carried: &[&'static str]) {
    tracing::info!(
        maps = %maps_dir.display(),
        services_map_size = sizes.services,
        backends_map_size = sizes.backends,
        frontend_maps_size = sizes.frontends,
        sessions_carried = ?carried,
        "datapath loaded"
    );
}

/// The map of how traffic from outside is shared with netfilter, set to
/// `mode`.
fn take_handover(ebpf: &mut Ebpf, mode: OutsideHandover) -> Result<HandoverMap, LoadError> {
    let mut handover = HandoverMap::from_map(take_map(ebpf, map_names::OUTSIDE_HANDOVER)?)?;
    handover.set(mode)?;
    if mode != OutsideHandover::Off {
        tracing::info!(mode = ?mode, "traffic from outside shared with netfilter (--outside-handover)");
    }
    Ok(handover)
}

/// Loads the object with its maps pinned in `maps_dir` (Maglev's at
/// `maglev_pin`, made by the caller; the session maps `carry` takes over
/// where they are) and sized by `sizes` and `opts`; the names of the
/// session maps carried.
fn load_object(
    opts: &LoadOptions,
    sizes: Sizes,
    maps_dir: &Path,
    maglev_pin: &Path,
    carry: &Sessions,
) -> Result<(Ebpf, Vec<&'static str>), LoadError> {
    let at = crate::reconcile::maglev::SIZES
        .iter()
        .position(|m| *m == opts.maglev_size)
        .ok_or(crate::reconcile::maglev::BadSize(opts.maglev_size))?;
    let maglev_size = &MAGLEV_SIZES[at];
    // Indexed by frontend id, 1..=frontends (id 0 is never used), in a
    // region per CPU.
    let stride = sizes.frontends.saturating_add(1);
    let cpus = super::counters::possible_cpus().map_err(|source| LoadError::Cpus { source })?;
    let counters_size = stride.checked_mul(cpus).ok_or(LoadError::TooManyCounters { stride, cpus })?;
    let mut loader = LOADER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let carried = carry_sessions(&mut loader, maps_dir, carry);
    loader
        .default_map_pin_directory(maps_dir)
        .map_pin_path(map_names::MAGLEV, maglev_pin.to_owned())
        .map_max_entries(map_names::SERVICES, sizes.services)
        .map_max_entries(map_names::BACKENDS, sizes.backends)
        .map_max_entries(map_names::REVNAT, sizes.frontends)
        .map_max_entries(map_names::CONNECTIONS, counters_size)
        .override_global(CONNECTIONS_STRIDE, interned(stride), true)
        .map_max_entries(map_names::CT, opts.ct_map_size)
        .map_max_entries(map_names::ACTIVE_CONNS, sizes.backends)
        .override_global(MAGLEV_SIZE, maglev_size, true);
    let ebpf = settings_globals(&mut loader, opts)?
        .load(OBJECT)
        .map_err(|source| LoadError::Load { pin_dir: opts.pin_dir.display().to_string(), source: Box::new(source) })?;
    Ok((ebpf, carried))
}

/// Points the loader at the session maps `sessions` takes over, pinned in
/// the set it replaces (unless `maps_dir` has its own: a set found
/// pinned), and every other session map at `maps_dir`: the one loader
/// keeps what it was told. The names taken over.
fn carry_sessions(loader: &mut EbpfLoader<'static>, maps_dir: &Path, sessions: &Sessions) -> Vec<&'static str> {
    let mut carried = Vec::new();
    for name in SESSION_MAPS {
        let (path, theirs) = session_pin(maps_dir, sessions, name);
        if theirs {
            carried.push(name);
        }
        loader.map_pin_path(name, path);
    }
    carried
}

/// Where session map `name` is pinned for a set in `maps_dir`: in the set
/// `sessions` takes it over from (true), or in its own.
fn session_pin(maps_dir: &Path, sessions: &Sessions, name: &'static str) -> (PathBuf, bool) {
    let (names, from) = sessions.carried();
    let own = maps_dir.join(name);
    match from.map(|from| from.join(name)) {
        Some(theirs) if names.contains(&name) && theirs.exists() && !own.exists() => (theirs, true),
        _ => (own, false),
    }
}

/// Unpins maps of other layouts than `current` (and of the unversioned
/// first layout, pinned straight in the pin directory); failures are
/// logged.
fn remove_other_layouts(pin_dir: &Path, current: &Path) {
    let Ok(entries) = std::fs::read_dir(pin_dir) else { return };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let result = if path.is_dir() {
            if path == current || !name.starts_with("maps-v") {
                continue;
            }
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => tracing::info!(path = %path.display(), "unpinned maps of another layout"),
            Err(err) => tracing::warn!(path = %path.display(), %err, "cannot unpin maps of another layout"),
        }
    }
}

/// A `'static` copy of `value`, for a global of the one loader (which
/// keeps what it is given for its whole life): one per distinct value, so
/// loads of sizes seen before add nothing.
fn interned(value: u32) -> &'static u32 {
    static SEEN: std::sync::Mutex<Vec<&'static u32>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = seen.iter().find(|v| ***v == value) {
        return found;
    }
    let new: &'static u32 = Box::leak(Box::new(value));
    seen.push(new);
    new
}

/// `check_layout` of every map with a fixed layout.
fn check_layouts(ebpf: &Ebpf, maps_dir: &Path) -> Result<(), LoadError> {
    check_layout::<ServiceKey, ServiceValue>(ebpf, maps_dir, map_names::SERVICES)?;
    check_layout::<u32, Backend>(ebpf, maps_dir, map_names::BACKENDS)?;
    check_layout::<RevNatId, RevNat>(ebpf, maps_dir, map_names::REVNAT)?;
    check_layout::<SockRevNatKey, SockRevNat>(ebpf, maps_dir, map_names::SOCK_REVNAT)?;
    check_layout::<SockBackendKey, u32>(ebpf, maps_dir, map_names::SOCK_BACKEND)?;
    check_layout::<AffinityKey, AffinityValue>(ebpf, maps_dir, map_names::AFFINITY)?;
    check_layout::<CtKey, CtValue>(ebpf, maps_dir, map_names::CT)?;
    check_layout::<u32, u64>(ebpf, maps_dir, map_names::ACTIVE_CONNS)?;
    check_layout::<u64, SockConn>(ebpf, maps_dir, map_names::SOCK_CONN)
}

/// Fails when a map reused from a pin has another key or value size than
/// this build's types (aya reuses pins without checking).
fn check_layout<K, V>(ebpf: &Ebpf, pin_dir: &Path, name: &'static str) -> Result<(), LoadError> {
    let map = ebpf.map(name).ok_or(LoadError::MissingMap { name })?;
    let (Map::HashMap(data) | Map::LruHashMap(data) | Map::Array(data)) = map else {
        return Err(LoadError::MissingMap { name });
    };
    let info = data.info().map_err(|source| LoadError::MapInfo { name, source })?;
    let wanted = (size_of::<K>(), size_of::<V>());
    let found = (info.key_size() as usize, info.value_size() as usize);
    if found != wanted {
        return Err(LoadError::PinnedLayout {
            path: pin_dir.join(name).display().to_string(),
            found: format!("key {} / value {} bytes", found.0, found.1),
            wanted: format!("key {} / value {} bytes", wanted.0, wanted.1),
        });
    }
    Ok(())
}

/// Forwards the programs' aya-log records to the agent's log.
fn start_bpf_log(ebpf: &mut Ebpf) {
    match aya_log::EbpfLogger::init(ebpf) {
        // SAFETY: the logger owns the ring buffer fd and the AsyncFd owns the
        // logger, so the fd stays open for as long as it is registered.
        Ok(logger) => {
            match unsafe { tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
                Ok(mut logger) => {
                    tokio::spawn(async move {
                        loop {
                            let Ok(mut guard) = logger.readable_mut().await else { return };
                            guard.get_inner_mut().flush();
                            guard.clear_ready();
                        }
                    });
                }
                Err(err) => tracing::warn!(%err, "--bpf-log: cannot poll the eBPF log buffer; eBPF logging is off"),
            }
        }
        Err(err) => tracing::warn!(%err, "--bpf-log: cannot read the eBPF log buffer; eBPF logging is off"),
    }
}

#[cfg(test)]
mod tests {
    /// The one loader skips the kernel's BTF (`LOADER`), which is right
    /// only while the programs need no CO-RE relocation: this asks aya's
    /// parser of the object (the check aya itself makes before it reads
    /// the kernel's BTF) and fails the day a program starts to need one
    /// (then give the loader the kernel's BTF again).
    #[test]
    fn the_programs_need_no_btf_relocation() {
        let object = aya_obj::Object::parse(super::OBJECT).expect("the eBPF object parses");
        assert!(
            !object.has_btf_relocations(),
            "a program needs CO-RE relocations: the loader must have the kernel's BTF"
        );
    }
}
