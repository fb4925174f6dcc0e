//! kube-proxy's frontends against the desired table, frontend by frontend.
//!
//! Both sides are reduced to what a new connection can reach: per
//! frontend (address, port, protocol; a nodePort by port, protocol and
//! family, since kube-proxy's rules match any local address or its
//! nodePortAddresses rather than one address) the set of backend
//! addresses and ports, over every kind of client. For
//! `externalTrafficPolicy: Local` that is the union of the cluster
//! endpoints (pods and the node itself) and the local ones on both sides,
//! so the sets agree when the endpoints do. Which node addresses serve a
//! nodePort is not compared: both follow the same nodePortAddresses.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::SocketAddr,
};

use super::{Family, Place, RuleKey, RuleTable};
use crate::model::{FrontendKind, ServiceTable};

/// One way kube-proxy's rules and the desired table differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    /// kube-proxy serves it; ebpf-proxy would not.
    Missing {
        /// The frontend, by its rule key.
        key: RuleKey,
        /// Its service, when the rules name it.
        service: Option<String>,
        /// The backends kube-proxy's rules send to.
        backends: BTreeSet<SocketAddr>,
    },
    /// ebpf-proxy serves it; kube-proxy's rules do not.
    Extra {
        /// The frontend, by its rule key.
        key: RuleKey,
        /// Its service.
        service: String,
    },
    /// Both serve it, with other backends.
    Backends {
        /// The frontend, by its rule key.
        key: RuleKey,
        /// Its service.
        service: String,
        /// Backends only kube-proxy's rules send to.
        only_kube_proxy: BTreeSet<SocketAddr>,
        /// Backends only ebpf-proxy sends to.
        only_ebpf_proxy: BTreeSet<SocketAddr>,
    },
    /// kube-proxy serves it with a protocol ebpf-proxy does not (SCTP).
    Unserved {
        /// The rule, as it reads.
        what: String,
    },
}

struct List<'a>(&'a BTreeSet<SocketAddr>);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, a) in self.0.iter().enumerate() {
            write!(f, "{}{a}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { key, service, backends } => write!(
                f,
                "{key} ({}) is served by kube-proxy's rules (backends {}) but not in ebpf-proxy's table",
                service.as_deref().unwrap_or("service unknown"),
                List(backends)
            ),
            Self::Extra { key, service } => {
                write!(f, "{key} ({service}) is in ebpf-proxy's table but not in kube-proxy's rules")
            }
            Self::Backends { key, service, only_kube_proxy, only_ebpf_proxy } => write!(
                f,
                "{key} ({service}) has other backends: only kube-proxy's rules {}, only ebpf-proxy {}",
                List(only_kube_proxy),
                List(only_ebpf_proxy)
            ),
            Self::Unserved { what } => {
                write!(f, "{what} is served by kube-proxy's rules with a protocol ebpf-proxy does not serve (SCTP)")
            }
        }
    }
}

