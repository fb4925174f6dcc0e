//! Removes kube-proxy's rules as `kube-proxy --cleanup` does (its
//! pkg/proxy/iptables CleanupLeftovers and the nftables proxier's
//! cleanup), each table in one transaction: per iptables backend, family
//! and table (nat, filter, mangle), one `iptables-restore --noflush` that
//! deletes every rule of another chain jumping to one of kube-proxy's
//! chains, flushes them and deletes them; per nftables family, `nft
//! delete table FAMILY kube-proxy`. Rules and chains of anyone else stay.
//!
//! Connections kube-proxy's DNAT translated keep their translation in
//! conntrack, but only while netfilter's conntrack and NAT hooks stay
//! registered in the namespace, and the kernel unregisters them with
//! their last user: kube-proxy's rules may be that (tested: a connection
//! held through the DNAT stalls the moment they go, on a node where
//! nothing else uses conntrack). So first (in the same nft transaction as
//! the table's deletion in nftables mode) the table `KEEPER` is added:
//! empty NAT base chains with policy accept and one rule that only reads
//! the connection state, in a chain no hook calls. It changes no verdict
//! and stays (`nft delete table ip ebpf-proxy-conntrack` once the flows
//! kube-proxy translated are gone).
use std::{collections::HashSet, fmt::Write as _};

use super::{
    Error,
    iptables::parse_save,
    read::{Tools, is_service_chain, kube_proxy_chains, nft_tables, nft_tables_named, read_rules, run},
};

/// The table that keeps conntrack and NAT in place (see the module's
/// documentation).
pub const KEEPER: &str = "ebpf-proxy-conntrack";

/// `nft -f` input adding `KEEPER` in `family` (`ip`, `ip6`).
#[must_use]
pub fn keeper(family: &str) -> String {
    format!(
        "table {family} {KEEPER} {{\n\
         \tcomment \"keeps conntrack and NAT for connections kube-proxy translated (ebpf-proxy --take-over-from-kube-proxy)\"\n\
         \tchain prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}\n\
         \tchain input {{ type nat hook input priority 100; policy accept; }}\n\
         \tchain output {{ type nat hook output priority -100; policy accept; }}\n\
         \tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         \tchain conntrack {{\n\t\tct state established,related counter\n\t}}\n\
         }}\n"
    )
}

/// What was removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// kube-proxy's iptables chains deleted (every backend and family).
    pub(crate) chains: usize,
    /// Rules of other chains (PREROUTING, OUTPUT, FORWARD, ...) that jumped
    /// to them, deleted.
    pub(crate) jumps: usize,
    /// nftables tables deleted (`ip kube-proxy`, `ip6 kube-proxy`).
    pub(crate) nft_tables: Vec<String>,
    /// Families `KEEPER` was added in (`ip`, `ip6`).
    pub(crate) kept: Vec<&'static str>,
}

/// The `iptables-restore --noflush` input that removes kube-proxy's
/// chains from `table` given its `iptables-save -t TABLE` text, and how
/// many chains and jumps it removes (`None`: nothing of kube-proxy's).
pub(crate) fn removal(table: &str, saved: &str) -> Result<Option<(String, usize, usize)>, String> {
    let tables = parse_save(saved)?;
    let Some(t) = tables.get(table) else { return Ok(None) };
    let names = kube_proxy_chains(table);
    let ours: Vec<&str> = t
        .chains
        .iter()
        .map(String::as_str)
        .filter(|c| names.contains(c) || (table == "nat" && is_service_chain(c)))
        .collect();
    if ours.is_empty() {
        return Ok(None);
    }
    let set: HashSet<&str> = ours.iter().copied().collect();
    let jumps: Vec<&str> = t
        .rules
        .iter()
        .filter(|r| !set.contains(r.chain.as_str()) && r.target.as_deref().is_some_and(|j| set.contains(j)))
        .map(|r| r.line.as_str())
        .collect();
    let mut input = format!("*{table}\n");
    for chain in &ours {
        let _ = writeln!(input, ":{chain} - [0:0]");
    }
    for jump in &jumps {
        let _ = writeln!(input, "-D {}", jump.strip_prefix("-A ").expect("a saved rule"));
    }
    for chain in &ours {
        let _ = writeln!(input, "-X {chain}");
    }
    input.push_str("COMMIT\n");
    Ok(Some((input, ours.len(), jumps.len())))
}

/// Adds the conntrack keeper table for both families where it is not in
/// place yet (kube-proxy's rules removed by someone else while a takeover
/// was pending); the families added. Without `nft`, a warning.
pub fn keep_conntrack(tools: &Tools) -> Result<Vec<&'static str>, Error> {
    if !tools.nft {
        tracing::warn!(
            "nft is not installed: connections kube-proxy translated may stall if nothing else on the node uses conntrack"
        );
        return Ok(Vec::new());
    }
    let kept_before = nft_tables_named(KEEPER)?;
    let mut added = Vec::new();
    for family in ["ip", "ip6"].into_iter().filter(|f| !kept_before.contains(f)) {
        run("nft", &["-f", "-"], Some(&keeper(family)))?;
        added.push(family);
    }
    Ok(added)
}

