//! docs/reference/config.md: the config file's fields. ebpf-proxy's own
//! are the `run` flags the parser takes (found by asking it), described by
//! the flag's help; kube-proxy's `KubeProxyConfiguration` fields are
//! listed with an example each, and what ebpf-proxy does with it is what
//! `config::parse` does with that example, not a claim written beside it.
use std::fmt::Write as _;

use clap::{Arg, CommandFactory as _};

use crate::{
    args::Cli,
    config::{KUBE_PROXY_API_VERSIONS, NOT_APPLICABLE, parse},
};

/// Flags whose field is not their name in camelCase.
const FIELD_NAMES: &[(&str, &str)] = &[
    ("node-ip", "nodeIPs"),
    ("health-timeout", "healthTimeoutSeconds"),
    ("nodeport-addresses", "nodePortAddresses"),
    ("audit-interval", "syncPeriod"),
    ("socket-lb", "socketLB"),
    ("cluster-cidr", "clusterCIDR"),
];

/// kube-proxy's `KubeProxyConfiguration` fields (v1alpha1 and v1alpha2,
/// dotted within their section): an example value, and what it does here
/// when honoured. `CONTEXT` gives some examples the fields they need.
const KUBE_PROXY_FIELDS: &[(&str, &str, &str)] = &[
    ("clientConnection.kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf", "the kubeconfig (`--kubeconfig` wins)"),
    ("clientConnection.qps", "5", "no client-side limiter: a limit the agent always stays under holds"),
    ("clientConnection.qps", "1", ""),
    ("clientConnection.burst", "10", "as qps"),
    ("clientConnection.burst", "3", ""),
    ("clientConnection.acceptContentTypes", "application/json", ""),
    ("clientConnection.contentType", "application/vnd.kubernetes.protobuf", ""),
    ("hostnameOverride", "node-1", "this node's name (`--node-name` wins)"),
    ("bindAddress", "0.0.0.0", ""),
    ("healthzBindAddress", "0.0.0.0:10256", "as `--healthz-bind-address`"),
    ("metricsBindAddress", "127.0.0.1:10249", "as `--metrics-bind-address`"),
    ("healthzBindAddresses", "[0.0.0.0/0]", "v1alpha2: one address to bind (all of a family, or a single one)"),
    ("healthzBindAddresses", "[10.0.0.0/8]", ""),
    ("healthzBindPort", "10266", "v1alpha2, with healthzBindAddresses: the port to bind"),
    ("metricsBindAddresses", "[127.0.0.0/8]", "v1alpha2: as healthzBindAddresses"),
    ("metricsBindPort", "10259", "v1alpha2, with metricsBindAddresses: the port to bind"),
    ("bindAddressHardFail", "true", ""),
    ("enableProfiling", "true", ""),
    ("showHiddenMetricsForVersion", "\"1.30\"", ""),
    ("mode", "ipvs", ""),
    ("featureGates", "{}", ""),
    ("minSyncPeriod", "1s", "v1alpha2: syncs start at most this often (changes within it are applied together)"),
    ("syncPeriod", "30s", "v1alpha2: the drift audit's interval (`--audit-interval` wins)"),
    ("iptables.minSyncPeriod", "1s", "v1alpha1, mode iptables or unset: as minSyncPeriod"),
    ("iptables.syncPeriod", "30s", "v1alpha1, mode iptables or unset: as syncPeriod"),
    ("iptables.localhostNodePorts", "true", "NodePorts on 127.0.0.1 as nodePortAddresses admits"),
    ("iptables.localhostNodePorts", "false", ""),
    ("iptables.masqueradeAll", "true", ""),
    ("iptables.masqueradeBit", "14", ""),
    ("nftables.minSyncPeriod", "1s", "v1alpha1, with `mode: nftables`: as minSyncPeriod"),
    ("nftables.syncPeriod", "30s", "v1alpha1, with `mode: nftables`: as syncPeriod"),
    ("nftables.masqueradeAll", "true", ""),
    ("ipvs.minSyncPeriod", "1s", "v1alpha1, with `mode: ipvs`: as minSyncPeriod"),
    ("ipvs.scheduler", "rr", ""),
    ("ipvs.strictARP", "true", ""),
    ("ipvs.excludeCIDRs", "[10.0.0.0/8]", ""),
    ("winkernel", "{}", ""),
    ("windows", "{}", ""),
    ("linux", "{}", ""),
    ("detectLocalMode", "ClusterCIDR", ""),
    ("detectLocal", "{}", ""),
    (
        "clusterCIDR",
        "10.244.0.0/16",
        "packets routed to the node for a ClusterIP are translated, masqueraded from outside it (`--cluster-cidr` wins)",
    ),
    ("nodePortAddresses", "[10.0.0.0/8]", "which local addresses serve NodePorts (`--nodeport-addresses` wins)"),
    ("nodePortAddresses", "[primary]", "the node's first IP of each family"),
    ("nodeIPOverride", "[10.0.0.5]", ""),
    ("oomScoreAdj", "-999", ""),
    ("conntrack", "{maxPerCore: 32768}", ""),
    ("configSyncPeriod", "15m", ""),
    ("portRange", "\"\"", ""),
    ("udpIdleTimeout", "250ms", ""),
    ("logging.format", "json", "the log format (`--log-format` wins)"),
    ("logging.format", "logfmt", ""),
    ("logging.verbosity", "4", "klog's `-v`: 0-2 info, 3-4 debug, 5 and above trace (`RUST_LOG` wins)"),
    ("logging.flushFrequency", "5s", ""),
    ("logging.vmodule", "[]", ""),
];

