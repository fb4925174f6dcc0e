//! `ebpf-proxy explain ADDR:PORT[/PROTO] [--from IP[:PORT]]`: where a
//! connection to a frontend goes and why, read from the pinned maps (the
//! agent need not be running): the service and port, its type and
//! policies, each backend with its state, and with `--from` the backend
//! that client would get. Which endpoints of the cluster are not used, and
//! why, only the running agent knows: it is asked on its socket
//! (`crate::observe::explain_socket`), and when it cannot be, the answer says so.
use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
};

use anyhow::{Context as _, bail};
use serde::Serialize;

use crate::{
    args::{ExplainArgs, OutputFormat},
    datapath::{KernelMaps, active::ActiveConns, socket_lb_pins},
    model::explain::{EndpointUse, Explained},
    observe::explain_socket::{self, Answer, Request},
    reconcile::{
        ServiceMaps as _,
        inspect::{self, BackendView, FrontendView},
    },
};

#[derive(Debug, Serialize)]
struct Explanation {
    /// The entries of the frontend (the one every client uses, and its
    /// `external` twin when externalTrafficPolicy is Local), each with the
    /// agent's reasons when it could be asked.
    frontends: Vec<Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<ClientView>,
    /// What this answer cannot tell.
    unknown: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Entry {
    #[serde(flatten)]
    frontend: FrontendView,
    /// Every endpoint of the service port the cluster has that this entry
    /// does not use, with why (from the agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    unused: Option<Vec<UnusedView>>,
    /// The endpoints the agent says are used are the backends in the maps
    /// (false: the maps are behind the agent, or were changed by hand).
    #[serde(skip_serializing_if = "Option::is_none")]
    agrees_with_maps: Option<bool>,
}

#[derive(Debug, Serialize)]
struct UnusedView {
    address: IpAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// `not-ready`, `other-node`, `port-name-unmatched`, ...
    reason: crate::model::explain::Unused,
    /// The reason in words.
    why: &'static str,
}

#[derive(Debug, Serialize)]
struct ClientView {
    client: IpAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    /// Traffic from outside: the source ranges admit it.
    admitted: bool,
    /// Traffic from outside: the Maglev entry a new flow picks.
    #[serde(skip_serializing_if = "Option::is_none")]
    maglev_entry: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<BackendView>,
    /// How it is chosen, in words.
    how: String,
    /// ClientIP affinity: the entries (`AFFINITY`) of the network
    /// namespaces on this node that hold the client's address (the socket
    /// programs key a client by its namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    affinity: Option<Vec<AffinityView>>,
    /// Where the client's connections are translated, per network
    /// namespace on this node that holds its address (none: it is not on
    /// this node); unset when the attached programs cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    paths: Option<Vec<PathView>>,
}

/// Where connections from one client namespace are translated.
#[derive(Debug, Serialize, PartialEq, Eq)]
struct PathView {
    /// A file naming the client's network namespace.
    netns: std::path::PathBuf,
    /// `socket` (at connect()/sendmsg()), `per-packet` (on the pod-facing
    /// devices) or `none`.
    path: &'static str,
    /// Why, in words.
    why: String,
}

#[derive(Debug, Serialize)]
struct AffinityView {
    /// A file naming the client's network namespace.
    netns: std::path::PathBuf,
    backend_id: u32,
    /// The backend, when it still serves the frontend.
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<BackendView>,
    /// Since the client's last connection through the frontend.
    idle_seconds: u64,
    /// Until the entry expires (0: expired; the next connection picks
    /// a backend again).
    expires_in_seconds: u64,
}

/// Runs `ebpf-proxy explain`.
pub fn run(args: &ExplainArgs) -> anyhow::Result<()> {
    let (addr, port, protocol) = super::service::parse_frontend(&args.frontend)?;
    let client = args.from.as_deref().map(parse_client).transpose()?;
    let dir = crate::paths::current_maps_dir(&args.bpffs_dir)
        .with_context(|| format!("no ebpf-proxy maps pinned in {}", args.bpffs_dir.display()))?;
    let dump = KernelMaps::open_pinned(&dir)
        .with_context(|| format!("no ebpf-proxy maps pinned in {}", args.bpffs_dir.display()))?
        .dump()?;
    let mut frontends: Vec<FrontendView> = inspect::frontends(&dump)
        .into_iter()
        .filter(|f| {
            f.key().is_some_and(|k| k.addr == addr && k.port == port && protocol.is_none_or(|p| p == k.protocol))
        })
        .collect();
    // Maps pinned by a build before the counts have none: shown without.
    if let Ok(active) = ActiveConns::open_pinned(&dir.join(proxy_common::map_names::ACTIVE_CONNS)) {
        inspect::with_active(&mut frontends, |id| active.get(id));
    }
    if frontends.is_empty() {
        bail!("no frontend {} in the maps: it is not a service address this node translates", args.frontend);
    }
    let mut affinity_unknown = None;
    let mut paths_unknown = None;
    let from = client.map(|(ip, port)| {
        let mut view = client_view(&dump, &frontends, ip, port);
        match affinity_views(&dir, &frontends[0], ip) {
            Ok(views) => view.affinity = views,
            Err(err) => affinity_unknown = Some(format!("the affinity entry of {ip}: {err}")),
        }
        match socket_lb_pins::read(&args.bpffs_dir) {
            Ok(seen) => {
                let devices = socket_lb_pins::pod_devices(&args.bpffs_dir);
                let namespaces = crate::node::client_netns::holding(ip);
                view.paths = Some(namespaces.iter().map(|n| path_view(seen, &devices, n)).collect());
            }
            Err(err) => paths_unknown = Some(format!("where connections from {ip} are translated: {err}")),
        }
        view
    });
    let (frontends, mut unknown) = ask_agent(&args.agent_socket, frontends);
    unknown.extend(affinity_unknown);
    unknown.extend(paths_unknown);
    let explanation = Explanation { frontends, from, unknown };
    match args.output {
        OutputFormat::Table => print!("{}", text(&explanation)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&explanation)?),
    }
    Ok(())
}