/// Removes kube-proxy's rules with `tools`, then reads again to check
/// that nothing of them is left.
pub fn remove_rules(tools: &Tools) -> Result<Removed, Error> {
    let mut removed = Removed::default();
    // A keeper from an earlier takeover stays as it is (declaring it again
    // would add its rule again).
    let kept_before = if tools.nft { nft_tables_named(KEEPER)? } else { Vec::new() };
    let new_keeper = |family: &str| if kept_before.contains(&family) { String::new() } else { keeper(family) };
    for ipt in &tools.iptables {
        for table in ["nat", "filter", "mangle"].into_iter().filter(|t| ipt.has_table(t)) {
            let saved = run(&ipt.save(), &["-t", table], None)?;
            let plan = removal(table, &saved).map_err(|reason| Error::Parse { command: ipt.save(), reason })?;
            let Some((input, chains, jumps)) = plan else { continue };
            let family = match ipt.family {
                super::Family::V4 => "ip",
                super::Family::V6 => "ip6",
            };
            if !removed.kept.contains(&family) {
                if tools.nft {
                    if !kept_before.contains(&family) {
                        run("nft", &["-f", "-"], Some(&new_keeper(family)))?;
                    }
                } else {
                    tracing::warn!(
                        family,
                        "nft is not installed: connections kube-proxy translated may stall if nothing else on the node uses conntrack"
                    );
                }
                removed.kept.push(family);
            }
            run(&ipt.restore(), &["--noflush", "--wait"], Some(&input))?;
            tracing::info!(tool = %ipt.name, table, chains, jumps, "removed kube-proxy's iptables chains");
            removed.chains += chains;
            removed.jumps += jumps;
        }
    }
    if tools.nft {
        for family in nft_tables()? {
            // One transaction: the keeper in, kube-proxy's table out.
            let input = format!("{}delete table {family} kube-proxy\n", new_keeper(family));
            run("nft", &["-f", "-"], Some(&input))?;
            tracing::info!(family, "removed kube-proxy's nftables table");
            removed.nft_tables.push(format!("{family} kube-proxy"));
            if !removed.kept.contains(&family) {
                removed.kept.push(family);
            }
        }
    }
    let left = read_rules(tools)?;
    if !left.found.is_empty() {
        return Err(Error::Left { left: left.found.join(", ") });
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAT: &str = include_str!("../../tests/fixtures/kube-proxy-rules/nat-nft.txt");
    const FILTER: &str = include_str!("../../tests/fixtures/kube-proxy-rules/filter-nft.txt");

    #[test]
    fn the_nat_removal_unhooks_flushes_and_deletes_kube_proxys_chains_only() {
        let (input, chains, jumps) = removal("nat", NAT).unwrap().unwrap();
        // Every KUBE-* chain of the fixture (all kube-proxy's).
        assert_eq!(chains, NAT.lines().filter(|l| l.starts_with(":KUBE-")).count());
        assert_eq!(jumps, 3, "{input}");
        assert!(input.starts_with("*nat\n:KUBE-"));
        assert!(input.ends_with("COMMIT\n"));
        assert!(input.contains("-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"));
        assert!(
            input
                .contains("-D POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
        );
        assert!(input.contains("-X KUBE-SEP-AFF2AAAAAAAAAAAA\n"));
        // Docker's chain and rules stay.
        assert!(!input.contains("DOCKER") && !input.contains("docker0"), "{input}");
    }

    #[test]
    fn the_filter_removal_keeps_other_chains() {
        let (input, chains, jumps) = removal("filter", FILTER).unwrap().unwrap();
        assert_eq!(chains, 6);
        assert_eq!(jumps, 9, "{input}");
        assert!(!input.contains("UNRELATED"), "{input}");
        assert!(input.contains("-X KUBE-PROXY-FIREWALL\n"));
    }

    #[test]
    fn the_keeper_changes_no_verdict() {
        let text = keeper("ip6");
        assert!(text.starts_with("table ip6 ebpf-proxy-conntrack {"));
        assert_eq!(text.matches("type nat hook").count(), 4);
        assert_eq!(text.matches("policy accept").count(), 4);
        for verdict in ["drop", "reject", "dnat", "snat", "masquerade", "jump", "goto", "return"] {
            assert!(!text.contains(&format!(" {verdict}")), "{verdict} in {text}");
        }
    }

    #[test]
    fn nothing_of_kube_proxys_is_nothing_to_do() {
        let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-MARK-DROP - [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n";
        assert_eq!(removal("nat", text).unwrap(), None);
        assert_eq!(removal("filter", text).unwrap(), None);
    }
}
