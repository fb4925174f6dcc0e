//! A read-only view of the pinned maps, for `ebpf-proxy service`: what the
//! kernel translates, as the programs see it (slot 0 and the slots it
//! announces), whether or not the agent is running.
use std::{fmt::Write as _, net::IpAddr};

use proxy_common::{backend_flags, backend_state, net::decode, scope, service_flags};
use serde::Serialize;

use super::maps::Dump;
use crate::model::{FrontendKey, Protocol, Scope};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FrontendView {
    /// The frontend's rev-NAT id.
    pub id: u16,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: String,
    /// ClusterIP, NodePort, LoadBalancer or ExternalIP.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// ClientIP affinity timeout in seconds, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_timeout: Option<u32>,
    /// `external`: the twin traffic from outside uses (externalTrafficPolicy:
    /// Local); absent for the entry every client uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<&'static str>,
    /// `outside-only` (local clients are not translated), `two-scopes`
    /// (traffic from outside uses the external twin).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reach: Vec<&'static str>,
    /// loadBalancerSourceRanges (traffic from outside); `Some([])` admits none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<String>>,
    /// Id of the Maglev table traffic from outside picks backends in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev_table: Option<u16>,
    pub backends: Vec<BackendView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendView {
    pub id: u32,
    /// `None` when the slot names a backend id that is not in the map.
    pub address: Option<IpAddr>,
    pub port: u16,
    /// active, terminating, or missing.
    pub state: &'static str,
    /// On this node: traffic from outside reaches it without source NAT.
    pub local: bool,
}

impl FrontendView {
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
}

fn kind(flags: u16) -> &'static str {
    if flags & service_flags::NODE_PORT != 0 {
        "NodePort"
    } else if flags & service_flags::LOAD_BALANCER != 0 {
        "LoadBalancer"
    } else if flags & service_flags::EXTERNAL_IP != 0 {
        "ExternalIP"
    } else {
        "ClusterIP"
    }
}

/// Every frontend in `dump`, ordered by id.
#[must_use]
pub fn frontends(dump: &Dump) -> Vec<FrontendView> {
    let mut out: Vec<FrontendView> = dump
        .services
        .iter()
        .filter(|(k, _)| k.slot == 0)
        .map(|(k, master)| {
            let backends = (1..=master.count)
                .map(|slot| {
                    let slot_key = proxy_common::ServiceKey { slot, ..*k };
                    let id = dump.services.get(&slot_key).map_or(0, |v| v.backend_id);
                    match dump.backends.get(&id) {
                        Some(b) => BackendView {
                            id,
                            address: Some(decode(&b.addr)),
                            port: u16::from_be(b.port),
                            state: if b.state == backend_state::TERMINATING { "terminating" } else { "active" },
                            local: b.flags & backend_flags::LOCAL != 0,
                        },
                        None => BackendView { id, address: None, port: 0, state: "missing", local: false },
                    }
                })
                .collect();
            FrontendView {
                id: master.rev_nat,
                address: decode(&k.addr),
                port: u16::from_be(k.port),
                protocol: Protocol::from_number(k.proto).map_or_else(|| k.proto.to_string(), |p| p.to_string()),
                kind: kind(master.flags),
                affinity_timeout: (master.flags & service_flags::AFFINITY != 0).then_some(master.affinity_timeout),
                scope: (k.scope == scope::EXTERNAL).then_some("external"),
                reach: [(service_flags::EXTERNAL_ONLY, "outside-only"), (service_flags::TWO_SCOPES, "two-scopes")]
                    .into_iter()
                    .filter(|(flag, _)| master.flags & flag != 0)
                    .map(|(_, name)| name)
                    .collect(),
                source_ranges: (master.flags & service_flags::SOURCE_RANGES != 0).then(|| {
                    dump.source_ranges
                        .iter()
                        .filter(|(id, _)| *id == master.rev_nat)
                        .map(|(_, net)| net.to_string())
                        .collect()
                }),
                maglev_table: (master.maglev != 0).then_some(master.maglev),
                backends,
            }
        })
        .collect();
    out.sort_by_key(|f| f.id);
    out
}

/// The frontends as an aligned text table.
#[must_use]
pub fn table(frontends: &[FrontendView]) -> String {
    let rows: Vec<[String; 4]> = frontends
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
            let backends: Vec<String> = f
                .backends
                .iter()
                .map(|b| {
                    let state = if b.local { format!("{}, local", b.state) } else { b.state.to_owned() };
                    match b.address {
                        Some(IpAddr::V6(a)) => format!("[{a}]:{} ({state})", b.port),
                        Some(a) => format!("{a}:{} ({state})", b.port),
                        None => format!("#{} (missing)", b.id),
                    }
                })
                .collect();
            let backends =
                if backends.is_empty() { "(none: connections are refused)".to_owned() } else { backends.join(", ") };
            [f.id.to_string(), frontend, kind, backends]
        })
        .collect();
    let header = ["ID".to_owned(), "FRONTEND".to_owned(), "TYPE".to_owned(), "BACKENDS".to_owned()];
    let widths: Vec<usize> = (0..3)
        .map(|c| rows.iter().map(|r| r[c].len()).chain(std::iter::once(header[c].len())).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    out
}
