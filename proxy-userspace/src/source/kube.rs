//! The Kubernetes API as a source: watches over `v1/Service` and
//! `discovery.k8s.io/v1/EndpointSlice` cluster-wide (never the legacy
//! Endpoints), and this node's Node. kube-runtime's watcher lists, watches,
//! re-lists after a 410 and reconnects with backoff; the stores (a
//! reflector's for Services and the Node, `SliceStore` for the slices) swap
//! a re-list in atomically, so a reconnect never shows an empty cluster.
//! While the API server is away the stores keep the last state, and so
//! does the datapath.
//!
//! The watch events say which services changed; a snapshot reads only
//! those from the stores (all of them after a relist).
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

pub use super::bootstrap::{ApiEndpoint, Origin};
use super::{
    Changed, Snapshot,
    slice_store::SliceStore,
    slim::{slim_node, slim_service},
    tracker::{Pending, SliceIndex},
};
use crate::model::ServiceId;

/// Watch errors since start (each is retried with backoff).
#[derive(Debug, Default)]
pub struct WatchCounters {
    pub errors: AtomicU64,
    pub events: AtomicU64,
}

/// What the watch tasks write and a snapshot reads.
#[derive(Debug, Default)]
struct Watched {
    /// What the events since the last snapshot touched.
    pending: Pending,
    slices: SliceStore,
}

pub struct KubeSource {
    services: reflector::Store<Service>,
    /// This node's Node object (its zone label).
    node: reflector::Store<Node>,
    watched: Arc<Mutex<Watched>>,
    slices_listed: watch::Receiver<bool>,
    changed: Arc<Notify>,
    /// The slices of each service.
    index: SliceIndex,
    pub counters: Arc<WatchCounters>,
    tasks: Vec<JoinHandle<()>>,
}

impl KubeSource {
    /// Starts the watches: all Services and EndpointSlices, and the Node
    /// named `node_name`.
    #[must_use]
    pub fn start(client: &Client, node_name: &str) -> Self {
        let changed = Arc::new(Notify::new());
        let counters = Arc::new(WatchCounters::default());
        let watched = Arc::new(Mutex::new(Watched { pending: Pending::everything(), ..Watched::default() }));
        let (services, svc_writer) = reflector::store::<Service>();
        let svc_stream = watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
            .modify(slim_service)
            .default_backoff()
            .reflect(svc_writer);
        let eps_stream =
            watcher(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default()).default_backoff();
        let (node, node_writer) = reflector::store::<Node>();
        let node_config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
        let node_stream = watcher(Api::<Node>::all(client.clone()), node_config)
            .modify(slim_node)
            .default_backoff()
            .reflect(node_writer);
        let (listed_tx, slices_listed) = watch::channel(false);
        let on_service = recorder(&watched, &changed, |p, event: &watcher::Event<Service>| match event {
            watcher::Event::Apply(svc) | watcher::Event::Delete(svc) => p.service(svc),
            watcher::Event::InitDone => p.full = true,
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        });
        let on_node = recorder(&watched, &changed, |p, event: &watcher::Event<Node>| {
            if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                p.node = true;
            }
        });
        let on_slice = {
            let (watched, changed) = (watched.clone(), changed.clone());
            move |event: watcher::Event<EndpointSlice>| {
                let wakes = !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_));
                let mut w = watched.lock().expect("watched lock");
                let Watched { pending, slices } = &mut *w;
                slices.apply(event, pending);
                let listed = slices.is_listed();
                drop(w);
                listed_tx.send_if_modified(|l| !std::mem::replace(l, listed) && listed);
                if wakes {
                    changed.notify_one();
                }
            }
        };
        let tasks = vec![
            tokio::spawn(drive(svc_stream, "Service", on_service, counters.clone())),
            tokio::spawn(drive(eps_stream, "EndpointSlice", on_slice, counters.clone())),
            tokio::spawn(drive(node_stream, "Node", on_node, counters.clone())),
        ];
        Self { services, node, watched, slices_listed, changed, index: SliceIndex::default(), counters, tasks }
    }

    /// Resolves once the initial lists are complete.
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        self.services.wait_until_ready().await?;
        self.slices_listed.clone().wait_for(|listed| *listed).await?;
        self.node.wait_until_ready().await?;
        let slices = self.watched.lock().expect("watched lock").slices.len();
        info!(services = self.services.state().len(), slices, "initial lists complete");
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
        let mut w = self.watched.lock().expect("watched lock");
        let pending = std::mem::take(&mut w.pending);
        let triggers = w.slices.take_triggers();
        if pending.full {
            drop(w);
            return (self.everything_now(), triggers);
        }
        let mut services = pending.services;
        for id in pending.slices {
            let now = w.slices.get(&id);
            self.index.set(id, now.as_deref(), &mut services);
        }
        let changed = services.into_iter().map(|id| self.service(&w.slices, id)).collect();
        drop(w);
        let nodes = pending.node.then(|| self.node.state());
        (Snapshot::Changed { services: changed, nodes }, triggers)
    }

    /// Everything the stores hold (and the trigger times gathered).
    pub fn everything(&mut self) -> (Snapshot, Vec<SystemTime>) {
        let triggers = self.watched.lock().expect("watched lock").slices.take_triggers();
        (self.everything_now(), triggers)
    }

    /// Everything the stores hold, the index rebuilt.
    fn everything_now(&mut self) -> Snapshot {
        let services = self.services.state();
        let slices = self.watched.lock().expect("watched lock").slices.all();
        self.index.rebuild(slices.iter().map(|s| &**s));
        Snapshot::Full { services, slices, nodes: self.node.state() }
    }

    /// One service's objects as the stores hold them now.
    fn service(&self, slices: &SliceStore, id: ServiceId) -> Changed {
        let service = self.services.get(&reflector::ObjectRef::new(&id.1).within(&id.0));
        let slices = self.index.slices_of(&id).filter_map(|s| slices.get(s)).collect();
        Changed { id, service, slices }
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A watch's event handler that records in `pending` what the event
/// touched (`record`), and wakes the agent for all but list progress.
fn recorder<K: 'static>(
    watched: &Arc<Mutex<Watched>>,
    changed: &Arc<Notify>,
    record: fn(&mut Pending, &watcher::Event<K>),
) -> impl FnMut(watcher::Event<K>) + Send + 'static {
    let (watched, changed) = (watched.clone(), changed.clone());
    move |event| {
        record(&mut watched.lock().expect("watched lock").pending, &event);
        if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
            changed.notify_one();
        }
    }
}

