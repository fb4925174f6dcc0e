//! kube-proxy's iptables mode, read from `iptables-save` text (the nat and
//! filter tables of one family; the same text from iptables-nft and
//! iptables-legacy). The shapes are those of kube-proxy's
//! pkg/proxy/iptables/proxier.go:
//!
//! - nat `KUBE-SERVICES`: `-d ADDR/32 -p PROTO --dport PORT -j CHAIN`, the
//!   comment ending in `cluster IP`, `external IP` or `loadbalancer IP`;
//!   its last rule jumps to `KUBE-NODEPORTS` (`-p PROTO --dport PORT -j
//!   KUBE-EXT-*`, older versions `KUBE-SVC-*`);
//! - below them `KUBE-FW-*` (source ranges), `KUBE-EXT-*` (external
//!   traffic), `KUBE-SVC-*` (cluster), `KUBE-SVL-*` (local endpoints),
//!   `KUBE-SEP-*` whose rule `-j DNAT --to-destination ADDR:PORT` names
//!   the backend; `KUBE-MARK-MASQ`/`KUBE-MARK-DROP` only mark;
//! - filter `KUBE-SERVICES` and `KUBE-EXTERNAL-SERVICES`: `-j REJECT`
//!   for frontends without endpoints (`-d ADDR`, or `--dst-type LOCAL`
//!   for a nodePort).
//!
//! A frontend's backends are every DNAT destination reachable from its
//! jump, whichever branch a client takes.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use super::{Family, Place, RuleFrontend, RuleKey, RuleKind, RuleTable, insert, protocol};

/// The fields of one `-A CHAIN ...` line that matter here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) chain: String,
    /// `-d ADDR[/LEN]` (not negated).
    pub(crate) destination: Option<String>,
    pub(crate) protocol: Option<String>,
    pub(crate) dport: Option<u16>,
    /// `-j TARGET`.
    pub(crate) target: Option<String>,
    /// `--to-destination ADDR:PORT`.
    pub(crate) to_destination: Option<String>,
    pub(crate) comment: Option<String>,
    /// `--dst-type LOCAL`.
    pub(crate) dst_local: bool,
    /// The line as saved (`-A CHAIN ...`), to delete it by.
    pub(crate) line: String,
}

/// One table of `iptables-save` output: its chains (declared with `:`)
/// and its rules in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    pub(crate) chains: Vec<String>,
    pub(crate) rules: Vec<Rule>,
}

/// The tables of `iptables-save` text, by name (`nat`, `filter`, ...).
pub(crate) fn parse_save(text: &str) -> Result<HashMap<String, Table>, String> {
    let mut tables: HashMap<String, Table> = HashMap::new();
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if let Some(name) = line.strip_prefix('*') {
            current = Some(name.to_owned());
            tables.entry(name.to_owned()).or_default();
        } else if line == "COMMIT" {
            current = None;
        } else if let Some(decl) = line.strip_prefix(':') {
            let table = current.as_ref().ok_or_else(|| format!("line {}: a chain outside a table", n + 1))?;
            let name = decl.split_whitespace().next().unwrap_or_default().to_owned();
            tables.get_mut(table).expect("entered above").chains.push(name);
        } else if line.starts_with("-A ") {
            let table = current.as_ref().ok_or_else(|| format!("line {}: a rule outside a table", n + 1))?;
            let rule = parse_rule(line).map_err(|e| format!("line {}: {e}", n + 1))?;
            tables.get_mut(table).expect("entered above").rules.push(rule);
        }
    }
    Ok(tables)
}

