//! A read-only view of the pinned maps, for `ebpf-proxy service`: what the
//! kernel translates, as the programs see it (slot 0 and the slots it
//! announces), whether or not the agent is running.
use proxy_common::RevNatId;
use std::{fmt::Write as _, net::IpAddr};

use serde::Serialize;

use super::{
    codec::{self, FrontendFlags},
    maps::Dump,
};
use crate::model::{BackendState, FrontendKey, Protocol, Scope};

/// A frontend as the maps hold it, for `status`, `service` and `explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FrontendView {
    /// The frontend's rev-NAT id.
    pub(crate) id: RevNatId,
    /// The frontend's address.
    pub address: IpAddr,
    pub(crate) port: u16,
    pub(crate) protocol: String,
    /// The Service's namespace (absent: the agent wrote no name for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    /// The Service's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    /// The service port's name (empty for an unnamed port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) port_name: Option<String>,
    /// ClusterIP, NodePort, LoadBalancer or ExternalIP (`unknown`: flags
    /// the agent never writes; nothing else is read from them then).
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// ClientIP affinity timeout in seconds, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) affinity_timeout: Option<u32>,
    /// `external`: the twin traffic from outside uses (externalTrafficPolicy:
    /// Local); absent for the entry every client uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scope: Option<&'static str>,
    /// `outside-only` (local clients are not translated), `two-scopes`
    /// (traffic from outside uses the external twin).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) reach: Vec<&'static str>,
    /// loadBalancerSourceRanges (traffic from outside); `Some([])` admits none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source_ranges: Option<Vec<String>>,
    /// Id of the Maglev table traffic from outside picks backends in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev_table: Option<u16>,
    /// How a new connection picks its backend (`random`,
    /// `least-connections`, `maglev`; `unknown` with unknown flags).
    pub(crate) lb_algorithm: &'static str,
    /// The service's `nodeport-mode` annotation (`snat`, `dsr`); absent
    /// when the node's `--nodeport-mode` applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) forwarding: Option<&'static str>,
    /// Its backends, in slot order.
    pub backends: Vec<BackendView>,
}

/// A backend of a frontend as the maps hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendView {
    pub(crate) id: u32,
    /// `None` when the slot names a backend id that is not in the map.
    pub address: Option<IpAddr>,
    /// The backend's port.
    pub port: u16,
    /// active, terminating, missing, or unknown (a state or flags the
    /// agent never writes).
    pub(crate) state: &'static str,
    /// On this node: traffic from outside reaches it without source NAT.
    pub(crate) local: bool,
    /// Its active connections, as the programs count them (open sockets
    /// and live flows from outside; `with_active`). Absent when not read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_connections: Option<u64>,
}

impl FrontendView {
    /// The frontend's key (`None`: a protocol or scope the agent never writes).
    #[must_use]
    pub fn key(&self) -> Option<FrontendKey> {
        let protocol = match self.protocol.as_str() {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            _ => return None,
        };
        let scope = if self.scope.is_some() { Scope::External } else { Scope::All };
        Some(FrontendKey { addr: self.address, port: self.port, protocol, scope })
    }

    /// `namespace/name:port` (`namespace/name` for an unnamed port), or
    /// `-` when the maps hold no name for it.
    #[must_use]
    pub(crate) fn service_text(&self) -> String {
        match (&self.namespace, &self.name, self.port_name.as_deref()) {
            (Some(ns), Some(name), None | Some("")) => format!("{ns}/{name}"),
            (Some(ns), Some(name), Some(port)) => format!("{ns}/{name}:{port}"),
            _ => "-".to_owned(),
        }
    }

    /// Whether it comes from `filter`: a service (`namespace/name`) or one
    /// of its ports (`namespace/name:port`).
    #[must_use]
    pub(crate) fn is_of(&self, filter: &ServiceFilter) -> bool {
        self.namespace.as_deref() == Some(filter.namespace.as_str())
            && self.name.as_deref() == Some(filter.name.as_str())
            && filter.port.as_ref().is_none_or(|p| self.port_name.as_ref() == Some(p))
    }
}

/// `--service NAMESPACE/NAME[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceFilter {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// One port's name (`Some("")`: the unnamed port).
    pub(crate) port: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not NAMESPACE/NAME or NAMESPACE/NAME:PORT-NAME (e.g. kube-system/kube-dns:dns)")]
