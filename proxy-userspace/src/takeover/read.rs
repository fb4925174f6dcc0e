//! Runs the tools that show kube-proxy's rules: `iptables-save` of each
//! backend (iptables-nft, iptables-legacy) and family, and `nft -j`.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::{Error, Family, RuleTable, iptables, nftables};

/// One iptables backend of one family: its save and restore commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Iptables {
    /// `iptables-nft`, `iptables-legacy`, `ip6tables-nft`, ... (or plain
    /// `iptables` when only that is installed).
    pub(crate) name: String,
    pub(crate) family: Family,
}

impl Iptables {
    #[must_use]
    pub(crate) fn save(&self) -> String {
        self.with_suffix("save")
    }

    #[must_use]
    pub(crate) fn restore(&self) -> String {
        self.with_suffix("restore")
    }

    fn with_suffix(&self, what: &str) -> String {
        format!("{}-{what}", self.name)
    }

    /// Whether to read `table` with this tool. A legacy table is read only
    /// when the kernel lists it (`/proc/net/ip_tables_names`, of the
    /// agent's network namespace): `iptables-legacy-save` of a table that
    /// does not exist would create it, adding legacy hooks to a node that
    /// has none.
    #[must_use]
    pub(crate) fn has_table(&self, table: &str) -> bool {
        if !self.name.ends_with("-legacy") {
            return true;
        }
        let names = match self.family {
            Family::V4 => "/proc/net/ip_tables_names",
            Family::V6 => "/proc/net/ip6_tables_names",
        };
        std::fs::read_to_string(names).is_ok_and(|text| text.lines().any(|l| l.trim() == table))
    }
}

/// The tools found on the PATH.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tools {
    pub(crate) iptables: Vec<Iptables>,
    /// `nft`, for kube-proxy's nftables mode.
    pub(crate) nft: bool,
}

impl Tools {
    /// Looks the tools up on the PATH: both iptables backends of both
    /// families where installed (plain `iptables-save` when neither is),
    /// and `nft`.
    #[must_use]
    pub(crate) fn find() -> Self {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
        let found = |name: &str| dirs.iter().any(|d| is_file(&d.join(name)));
        let mut iptables = Vec::new();
        for (prefix, family) in [("iptables", Family::V4), ("ip6tables", Family::V6)] {
            let mut any = false;
            for backend in ["nft", "legacy"] {
                let name = format!("{prefix}-{backend}");
                if found(&format!("{name}-save")) && found(&format!("{name}-restore")) {
                    iptables.push(Iptables { name, family });
                    any = true;
                }
            }
            if !any && found(&format!("{prefix}-save")) && found(&format!("{prefix}-restore")) {
                iptables.push(Iptables { name: prefix.into(), family });
            }
        }
        Self { iptables, nft: found("nft") }
    }
}

fn is_file(path: &Path) -> bool {
    path.metadata().is_ok_and(|m| m.is_file())
}

/// Runs `command args`, with `input` on its standard input, and returns
/// its standard output.
pub(super) fn run(command: &str, args: &[&str], input: Option<&str>) -> Result<String, Error> {
    let line = format!("{command} {}", args.join(" "));
    let spawn = |source| Error::Spawn { command: line.clone(), source };
    let mut child = Command::new(command)
        .args(args)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let Some(input) = input {
        child.stdin.take().expect("piped").write_all(input.as_bytes()).map_err(spawn)?;
    }
    let output = child.wait_with_output().map_err(spawn)?;
    if !output.status.success() {
        return Err(Error::Failed {
            command: line,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The chains kube-proxy creates by name in each table (its
/// pkg/proxy/iptables CleanupLeftovers), besides the per-service chains
/// of nat (`is_service_chain`).
#[must_use]
pub(crate) fn kube_proxy_chains(table: &str) -> &'static [&'static str] {
    match table {
        "nat" => &["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY"],
        "filter" => &[
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
            "KUBE-PROXY-CANARY",
        ],
        "mangle" => &["KUBE-PROXY-CANARY"],
        _ => &[],
    }
}

/// kube-proxy's per-service chains of the nat table.
#[must_use]
pub(crate) fn is_service_chain(name: &str) -> bool {
    ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"].iter().any(|p| name.starts_with(p))
}

/// The families (`ip`, `ip6`) of the tables `nft` lists named `kube-proxy`.
pub(super) fn nft_tables() -> Result<Vec<&'static str>, Error> {
    nft_tables_named("kube-proxy")
}

/// The families (`ip`, `ip6`) of the tables `nft` lists named `name`.
pub(super) fn nft_tables_named(name: &str) -> Result<Vec<&'static str>, Error> {
    let text = run("nft", &["-j", "list", "tables"], None)?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Parse { command: "nft -j list tables".into(), reason: e.to_string() })?;
    let items = json.get("nftables").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for family in ["ip", "ip6"] {
        let present = items.iter().any(|i| {
            i.pointer("/table/name").and_then(serde_json::Value::as_str) == Some(name)
                && i.pointer("/table/family").and_then(serde_json::Value::as_str) == Some(family)
        });
        if present {
            out.push(family);
        }
    }
    Ok(out)
}

/// kube-proxy's rules as found in the kernel.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rules {
    pub(crate) table: RuleTable,
    /// Frontends served with a protocol ebpf-proxy does not serve (SCTP).
    pub(crate) unserved: Vec<String>,
    /// Where kube-proxy's rules were found (`iptables-nft IPv4`,
    /// `nft ip kube-proxy`, ...); empty: nowhere.
    pub(crate) found: Vec<String>,
}

/// Reads kube-proxy's rules with `tools`, every backend and family.
pub(crate) fn read_rules(tools: &Tools) -> Result<Rules, Error> {
    let mut rules = Rules::default();
    for ipt in &tools.iptables {
        let save = ipt.save();
        let mut text = String::new();
        for table in ["nat", "filter"].into_iter().filter(|t| ipt.has_table(t)) {
            text.push_str(&run(&save, &["-t", table], None)?);
        }
        let ours = iptables::parse_save(&text)
            .map_err(|reason| Error::Parse { command: save.clone(), reason })?
            .iter()
            .any(|(name, t)| {
                t.chains.iter().any(|c| kube_proxy_chains(name).contains(&c.as_str()) || is_service_chain(c))
            });
        if !ours {
            continue;
        }
        rules.found.push(format!("{} {:?}", ipt.name, ipt.family));
        iptables::frontends(&text, ipt.family, &mut rules.table, &mut rules.unserved)
            .map_err(|reason| Error::Parse { command: save.clone(), reason })?;
    }
    if tools.nft {
        for family in nft_tables()? {
            let command = format!("nft -j list table {family} kube-proxy");
            let text = run("nft", &["-j", "list", "table", family, "kube-proxy"], None)?;
            let json = serde_json::from_str(&text)
                .map_err(|e| Error::Parse { command: command.clone(), reason: e.to_string() })?;
            let f = if family == "ip" { Family::V4 } else { Family::V6 };
            nftables::frontends(&json, f, &mut rules.table, &mut rules.unserved)
                .map_err(|reason| Error::Parse { command: command.clone(), reason })?;
            rules.found.push(format!("nft {family} kube-proxy"));
        }
    }
    Ok(rules)
}
