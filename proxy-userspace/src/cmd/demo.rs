//! `ebpf-proxy demo`: a ClusterIP service in front of three HTTP backends,
//! all inside a network namespace and cgroup made for the demo, removed on
//! exit. Nothing is attached to the machine's own cgroups and no traffic
//! leaves the demo namespace.
use std::{collections::BTreeMap, fmt::Write as _, fs, net::Ipv4Addr, path::Path, time::Duration};

use anyhow::{Context as _, bail};
use tokio::sync::{oneshot, watch};

use crate::{
    agent::{self, AgentConfig, Applied},
    args::DemoArgs,
    cmd::run::shutdown_signal,
    datapath::loader::LoadOptions,
    sandbox::{BpfFs, HttpBackend, NetNs, TestCgroup, spawn_in},
};

/// Prints a line; the demo goes on (and cleans up) when stdout is closed.
macro_rules! say {
    ($($arg:tt)*) => {
        let _ = super::output::line(format_args!($($arg)*));
    };
}

const NAME: &str = "ebpf-proxy-demo";
const BASE_DIR: &str = "/run/ebpf-proxy-demo";
const CLUSTER_IP: &str = "10.96.0.10";
const REQUESTS: usize = 30;

fn backend_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, 10 + i)
}

fn services_yaml() -> String {
    let mut endpoints = String::new();
    for i in 1..=3 {
        let _ = write!(
            endpoints,
            "  - addresses: [\"{}\"]\n    conditions: {{ready: true}}\n    nodeName: demo-node\n",
            backend_ip(i)
        );
    }
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: demo}}\n\
spec:\n  type: ClusterIP\n  clusterIP: {CLUSTER_IP}\n  clusterIPs: [\"{CLUSTER_IP}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}\n\
---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
metadata:\n  name: web-abc12\n  namespace: demo\n  labels: {{kubernetes.io/service-name: web}}\n\
addressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n{endpoints}"
    )
}

