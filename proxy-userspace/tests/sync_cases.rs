//! The whole sync pipeline, table-driven, without a kernel or root: each
//! file in tests/sync-cases is a case (a txtar-like script, as Cilium tests
//! its load balancer): watch events of real Service, EndpointSlice and Node
//! objects, faults, restarts, and after each step the maps the pipeline
//! wrote, as `ebpf-proxy service list` shows them.
//!
//! A case file is a sequence of sections, each opened by a `-- NAME --`
//! line (lines before the first, and lines starting with `#` in a step,
//! are comments):
//! - `config`: YAML with `node` (this node's name, default `node-a`),
//!   `nodeIPs`, `nodePortAddresses`, `localAddrs` (the node's local
//!   addresses, as its devices hold them);
//! - `addresses`: the node's local addresses are now the YAML list below
//!   (as the agent's netlink subscription reports them): a sync runs when
//!   that changes which addresses serve NodePorts;
//! - `list` / `relist`: the objects below (a YAML stream, as `kubectl get
//!   -o yaml` prints them) as a complete list of every kind; `relist` is
//!   what follows an expired watch (410 Gone); a line `#include PATH` takes
//!   in a file (relative to the case file), such as the captures of a real
//!   API server in tests/fixtures/real-apiserver;
//! - `apply` / `delete`: watch events for the objects below;
//! - `file`: the services file now holds the text below (replaced by
//!   rename, as the README asks) and the agent's own file source reads it
//!   (`source::file_source`): a case that writes one has the file as its
//!   source from then on (no `list`, `apply` or `restart` after);
//! - `fail N`: the Nth write of the next sync fails (as the kernel can);
//! - `capacity N`: every map takes at most N entries from now on;
//! - `restart`: a new agent: it reads the maps back and lists everything;
//! - `upgrade`: a new agent with a new map layout: it fills empty maps;
//! - `retry`: the retry of failed writes comes due (a sync runs);
//! - `tamper`: someone else changes the maps behind the agent's back, in
//!   ways a reader still follows: every backend's port is moved by one, the
//!   first frontend loses its last slot, a stray frontend appears;
//! - `resync`: the periodic full sync comes due (kube-proxy's syncPeriod):
//!   the maps are read back and the whole table compared with them;
//! - `maps`: the expected state: a sync runs first if anything changed, and
//!   the first line is `# writes W, failures F` of the syncs since the last
//!   `maps` (`# no sync` when none ran).
//!
//! `UPDATE_SYNC_CASES=1 cargo test --test sync_cases` rewrites the `maps`
//! sections with what the pipeline did (review the diff!).
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use ebpf_proxy::{
    model::LbAlgorithm,
    node::nodeport_addresses::NodePortAddresses,
    pipeline::{NodeSettings, Pipeline, Wake},
    reconcile::{Reconciler, ServiceMaps as _, fake_maps::FakeMaps, inspect},
    source::{ChangeSource, Delivery, file, file_source::FileSource, store::ObjectStore},
};
use kube::runtime::watcher::Event;

/// A source a test feeds with watch events, or, once a case writes a
/// `file`, the services file source.
#[derive(Default)]
struct TestSource {
    store: ObjectStore,
    /// Objects that did not parse since the last delivery.
    rejected: u64,
    file: Option<FileCase>,
}

/// The services file of a case and the agent's source reading it.
struct FileCase {
    source: FileSource,
    dir: tempfile::TempDir,
    /// The source saw the file change since its last read.
    changed: bool,
}

impl ChangeSource for TestSource {
    fn name(&self) -> &'static str {
        "test"
    }

    async fn changed(&mut self) {
        if !self.store.has_pending() {
            std::future::pending::<()>().await;
        }
    }

    fn snapshot(&mut self) -> Option<Delivery> {
        if let Some(file) = &mut self.file {
            // The file is the source: the empty list the case began with
            // is not delivered.
            let _ = self.store.take();
            file.changed = false;
            return file.source.snapshot();
        }
        let mut delivery = self.store.take();
        delivery.rejected = std::mem::take(&mut self.rejected);
        Some(delivery)
    }

    fn everything(&mut self) -> Option<Delivery> {
        match &mut self.file {
            Some(file) => file.source.everything(),
            None => Some(self.store.everything()),
        }
    }
}

