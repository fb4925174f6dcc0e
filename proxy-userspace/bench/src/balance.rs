//! Balancing by load: one service of three backends, one of which answers
//! ten times slower, and clients that open a new connection per request
//! (connect, 32 bytes each way, close; the whole request timed), through
//! ebpf-proxy with `lb-algorithm: random`, with `least-connections`, and
//! through kube-proxy's iptables mode (on iptables-nft). Then the same with
//! three equal backends that answer at once: what the choice costs a new
//! connection (rate and connect latency, random against least-connections).
//!
//! A backend serves `WORKERS` requests at a time, each taking its service
//! time (`FAST`, or ten times that for the slow one); the others wait their
//! turn, as in a server with a fixed pool of workers. So a slow backend
//! that keeps getting its share of connections builds a queue, and its
//! clients' latency is the queue's, which is what least-connections avoids.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use proxy_testkit::{BpfFs, NetNs, TestCgroup, unique_name};
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{
    Settings,
    datapath::{interleave, load_in, load_within_limit, write_targets},
    load::{LoadResult, Mode},
    net::{BenchNet, Variant},
    rules::chain_hash,
    spec::{BACKEND_PORT, SERVICE_PORT, endpoint, vip},
};

/// Backends of the service.
const BACKENDS: u8 = 3;
/// A fast backend's time per request.
const FAST: Duration = Duration::from_millis(2);
/// How much slower the slow backend is.
const SLOWER: u32 = 10;
/// Requests a backend serves at once.
const WORKERS: usize = 4;
/// Client threads of the slow case, each a request at a time: enough that
/// a slow backend given its share of them builds a queue (with two, one
/// request at a time waits there and no queue forms).
const CLIENTS: usize = 16;

/// One way of reaching the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Way {
    Random,
    LeastConnections,
    Iptables,
}

impl Way {
    const ALL: [Self; 3] = [Self::Random, Self::LeastConnections, Self::Iptables];

    const fn name(self) -> &'static str {
        match self {
            Self::Random => "ebpf-proxy random",
            Self::LeastConnections => "ebpf-proxy least-connections",
            Self::Iptables => "kube-proxy iptables (nft)",
        }
    }

    /// The service (its index in the address plan) this way reaches.
    const fn service(self) -> u32 {
        match self {
            Self::LeastConnections => 1,
            Self::Random | Self::Iptables => 0,
        }
    }
}

/// One way's numbers in one case.
#[derive(Clone, Debug, Serialize)]
pub struct BalanceRow {
    /// `slow backend` or `equal backends`.
    pub case: &'static str,
    pub way: &'static str,
    pub requests_per_second: f64,
    /// Over `ebpf-proxy random`'s rate in the same case.
    pub ratio: f64,
    /// Median over rounds, microseconds: the whole request (slow backend)
    /// or the connect (equal backends).
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

/// Each backend's time per request, microseconds (0: answers at once),
/// changed between cases.
type Delays = Arc<[AtomicU64; BACKENDS as usize]>;

/// Runs both cases; the rows of the report.
pub fn run(settings: &Settings) -> anyhow::Result<Vec<BalanceRow>> {
    let net = BenchNet::new(&[Variant::Ebpf, Variant::IptablesNft]).context("making the bench namespaces")?;
    let delays: Delays = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
    let _servers = start_servers(&net.backends[..usize::from(BACKENDS)], &delays).context("starting the backends")?;
    let dir = tempfile::tempdir()?;
    let targets: BTreeMap<Way, std::path::PathBuf> = Way::ALL
        .iter()
        .map(|w| {
            let path = dir.path().join(format!("{}.txt", w.service()));
            write_targets(&path, std::iter::once(format!("{}:{SERVICE_PORT}", vip(w.service())))).map(|()| (*w, path))
        })
        .collect::<Result<_, _>>()?;

    let rules = dir.path().join("iptables.rules");
    std::fs::write(&rules, iptables_rules())?;
    load_within_limit(
        settings,
        net.client(Variant::IptablesNft),
        ["iptables-nft-restore", "iptables"],
        &[],
        &rules,
        1,
    )?
    .map_err(anyhow::Error::msg)?;

    let cgroup = TestCgroup::create(&unique_name("ebpf-proxy-bench"))?;
    let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-bench"))?;
    let services = dir.path().join("services.yaml");
    std::fs::write(&services, services_yaml())?;
    let agent = settings.start_agent(
        ["--services-file", &services.display().to_string()],
        cgroup.path(),
        bpffs.path(),
        "warn,ebpf_proxy::agent=info",
    )?;
    super::control::first_applied(&agent, "ebpf-proxy")?;

    let run = |way: Way, mode: Mode, seconds: f64| -> anyhow::Result<LoadResult> {
        let (ns, cgroup) = match way {
            Way::Iptables => (net.client(Variant::IptablesNft), None),
            Way::Random | Way::LeastConnections => (net.client(Variant::Ebpf), Some(&cgroup)),
        };
        let threads = if mode == Mode::Request { CLIENTS } else { settings.threads };
        load_in(ns, cgroup, &targets[&way], mode, seconds, threads)
            .with_context(|| format!("the load client of {}", way.name()))
    };
    let mut rows = Vec::new();
    // The slow case: backend 0 ten times slower than the others.
    let fast = u64::try_from(FAST.as_micros()).expect("small");
    delays[0].store(fast * u64::from(SLOWER), Ordering::Relaxed);
    delays[1].store(fast, Ordering::Relaxed);
    delays[2].store(fast, Ordering::Relaxed);
    for way in Way::ALL {
        run(way, Mode::Request, settings.seconds.min(0.5))?; // warm-up
    }
    let results = interleave(u32::from(BACKENDS), settings, &Way::ALL, &[Mode::Request], Way::name, run)?;
    rows.extend(rows_of("slow backend", &results));
    // Equal backends that answer at once: the cost of the choice.
    for d in delays.iter() {
        d.store(0, Ordering::Relaxed);
    }
    let results = interleave(u32::from(BACKENDS), settings, &Way::ALL, &[Mode::Short], Way::name, run)?;
    rows.extend(rows_of("equal backends", &results));
    drop(agent);
    Ok(rows)
}

fn rows_of(case: &'static str, results: &BTreeMap<(Mode, Way), Vec<LoadResult>>) -> Vec<BalanceRow> {
    let rate = |runs: &[LoadResult]| {
        let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
        #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let ops = runs.iter().map(|r| r.ops).sum::<u64>() as f64;
        if seconds > 0.0 { ops / seconds } else { 0.0 }
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let base = results.iter().find(|((_, w), _)| *w == Way::Random).map_or(0.0, |(_, r)| rate(r));
    results
        .iter()
        .map(|((_, way), runs)| BalanceRow {
            case,
            way: way.name(),
            requests_per_second: rate(runs),
            ratio: if base > 0.0 { rate(runs) / base } else { 0.0 },
            p50_us: median(runs.iter().map(|r| r.p50_us).collect()),
            p99_us: median(runs.iter().map(|r| r.p99_us).collect()),
            errors: runs.iter().map(|r| r.errors).sum(),
        })
        .collect()
}

/// The two services: `random` at service 0's address, `least-connections`
/// at service 1's, each with endpoint `i` of its own in backend `i`.
fn services_yaml() -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (s, algorithm) in [(0, "random"), (1, "least-connections")] {
        let name = format!("svc{s}");
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bench, annotations: {{ebpf-proxy.io/lb-algorithm: {algorithm}}}}}\nspec:\n  clusterIP: {}\n  ports: [{{name: http, port: {SERVICE_PORT}, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: bench, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_PORT}, protocol: TCP}}]\nendpoints:\n",
            vip(s)
        );
        for i in 0..BACKENDS {
            let _ = writeln!(out, "- {{addresses: [\"{}\"], conditions: {{ready: true}}}}", endpoint(s, i));
        }
    }
    out
}

