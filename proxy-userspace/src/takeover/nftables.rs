//! kube-proxy's nftables mode, read from `nft -j list table ip kube-proxy`
//! (or `ip6`). The shapes are those of kube-proxy's
//! pkg/proxy/nftables/proxier.go: the verdict map `service-ips` (address
//! . protocol . port to `goto service-*` for a ClusterIP, `goto
//! external-*` for an externalIP or a LoadBalancer IP), `service-nodeports`
//! (protocol . port to `goto external-*`), the chains below them
//! (`external-*`, `service-*`, `local-*`, `firewall-*`: jumps, gotos and
//! `numgen ... vmap` over `endpoint-*` chains, whose `dnat to ADDR:PORT`
//! names the backend), and `no-endpoint-services` / `no-endpoint-nodeports`
//! (frontends without endpoints, to `reject-chain`).
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use serde_json::Value;

use super::{Family, Place, RuleFrontend, RuleKey, RuleKind, RuleTable, insert, protocol};

/// The chains' rules (each rule's `expr` array) and the maps' elements of
/// one table.
#[derive(Default)]
struct Table<'a> {
    chains: HashMap<&'a str, Vec<&'a Value>>,
    maps: HashMap<&'a str, &'a [Value]>,
}

fn table(json: &Value) -> Result<Table<'_>, String> {
    let items = json.get("nftables").and_then(Value::as_array).ok_or("no \"nftables\" array")?;
    let mut t = Table::default();
    for item in items {
        if let Some(chain) = item.get("chain") {
            t.chains.entry(str_field(chain, "name")?).or_default();
        } else if let Some(rule) = item.get("rule") {
            t.chains.entry(str_field(rule, "chain")?).or_default().push(rule.get("expr").unwrap_or(&Value::Null));
        } else if let Some(map) = item.get("map") {
            let elems = map.get("elem").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
            t.maps.insert(str_field(map, "name")?, elems);
        }
    }
    Ok(t)
}

fn str_field<'a>(v: &'a Value, name: &str) -> Result<&'a str, String> {
    v.get(name).and_then(Value::as_str).ok_or_else(|| format!("an item without \"{name}\": {v}"))
}

/// What the `kube-proxy` table of one family serves, and the frontends of
/// a protocol ebpf-proxy does not serve (SCTP), described.
pub(crate) fn frontends(
    json: &Value,
    family: Family,
    out: &mut RuleTable,
    unserved: &mut Vec<String>,
) -> Result<(), String> {
    let t = table(json)?;
    let elements = |name| t.maps.get(name).copied().unwrap_or_default();
    for elem in elements("service-ips") {
        let (key, target) = element(elem)?;
        let [addr, proto, port] = key.as_slice() else { return Err(format!("service-ips element {elem}")) };
        let addr: IpAddr = addr.parse().map_err(|_| format!("service-ips address {addr:?}"))?;
        let kind = if target.starts_with("service-") { RuleKind::ClusterIp } else { RuleKind::External };
        let Some(key) = rule_key(Place::Address(addr), proto, port, unserved)? else { continue };
        let frontend = RuleFrontend { kind, service: service_name(target), backends: backends(target, &t)? };
        insert(out, key, frontend);
    }
    for elem in elements("service-nodeports") {
        let (key, target) = element(elem)?;
        let [proto, port] = key.as_slice() else { return Err(format!("service-nodeports element {elem}")) };
        let Some(key) = rule_key(Place::NodePort(family), proto, port, unserved)? else { continue };
        let frontend =
            RuleFrontend { kind: RuleKind::NodePort, service: service_name(target), backends: backends(target, &t)? };
        insert(out, key, frontend);
    }
    // Rejected for want of endpoints (drop verdicts, for a Local policy
    // without local endpoints, belong to frontends listed above).
    for (map, nodeport) in [("no-endpoint-services", false), ("no-endpoint-nodeports", true)] {
        for elem in elements(map) {
            let (key, target) = element(elem)?;
            if target != "reject-chain" {
                continue;
            }
            let found = match (nodeport, key.as_slice()) {
                (false, [addr, proto, port]) => {
                    let addr: IpAddr = addr.parse().map_err(|_| format!("{map} address {addr:?}"))?;
                    rule_key(Place::Address(addr), proto, port, unserved)?
                }
                (true, [proto, port]) => rule_key(Place::NodePort(family), proto, port, unserved)?,
                _ => return Err(format!("{map} element {elem}")),
            };
            if let Some(key) = found {
                let service = comment(elem);
                out.entry(key).or_insert(RuleFrontend {
                    kind: RuleKind::NoEndpoints,
                    service,
                    backends: BTreeSet::new(),
                });
            }
        }
    }
    Ok(())
}