/// Runs `ebpf-proxy demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let base = Path::new(BASE_DIR);
    fs::create_dir_all(base).with_context(|| format!("creating {BASE_DIR}"))?;
    let ns = NetNs::create(NAME).context("creating the demo network namespace (needs root and iproute2)")?;
    let mut backends = Vec::new();
    for i in 1..=3 {
        ns.add_lo_addr(&format!("{}/32", backend_ip(i)))?;
        backends.push(HttpBackend::start(&ns, backend_ip(i).into(), 8080, &format!("backend-{i}"))?);
    }
    let cgroup = TestCgroup::create(NAME).context("creating the demo cgroup")?;
    let bpffs = BpfFs::mount_at(&base.join("bpffs")).context("mounting a bpffs for the demo")?;
    let services_file = base.join("services.yaml");
    fs::write(&services_file, services_yaml())?;

    let config = AgentConfig {
        source: agent::SourceConfig::File(services_file.clone()),
        node_name: "demo-node".into(),
        load: LoadOptions {
            pin_dir: bpffs.path().join("ebpf-proxy"),
            cgroup: cgroup.path().to_owned(),
            bpf_log: false,
            services_map_size: proxy_common::map_sizes::SERVICES,
            backends_map_size: proxy_common::map_sizes::BACKENDS,
            maglev_size: crate::reconcile::maglev::DEFAULT_SIZE,
            ct_map_size: proxy_common::map_sizes::CT,
            ct_map_grows: false,
            acceleration: crate::datapath::acceleration::Acceleration::Disabled,
            outside_handover: crate::datapath::handover::OutsideHandover::Off,
            nodeport_mode: crate::datapath::loader::NodePortMode::Snat,
            dsr_dispatch: crate::datapath::loader::DsrDispatch::Option,
            socket_lb: crate::datapath::loader::SocketLb::All,
            cluster_cidrs: Vec::new(),
        },
        socket_netns: vec![ns.path()],
        node_ips: Vec::new(),
        node_port_addresses: crate::node::nodeport_addresses::NodePortAddresses::All,
        external_ips_local_only: false,
        take_over_from_kube_proxy: None,
        // The agent runs in the machine's own network namespace: its
        // sysctls are the operator's.
        node_port_range: None,
        health_bind: None,
        metrics_bind: None,
        health_timeout: Duration::from_mins(1),
        // The demo's clients are on the node: nothing is attached to the
        // machine's own devices.
        devices: crate::node::devices::DeviceSelection::Named(Vec::new()),
        pod_devices: crate::node::pod_devices::PodDeviceSelection::Named(Vec::new()),
        max_service_series: crate::observe::metrics::DEFAULT_MAX_SERVICE_SERIES,
        min_sync_period: agent::DEFAULT_MIN_SYNC_PERIOD,
        audit_interval: None,
        explain_socket: None,
        lb_algorithm: crate::model::LbAlgorithm::Random,
    };
    let (applied_tx, mut applied_rx) = watch::channel(Applied::default());
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let mut agent = tokio::spawn(agent::run(config, applied_tx, async {
        let _ = stop_rx.await;
    }));
    tokio::select! {
        res = &mut agent => {
            res??;
            bail!("the agent stopped before applying the services file");
        }
        res = tokio::time::timeout(Duration::from_secs(15), applied_rx.wait_for(|a| a.generation >= 1)) => {
            if res.context("the agent did not apply the services file within 15 s")?.is_err() {
                // The agent ended (and dropped its sender) first: its error
                // says why.
                agent.await??;
                bail!("the agent stopped before applying the services file");
            }
        }
    }

    let mut outcome = spread_check(&ns, &cgroup, &backends);
    // No `sudo`: the demo runs as root, and a root shell (a container's, a
    // Debian root login) often has no sudo; a user who is not root knows
    // to add it.
    let try_cmd = format!(
        "sh -c 'echo $$ > {}; exec nsenter --net={} curl -s http://{CLUSTER_IP}/'",
        cgroup.procs_file().display(),
        ns.path().display()
    );
    say!(
        "\nTry it yourself, as root (a shell that joins the demo cgroup, then enters the demo namespace):\n\n  {try_cmd}\n"
    );
    if args.check && outcome.is_ok() {
        outcome = try_it(&try_cmd, &backends);
    }
    say!(
        "Edit {} (add or remove an endpoint, change the port) and the agent applies only the difference.",
        services_file.display()
    );
    if !args.check && outcome.is_ok() {
        say!("Press Ctrl-C to stop the demo and remove everything it made.");
        shutdown_signal().await;
    }
    let _ = stop_tx.send(());
    agent.await??;
    drop(backends);
    drop(cgroup);
    drop(bpffs);
    drop(ns);
    let _ = fs::remove_file(&services_file);
    let _ = fs::remove_dir(base);
    say!("Demo removed: namespace, cgroup, bpffs and programs are gone.");
    outcome
}

/// Runs the command the demo prints, as printed, and checks that a backend
/// answered it (`--check`), so the line shown is one that works.
fn try_it(try_cmd: &str, backends: &[HttpBackend]) -> anyhow::Result<()> {
    let out = std::process::Command::new("sh").args(["-c", try_cmd]).output().context("running sh")?;
    let answer = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !backends.iter().any(|b| answer.trim() == b.name()) {
        bail!(
            "the printed command did not reach a backend ({}): {answer}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    say!("The command above answered: {}", answer.trim());
    Ok(())
}

/// Sends `REQUESTS` requests through the ClusterIP with curl, from inside
/// the demo cgroup and namespace, and shows which backend answered each.
fn spread_check(ns: &NetNs, cgroup: &TestCgroup, backends: &[HttpBackend]) -> anyhow::Result<()> {
    let url = format!("http://{CLUSTER_IP}/?[1-{REQUESTS}]");
    let out = spawn_in(ns, Some(cgroup), "curl")?
        .args(["-sS", "--max-time", "5", &url])
        .output()
        .context("running curl (install it with `cargo xtask setup`)")?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    say!("\n{REQUESTS} requests to http://{CLUSTER_IP}/ (service demo/web), one new connection each:");
    for b in backends {
        let n = counts.get(b.name()).copied().unwrap_or(0);
        say!("  {:<10} {:>15}  {:>3} requests {}", b.name(), b.addr().to_string(), n, "#".repeat(n));
    }
    let answered: usize = counts.values().sum();
    if !out.status.success() || answered != REQUESTS {
        bail!("only {answered} of {REQUESTS} requests were answered: {}", String::from_utf8_lossy(&out.stderr));
    }
    if backends.iter().any(|b| counts.get(b.name()).copied().unwrap_or(0) == 0) {
        bail!("a backend got no request: the spread is wrong");
    }
    Ok(())
}
