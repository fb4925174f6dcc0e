//! The Kubernetes API as a source: reflectors over `v1/Service` and
//! `discovery.k8s.io/v1/EndpointSlice` cluster-wide (never the legacy
//! Endpoints). kube-runtime's watcher lists, watches, re-lists after a 410
//! and reconnects with backoff; its store swaps a re-list in atomically, so
//! a reconnect never shows an empty cluster. While the API server is away
//! the stores keep the last state, and so does the datapath.
//!
//! The watch events say which services changed; a snapshot reads only
//! those from the stores (all of them after a relist).
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use futures::{Stream, StreamExt as _};
use k8s_openapi::{api::core::v1::NodeStatus, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use k8s_openapi::{
    api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt as _,
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use tokio::{sync::Notify, task::JoinHandle};
use tracing::{debug, info, warn};

use super::{
    Changed, Snapshot,
    tracker::{Pending, SliceId, SliceIndex, slice_id},
};
use crate::model::{ServiceId, ZONE_LABEL};

/// Annotation the EndpointSlice controller sets to when the change that
/// made this version of the slice happened.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Watch errors since start (each is retried with backoff).
#[derive(Debug, Default)]
pub struct WatchCounters {
    pub errors: AtomicU64,
    pub events: AtomicU64,
}

pub struct KubeSource {
    services: reflector::Store<Service>,
    slices: reflector::Store<EndpointSlice>,
    /// This node's Node object (its zone label).
    node: reflector::Store<Node>,
    changed: Arc<Notify>,
    /// What the events since the last snapshot touched.
    pending: Arc<Mutex<Pending>>,
    /// The slices of each service.
    index: SliceIndex,
    pub counters: Arc<WatchCounters>,
    /// resourceVersion of each slice at the last snapshot, to find the
    /// slices that changed since.
    seen_slices: HashMap<SliceId, String>,
    tasks: Vec<JoinHandle<()>>,
}

impl KubeSource {
    /// Starts the reflectors: all Services and EndpointSlices, and the Node
    /// named `node_name`.
    #[must_use]
    pub fn start(client: &Client, node_name: &str) -> Self {
        let changed = Arc::new(Notify::new());
        let counters = Arc::new(WatchCounters::default());
        let (services, svc_writer) = reflector::store::<Service>();
        let (slices, eps_writer) = reflector::store::<EndpointSlice>();
        let svc_stream = watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
            .modify(slim_service)
            .default_backoff()
            .reflect(svc_writer);
        let eps_stream = watcher(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default())
            .modify(slim_slice)
            .default_backoff()
            .reflect(eps_writer);
        let (node, node_writer) = reflector::store::<Node>();
        let node_config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
        let node_stream = watcher(Api::<Node>::all(client.clone()), node_config)
            .modify(slim_node)
            .default_backoff()
            .reflect(node_writer);
        let pending = Arc::new(Mutex::new(Pending::everything()));
        let tasks = vec![
            tokio::spawn(drive(svc_stream, "Service", noter(&pending, &changed, Pending::service), counters.clone())),
            tokio::spawn(drive(
                eps_stream,
                "EndpointSlice",
                noter(&pending, &changed, Pending::slice),
                counters.clone(),
            )),
            tokio::spawn(drive(
                node_stream,
                "Node",
                noter(&pending, &changed, |p, _: &Node| p.node = true),
                counters.clone(),
            )),
        ];
        Self {
            services,
            slices,
            node,
            changed,
            pending,
            index: SliceIndex::default(),
            counters,
            seen_slices: HashMap::new(),
            tasks,
        }
    }

    /// Resolves once both initial lists are complete.
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        self.services.wait_until_ready().await?;
        self.slices.wait_until_ready().await?;
        self.node.wait_until_ready().await?;
        info!(services = self.services.state().len(), slices = self.slices.state().len(), "initial lists complete");
        Ok(())
    }

    /// Resolves when something changed since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Drops a pending change notice (its change is in the next snapshot).
    pub fn absorb_pending(&self) {
        let _ = futures::FutureExt::now_or_never(self.changed.notified());
    }

    /// What changed since the last snapshot (everything, the first time
    /// and after a relist), and the trigger times of the slice versions
    /// that are new since.
    pub fn snapshot(&mut self) -> (Snapshot, Vec<SystemTime>) {
        let pending = std::mem::take(&mut *self.pending.lock().expect("pending lock"));
        if pending.full {
            return self.everything();
        }
        let mut triggers = Vec::new();
        let mut services = pending.services;
        for id in pending.slices {
            let now = self.slices.get(&object_ref(&id));
            self.note_version(&id, now.as_deref(), &mut triggers);
            self.index.set(id, now.as_deref(), &mut services);
        }
        let changed = services.into_iter().map(|id| self.service(id)).collect();
        let nodes = pending.node.then(|| self.node.state());
        (Snapshot::Changed { services: changed, nodes }, triggers)
    }

    /// Everything the stores hold, the index rebuilt.
    pub fn everything(&mut self) -> (Snapshot, Vec<SystemTime>) {
        let services = self.services.state();
        let slices = self.slices.state();
        self.index.rebuild(slices.iter().map(|s| &**s));
        let mut triggers = Vec::new();
        let before = std::mem::take(&mut self.seen_slices);
        for slice in &slices {
            let id = slice_id(slice);
            if let Some(version) = before.get(&id) {
                self.seen_slices.insert(id.clone(), version.clone());
            }
            self.note_version(&id, Some(slice), &mut triggers);
        }
        (Snapshot::Full { services, slices, nodes: self.node.state() }, triggers)
    }

    /// One service's objects as the stores hold them now.
    fn service(&self, id: ServiceId) -> Changed {
        let service = self.services.get(&object_ref(&id));
        let slices = self.index.slices_of(&id).filter_map(|s| self.slices.get(&object_ref(s))).collect();
        Changed { id, service, slices }
    }

    /// Remembers the version of slice `id` now, adding the trigger time of
    /// a version not seen before.
    fn note_version(&mut self, id: &SliceId, now: Option<&EndpointSlice>, triggers: &mut Vec<SystemTime>) {
        let Some(slice) = now else {
            self.seen_slices.remove(id);
            return;
        };
        let version = slice.resource_version().unwrap_or_default();
        if self.seen_slices.get(id) != Some(&version) {
            if let Some(at) = slice.annotations().get(TRIGGER_TIME_ANNOTATION).and_then(|t| parse_time(t)) {
                triggers.push(at);
            }
            self.seen_slices.insert(id.clone(), version);
        }
    }
}

/// What a watch does with its events: records in `pending` what they
/// touched (`record`), or that a relist is complete, and wakes the agent.
fn noter<K: 'static>(
    pending: &Arc<Mutex<Pending>>,
    changed: &Arc<Notify>,
    record: fn(&mut Pending, &K),
) -> impl FnMut(Option<&K>) + Send + 'static {
    let (pending, changed) = (pending.clone(), changed.clone());
    move |obj| {
        let mut p = pending.lock().expect("pending lock");
        match obj {
            Some(obj) => record(&mut p, obj),
            None => p.full = true,
        }
        drop(p);
        changed.notify_one();
    }
}