/// Asks the agent at `socket` about each entry: the entries with the
/// endpoints they do not use, and what could not be told.
fn ask_agent(socket: &Path, frontends: Vec<FrontendView>) -> (Vec<Entry>, Vec<String>) {
    let mut unknown = Vec::new();
    let mut entries = Vec::new();
    let mut unreachable = false;
    for frontend in frontends {
        let mut entry = Entry { frontend, unused: None, agrees_with_maps: None };
        let f = &entry.frontend;
        if unreachable {
            entries.push(entry);
            continue;
        }
        let (Some(namespace), Some(name)) = (f.namespace.clone(), f.name.clone()) else {
            unknown.push(format!(
                "which endpoints {}:{}/{} does not use, and why: the maps name no service for it",
                f.address, f.port, f.protocol
            ));
            entries.push(entry);
            continue;
        };
        let request = Request {
            namespace,
            name,
            address: f.address,
            port: f.port,
            protocol: f.protocol.clone(),
            external: f.scope.is_some(),
        };
        let what = format!("which endpoints of {} the cluster has are not used, and why", f.service_text());
        match explain_socket::ask(socket, &request) {
            Ok(Answer::Explained(explained)) => {
                entry.agrees_with_maps = Some(agrees(&explained, &entry.frontend.backends));
                entry.unused = Some(unused_views(&explained.endpoints));
            }
            Ok(Answer::NotExplained { reason }) => unknown.push(format!("{what}: the agent cannot tell: {reason}")),
            Err(err) => {
                unknown.push(format!("{what}: only the running agent knows, and it cannot be asked: {err}"));
                // Said once: the socket will not answer the next entry either.
                unreachable = true;
            }
        }
        entries.push(entry);
    }
    (entries, unknown)
}

/// Whether the endpoints the agent says are used are the backends the maps
/// hold (address and port; their order and states aside).
fn agrees(explained: &Explained, backends: &[BackendView]) -> bool {
    let mut used: Vec<(IpAddr, u16)> =
        explained.endpoints.iter().filter(|u| u.unused.is_none()).filter_map(|u| Some((u.address, u.port?))).collect();
    let mut mapped: Vec<(IpAddr, u16)> = backends.iter().filter_map(|b| Some((b.address?, b.port))).collect();
    used.sort_unstable();
    mapped.sort_unstable();
    used == mapped
}

fn unused_views(endpoints: &[EndpointUse]) -> Vec<UnusedView> {
    endpoints
        .iter()
        .filter_map(|u| {
            let reason = u.unused?;
            Some(UnusedView { address: u.address, port: u.port, node: u.node.clone(), reason, why: reason.text() })
        })
        .collect()
}

