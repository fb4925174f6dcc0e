//! The rule sets kube-proxy would write for the same services, for the
//! variants that translate with netfilter: iptables mode (KUBE-SERVICES ->
//! KUBE-SVC-* -> KUBE-SEP-*, `statistic --mode random`, KUBE-MARK-MASQ) as
//! `iptables-restore` input, and nftables mode (a verdict map from address,
//! protocol and port to a per-service chain, `numgen random` over endpoint
//! chains) as `nft -f` input. Shapes follow kube-proxy's
//! pkg/proxy/iptables and pkg/proxy/nftables.
use std::fmt::Write as _;

use super::spec::{BACKEND_PORT, ENDPOINTS, SERVICE_PORT, endpoint, vip};

/// kube-proxy's cluster CIDR assumption: sources outside it are marked for
/// masquerade.
const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// A chain name suffix as kube-proxy makes them: 16 characters of base32
/// of a hash of the service port (and endpoint).
pub fn chain_hash(text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    // FNV-1a 64, twice with different seeds, as 80 bits of base32.
    let fnv = |seed: u64| text.bytes().fold(seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142));
    let bits = (u128::from(a) << 64) | u128::from(b);
    (0..16).map(|i| char::from(ALPHABET[((bits >> (i * 5)) & 31) as usize])).collect()
}

/// Service `s`'s port as kube-proxy names it in comments and hashes.
pub fn svc_port_name(s: u32) -> String {
    format!("bench/svc{s}:http")
}

/// `iptables-restore` input for `n` services (nat and filter tables).
#[must_use]
pub fn iptables(n: u32) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    for name in ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-NODEPORTS"] {
        let _ = writeln!(chains, ":{name} - [0:0]");
    }
    rules.push_str("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    rules.push_str("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    rules.push_str("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n");
    rules.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
    rules.push_str("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n");
    rules.push_str("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n");
    rules.push_str("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n");
    for s in 0..n {
        let port_name = svc_port_name(s);
        let svc_chain = format!("KUBE-SVC-{}", chain_hash(&port_name));
        let vip = vip(s);
        let _ = writeln!(chains, ":{svc_chain} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment \"{port_name} cluster IP\" -m tcp --dport {SERVICE_PORT} -j {svc_chain}"
        );
        let _ = writeln!(
            rules,
            "-A {svc_chain} ! -s {CLUSTER_CIDR} -d {vip}/32 -p tcp -m comment --comment \"{port_name} cluster IP\" -m tcp --dport {SERVICE_PORT} -j KUBE-MARK-MASQ"
        );
        for i in 0..ENDPOINTS {
            let ep = endpoint(s, i);
            let sep_chain = format!("KUBE-SEP-{}", chain_hash(&format!("{port_name}:{ep}")));
            let _ = writeln!(chains, ":{sep_chain} - [0:0]");
            let remaining = ENDPOINTS - i;
            let probability = if remaining > 1 {
                format!(" -m statistic --mode random --probability {:.11}", 1.0 / f64::from(remaining))
            } else {
                String::new()
            };
            let _ = writeln!(
                rules,
                "-A {svc_chain} -m comment --comment \"{port_name} -> {ep}:{BACKEND_PORT}\"{probability} -j {sep_chain}"
            );
            let _ = writeln!(rules, "-A {sep_chain} -s {ep}/32 -m comment --comment \"{port_name}\" -j KUBE-MARK-MASQ");
            let _ = writeln!(
                rules,
                "-A {sep_chain} -p tcp -m comment --comment \"{port_name}\" -m tcp -j DNAT --to-destination {ep}:{BACKEND_PORT}"
            );
        }
    }
    rules.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    format!(
        "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{chains}{rules}COMMIT\n"
    )
}

/// The name of service `s`'s nftables chain of `kind` (`service`,
/// `external`): kube-proxy's `KIND-HASH-NAMESPACE/NAME/PROTOCOL/PORT`.
pub fn nft_chain(kind: &str, s: u32) -> String {
    format!("{kind}-{}-bench/svc{s}/tcp/http", &chain_hash(&svc_port_name(s))[..8])
}

/// `nft -f` input for `n` services: table `ip kube-proxy`.
#[must_use]
pub fn nftables(n: u32) -> String {
    let mut out = String::from(
        "table ip kube-proxy {\n  comment \"rules for kube-proxy\"\n  chain mark-for-masquerade {\n    mark set mark or 0x4000\n  }\n  chain masquerading {\n    mark and 0x4000 == 0 return\n    mark set mark xor 0x4000\n    masquerade fully-random\n  }\n  chain nat-output {\n    type nat hook output priority -100; policy accept;\n    jump services\n  }\n  chain nat-prerouting {\n    type nat hook prerouting priority -100; policy accept;\n    jump services\n  }\n  chain nat-postrouting {\n    type nat hook postrouting priority 100; policy accept;\n    jump masquerading\n  }\n",
    );
    let mut map = String::new();
    for s in 0..n {
        let port_name = svc_port_name(s);
        let svc_chain = nft_chain("service", s);
        let vip = vip(s);
        let _ = writeln!(map, "      {vip} . tcp . {SERVICE_PORT} : goto {svc_chain},");
        let mut arms = Vec::new();
        for i in 0..ENDPOINTS {
            let ep = endpoint(s, i);
            let ep_chain = format!(
                "endpoint-{}-bench/svc{s}/tcp/http__{ep}/{BACKEND_PORT}",
                &chain_hash(&format!("{port_name}:{ep}"))[..8]
            );
            arms.push(format!("{i} : goto {ep_chain}"));
            let _ = write!(
                out,
                "  chain {ep_chain} {{\n    ip saddr {ep} jump mark-for-masquerade\n    meta l4proto tcp dnat to {ep}:{BACKEND_PORT}\n  }}\n"
            );
        }
        let _ = write!(
            out,
            "  chain {svc_chain} {{\n    ip daddr {vip} tcp dport {SERVICE_PORT} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade\n    numgen random mod {ENDPOINTS} vmap {{ {} }}\n  }}\n",
            arms.join(", ")
        );
    }
    out.push_str("  map service-ips {\n    type ipv4_addr . inet_proto . inet_service : verdict\n    comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"\n");
    if n > 0 {
        out.push_str("    elements = {\n");
        out.push_str(&map);
        out.push_str("    }\n");
    }
    out.push_str("  }\n  chain services {\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_rules_have_kube_proxys_shape() {
        let text = iptables(2);
        // Per service: a KUBE-SERVICES jump, a masquerade mark, ten endpoint
        // jumps with decreasing probabilities (the last without).
        assert_eq!(text.matches("-A KUBE-SERVICES -d ").count(), 2);
        assert_eq!(text.matches("--probability 0.10000000000").count(), 2);
        assert_eq!(text.matches("--probability 0.50000000000").count(), 2);
        assert_eq!(text.matches("-j DNAT --to-destination").count(), 20);
        assert_eq!(text.matches(":KUBE-SEP-").count(), 20);
        let chain = text.lines().find(|l| l.starts_with(":KUBE-SVC-")).unwrap();
        assert!(
            chain.len() - ":".len() - " - [0:0]".len() <= 28,
            "iptables chain names are at most 28 characters: {chain}"
        );
    }

    #[test]
    fn nftables_rules_have_kube_proxys_shape() {
        let text = nftables(2);
        assert_eq!(text.matches(" : goto service-").count(), 2);
        assert_eq!(text.matches("dnat to").count(), 20);
        assert!(text.contains("numgen random mod 10 vmap"));
    }
}