pub(crate) struct BadServiceFilter(String);

impl std::str::FromStr for ServiceFilter {
    type Err = BadServiceFilter;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadServiceFilter(text.to_owned());
        let (service, port) = match text.split_once(':') {
            Some((s, p)) => (s, Some(p.to_owned())),
            None => (text, None),
        };
        let (namespace, name) = service.split_once('/').ok_or_else(bad)?;
        if namespace.is_empty() || name.is_empty() || name.contains('/') {
            return Err(bad());
        }
        Ok(Self { namespace: namespace.to_owned(), name: name.to_owned(), port })
    }
}

/// The view of the backend slot `id` names (`None`: not in the map).
fn backend_view(id: u32, value: Option<&proxy_common::Backend>) -> BackendView {
    let Some(value) = value else {
        return BackendView { id, address: None, port: 0, state: "missing", local: false, active_connections: None };
    };
    let (address, port) = codec::endpoint_of(&value.addr, value.port);
    let address = Some(address);
    match codec::backend_entry(value) {
        Ok(b) => BackendView {
            id,
            address,
            port,
            state: match b.state {
                BackendState::Active => "active",
                BackendState::Terminating => "terminating",
            },
            local: b.local,
            active_connections: None,
        },
        Err(_) => BackendView { id, address, port, state: "unknown", local: false, active_connections: None },
    }
}

/// Every frontend in `dump`, ordered by id.
#[must_use]
pub fn frontends(dump: &Dump) -> Vec<FrontendView> {
    let mut out: Vec<FrontendView> = dump
        .services
        .iter()
        .filter(|(k, _)| k.slot == 0)
        .map(|(k, slot_zero)| {
            let service = dump.names.get(&slot_zero.rev_nat).map(codec::service_port_of);
            let flags = FrontendFlags::decode(slot_zero.flags).ok();
            let has = |f: fn(&FrontendFlags) -> bool| flags.as_ref().is_some_and(f);
            let backends = (0..slot_zero.count)
                .map(|index| {
                    let id = dump.services.get(&k.slots_of(index)).map_or(0, |v| v.slot_id(index));
                    backend_view(id, dump.backends.get(&id))
                })
                .collect();
            let (address, port) = codec::endpoint_of(&k.addr, k.port);
            FrontendView {
                id: slot_zero.rev_nat,
                address,
                port,
                protocol: codec::protocol_of(k.proto).map_or_else(|_| k.proto.to_string(), |p| p.to_string()),
                namespace: service.as_ref().map(|s| s.namespace().to_string()),
                name: service.as_ref().map(|s| s.name().to_string()),
                port_name: service.map(|s| s.port().to_string()),
                kind: flags.map_or("unknown", |f| f.kind.as_str()),
                affinity_timeout: has(|f| f.affinity).then_some(slot_zero.affinity_timeout()),
                scope: (codec::scope_of(k.scope) == Ok(Scope::External)).then_some("external"),
                reach: [(has(|f| f.outside_only), "outside-only"), (has(|f| f.two_scopes), "two-scopes")]
                    .into_iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, name)| name)
                    .collect(),
                source_ranges: has(|f| f.source_ranges).then(|| {
                    dump.source_ranges
                        .iter()
                        .filter(|(id, _)| *id == slot_zero.rev_nat)
                        .map(|(_, net)| net.to_string())
                        .collect()
                }),
                maglev_table: (slot_zero.maglev != 0).then_some(slot_zero.maglev),
                lb_algorithm: flags.map_or("unknown", |f| f.algorithm.as_str()),
                forwarding: flags.and_then(|f| f.forwarding).map(crate::model::Forwarding::as_str),
                backends,
            }
        })
        .collect();
    out.sort_by_key(|f| f.id);
    out
}

/// Fills in each present backend's active connections from `active`
/// (`ACTIVE_CONNS`, by backend id).
pub fn with_active(frontends: &mut [FrontendView], active: impl Fn(u32) -> u64) {
    for b in frontends.iter_mut().flat_map(|f| f.backends.iter_mut()) {
        if b.address.is_some() {
            b.active_connections = Some(active(b.id));
        }
    }
}