/// kube-proxy's iptables rules for service 0 (`rules::iptables`, with
/// `BACKENDS` endpoints): `statistic --mode random` with probabilities
/// 1/3, 1/2, then the last.
fn iptables_rules() -> String {
    use std::fmt::Write as _;
    let port_name = "bench/svc0:http";
    let svc = format!("KUBE-SVC-{}", chain_hash(port_name));
    let mut chains = format!(":KUBE-SERVICES - [0:0]\n:{svc} - [0:0]\n");
    let mut rules = String::from("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    let _ = writeln!(rules, "-A KUBE-SERVICES -d {}/32 -p tcp -m tcp --dport {SERVICE_PORT} -j {svc}", vip(0));
    for i in 0..BACKENDS {
        let sep = format!("KUBE-SEP-{}", chain_hash(&format!("{port_name}{i}")));
        let _ = writeln!(chains, ":{sep} - [0:0]");
        let left = BACKENDS - i;
        let statistic = if left > 1 {
            format!("-m statistic --mode random --probability {:.10} ", 1.0 / f64::from(left))
        } else {
            String::new()
        };
        let _ = writeln!(rules, "-A {svc} {statistic}-j {sep}");
        let _ = writeln!(rules, "-A {sep} -p tcp -m tcp -j DNAT --to-destination {}:{BACKEND_PORT}", endpoint(0, i));
    }
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{chains}{rules}COMMIT\n"
    )
}

/// The backends: in backend namespace `i`, a listener whose connections
/// each read 32 bytes, wait for one of `WORKERS` workers, hold it for the
/// backend's delay, and echo.
fn start_servers(backends: &[NetNs], delays: &Delays) -> std::io::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    for (i, ns) in backends.iter().enumerate() {
        let addr = SocketAddr::from(([0, 0, 0, 0], BACKEND_PORT));
        let listener = ns.run_inside(move || {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(l)
        })??;
        let listener = {
            let _guard = rt.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let workers = Arc::new(tokio::sync::Semaphore::new(WORKERS));
        let delays = delays.clone();
        rt.spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { continue };
                let (workers, delays) = (workers.clone(), delays.clone());
                tokio::spawn(async move {
                    let mut buf = [0u8; 32];
                    while stream.read_exact(&mut buf).await.is_ok() {
                        let delay = delays[i].load(Ordering::Relaxed);
                        if delay > 0 {
                            let Ok(_worker) = workers.acquire().await else { return };
                            tokio::time::sleep(Duration::from_micros(delay)).await;
                        }
                        if stream.write_all(&buf).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    Ok(rt)
}

/// The markdown of `rows`.
pub fn markdown(out: &mut String, rows: &[BalanceRow]) {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return;
    }
    let fast = FAST.as_millis();
    let _ = writeln!(
        out,
        "Balancing by load: one service of {BACKENDS} backends, each serving {WORKERS} requests at a time; a new connection per request. `slow backend`: one takes {} ms a request, the others {fast} ms, {CLIENTS} client threads (the whole request timed); `equal backends`: all answer at once (the connect timed). Requests/s, ratio to ebpf-proxy random, latency p50/p99:\n",
        fast * u128::from(SLOWER)
    );
    let _ =
        writeln!(out, "| case | way | requests/s | ratio | p50 | p99 | errors |\n|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.2} | {:.0} us | {:.0} us | {} |",
            r.case, r.way, r.requests_per_second, r.ratio, r.p50_us, r.p99_us, r.errors
        );
    }
    out.push('\n');
}