fn rule_key(place: Place, proto: &str, port: &str, unserved: &mut Vec<String>) -> Result<Option<RuleKey>, String> {
    let port: u16 = port.parse().map_err(|_| format!("port {port:?}"))?;
    if let Some(protocol) = protocol(proto)? {
        return Ok(Some(RuleKey { place, port, protocol }));
    }
    let at = match place {
        Place::Address(a) => a.to_string(),
        Place::NodePort(_) => "nodePort".into(),
    };
    unserved.push(format!("{at} port {port}/{proto}"));
    Ok(None)
}

/// A verdict map element: its key's parts as text and the chain it goes
/// to (`[{"concat": [...]}, {"goto": {"target": ...}}]`, the key maybe
/// wrapped with a comment: `{"elem": {"val": ..., "comment": ...}}`).
fn element(elem: &Value) -> Result<(Vec<String>, &str), String> {
    let [key, verdict] = elem.as_array().map(Vec::as_slice).unwrap_or_default() else {
        return Err(format!("a map element that is not [key, verdict]: {elem}"));
    };
    let key = key.pointer("/elem/val").unwrap_or(key);
    let parts = match key.get("concat").and_then(Value::as_array) {
        Some(parts) => parts.iter().map(scalar).collect(),
        None => vec![scalar(key)],
    };
    let target = ["goto", "jump"]
        .iter()
        .find_map(|v| verdict.get(v).and_then(|g| g.get("target")).and_then(Value::as_str))
        .unwrap_or_default();
    Ok((parts, target))
}

fn comment(elem: &Value) -> Option<String> {
    elem.pointer("/0/elem/comment").and_then(Value::as_str).map(str::to_owned)
}