impl TestSource {
    /// Replaces the services file with `text` (by rename) and waits until
    /// the file source sees the change.
    async fn write_file(&mut self, text: &str) -> Result<(), String> {
        if self.file.is_none() {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let source = FileSource::new(dir.path().join("services.yaml"));
            self.file = Some(FileCase { source, dir, changed: false });
        }
        let file = self.file.as_mut().expect("made above");
        let tmp = file.dir.path().join(".services.yaml.tmp");
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, file.dir.path().join("services.yaml")).map_err(|e| e.to_string())?;
        file.source.changed().await;
        file.changed = true;
        Ok(())
    }

    /// Something waits to be delivered.
    fn has_pending(&self) -> bool {
        self.store.has_pending() || self.file.as_ref().is_some_and(|f| f.changed)
    }

    /// A complete list (or relist) of every kind: `objects`.
    fn list(&mut self, objects: file::Parsed) {
        self.rejected += objects.errors.len() as u64;
        let s = &mut self.store;
        s.service_event(Event::Init);
        objects.objects.services.into_iter().for_each(|o| s.service_event(Event::InitApply(o)));
        s.service_event(Event::InitDone);
        s.slice_event(Event::Init);
        objects.objects.slices.into_iter().for_each(|o| s.slice_event(Event::InitApply(o)));
        s.slice_event(Event::InitDone);
        s.node_event(Event::Init);
        objects.objects.nodes.into_iter().for_each(|o| s.node_event(Event::InitApply(o)));
        s.node_event(Event::InitDone);
    }

    fn apply(&mut self, objects: file::Parsed) {
        self.rejected += objects.errors.len() as u64;
        let s = &mut self.store;
        objects.objects.services.into_iter().for_each(|o| s.service_event(Event::Apply(o)));
        objects.objects.slices.into_iter().for_each(|o| s.slice_event(Event::Apply(o)));
        objects.objects.nodes.into_iter().for_each(|o| s.node_event(Event::Apply(o)));
    }

    fn delete(&mut self, objects: file::Parsed) {
        let s = &mut self.store;
        objects.objects.services.into_iter().for_each(|o| s.service_event(Event::Delete(o)));
        objects.objects.slices.into_iter().for_each(|o| s.slice_event(Event::Delete(o)));
        objects.objects.nodes.into_iter().for_each(|o| s.node_event(Event::Delete(o)));
    }
}

/// One section of a case file.
struct Section {
    name: String,
    body: String,
    /// Line number of the `-- NAME --` line (1-based).
    line: usize,
}