/// Follows one watch, handing each event to `handle`; errors are counted
/// and logged (the watcher retries with backoff).
async fn drive<K: Resource>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    kind: &'static str,
    mut handle: impl FnMut(watcher::Event<K>),
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
                if matches!(event, watcher::Event::Init) {
                    debug!(kind, "(re-)listing");
                }
                handle(event);
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

/// How to reach the API server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// `--kubeconfig`: else in-cluster when in a pod, else `KUBECONFIG` or
    /// `~/.kube/config`.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// `HOST:PORT` dialled instead of the configured server (the
    /// credentials and CA are kept).
    pub api_server_endpoint: Option<String>,
}

/// The one place the Kubernetes client is built: from `--kubeconfig` when
/// given, else the in-cluster service account when in a pod
/// (`KUBERNETES_SERVICE_HOST` set), else `KUBECONFIG` / `~/.kube/config`;
/// `api_server_endpoint` then replaces the server's address. Returns the
/// client and where it dials.
pub async fn client(options: &ClientOptions) -> anyhow::Result<(Client, ApiEndpoint)> {
    use anyhow::Context as _;
    let (mut config, mut origin) = match &options.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?;
            (config, Origin::Kubeconfig)
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => (
            kube::Config::incluster().context(
                "KUBERNETES_SERVICE_HOST is set (in a pod) but the service account's token and CA cannot be \
                 read from /var/run/secrets/kubernetes.io/serviceaccount; pass --kubeconfig",
            )?,
            Origin::InCluster,
        ),
        None => (
            kube::Config::infer().await.context(
                "no Kubernetes configuration: not in a pod, no KUBECONFIG and no ~/.kube/config; \
                 pass --kubeconfig, or --services-file to run without a cluster",
            )?,
            Origin::Kubeconfig,
        ),
    };
    if let Some(endpoint) = &options.api_server_endpoint {
        config.cluster_url = format!("https://{endpoint}")
            .parse()
            .with_context(|| format!("--api-server-endpoint {endpoint:?} is not HOST:PORT"))?;
        origin = Origin::Endpoint;
    }
    let endpoint = ApiEndpoint::new(&config.cluster_url, origin);
    info!(api_server = %endpoint.url, origin = endpoint.origin.name(), "Kubernetes API server");
    Ok((Client::try_from(config).context("building the Kubernetes client")?, endpoint))
}
