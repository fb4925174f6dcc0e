//! docs/reference/metrics.md: every metric `/metrics` serves, from the
//! registry itself (`metrics::Metrics::encode`), with each labelled family
//! given one sample so its labels show.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{Arc, Mutex},
};

use crate::{
    observe::{
        health::Endpoint,
        metrics::{LatencyLabels, Metrics, RequestLabels, Server},
        telemetry::{EXTERNAL_PACKETS, POD_PACKETS, SERVICE_CONNECTIONS, SERVICE_SERIES_OMITTED, Telemetry},
    },
    reconcile::audit::{Drift, MapDrift},
    source::kube::WatchCounters,
};

/// One metric family as the exposition describes it.
#[derive(Default)]
struct Family {
    kind: String,
    help: String,
    labels: Vec<String>,
}

/// A registry as a running agent has it: the Kubernetes watches' counters
/// on, and one sample in each labelled family.
fn exposition() -> String {
    let mut telemetry = Telemetry::new(1, 1);
    telemetry.watch = Some(Arc::new(WatchCounters::default()));
    let metrics = Metrics::new(Arc::new(Mutex::new(telemetry)), 1);
    metrics.health_answered(Endpoint::Healthz, 200);
    metrics.health_answered(Endpoint::Livez, 200);
    metrics.set_no_local_endpoints(0, 0);
    metrics.bind_failed(Server::Health);
    metrics.drift_repaired(&Drift { maps: BTreeMap::from([("SERVICES", MapDrift::default())]) });
    metrics.file_rejected("not_yaml");
    metrics.requests.get_or_create(&RequestLabels { code: "200".into(), method: "GET".into(), host: "h".into() }).inc();
    metrics.request_duration.get_or_create(&LatencyLabels { verb: "GET".into(), host: "h".into() }).observe(0.0);
    metrics.encode()
}

/// The families of an OpenMetrics text, by name.
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            help.clone_into(&mut families.entry(name.to_owned()).or_default().help);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            kind.clone_into(&mut families.entry(name.to_owned()).or_default().kind);
        } else if !line.starts_with('#') {
            let Some((sample, labels)) = line.split_once('{') else { continue };
            let Some(family) = family_of(&mut families, sample) else { continue };
            let labels = labels.split_once('}').map_or("", |(l, _)| l);
            for label in labels.split(',').filter_map(|l| l.split_once('=')).map(|(k, _)| k) {
                if label != "le" && !family.labels.iter().any(|l| l == label) {
                    family.labels.push(label.to_owned());
                }
            }
        }
    }
    families
}

/// The family a sample belongs to (`x_total`, `x_bucket`, ... are `x`'s).
fn family_of<'a>(families: &'a mut BTreeMap<String, Family>, sample: &str) -> Option<&'a mut Family> {
    let name = ["_total", "_bucket", "_sum", "_count", "_created"]
        .iter()
        .find_map(|suffix| sample.strip_suffix(suffix).filter(|n| families.contains_key(*n)))
        .unwrap_or(sample);
    families.get_mut(name)
}

/// The metrics reference.
#[must_use]
pub(crate) fn metrics_markdown() -> String {
    let mut families = families(&exposition());
    // Encoded only once the programs' maps are loaded, which a unit test
    // has not: described from the names and help texts the collector uses.
    let kernel: [((&str, &str), &str, &[&str]); 4] = [
        (EXTERNAL_PACKETS, "counter", &["result"]),
        (POD_PACKETS, "counter", &["result"]),
        (SERVICE_CONNECTIONS, "counter", &["service", "frontend"]),
        (SERVICE_SERIES_OMITTED, "gauge", &[]),
    ];
    for ((name, help), kind, labels) in kernel {
        let labels = labels.iter().map(|l| (*l).to_owned()).collect();
        families.insert(name.to_owned(), Family { kind: kind.into(), help: help.into(), labels });
    }
    let mut out = format!(
        "# Metrics reference\n\n{}\n\n`/metrics` on `--metrics-bind-address` (default `{}`) \
         serves OpenMetrics text. kube-proxy's metrics keep kube-proxy's names (`kubeproxy_*`, client-go's \
         `rest_client_*`, `process_*`), so its dashboards and alerts work; ebpf-proxy's own are \
         `ebpf_proxy_*`. A counter's samples end in `_total`, a histogram's in `_bucket`, `_sum` and \
         `_count`.\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n",
        super::GENERATED,
        crate::paths::DEFAULT_METRICS
    );
    for (name, family) in &families {
        let sample = if family.kind == "counter" { format!("{name}_total") } else { name.clone() };
        let labels = family.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(out, "| `{sample}` | {} | {labels} | {} |", family.kind, super::one_line(&family.help));
    }
    let results = proxy_common::external_stat::NAMES.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>();
    let _ = writeln!(
        out,
        "\n`{}_total{{result}}` and `{}_total{{result}}` are each one of {}. `{}_total` is one series per \
         frontend, at most `--max-service-series` of them; `process_*` appear where `/proc` can be read.",
        EXTERNAL_PACKETS.0,
        POD_PACKETS.0,
        results.join(", "),
        SERVICE_CONNECTIONS.0
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_with_their_labels() {
        let page = metrics_markdown();
        for line in [
            "| `kubeproxy_sync_proxy_rules_duration_seconds` | histogram |  |",
            "| `kubeproxy_proxy_healthz_total` | counter | `code` |",
            "| `rest_client_requests_total` | counter | `code`, `method`, `host` |",
            "| `ebpf_proxy_watch_relists_total` | counter |  |",
            "| `ebpf_proxy_map_size` | gauge | `map` |",
            "| `ebpf_proxy_external_packets_total` | counter | `result` |",
            "| `ebpf_proxy_service_connections_total` | counter | `service`, `frontend` |",
            "| `ebpf_proxy_service_series_omitted` | gauge |  |",
        ] {
            assert!(page.contains(line), "{line} missing:\n{page}");
        }
    }
}