/// Fields an example of the first needs beside it to mean anything.
const CONTEXT: &[(&str, &str)] = &[
    ("healthzBindPort", "healthzBindAddresses: [0.0.0.0/0]"),
    ("metricsBindPort", "metricsBindAddresses: [127.0.0.0/8]"),
    ("nftables.minSyncPeriod", "mode: nftables"),
    ("nftables.syncPeriod", "mode: nftables"),
    ("ipvs.minSyncPeriod", "mode: ipvs"),
];

/// What the parser makes of one document.
enum Outcome {
    Honoured,
    Ignored,
    Unknown,
    NoEffect,
    Refused(String),
}

fn outcome(yaml: &str) -> Outcome {
    outcome_beside("", yaml)
}

/// What the parser makes of `yaml` added to `context`: honoured when the
/// settings differ from those of `context` alone.
fn outcome_beside(context: &str, yaml: &str) -> Outcome {
    let base = parse(context).map(|cfg| cfg.settings).unwrap_or_default();
    match parse(&format!("{context}{yaml}")) {
        Err((_, message)) => Outcome::Refused(message),
        Ok(cfg) => {
            if cfg.settings != base {
                Outcome::Honoured
            } else if !cfg.unknown.is_empty() {
                Outcome::Unknown
            } else if cfg.ignored.len() > parse(context).map_or(0, |c| c.ignored.len()) {
                Outcome::Ignored
            } else {
                Outcome::NoEffect
            }
        }
    }
}

/// The fields `field`'s example needs beside it (`CONTEXT`), as YAML.
fn context_of(field: &str) -> String {
    CONTEXT.iter().find(|(f, _)| *f == field).map_or(String::new(), |(_, c)| format!("{c}\n"))
}

/// `a.b` with `value` as YAML: `a:\n  b: value`.
fn document(path: &str, value: &str) -> String {
    match path.split_once('.') {
        Some((section, field)) => format!("{section}:\n  {field}: {value}\n"),
        None => format!("{path}: {value}\n"),
    }
}

/// The config file's field of `flag`, if the file has one.
fn field_of(flag: &str) -> Option<String> {
    let name = FIELD_NAMES.iter().find(|(f, _)| *f == flag).map_or_else(|| camel_case(flag), |(_, n)| (*n).to_owned());
    // A null asks the parser whether it knows the field without a value
    // of the field's type: it is unknown, or taken (or refused for its type).
    match outcome(&document(&name, "~")) {
        Outcome::Unknown | Outcome::Ignored => None,
        Outcome::Honoured | Outcome::NoEffect | Outcome::Refused(_) => Some(name),
    }
}

fn camel_case(flag: &str) -> String {
    let mut out = String::new();
    for (i, word) in flag.split('-').enumerate() {
        let mut chars = word.chars();
        if i > 0
            && let Some(first) = chars.next()
        {
            out.extend(first.to_uppercase());
            out.extend(chars);
        } else {
            out.push_str(word);
        }
    }
    out
}

fn help(arg: &Arg) -> String {
    arg.get_long_help().or_else(|| arg.get_help()).map(|h| super::one_line(&h.to_string())).unwrap_or_default()
}

/// The configuration file reference.
#[must_use]
pub(crate) fn config_markdown() -> String {
    let mut out = format!(
        "# Configuration file reference\n\n{}\n\n\
         `ebpf-proxy run --config FILE` (or `ebpf-proxy --config FILE`, kube-proxy's command line) reads one \
         YAML document: ebpf-proxy's own fields, the fields of a kube-proxy `KubeProxyConfiguration` \
         (`apiVersion` one of {}; kubeadm's `config.conf` as it is), or both. Flags override the file. \
         An invalid value stops the start with the file and field named; kube-proxy's fields that do not \
         apply are noted in the log and ignored; unknown fields are named in a warning.\n",
        super::GENERATED,
        KUBE_PROXY_API_VERSIONS.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "),
    );
    own_fields(&mut out);
    kube_proxy_fields(&mut out);
    out
}