/// The frontends as an aligned text table.
#[must_use]
pub fn table(frontends: &[FrontendView]) -> String {
    let rows: Vec<[String; 5]> = frontends
        .iter()
        .map(|f| {
            let frontend =
                f.key().map_or_else(|| format!("{}:{}/{}", f.address, f.port, f.protocol), |k| k.to_string());
            let mut kind = f.kind.to_owned();
            for word in f.scope.iter().chain(&f.reach) {
                let _ = write!(kind, " {word}");
            }
            if let Some(ranges) = &f.source_ranges {
                let _ =
                    write!(kind, " sources={}", if ranges.is_empty() { "none".to_owned() } else { ranges.join(",") });
            }
            if let Some(t) = f.affinity_timeout {
                let _ = write!(kind, " affinity={t}s");
            }
            if f.lb_algorithm != "random" {
                let _ = write!(kind, " lb={}", f.lb_algorithm);
            }
            if let Some(forwarding) = f.forwarding {
                let _ = write!(kind, " forward={forwarding}");
            }
            let backends: Vec<String> = f
                .backends
                .iter()
                .map(|b| {
                    let mut state = if b.local { format!("{}, local", b.state) } else { b.state.to_owned() };
                    if let Some(n) = b.active_connections {
                        let _ = write!(state, ", {n} connections");
                    }
                    match b.address {
                        Some(IpAddr::V6(a)) => format!("[{a}]:{} ({state})", b.port),
                        Some(a) => format!("{a}:{} ({state})", b.port),
                        None => format!("#{} (missing)", b.id),
                    }
                })
                .collect();
            let backends =
                if backends.is_empty() { "(none: connections are refused)".to_owned() } else { backends.join(", ") };
            [f.id.to_string(), frontend, f.service_text(), kind, backends]
        })
        .collect();
    let header = ["ID", "FRONTEND", "SERVICE", "TYPE", "BACKENDS"].map(str::to_owned);
    let widths: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].len()).chain(std::iter::once(header[c].len())).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(out, "{cell:<width$}  ");
        }
        let _ = writeln!(out, "{}", row[4]);
    }
    out
}

/// Which backend a flow from outside the node, from `client`, gets at
/// `frontend`: the Maglev table entry the TC programs pick for a new flow
/// (the same hash, `proxy_common::flow_hash`), with its index. `None` when
/// the frontend has no Maglev table (it is not served to traffic from
/// outside) or the table is not in `dump`.
#[must_use]
pub(crate) fn maglev_pick(
    dump: &Dump,
    frontend: &FrontendView,
    client: std::net::SocketAddr,
) -> Option<(u32, BackendView)> {
    let table = dump.maglev.get(&frontend.maglev_table?)?;
    let protocol = frontend.key()?.protocol;
    let hash = proxy_common::flow_hash(
        &proxy_common::net::encode(client.ip()),
        client.port().to_be(),
        frontend.port.to_be(),
        codec::protocol_number(protocol),
    );
    let index = proxy_common::maglev_index(hash, u32::try_from(table.len()).ok()?);
    let id = *table.get(usize::try_from(index).ok()?)?;
    Some((index, backend_view(id, dump.backends.get(&id))))
}