/// `body` with each `#include PATH` line replaced by the file's text.
fn expand(body: &str, dir: &Path) -> Result<String, String> {
    let mut out = String::new();
    for line in body.lines() {
        if let Some(path) = line.strip_prefix("#include ") {
            let path = dir.join(path.trim());
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            out.push_str("---\n");
            out.push_str(&text);
            out.push_str("\n---\n");
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(name) = line.strip_prefix("-- ").and_then(|l| l.strip_suffix(" --")) {
            out.push(Section { name: name.trim().to_owned(), body: String::new(), line: i + 1 });
        } else if let Some(section) = out.last_mut() {
            section.body.push_str(line);
            section.body.push('\n');
        }
    }
    out
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CaseConfig {
    node: Option<String>,
    #[serde(default, rename = "nodeIPs")]
    node_ips: Vec<std::net::IpAddr>,
    #[serde(default)]
    node_port_addresses: Vec<String>,
    #[serde(default)]
    local_addrs: Vec<std::net::IpAddr>,
    /// `--external-ips-local-only`.
    #[serde(default)]
    external_ips_local_only: bool,
    /// `--lb-algorithm` (default `random`).
    #[serde(default)]
    lb_algorithm: Option<String>,
}

impl CaseConfig {
    /// The agent's settings this configuration gives.
    fn settings(&self) -> NodeSettings {
        NodeSettings {
            node_name: self.node.clone().unwrap_or_else(|| "node-a".to_owned()),
            node_ips: self.node_ips.clone(),
            node_port_addresses: NodePortAddresses::parse(&self.node_port_addresses).expect("nodePortAddresses"),
            local_addrs: self.local_addrs.clone(),
            external_ips_local_only: self.external_ips_local_only,
            lb_algorithm: self
                .lb_algorithm
                .as_deref()
                .map(|a| LbAlgorithm::parse(a).expect("lbAlgorithm"))
                .unwrap_or_default(),
        }
    }
}

/// The agent of a case: a pipeline over the test source and the maps.
struct Agent {
    settings: NodeSettings,
    source: TestSource,
    pipeline: Pipeline,
    /// Every object as the cluster has it now (for a restart's list).
    cluster: String,
}

impl Agent {
    fn new(settings: NodeSettings, maps: &mut FakeMaps, cluster: String) -> Result<Self, String> {
        let (reconciler, _) = Reconciler::recover(maps).map_err(|e| format!("recover: {e}"))?;
        let mut source = TestSource::default();
        source.list(parse(&cluster)?);
        Ok(Self { pipeline: Pipeline::new(settings.clone(), reconciler), settings, source, cluster })
    }
}

impl Agent {
    /// The node's local addresses are now the YAML list `body`: a sync when
    /// that changes which serve NodePorts.
    async fn addresses(
        &mut self,
        body: &str,
        maps: &mut FakeMaps,
    ) -> Result<Option<ebpf_proxy::pipeline::Synced>, String> {
        let addrs: Vec<std::net::IpAddr> = serde_norway::from_str(body).map_err(|e| e.to_string())?;
        self.settings.local_addrs.clone_from(&addrs);
        if !self.pipeline.set_local_addresses(addrs) {
            return Ok(None);
        }
        let synced = self.pipeline.step(Wake::NodeAddresses, &mut self.source, maps).await;
        synced.map(Some).ok_or_else(|| "nothing to sync".to_owned())
    }
}

fn parse(yaml: &str) -> Result<file::Parsed, String> {
    file::parse(yaml).map_err(|e| format!("not YAML: {e}"))
}

/// The cluster's objects after `apply`/`delete` of `body`, as YAML text
/// (later documents with the same kind/namespace/name win).
fn merge_cluster(cluster: &str, body: &str, delete: bool) -> String {
    let key = |doc: &serde_norway::Value| {
        let meta = &doc["metadata"];
        (
            doc["kind"].as_str().unwrap_or_default().to_owned(),
            meta["namespace"].as_str().unwrap_or("default").to_owned(),
            meta["name"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let docs = |text: &str| -> Vec<serde_norway::Value> {
        serde_norway::Deserializer::from_str(text)
            .filter_map(|d| serde::Deserialize::deserialize(d).ok())
            .filter(|v: &serde_norway::Value| !v.is_null())
            .collect()
    };
    let changes = docs(body);
    let mut all: Vec<serde_norway::Value> =
        docs(cluster).into_iter().filter(|d| !changes.iter().any(|c| key(c) == key(d))).collect();
    if !delete {
        all.extend(changes);
    }
    let mut out = String::new();
    for d in &all {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(d).expect("YAML"));
    }
    out
}

/// A case whose source is a `file` takes no watch events or restarts.
fn only_one_source(verb: &str, agent: Option<&Agent>) -> Result<(), String> {
    let events = matches!(verb, "list" | "relist" | "apply" | "delete" | "restart" | "upgrade");
    if events && agent.is_some_and(|a| a.source.file.is_some()) {
        return Err(format!("`{verb}` after a `file`: the file is the case's source"));
    }
    Ok(())
}

/// A `file` section: the services file now holds `text`. The agent is made
/// at the first one, on an empty list (which the file source replaces).
fn write_file(
    agent: &mut Option<Agent>,
    settings: NodeSettings,
    maps: &mut FakeMaps,
    runtime: &tokio::runtime::Runtime,
    text: &str,
) -> Result<(), String> {
    if agent.is_none() {
        *agent = Some(Agent::new(settings, maps, String::new())?);
    }
    let agent = agent.as_mut().expect("made above");
    runtime.block_on(agent.source.write_file(text))
}

fn run_case(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let sections = sections(&text);
    let mut config = CaseConfig::default();
    let mut maps = FakeMaps::default();
    let mut agent: Option<Agent> = None;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let mut actual_maps: Vec<(usize, String)> = Vec::new();
    let mut mismatches = String::new();
    // Writes and failures of the syncs since the last `maps`.
    let mut synced: Option<(usize, usize)> = None;
    let count = |synced: &mut Option<(usize, usize)>, s: &ebpf_proxy::pipeline::Synced| {
        let (w, f) = synced.get_or_insert((0, 0));
        *w += s.report.writes;
        *f += s.report.failures.len();
    };
    let dir = path.parent().expect("a case file's folder");
    for section in &sections {
        let at = |e: String| format!("{}:{}: {e}", path.display(), section.line);
        let body = expand(&section.body, dir).map_err(at)?;
        let mut words = section.name.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let number = || -> Result<usize, String> {
            words.clone().next().and_then(|n| n.parse().ok()).ok_or_else(|| at(format!("`{verb} N` needs a number")))
        };
        let settings = || config.settings();
        only_one_source(verb, agent.as_ref()).map_err(at)?;
        match verb {
            "config" => config = serde_norway::from_str(&section.body).map_err(|e| at(e.to_string()))?,
            "list" | "relist" if agent.is_none() => {
                agent = Some(Agent::new(settings(), &mut maps, body).map_err(at)?);
            }
            "list" | "relist" => {
                let a = agent.as_mut().expect("checked");
                a.source.list(parse(&body).map_err(at)?);
                a.cluster = body;
            }
            "apply" | "delete" => {
                let a = agent.as_mut().ok_or_else(|| at("no `list` before".into()))?;
                a.cluster = merge_cluster(&a.cluster, &body, verb == "delete");
                let objects = parse(&body).map_err(at)?;
                if verb == "apply" { a.source.apply(objects) } else { a.source.delete(objects) }
            }
            "file" => write_file(&mut agent, settings(), &mut maps, &runtime, &body).map_err(at)?,
            "fail" => maps.fail_at = Some(maps.ops + number()? - 1),
            "capacity" => maps.capacity = Some(number()?),
            "restart" | "upgrade" => {
                let a = agent.take().ok_or_else(|| at("no `list` before".into()))?;
                if verb == "upgrade" {
                    maps = FakeMaps { capacity: maps.capacity, ..FakeMaps::default() };
                }
                agent = Some(Agent::new(a.settings, &mut maps, a.cluster).map_err(at)?);
            }
            "retry" | "resync" => {
                let a = agent.as_mut().ok_or_else(|| at("no `list` before".into()))?;
                let wake = if verb == "retry" { Wake::Retry } else { Wake::Resync };
                let s = runtime.block_on(a.pipeline.step(wake, &mut a.source, &mut maps));
                count(&mut synced, &s.ok_or_else(|| at("nothing to sync".into()))?);
            }
            "addresses" => {
                let a = agent.as_mut().ok_or_else(|| at("no `list` before".into()))?;
                if let Some(s) = runtime.block_on(a.addresses(&body, &mut maps)).map_err(at)? {
                    count(&mut synced, &s);
                }
            }
            "tamper" => tamper(&mut maps),
            "maps" => {
                let a = agent.as_mut().ok_or_else(|| at("no `list` before".into()))?;
                if a.source.has_pending()
                    && let Some(s) = runtime.block_on(a.pipeline.step(Wake::Changed, &mut a.source, &mut maps))
                {
                    count(&mut synced, &s);
                }
                let actual = render(synced.take(), &maps, a).map_err(at)?;
                let expected = normalized(&section.body);
                if expected.trim_end() != actual.trim_end() {
                    let _ = write!(
                        mismatches,
                        "{}:{}: maps differ\n--- expected\n{expected}--- actual\n{actual}",
                        path.display(),
                        section.line
                    );
                }
                actual_maps.push((section.line, actual));
            }
            other => return Err(at(format!("unknown section `{other}`"))),
        }
    }
    if std::env::var_os("UPDATE_SYNC_CASES").is_some() {
        rewrite(path, &text, &actual_maps).map_err(|e| e.to_string())?;
        return Ok(());
    }
    if actual_maps.is_empty() {
        return Err(format!("{}: no `maps` section: the case checks nothing", path.display()));
    }
    if mismatches.is_empty() { Ok(()) } else { Err(mismatches) }
}

/// Changes `maps` as someone other than the agent might, keeping them
/// readable (a slot 0 never counts a missing slot).
fn tamper(maps: &mut FakeMaps) {
    use ebpf_proxy::{
        model::{FrontendKey, Protocol},
        reconcile::codec,
    };
    use proxy_common::{ServiceKey, ServiceValue};
    for backend in maps.state.backends.values_mut() {
        let mut entry = codec::backend_entry(backend).expect("the agent writes known backends");
        entry.addr.port += 1;
        *backend = codec::backend_value(entry);
    }
    if let Some((key, slot_zero)) = maps.state.services.iter_mut().find(|(k, v)| k.slot == 0 && v.count > 0) {
        let last = ServiceKey { slot: slot_zero.count, ..*key };
        slot_zero.count -= 1;
        maps.state.services.remove(&last);
    }
    let stray = FrontendKey::new("10.96.9.9".parse().expect("an IP"), 80, Protocol::Tcp);
    maps.state.services.insert(codec::service_key(stray, 0), ServiceValue { rev_nat: 999, ..ServiceValue::default() });
    maps.state.rev_nat.insert(999, codec::rev_nat_value(stray));
}

/// What a `maps` section expects: the writes and failures of the syncs
/// since the last one, the maps as `ebpf-proxy service list` shows them,
/// the entries of each map, and the pipeline's counts of bad input.
fn render(synced: Option<(usize, usize)>, maps: &FakeMaps, agent: &Agent) -> Result<String, String> {
    let mut out = String::new();
    match synced {
        Some((writes, failures)) => {
            let _ = writeln!(out, "# writes {writes}, failures {failures}");
        }
        None => out.push_str("# no sync\n"),
    }
    let dump = maps.dump().map_err(|e| e.to_string())?;
    out.push_str(&inspect::table(&inspect::frontends(&dump)));
    let _ = writeln!(
        out,
        "entries: services {} backends {} rev-nat {} maglev {} source-ranges {} names {}",
        dump.services.len(),
        dump.backends.len(),
        dump.rev_nat.len(),
        dump.maglev.len(),
        dump.source_ranges.len(),
        dump.names.len()
    );
    let stats = agent.pipeline.stats();
    if stats.objects_rejected + stats.problems > 0 {
        let _ = writeln!(out, "rejected objects {}, problems {}", stats.objects_rejected, stats.problems);
    }
    Ok(normalized(&out))
}

/// `text` without trailing blanks on its lines.
fn normalized(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Writes `actual` in place of the `maps` sections (by their line).
fn rewrite(path: &Path, text: &str, actual: &[(usize, String)]) -> std::io::Result<()> {
    let mut out = String::new();
    let mut skipping = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("-- ") && line.ends_with(" --") {
            skipping = false;
            out.push_str(line);
            out.push('\n');
            if let Some((_, body)) = actual.iter().find(|(l, _)| *l == i + 1) {
                out.push_str(body);
                skipping = true;
            }
        } else if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    std::fs::write(path, out)
}

/// `n` one-port services (10.97.x.y), each with one endpoint: 2 `SERVICES`
/// entries each (slot 0 and the backend's slot).
fn many_services(n: u16) -> String {
    let mut yaml = String::new();
    for i in 0..n {
        let ip = format!("10.97.{}.{}", i / 250, i % 250 + 1);
        let _ = write!(
            yaml,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: ns}}\n\
             spec: {{clusterIP: {ip}, clusterIPs: [{ip}], ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: s{i}-a, namespace: ns, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
             endpoints: [{{addresses: [10.244.{}.{}], conditions: {{ready: true}}}}]\n",
            i / 250,
            i % 250 + 1
        );
    }
    yaml
}

/// A start with more entries than the smallest maps hold (4,200 `SERVICES`
/// entries; a fresh start's maps hold `sizing::MIN_SIZE`, 4,096): the agent
/// sizes its maps from the translated table before the first write
/// (`resize::before_first_write_sizes`, as `agent::run_with` does), so not
/// one write is refused. Without that step, the same write is refused.
fn start_sized_before_first_write() -> Result<(), String> {
    let min = ebpf_proxy::reconcile::sizing::MIN_SIZE;
    let bounds = ebpf_proxy::reconcile::sizing::DEFAULT_BOUNDS;
    let cluster = many_services(2100);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let fresh = || FakeMaps { capacity: Some(min as usize), ..FakeMaps::default() };
    let current = ebpf_proxy::reconcile::sizing::Sizes { services: min, backends: min, frontends: min };

    // Unsized, the first write fills the small maps and is refused.
    let mut small = fresh();
    let mut agent = Agent::new(NodeSettings::default(), &mut small, cluster.clone())?;
    let unsized_ = runtime.block_on(agent.pipeline.step(Wake::Changed, &mut agent.source, &mut small));
    let refused = unsized_.ok_or("nothing to sync")?.report.failures.len();
    if refused == 0 {
        return Err("4,200 entries fit 4,096-entry maps: the case checks nothing".into());
    }

    let mut maps = fresh();
    let mut agent = Agent::new(NodeSettings::default(), &mut maps, cluster)?;
    let pipeline = &mut agent.pipeline;
    let translated =
        runtime.block_on(pipeline.translate(Wake::Changed, &mut agent.source, &mut maps)).ok_or("nothing to sync")?;
    if !translated.whole_table() {
        return Err("a start compares the whole table".into());
    }
    let (next, demand) = ebpf_proxy::agent::resize::before_first_write_sizes(pipeline, current, bounds);
    let next = next.ok_or("the start stays in maps too small for it")?;
    if demand.backends != 2100 {
        return Err(format!("counted {} distinct backends, not 2,100", demand.backends));
    }
    // 4,200 entries, twice that rounded up; 2,100 backends fit 4,096.
    if next.services != 16_384 || next.backends != min {
        return Err(format!("planned {next:?}"));
    }
    let mut sized = FakeMaps { capacity: Some(next.services as usize), ..FakeMaps::default() };
    let (reconciler, _) = Reconciler::recover(&mut sized).map_err(|e| format!("recover: {e}"))?;
    pipeline.write_through(reconciler);
    pipeline.reserve_backends(demand.backends);
    let synced = pipeline.write(translated, &mut sized);
    if !synced.report.failures.is_empty() || pipeline.reconciler().frontend_count() != 2100 {
        return Err(format!(
            "{} writes refused, {} frontends written",
            synced.report.failures.len(),
            pipeline.reconciler().frontend_count()
        ));
    }
    if maps.ops != 0 {
        return Err(format!("{} operations on the small maps: the first write went to the sized ones only", maps.ops));
    }
    Ok(())
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sync-cases");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/sync-cases")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    paths.sort();
    let trials = paths
        .into_iter()
        .map(|path| {
            let name = path.file_stem().expect("a file name").to_string_lossy().into_owned();
            libtest_mimic::Trial::test(name, move || run_case(&path).map_err(Into::into))
        })
        .chain([libtest_mimic::Trial::test(
            "a-start-too-big-for-the-smallest-maps-is-sized-before-its-first-write",
            || start_sized_before_first_write().map_err(Into::into),
        )])
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