/// `IP` or `IP:PORT` (`[IPv6]:PORT`).
fn parse_client(text: &str) -> anyhow::Result<(IpAddr, Option<u16>)> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    let sock: SocketAddr =
        text.parse().with_context(|| format!("--from {text}: expected IP or IP:PORT ([IPv6]:PORT)"))?;
    Ok((sock.ip(), Some(sock.port())))
}

/// The affinity entries of frontend `f` (the one local clients use) for
/// the namespaces holding `ip`; `None` when `f` has no affinity.
fn affinity_views(
    dir: &Path,
    f: &FrontendView,
    ip: IpAddr,
) -> Result<Option<Vec<AffinityView>>, crate::datapath::maps::MapError> {
    let Some(timeout) = f.affinity_timeout.map(u64::from) else { return Ok(None) };
    let entries = crate::datapath::affinity::entries(dir, f.id)?;
    let namespaces = if entries.is_empty() { Vec::new() } else { crate::node::client_netns::holding(ip) };
    let views = entries
        .iter()
        .filter_map(|e| {
            let ns = namespaces.iter().find(|n| n.cookie == e.client)?;
            let idle = e.idle.as_secs();
            Some(AffinityView {
                netns: ns.path.clone(),
                backend_id: e.backend_id,
                backend: f.backends.iter().find(|b| b.id == e.backend_id).cloned(),
                idle_seconds: idle,
                expires_in_seconds: timeout.saturating_sub(idle),
            })
        })
        .collect();
    Ok(Some(views))
}

/// Where connections from the client namespace `netns` are translated,
/// with the socket programs run as `seen` and per-packet programs on the
/// pod-facing `devices`.
fn path_view(
    seen: socket_lb_pins::Seen,
    devices: &[String],
    netns: &crate::node::client_netns::ClientNetns,
) -> PathView {
    let mode = seen.mode().as_str();
    let (path, why) = if seen.translates_socket_of(netns.cookie) {
        (
            "socket",
            format!("its processes in the agent's cgroup are translated at connect()/sendmsg() (--socket-lb {mode})"),
        )
    } else if devices.is_empty() {
        (
            "none",
            format!(
                "its sockets keep the service address (--socket-lb {mode}: only the node's namespace) and no pod-facing device is attached"
            ),
        )
    } else {
        (
            "per-packet",
            format!(
                "its sockets keep the service address (--socket-lb {mode}: only the node's namespace); its packets are translated on the pod-facing devices ({})",
                devices.join(" ")
            ),
        )
    };
    PathView { netns: netns.path.clone(), path, why }
}

/// The backend `client` gets: from outside, the Maglev entry of the entry
/// traffic from outside uses (the external twin when there is one).
fn client_view(
    dump: &crate::datapath::maps::Dump,
    frontends: &[FrontendView],
    ip: IpAddr,
    port: Option<u16>,
) -> ClientView {
    let outside = frontends
        .iter()
        .find(|f| f.scope.is_some())
        .or_else(|| frontends.iter().find(|f| f.maglev_table.is_some()))
        .unwrap_or(&frontends[0]);
    let admitted = inspect::admits(outside, ip);
    let mut view = ClientView {
        client: ip,
        port,
        admitted,
        maglev_entry: None,
        backend: None,
        how: String::new(),
        affinity: None,
        paths: None,
    };
    let least = frontends[0].lb_algorithm == crate::model::LbAlgorithm::LeastConnections.as_str();
    let pick =
        if least { "of two backends at random the one with fewer active connections" } else { "a backend at random" };
    let local = match frontends[0].affinity_timeout {
        Some(t) => format!(
            "from this node: {pick} at connect, then kept {t}s per client network namespace (ClientIP affinity; not applied to traffic from outside, which Maglev keeps on one backend per flow)"
        ),
        None => format!("from this node: {pick} per connection"),
    };
    view.how = if outside.maglev_table.is_none() {
        format!("{local}; traffic from outside is not served at this frontend")
    } else if !admitted {
        format!("{local}; from outside: dropped, the source ranges do not admit {ip}")
    } else if least {
        format!(
            "{local}; from outside: {pick} per new flow (kept by connection tracking; the Maglev entry instead with --nodeport-mode dsr, or hybrid for TCP)"
        )
    } else if let Some(port) = port {
        match inspect::maglev_pick(dump, outside, SocketAddr::new(ip, port)) {
            Some((entry, backend)) => {
                view.maglev_entry = Some(entry);
                view.backend = Some(backend);
                format!("{local}; from outside: a new flow takes Maglev entry {entry} (kept by connection tracking)")
            }
            None => format!("{local}; from outside: the Maglev table is missing from the maps"),
        }
    } else {
        format!("{local}; from outside: the Maglev entry depends on the client's port (give --from IP:PORT)")
    };
    view
}