fn own_fields(out: &mut String) {
    out.push_str(
        "\n## ebpf-proxy's fields\n\nEach is the `run` flag of the same meaning \
         ([cli.md](cli.md#ebpf-proxy-run)); its default and range are the flag's.\n\n\
         | field | flag | meaning |\n|---|---|---|\n",
    );
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("ebpf-proxy has a run subcommand");
    let mut flag_only = Vec::new();
    for arg in run.get_arguments() {
        let Some(flag) = arg.get_long() else { continue };
        match field_of(flag) {
            Some(field) => {
                let _ = writeln!(out, "| `{field}` | `--{flag}` | {} |", help(arg));
            }
            None => flag_only.push(format!("`--{flag}`")),
        }
    }
    let _ = writeln!(out, "\nOnly on the command line: {}.", flag_only.join(", "));
}

fn kube_proxy_fields(out: &mut String) {
    out.push_str(
        "\n## kube-proxy's fields\n\nWhat ebpf-proxy does with each field of a `KubeProxyConfiguration`, \
         shown on an example value: **honoured** (it changes what the agent does), **ignored** (it tunes a \
         datapath ebpf-proxy does not have; noted in the log), **refused** (the start stops, with this \
         message), **accepted** (read, and this value asks for nothing ebpf-proxy does not do already), \
         or **unknown** (named in a warning).\n\n| field | example | here | what it does |\n|---|---|---|---|\n",
    );
    for (field, example, note) in KUBE_PROXY_FIELDS {
        let context = context_of(field);
        let here = match outcome_beside(&context, &document(field, example)) {
            Outcome::Honoured => "honoured".to_owned(),
            Outcome::Ignored => "ignored".to_owned(),
            Outcome::Unknown => "unknown".to_owned(),
            Outcome::NoEffect => "accepted".to_owned(),
            Outcome::Refused(message) => format!("refused: {}", super::one_line(&message)),
        };
        let with = if context.is_empty() { String::new() } else { format!(" (with `{}`)", context.trim()) };
        let _ = writeln!(out, "| `{field}` | `{}`{with} | {here} | {note} |", super::one_line(example));
    }
    let _ = writeln!(
        out,
        "\nThese fields, and everything under them, are ignored: {}.",
        NOT_APPLICABLE.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page's own fields are the ones the parser takes: every flag
    /// with a field has it parsed, and a made-up one is not a field.
    #[test]
    fn own_fields_are_found_by_asking_the_parser() {
        assert_eq!(field_of("ct-map-size").as_deref(), Some("ctMapSize"));
        assert_eq!(field_of("node-ip").as_deref(), Some("nodeIPs"));
        assert_eq!(field_of("devices").as_deref(), Some("devices"));
        assert_eq!(field_of("take-over-from-kube-proxy"), None, "a flag only");
        assert_eq!(field_of("no-such-flag"), None);
    }

    #[test]
    fn each_outcome_is_the_parsers() {
        assert!(matches!(outcome(&document("ctMapSize", "1024")), Outcome::Honoured));
        assert!(matches!(outcome(&document("ctMapSize", "0")), Outcome::Refused(_)));
        assert!(matches!(outcome(&document("mode", "ipvs")), Outcome::Ignored));
        assert!(matches!(outcome(&document("iptables.masqueradeBit", "14")), Outcome::Ignored));
        assert!(matches!(outcome(&document("noSuchField", "1")), Outcome::Unknown));
        assert!(matches!(outcome(&document("ipvs.minSyncPeriod", "1s")), Outcome::NoEffect), "mode is iptables");
        assert!(matches!(outcome_beside("mode: ipvs\n", &document("ipvs.minSyncPeriod", "1s")), Outcome::Honoured));
        let addresses = "healthzBindAddresses: [0.0.0.0/0]\n";
        assert!(
            matches!(outcome_beside(addresses, &document("healthzBindPort", "10256")), Outcome::NoEffect),
            "what the context sets is not the field's doing"
        );
        assert!(matches!(outcome_beside(addresses, &document("healthzBindPort", "10257")), Outcome::Honoured));
    }

    /// Every honoured example says what it does.
    #[test]
    fn honoured_kube_proxy_fields_are_described() {
        for (field, example, note) in KUBE_PROXY_FIELDS {
            if matches!(outcome_beside(&context_of(field), &document(field, example)), Outcome::Honoured) {
                assert!(!note.is_empty(), "{field}: {example} is honoured: say what it does");
            }
        }
    }
}