fn scalar(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// `namespace/name:port` from a chain name `KIND-HASH-NAMESPACE/NAME/PROTO/PORT`.
fn service_name(chain: &str) -> Option<String> {
    let mut parts = chain.splitn(3, '-').nth(2)?.split('/');
    let (namespace, name, _proto, port) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some(format!("{namespace}/{name}:{port}"))
}

/// Every `dnat to` destination reachable from chain `start`.
fn backends(start: &str, t: &Table<'_>) -> Result<BTreeSet<SocketAddr>, String> {
    let mut out = BTreeSet::new();
    let (mut todo, mut seen) = (vec![start.to_owned()], HashSet::new());
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) || name == "mark-for-masquerade" {
            continue;
        }
        for expr in t.chains.get(name.as_str()).map(Vec::as_slice).unwrap_or_default() {
            walk(expr, &mut |key, v| {
                match key {
                    "dnat" => out.insert(dnat(v)?),
                    "goto" | "jump" => match v.get("target").and_then(Value::as_str) {
                        Some(target) if t.chains.contains_key(target) => {
                            todo.push(target.to_owned());
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                Ok(())
            })?;
        }
    }
    Ok(out)
}

/// Calls `f` with every object member below `v`, depth first.
fn walk(v: &Value, f: &mut impl FnMut(&str, &Value) -> Result<(), String>) -> Result<(), String> {
    match v {
        Value::Object(members) => {
            for (key, value) in members {
                f(key, value)?;
                walk(value, f)?;
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, f)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `{"addr": "10.0.0.1", "port": 80}`.
fn dnat(v: &Value) -> Result<SocketAddr, String> {
    let addr = v.get("addr").and_then(Value::as_str).and_then(|a| a.parse::<IpAddr>().ok());
    let port = v.get("port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
    match (addr, port) {
        (Some(addr), Some(port)) => Ok(SocketAddr::new(addr, port)),
        _ => Err(format!("a dnat that is not to one address and port: {v}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn fixture(name: &str) -> Value {
        let text = match name {
            "ip" => include_str!("../../tests/fixtures/kube-proxy-rules/nft-ip.json"),
            _ => include_str!("../../tests/fixtures/kube-proxy-rules/nft-ip6.json"),
        };
        serde_json::from_str(text).unwrap()
    }

    fn at(addr: &str, port: u16, protocol: Protocol) -> RuleKey {
        RuleKey { place: Place::Address(addr.parse().unwrap()), port, protocol }
    }

    fn set(addrs: &[&str]) -> BTreeSet<SocketAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn every_frontend_of_the_listed_tables_with_its_backends() {
        let (mut table, mut unserved) = (RuleTable::new(), Vec::new());
        frontends(&fixture("ip"), Family::V4, &mut table, &mut unserved).unwrap();
        frontends(&fixture("ip6"), Family::V6, &mut table, &mut unserved).unwrap();
        assert!(unserved.is_empty());
        let node_port = |port| RuleKey { place: Place::NodePort(Family::V4), port, protocol: Protocol::Tcp };
        let want: Vec<(RuleKey, RuleKind, Vec<&str>)> = vec![
            (at("10.96.0.10", 80, Protocol::Tcp), RuleKind::ClusterIp, vec!["10.244.1.2:8080", "10.244.2.3:8080"]),
            (at("203.0.113.5", 80, Protocol::Tcp), RuleKind::External, vec!["10.244.1.2:8080", "10.244.2.3:8080"]),
            (at("10.96.0.20", 8080, Protocol::Tcp), RuleKind::ClusterIp, vec!["10.244.1.7:8080", "10.244.2.7:8080"]),
            // Local policy: pods and the node go to the service chain.
            (at("192.0.2.20", 8080, Protocol::Tcp), RuleKind::External, vec!["10.244.1.7:8080", "10.244.2.7:8080"]),
            (node_port(30081), RuleKind::NodePort, vec!["10.244.1.7:8080", "10.244.2.7:8080"]),
            // Affinity: the set lookup's goto names the same endpoint.
            (at("10.96.0.40", 80, Protocol::Tcp), RuleKind::ClusterIp, vec!["10.244.1.9:8080"]),
            (at("10.96.0.53", 53, Protocol::Udp), RuleKind::ClusterIp, vec!["10.244.1.53:53"]),
            (at("10.96.0.50", 80, Protocol::Tcp), RuleKind::NoEndpoints, vec![]),
            (node_port(30050), RuleKind::NoEndpoints, vec![]),
            (at("fd00:96::10", 80, Protocol::Tcp), RuleKind::ClusterIp, vec!["[fd00::1:2]:8080"]),
        ];
        for (key, kind, backends) in &want {
            let got = table.get(key).unwrap_or_else(|| panic!("{key} missing: {table:#?}"));
            assert_eq!((got.kind, &got.backends), (*kind, &set(backends)), "{key}");
        }
        assert_eq!(table.len(), want.len(), "{table:#?}");
        assert_eq!(table[&at("10.96.0.53", 53, Protocol::Udp)].service.as_deref(), Some("kube-system/dns:dns"));
        assert_eq!(table[&node_port(30050)].service.as_deref(), Some("shop/empty:http"));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for text in [
            "{}",
            r#"{"nftables": [{"rule": {"expr": []}}]}"#,
            r#"{"nftables": [{"map": {"name": "service-ips", "elem": [[{"concat": ["x", "tcp", 80]}, {"goto": {"target": "a"}}]]}}]}"#,
            r#"{"nftables": [{"map": {"name": "service-ips", "elem": [[{"concat": ["10.0.0.1", "icmp", 80]}, {"goto": {"target": "a"}}]]}}]}"#,
            r#"{"nftables": [{"map": {"name": "service-ips", "elem": [[{"concat": ["10.0.0.1", "tcp", 80]}, {"goto": {"target": "a"}}]]}}, {"rule": {"chain": "a", "expr": [{"dnat": {"addr": "10.1.1.1"}}]}}]}"#,
        ] {
            let json: Value = serde_json::from_str(text).unwrap();
            assert!(frontends(&json, Family::V4, &mut RuleTable::new(), &mut Vec::new()).is_err(), "{text}");
        }
    }
}