/// The store key of the object `namespace/name`.
fn object_ref<K>(id: &(String, String)) -> reflector::ObjectRef<K>
where
    K: Resource<DynamicType = ()>,
{
    reflector::ObjectRef::new(&id.1).within(&id.0)
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn parse_time(text: &str) -> Option<SystemTime> {
    text.parse::<Timestamp>().ok().map(SystemTime::from)
}

// The stores keep only what the model reads: at 10,000 services the
// objects as the API sends them are most of the agent's memory. A field the
// model starts to read must be kept here too.

/// Metadata the model never reads: managed fields, owner references, and
/// every annotation but `keep`.
fn slim_meta(meta: &mut ObjectMeta, keep: Option<&str>) {
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| Some(k.as_str()) == keep);
    }
}

fn slim_service(svc: &mut Service) {
    slim_meta(&mut svc.metadata, None);
    if let Some(status) = svc.status.as_mut() {
        status.conditions = None;
    }
}

/// A slice keeps its endpoints' addresses, conditions, node, zone and
/// hints; not the pods they point at.
fn slim_slice(slice: &mut EndpointSlice) {
    slim_meta(&mut slice.metadata, Some(TRIGGER_TIME_ANNOTATION));
    for endpoint in slice.endpoints.iter_mut().flatten() {
        endpoint.target_ref = None;
        endpoint.deprecated_topology = None;
        endpoint.hostname = None;
    }
}

/// The node keeps its zone label and its addresses: not its images,
/// conditions and the rest of its status.
fn slim_node(node: &mut Node) {
    slim_meta(&mut node.metadata, None);
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.retain(|k, _| k == ZONE_LABEL);
    }
    node.spec = None;
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus { addresses: status.addresses.take(), ..NodeStatus::default() };
    }
}

/// Follows one watch: `note(Some(obj))` for each object applied or
/// deleted, `note(None)` when a (re-)list is complete.
async fn drive<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    kind: &'static str,
    mut note: impl FnMut(Option<&K>),
    counters: Arc<WatchCounters>,
) {
    let mut stream = std::pin::pin!(stream);
    let mut failing = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if failing {
                    info!(kind, "watch is back");
                    failing = false;
                }
                counters.events.fetch_add(1, Ordering::Relaxed);
                match event {
                    watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => note(Some(&obj)),
                    watcher::Event::InitDone => note(None),
                    watcher::Event::Init => debug!(kind, "(re-)listing"),
                    watcher::Event::InitApply(_) => {}
                }
            }
            Err(err) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                if failing {
                    debug!(kind, %err, "watch still failing");
                } else {
                    warn!(kind, %err, "watch failed; retrying with backoff, the datapath keeps the last applied state");
                    failing = true;
                }
            }
        }
    }
}

/// Publishes a Normal event on this node's Node object, as kube-proxy
/// records its start; a failure is logged, never fatal.
pub fn announce(client: &Client, node_name: &str, reason: &str, note: String) {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let recorder = Recorder::new(
        client.clone(),
        Reporter { controller: "ebpf-proxy".into(), instance: Some(node_name.to_owned()) },
    );
    let regarding = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.to_owned()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: reason.to_owned(),
        note: Some(note),
        action: reason.to_owned(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(err) = recorder.publish(&event, &regarding).await {
            warn!(%err, "cannot publish the node event (check the ClusterRole's events permission)");
        }
    });
}

/// A client from `--kubeconfig` when given, else the usual inference
/// (in-cluster service account, else `KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    use anyhow::Context as _;
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration: not in a pod, no KUBECONFIG and no ~/.kube/config; \
             pass --kubeconfig, or --services-file to run without a cluster",
        )?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}