fn text(e: &Explanation) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for entry in &e.frontends {
        let f = &entry.frontend;
        let scope =
            if f.scope.is_some() { " (external: traffic from outside, externalTrafficPolicy: Local)" } else { "" };
        let _ = writeln!(out, "frontend {}:{}/{}{scope}", f.address, f.port, f.protocol);
        let _ = writeln!(out, "  service        {} (id {})", f.service_text(), f.id);
        let _ = writeln!(out, "  type           {}", f.kind);
        let affinity = f.affinity_timeout.map_or_else(|| "none".to_owned(), |t| format!("ClientIP, {t}s"));
        let _ = writeln!(out, "  affinity       {affinity}");
        let _ = writeln!(out, "  lb algorithm   {}", f.lb_algorithm);
        if let Some(forwarding) = f.forwarding {
            let _ = writeln!(out, "  nodeport mode  {forwarding} (the service's annotation)");
        }
        let reach = match (f.reach.contains(&"outside-only"), f.reach.contains(&"two-scopes"), f.maglev_table) {
            (true, _, _) => "traffic from outside only",
            (_, true, _) => "local clients; traffic from outside uses the external entry (this node's endpoints)",
            (_, _, Some(_)) => "local clients and traffic from outside",
            _ => "local clients only",
        };
        let _ = writeln!(out, "  reach          {reach}");
        let ranges = f.source_ranges.as_ref().map_or_else(
            || "any".to_owned(),
            |r| if r.is_empty() { "none (admits nobody)".to_owned() } else { r.join(", ") },
        );
        let _ = writeln!(out, "  source ranges  {ranges}");
        if let Some(t) = f.maglev_table {
            let _ = writeln!(out, "  maglev table   {t}");
        }
        let _ = writeln!(
            out,
            "  backends       {}",
            if f.backends.is_empty() { "none: connections are refused" } else { "" }
        );
        for b in &f.backends {
            let addr =
                b.address.map_or_else(|| format!("id {} (missing)", b.id), |a| SocketAddr::new(a, b.port).to_string());
            let active = b.active_connections.map_or_else(String::new, |n| format!(", {n} connections"));
            let _ = writeln!(out, "    {addr}  {}{}{active}", b.state, if b.local { ", local" } else { "" });
        }
        if let Some(unused) = &entry.unused {
            let _ = writeln!(out, "  not used       {}", if unused.is_empty() { "none" } else { "" });
            for u in unused {
                let addr = u.port.map_or_else(|| u.address.to_string(), |p| SocketAddr::new(u.address, p).to_string());
                let node = u.node.as_ref().map_or_else(String::new, |n| format!(" (node {n})"));
                let _ = writeln!(out, "    {addr}{node}  {}", u.why);
            }
        }
        if entry.agrees_with_maps == Some(false) {
            let _ = writeln!(
                out,
                "  note           the agent's endpoints differ from the backends in the maps (a sync in progress, or the maps changed by hand)"
            );
        }
    }
    if let Some(c) = &e.from {
        client_text(c, &mut out);
    }
    for u in &e.unknown {
        let _ = writeln!(out, "not known: {u}");
    }
    out
}