/// Every difference between kube-proxy's `rules` (and the frontends they
/// serve with a protocol ebpf-proxy does not, `unserved`) and `desired`.
#[must_use]
pub fn compare(desired: &ServiceTable, rules: &RuleTable, unserved: &[String]) -> Vec<Difference> {
    let mut ours: BTreeMap<RuleKey, (String, BTreeSet<SocketAddr>)> = BTreeMap::new();
    for (key, frontend) in desired {
        let place = match frontend.kind {
            FrontendKind::NodePort => Place::NodePort(Family::of(key.addr)),
            FrontendKind::ClusterIp | FrontendKind::ExternalIp | FrontendKind::LoadBalancer => Place::Address(key.addr),
        };
        let entry = ours
            .entry(RuleKey { place, port: key.port, protocol: key.protocol })
            .or_insert_with(|| (frontend.service_port.to_string(), BTreeSet::new()));
        entry.1.extend(frontend.backends.iter().map(|b| SocketAddr::new(b.addr, b.port)));
    }
    let mut out: Vec<Difference> = unserved.iter().map(|what| Difference::Unserved { what: what.clone() }).collect();
    for (key, theirs) in rules {
        match ours.remove(key) {
            None => out.push(Difference::Missing {
                key: *key,
                service: theirs.service.clone(),
                backends: theirs.backends.clone(),
            }),
            Some((service, backends)) if backends != theirs.backends => out.push(Difference::Backends {
                key: *key,
                service,
                only_kube_proxy: theirs.backends.difference(&backends).copied().collect(),
                only_ebpf_proxy: backends.difference(&theirs.backends).copied().collect(),
            }),
            Some(_) => {}
        }
    }
    out.extend(ours.into_iter().map(|(key, (service, _))| Difference::Extra { key, service }));
    out
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::{
        model::{Backend, BackendState, Frontend, FrontendKey, Protocol, Scope, ServicePort},
        takeover::{RuleFrontend, RuleKind},
    };

    fn backends(addrs: &[&str]) -> Vec<Backend> {
        addrs
            .iter()
            .map(|a| {
                let a: SocketAddr = a.parse().unwrap();
                Backend { addr: a.ip(), port: a.port(), state: BackendState::Active, local: false }
            })
            .collect()
    }

    fn entry(kind: FrontendKind, addrs: &[&str]) -> Frontend {
        Frontend::new(ServicePort::new("shop", "web", "http"), kind, backends(addrs))
    }

    fn key(addr: &str, port: u16) -> FrontendKey {
        FrontendKey::new(addr.parse::<IpAddr>().unwrap(), port, Protocol::Tcp)
    }

    fn rule(kind: RuleKind, addrs: &[&str]) -> RuleFrontend {
        RuleFrontend {
            kind,
            service: Some("shop/web:http".into()),
            backends: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn rule_at(addr: &str, port: u16) -> RuleKey {
        RuleKey { place: Place::Address(addr.parse().unwrap()), port, protocol: Protocol::Tcp }
    }

    const NODE_PORT: RuleKey = RuleKey { place: Place::NodePort(Family::V4), port: 30080, protocol: Protocol::Tcp };

    /// The desired table: a ClusterIP of two backends, its nodePort on
    /// two node addresses with an `External` twin of one (Local policy).
    fn desired() -> ServiceTable {
        let both = ["10.244.1.2:8080", "10.244.2.3:8080"];
        let mut t = ServiceTable::new();
        t.insert(key("10.96.0.10", 80), entry(FrontendKind::ClusterIp, &both));
        for node in ["192.168.1.5", "127.0.0.1"] {
            t.insert(key(node, 30080), entry(FrontendKind::NodePort, &both));
            t.insert(key(node, 30080).with_scope(Scope::External), entry(FrontendKind::NodePort, &both[..1]));
        }
        t
    }

    fn rules() -> RuleTable {
        let both = ["10.244.1.2:8080", "10.244.2.3:8080"];
        RuleTable::from([
            (rule_at("10.96.0.10", 80), rule(RuleKind::ClusterIp, &both)),
            (NODE_PORT, rule(RuleKind::NodePort, &both)),
        ])
    }

    #[test]
    fn the_same_frontends_and_backends_make_no_difference() {
        assert_eq!(compare(&desired(), &rules(), &[]), []);
        assert_eq!(compare(&ServiceTable::new(), &RuleTable::new(), &[]), []);
    }

    #[test]
    fn each_difference_is_reported_once() {
        let mut rules = rules();
        // Another backend in the rules for the ClusterIP, an externalIP
        // only kube-proxy serves, and the nodePort not in the rules.
        rules.get_mut(&rule_at("10.96.0.10", 80)).unwrap().backends =
            ["10.244.1.2:8080".parse().unwrap(), "10.244.9.9:8080".parse().unwrap()].into();
        rules.insert(rule_at("203.0.113.5", 80), rule(RuleKind::ExternalIp, &["10.244.1.2:8080"]));
        rules.remove(&NODE_PORT);
        let got = compare(&desired(), &rules, &["10.96.0.7 port 9/sctp".into()]);
        let want = vec![
            Difference::Unserved { what: "10.96.0.7 port 9/sctp".into() },
            Difference::Backends {
                key: rule_at("10.96.0.10", 80),
                service: "shop/web:http".into(),
                only_kube_proxy: ["10.244.9.9:8080".parse().unwrap()].into(),
                only_ebpf_proxy: ["10.244.2.3:8080".parse().unwrap()].into(),
            },
            Difference::Missing {
                key: rule_at("203.0.113.5", 80),
                service: Some("shop/web:http".into()),
                backends: ["10.244.1.2:8080".parse().unwrap()].into(),
            },
            Difference::Extra { key: NODE_PORT, service: "shop/web:http".into() },
        ];
        assert_eq!(got, want);
        let lines: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines[1],
            "10.96.0.10:80/TCP (shop/web:http) has other backends: only kube-proxy's rules 10.244.9.9:8080, only ebpf-proxy 10.244.2.3:8080"
        );
        assert_eq!(
            lines[3],
            "nodePort 30080/TCP (IPv4) (shop/web:http) is in ebpf-proxy's table but not in kube-proxy's rules"
        );
    }

    #[test]
    fn a_frontend_without_endpoints_matches_an_empty_entry() {
        let mut t = ServiceTable::new();
        t.insert(key("10.96.0.50", 80), entry(FrontendKind::ClusterIp, &[]));
        let rules = RuleTable::from([(rule_at("10.96.0.50", 80), rule(RuleKind::NoEndpoints, &[]))]);
        assert_eq!(compare(&t, &rules, &[]), []);
    }
}