/// Whether `frontend`'s source ranges admit `client` (`true` when it has
/// none: every source is admitted).
#[must_use]
pub(crate) fn admits(frontend: &FrontendView, client: IpAddr) -> bool {
    frontend.source_ranges.as_ref().is_none_or(|ranges| {
        ranges.iter().filter_map(|r| r.parse::<ipnet::IpNet>().ok()).any(|net| net.contains(&client))
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{ServiceFilter, frontends, table};
    use crate::{
        model::{Backend, BackendState, Frontend, FrontendKey, FrontendKind, Protocol, ServicePort, ServiceTable},
        reconcile::{Reconciler, fake_maps::FakeMaps},
    };

    fn maps_with(entries: &[(u8, u16, ServicePort)]) -> FakeMaps {
        let backend = Backend {
            addr: Ipv4Addr::new(10, 244, 0, 1).into(),
            port: 8080,
            state: BackendState::Active,
            local: false,
        };
        let desired: ServiceTable = entries
            .iter()
            .map(|(last, port, sp)| {
                let key = FrontendKey::new(Ipv4Addr::new(10, 96, 0, *last).into(), *port, Protocol::Tcp);
                (key, Frontend::new(sp.clone(), FrontendKind::ClusterIp, vec![backend]))
            })
            .collect();
        let mut maps = FakeMaps::default();
        let report = Reconciler::new().apply(&mut maps, &desired);
        assert!(report.failures.is_empty(), "{report:?}");
        maps
    }

    #[test]
    fn the_table_names_each_frontends_service_port() {
        let maps = maps_with(&[
            (10, 53, ServicePort::new("kube-system", "kube-dns", "dns-tcp")),
            (11, 80, ServicePort::new("default", "web", "")),
        ]);
        let all = frontends(&maps.state);
        assert_eq!(all[0].namespace.as_deref(), Some("kube-system"));
        assert_eq!(all[0].port_name.as_deref(), Some("dns-tcp"));
        assert_eq!(
            table(&all),
            "\
ID  FRONTEND           SERVICE                       TYPE       BACKENDS
1   10.96.0.10:53/TCP  kube-system/kube-dns:dns-tcp  ClusterIP  10.244.0.1:8080 (active)
2   10.96.0.11:80/TCP  default/web                   ClusterIP  10.244.0.1:8080 (active)
"
        );
        let json = serde_json::to_value(&all).unwrap();
        assert_eq!(json[0]["namespace"], "kube-system");
        assert_eq!(json[0]["name"], "kube-dns");
        assert_eq!(json[1]["port_name"], "");
    }

    #[test]
    fn flags_and_states_the_agent_never_writes_show_as_unknown() {
        let mut maps = maps_with(&[(10, 80, ServicePort::new("default", "web", "http"))]);
        let (key, slot_zero) = maps.state.services.iter_mut().find(|(k, _)| k.slot == 0).unwrap();
        let key = *key;
        slot_zero.flags |= 1 << 12;
        slot_zero.backend_id = 30; // slot 0: the affinity timeout
        let slot = maps.state.services[&proxy_common::ServiceKey { slot: 1, ..key }];
        maps.state.backends.get_mut(&slot.backend_id).unwrap().state = 9;
        let all = frontends(&maps.state);
        assert_eq!((all[0].kind, all[0].affinity_timeout), ("unknown", None));
        assert_eq!(all[0].backends[0].state, "unknown");
        assert_eq!(all[0].backends[0].address, Some(Ipv4Addr::new(10, 244, 0, 1).into()));
        // A protocol the agent never writes shows as its number.
        let value = maps.state.services.remove(&key).unwrap();
        maps.state.services.insert(proxy_common::ServiceKey { proto: 33, ..key }, value);
        let all = frontends(&maps.state);
        assert_eq!((all[0].protocol.as_str(), all[0].key()), ("33", None));
    }

    #[test]
    fn a_frontend_without_a_name_shows_a_dash() {
        let mut maps = maps_with(&[(10, 80, ServicePort::new("default", "web", "http"))]);
        maps.state.names.clear();
        let all = frontends(&maps.state);
        assert_eq!(all[0].service_text(), "-");
        assert!(serde_json::to_value(&all).unwrap()[0].get("namespace").is_none());
        assert!(!all[0].is_of(&"default/web".parse().unwrap()));
    }

    #[test]
    fn the_service_filter_matches_a_service_or_one_port() {
        let maps = maps_with(&[
            (10, 53, ServicePort::new("kube-system", "kube-dns", "dns")),
            (10, 9153, ServicePort::new("kube-system", "kube-dns", "metrics")),
            (11, 80, ServicePort::new("kube-system", "kube-dns-2", "dns")),
            (12, 80, ServicePort::new("default", "kube-dns", "dns")),
        ]);
        let all = frontends(&maps.state);
        let ports = |filter: &str| -> Vec<u16> {
            let filter: ServiceFilter = filter.parse().unwrap();
            all.iter().filter(|f| f.is_of(&filter)).map(|f| f.port).collect()
        };
        assert_eq!(ports("kube-system/kube-dns"), [53, 9153]);
        assert_eq!(ports("kube-system/kube-dns:metrics"), [9153]);
        assert_eq!(ports("default/kube-dns"), [80]);
        assert!(ports("kube-system/nothing").is_empty());
        for bad in ["kube-dns", "/kube-dns", "kube-system/", "a/b/c"] {
            assert!(bad.parse::<ServiceFilter>().is_err(), "{bad}");
        }
    }
}