/// What `--from` adds, as text.
fn client_text(c: &ClientView, out: &mut String) {
    use std::fmt::Write as _;
    let who = c.port.map_or_else(|| c.client.to_string(), |p| SocketAddr::new(c.client, p).to_string());
    let _ = writeln!(out, "from {who}");
    let _ = writeln!(out, "  {}", c.how);
    match c.paths.as_deref() {
        None => {}
        Some([]) => {
            let _ = writeln!(
                out,
                "  path           none on this node: no network namespace here holds {} (from outside, see above)",
                c.client
            );
        }
        Some(paths) => {
            for p in paths {
                let _ = writeln!(out, "  path           {} (netns {}): {}", p.path, p.netns.display(), p.why);
            }
        }
    }
    if let Some(b) = &c.backend {
        let addr =
            b.address.map_or_else(|| format!("id {} (missing)", b.id), |a| SocketAddr::new(a, b.port).to_string());
        let _ = writeln!(out, "  backend {addr}");
    }
    match c.affinity.as_deref() {
        None => {}
        Some([]) => {
            let _ = writeln!(
                out,
                "  affinity entry none for a network namespace on this node holding {} (its next connection picks a backend)",
                c.client
            );
        }
        Some(entries) => {
            for a in entries {
                let backend = a.backend.as_ref().and_then(|b| b.address.map(|ip| SocketAddr::new(ip, b.port)));
                let backend = backend
                    .map_or_else(|| format!("id {} (no longer a backend here)", a.backend_id), |b| b.to_string());
                let expiry = if a.expires_in_seconds == 0 {
                    "expired".to_owned()
                } else {
                    format!("expires in {}s", a.expires_in_seconds)
                };
                let _ = writeln!(
                    out,
                    "  affinity entry {backend} (netns {}), last used {}s ago, {expiry}",
                    a.netns.display(),
                    a.idle_seconds
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BackendView, EndpointUse, Explained, agrees, parse_client, path_view};
    use crate::model::explain::Unused;
    use crate::{datapath::socket_lb_pins::Seen, node::client_netns::ClientNetns};

    /// The agent's used endpoints against the maps' backends: the same
    /// addresses and ports in any order agree; one more or less does not.
    #[test]
    fn the_agent_agrees_with_the_maps_on_the_same_backends() {
        let used =
            |last: u8, unused| EndpointUse { address: [10, 0, 0, last].into(), port: Some(8080), node: None, unused };
        let explained = Explained {
            port_name: "http".into(),
            local_only: false,
            zone: None,
            endpoints: vec![used(2, None), used(1, None), used(3, Some(Unused::NotReady))],
        };
        let backend = |last: u8| BackendView {
            id: u32::from(last),
            address: Some([10, 0, 0, last].into()),
            port: 8080,
            state: "active",
            local: false,
            active_connections: None,
        };
        assert!(agrees(&explained, &[backend(1), backend(2)]));
        assert!(!agrees(&explained, &[backend(1)]));
        assert!(!agrees(&explained, &[backend(1), backend(2), backend(3)]));
    }

    /// Which path a client namespace takes: (mode, pod-facing devices,
    /// the namespace's cookie) -> path. The node's namespace has cookie 1.
    #[test]
    fn a_client_namespace_takes_the_socket_or_the_per_packet_path() {
        let cases: &[(Seen, &[&str], u64, &str)] = &[
            (Seen::All, &[], 1, "socket"),
            (Seen::All, &["cni0"], 9, "socket"),
            (Seen::HostNamespace { netns_cookie: 1 }, &["cni0"], 1, "socket"),
            (Seen::HostNamespace { netns_cookie: 1 }, &["cni0", "veth1"], 9, "per-packet"),
            (Seen::HostNamespace { netns_cookie: 1 }, &[], 9, "none"),
        ];
        for (seen, devices, cookie, want) in cases {
            let devices: Vec<String> = devices.iter().map(|d| (*d).to_owned()).collect();
            let netns = ClientNetns { path: "/run/netns/pod".into(), cookie: *cookie };
            let view = path_view(*seen, &devices, &netns);
            assert_eq!(view.path, *want, "{seen:?} {devices:?} cookie {cookie}: {}", view.why);
            if *want == "per-packet" {
                assert!(view.why.contains("cni0 veth1"), "{}", view.why);
            }
        }
    }

    #[test]
    fn clients_parse() {
        assert_eq!(parse_client("192.0.2.1").unwrap(), ("192.0.2.1".parse().unwrap(), None));
        assert_eq!(parse_client("192.0.2.1:4000").unwrap(), ("192.0.2.1".parse().unwrap(), Some(4000)));
        assert_eq!(parse_client("[fd00::1]:53").unwrap(), ("fd00::1".parse().unwrap(), Some(53)));
        assert!(parse_client("host:1").is_err());
    }
}
