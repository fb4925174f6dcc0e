//! Removes kube-proxy's rules as `kube-proxy --cleanup` does (its
//! pkg/proxy/iptables CleanupLeftovers and the nftables proxier's
//! cleanup), each table in one transaction: per iptables backend, family
//! and table (nat, filter, mangle), one `iptables-restore --noflush` that
//! deletes every rule of another chain jumping to one of kube-proxy's
//! chains, flushes them and deletes them; per nftables family, `nft
//! delete table FAMILY kube-proxy`. Rules and chains of anyone else stay.
use std::{collections::HashSet, fmt::Write as _};

use super::{
    Error,
    iptables::parse_save,
    read::{Tools, is_service_chain, kube_proxy_chains, nft_tables, read_rules, run},
};

/// What was removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// kube-proxy's iptables chains deleted (every backend and family).
    pub chains: usize,
    /// Rules of other chains (PREROUTING, OUTPUT, FORWARD, ...) that jumped
    /// to them, deleted.
    pub jumps: usize,
    /// nftables tables deleted (`ip kube-proxy`, `ip6 kube-proxy`).
    pub nft_tables: Vec<String>,
}

/// The `iptables-restore --noflush` input that removes kube-proxy's
/// chains from `table` given its `iptables-save -t TABLE` text, and how
/// many chains and jumps it removes (`None`: nothing of kube-proxy's).
pub fn removal(table: &str, saved: &str) -> Result<Option<(String, usize, usize)>, String> {
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

/// Removes kube-proxy's rules with `tools`, then reads again to check
/// that nothing of them is left.
pub fn remove_rules(tools: &Tools) -> Result<Removed, Error> {
    let mut removed = Removed::default();
    for ipt in &tools.iptables {
        for table in ["nat", "filter", "mangle"] {
            let saved = run(&ipt.save(), &["-t", table], None)?;
            let plan = removal(table, &saved).map_err(|reason| Error::Parse { command: ipt.save(), reason })?;
            let Some((input, chains, jumps)) = plan else { continue };
            run(&ipt.restore(), &["--noflush", "--wait"], Some(&input))?;
            tracing::info!(tool = %ipt.name, table, chains, jumps, "removed kube-proxy's iptables chains");
            removed.chains += chains;
            removed.jumps += jumps;
        }
    }
    if tools.nft {
        for family in nft_tables()? {
            run("nft", &["delete", "table", family, "kube-proxy"], None)?;
            tracing::info!(family, "removed kube-proxy's nftables table");
            removed.nft_tables.push(format!("{family} kube-proxy"));
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
    fn nothing_of_kube_proxys_is_nothing_to_do() {
        let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-MARK-DROP - [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n";
        assert_eq!(removal("nat", text).unwrap(), None);
        assert_eq!(removal("filter", text).unwrap(), None);
    }
}