/// Splits a saved rule into words: double quotes group, `\"` and `\\`
/// escape (as iptables-save quotes comments).
fn words(line: &str) -> Result<Vec<String>, String> {
    let (mut out, mut word, mut quoted, mut in_word) = (Vec::new(), String::new(), false, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => word.push(chars.next().ok_or("a line ending in a backslash")?),
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("an unclosed quote".into());
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

fn parse_rule(line: &str) -> Result<Rule, String> {
    let words = words(line)?;
    let mut rule = Rule { chain: words.get(1).cloned().unwrap_or_default(), line: line.to_owned(), ..Rule::default() };
    let mut i = 2;
    let mut negated = false;
    while i < words.len() {
        let value = words.get(i + 1).cloned();
        match words[i].as_str() {
            "!" => {
                negated = true;
                i += 1;
                continue;
            }
            "-d" | "--destination" if !negated => rule.destination = value,
            "-p" | "--protocol" if !negated => rule.protocol = value,
            "--dport" | "--destination-port" if !negated => {
                let text = value.unwrap_or_default();
                rule.dport = Some(text.parse().map_err(|_| format!("port {text:?}"))?);
            }
            "-j" | "--jump" | "-g" | "--goto" => rule.target = value,
            "--to-destination" => rule.to_destination = value,
            "--comment" => rule.comment = value,
            "--dst-type" if !negated => rule.dst_local = value.as_deref() == Some("LOCAL"),
            _ => {}
        }
        negated = false;
        i += 1;
    }
    Ok(rule)
}

/// What kube-proxy's rules of one family serve (`nat` and `filter` of
/// `iptables-save`), and the frontends of a protocol ebpf-proxy does not
/// serve (SCTP), described.
pub fn frontends(text: &str, family: Family, table: &mut RuleTable, unserved: &mut Vec<String>) -> Result<(), String> {
    let tables = parse_save(text)?;
    let empty = Table::default();
    let nat = tables.get("nat").unwrap_or(&empty);
    let mut chains: HashMap<&str, Vec<&Rule>> = HashMap::new();
    for rule in &nat.rules {
        chains.entry(rule.chain.as_str()).or_default().push(rule);
    }
    let chain = |name: &str| chains.get(name).map(Vec::as_slice).unwrap_or_default();
    for rule in chain("KUBE-SERVICES") {
        let (Some(dst), Some(target)) = (&rule.destination, &rule.target) else { continue };
        let Some(addr) = host(dst) else { continue };
        let kind = match rule.comment.as_deref().unwrap_or_default() {
            c if c.ends_with(" external IP") => RuleKind::ExternalIp,
            c if c.ends_with(" loadbalancer IP") => RuleKind::LoadBalancer,
            _ => RuleKind::ClusterIp,
        };
        let service = rule.comment.as_deref().map(|c| {
            [" cluster IP", " external IP", " loadbalancer IP"]
                .iter()
                .find_map(|suffix| c.strip_suffix(suffix))
                .unwrap_or(c)
                .to_owned()
        });
        add(table, unserved, rule, Place::Address(addr), kind, service, backends(target, &chains))?;
    }
    for rule in chain("KUBE-NODEPORTS") {
        let Some(target) = &rule.target else { continue };
        if target.starts_with("KUBE-MARK-") {
            continue;
        }
        add(
            table,
            unserved,
            rule,
            Place::NodePort(family),
            RuleKind::NodePort,
            rule.comment.clone(),
            backends(target, &chains),
        )?;
    }
    // Frontends without endpoints: only their reject rule, in filter.
    let Some(filter) = tables.get("filter") else { return Ok(()) };
    for rule in &filter.rules {
        let ours = matches!(rule.chain.as_str(), "KUBE-SERVICES" | "KUBE-EXTERNAL-SERVICES");
        if !ours || rule.target.as_deref() != Some("REJECT") {
            continue;
        }
        let place = match (&rule.destination, rule.dst_local) {
            (Some(dst), _) => match host(dst) {
                Some(addr) => Place::Address(addr),
                None => continue,
            },
            (None, true) => Place::NodePort(family),
            (None, false) => continue,
        };
        let Some((protocol, port)) = proto_port(rule, unserved)? else { continue };
        let key = super::RuleKey { place, port, protocol };
        table.entry(key).or_insert_with(|| {
            let service = rule.comment.as_deref().map(|c| c.trim_end_matches(" has no endpoints").to_owned());
            RuleFrontend { kind: RuleKind::NoEndpoints, service, backends: BTreeSet::new() }
        });
    }
    Ok(())
}

fn add(
    table: &mut RuleTable,
    unserved: &mut Vec<String>,
    rule: &Rule,
    place: Place,
    kind: RuleKind,
    service: Option<String>,
    backends: Result<BTreeSet<SocketAddr>, String>,
) -> Result<(), String> {
    let Some((protocol, port)) = proto_port(rule, unserved)? else { return Ok(()) };
    let backends = backends.map_err(|e| format!("{}: {e}", rule.line))?;
    insert(table, RuleKey { place, port, protocol }, RuleFrontend { kind, service, backends });
    Ok(())
}

/// The rule's protocol and port; `None` for one without (not a frontend)
/// or of SCTP (described into `unserved`).
fn proto_port(rule: &Rule, unserved: &mut Vec<String>) -> Result<Option<(crate::model::Protocol, u16)>, String> {
    let (Some(proto), Some(port)) = (&rule.protocol, rule.dport) else { return Ok(None) };
    if let Some(p) = protocol(proto).map_err(|e| format!("{}: {e}", rule.line))? {
        return Ok(Some((p, port)));
    }
    let at = rule.destination.as_deref().unwrap_or("nodePort");
    unserved.push(format!("{at} port {port}/{proto} ({})", rule.comment.as_deref().unwrap_or("no comment")));
    Ok(None)
}

/// `ADDR` or `ADDR/32` (`/128`): one address; `None` for a wider range.
fn host(text: &str) -> Option<IpAddr> {
    let (addr, len) = text.split_once('/').map_or((text, None), |(a, l)| (a, Some(l)));
    let addr: IpAddr = addr.parse().ok()?;
    let full = match addr {
        IpAddr::V4(_) => "32",
        IpAddr::V6(_) => "128",
    };
    (len.is_none() || len == Some(full)).then_some(addr)
}

/// Every DNAT destination reachable from chain `start`.
fn backends(start: &str, chains: &HashMap<&str, Vec<&Rule>>) -> Result<BTreeSet<SocketAddr>, String> {
    let mut out = BTreeSet::new();
    let (mut todo, mut seen) = (vec![start], HashSet::new());
    while let Some(name) = todo.pop() {
        if !seen.insert(name) || name.starts_with("KUBE-MARK-") {
            continue;
        }
        for rule in chains.get(name).map(Vec::as_slice).unwrap_or_default() {
            if let Some(to) = &rule.to_destination {
                out.insert(destination(to)?);
            } else if let Some(target) = rule.target.as_deref().filter(|t| chains.contains_key(t)) {
                todo.push(target);
            }
        }
    }
    Ok(out)
}

/// `--to-destination ADDR:PORT` (`[ADDR]:PORT` for IPv6).
fn destination(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| format!("DNAT to {text:?}: not ADDR:PORT"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    const NAT_NFT: &str = include_str!("../../tests/fixtures/kube-proxy-rules/nat-nft.txt");
    const FILTER_NFT: &str = include_str!("../../tests/fixtures/kube-proxy-rules/filter-nft.txt");
    const NAT_LEGACY: &str = include_str!("../../tests/fixtures/kube-proxy-rules/nat-legacy.txt");
    const FILTER_LEGACY: &str = include_str!("../../tests/fixtures/kube-proxy-rules/filter-legacy.txt");

    fn read(texts: &[&str]) -> (RuleTable, Vec<String>) {
        let (mut table, mut unserved) = (RuleTable::new(), Vec::new());
        for text in texts {
            frontends(text, Family::V4, &mut table, &mut unserved).unwrap();
        }
        (table, unserved)
    }

    fn at(addr: &str, port: u16, protocol: Protocol) -> RuleKey {
        RuleKey { place: Place::Address(addr.parse().unwrap()), port, protocol }
    }

    fn node_port(port: u16) -> RuleKey {
        RuleKey { place: Place::NodePort(Family::V4), port, protocol: Protocol::Tcp }
    }

    fn set(addrs: &[&str]) -> BTreeSet<SocketAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn words_keep_quoted_comments_whole() {
        assert_eq!(
            words(r#"-A X -m comment --comment "a \"b\" c" -j Y"#).unwrap(),
            ["-A", "X", "-m", "comment", "--comment", "a \"b\" c", "-j", "Y"]
        );
        assert!(words(r#"-A X --comment "open"#).is_err());
    }

    #[test]
    fn every_frontend_of_the_saved_rules_with_its_backends() {
        for (nat, filter) in [(NAT_NFT, FILTER_NFT), (NAT_LEGACY, FILTER_LEGACY)] {
            let (table, unserved) = read(&[nat, filter]);
            assert!(unserved.is_empty());
            // (key, kind, backends), table-driven.
            let want: Vec<(RuleKey, RuleKind, Vec<&str>)> = vec![
                (at("10.96.0.10", 80, Protocol::Tcp), RuleKind::ClusterIp, vec!["10.244.1.2:8080", "10.244.2.3:8080"]),
                (
                    at("203.0.113.5", 80, Protocol::Tcp),
                    RuleKind::ExternalIp,
                    vec!["10.244.1.2:8080", "10.244.2.3:8080"],
                ),
                (at("10.96.0.53", 53, Protocol::Udp), RuleKind::ClusterIp, vec!["10.244.1.53:53"]),
                (
                    at("10.96.0.20", 8080, Protocol::Tcp),
                    RuleKind::ClusterIp,
                    vec!["10.244.1.7:8080", "10.244.2.7:8080"],
                ),
                // Local policy: the cluster chain (pods, the node) and the local one.
                (node_port(30081), RuleKind::NodePort, vec!["10.244.1.7:8080", "10.244.2.7:8080"]),
                (at("10.96.0.30", 80, Protocol::Tcp), RuleKind::ClusterIp, vec!["10.244.3.1:8080"]),
                // Through KUBE-FW (source ranges) and KUBE-EXT.
                (at("192.0.2.10", 80, Protocol::Tcp), RuleKind::LoadBalancer, vec!["10.244.3.1:8080"]),
                (node_port(30082), RuleKind::NodePort, vec!["10.244.3.1:8080"]),
                // Session affinity: the `recent` jumps name the same endpoints.
                (at("10.96.0.40", 80, Protocol::Tcp), RuleKind::ClusterIp, vec!["10.244.1.9:8080", "10.244.2.9:8080"]),
                // No endpoints: the filter table's rejects.
                (at("10.96.0.50", 80, Protocol::Tcp), RuleKind::NoEndpoints, vec![]),
                (node_port(30050), RuleKind::NoEndpoints, vec![]),
            ];
            for (key, kind, backends) in &want {
                let got = table.get(key).unwrap_or_else(|| panic!("{key} missing: {table:?}"));
                assert_eq!((got.kind, &got.backends), (*kind, &set(backends)), "{key}");
            }
            assert_eq!(table.len(), want.len(), "{table:#?}");
            assert_eq!(table[&at("10.96.0.10", 80, Protocol::Tcp)].service.as_deref(), Some("shop/web:http"));
            assert_eq!(table[&at("192.0.2.10", 80, Protocol::Tcp)].service.as_deref(), Some("shop/lb:http"));
            assert_eq!(table[&node_port(30050)].service.as_deref(), Some("shop/empty:http"));
        }
    }

    #[test]
    fn sctp_is_served_and_ipv6_nodeports_are_of_their_family() {
        let text = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n\
            -A KUBE-SERVICES -d fd00:96::1/128 -p sctp -m comment --comment \"ns/s:p cluster IP\" -m sctp --dport 9 -j KUBE-SVC-A\n\
            -A KUBE-NODEPORTS -p tcp -m comment --comment \"ns/t:p\" -m tcp --dport 30001 -j KUBE-SVC-A\n\
            -A KUBE-SVC-A -j KUBE-SEP-A\n-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination [fd00::5]:80\nCOMMIT\n";
        let (mut table, mut unserved) = (RuleTable::new(), Vec::new());
        frontends(text, Family::V6, &mut table, &mut unserved).unwrap();
        assert!(unserved.is_empty(), "{unserved:?}");
        let key = RuleKey { place: Place::NodePort(Family::V6), port: 30001, protocol: Protocol::Tcp };
        assert_eq!(table[&key].backends, set(&["[fd00::5]:80"]));
        let sctp = RuleKey { place: Place::Address("fd00:96::1".parse().unwrap()), port: 9, protocol: Protocol::Sctp };
        assert_eq!(table[&sctp].backends, set(&["[fd00::5]:80"]));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn node_port_addresses_and_localhost_node_ports_are_one_node_port() {
        // With nodePortAddresses, KUBE-SERVICES jumps to KUBE-NODEPORTS per
        // address (no port: not a frontend); localhost nodePorts get their
        // own rule with `-d 127.0.0.0/8`.
        let text = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-EXT-A - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n\
            -A KUBE-SERVICES -d 192.168.1.5/32 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -j KUBE-NODEPORTS\n\
            -A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"ns/s:p\" -m tcp --dport 30080 -j KUBE-EXT-A\n\
            -A KUBE-NODEPORTS -p tcp -m comment --comment \"ns/s:p\" -m tcp --dport 30080 -j KUBE-EXT-A\n\
            -A KUBE-EXT-A -j KUBE-MARK-MASQ\n-A KUBE-EXT-A -j KUBE-SVC-A\n-A KUBE-SVC-A -j KUBE-SEP-A\n\
            -A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.1:80\nCOMMIT\n";
        let (table, unserved) = read(&[text]);
        assert!(unserved.is_empty());
        assert_eq!(table.len(), 1, "{table:?}");
        assert_eq!(table[&node_port(30080)].backends, set(&["10.244.1.1:80"]));
    }

    #[test]
    fn a_broken_destination_is_an_error_naming_the_rule() {
        let text = "*nat\n-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp --dport 80 -j KUBE-SVC-A\n-A KUBE-SVC-A -j DNAT --to-destination 10.1.1.1\nCOMMIT\n";
        let err = frontends(text, Family::V4, &mut RuleTable::new(), &mut Vec::new()).unwrap_err();
        assert!(err.contains("KUBE-SVC-A") && err.contains("10.1.1.1"), "{err}");
    }
}
