//! The Kubernetes API as a source: watches over `v1/Service` and
//! `discovery.k8s.io/v1/EndpointSlice` cluster-wide (never the legacy
//! Endpoints), and this node's Node. The Services and EndpointSlices are
//! listed and watched as client-go's reflectors do, in protobuf, lists
//! from the API server's watch cache (`super::listwatch`); the Node (one
//! object) through kube-runtime's watcher. Each re-lists after a 410 and
//! reconnects with backoff (`super::retry`); the store
//! (`super::store`) takes a re-list in place, so a reconnect never shows an
//! empty cluster. While the API server is away the store keeps the last
//! state, and so does the datapath.
//!
//! The watch events say which services changed; a snapshot reads only
//! those from the store (after a relist too: what the relist changed).
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, runtime::watcher};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

pub(crate) use super::bootstrap::{ApiEndpoint, Origin};
use super::{
    ChangeSource, Delivery,
    lean::{self, LeanService, LeanSlice},
    listwatch::{ApiBytes, ContentType, ListWatch},
    reachability::Reachability,
    requests::{ObserveLayer, Observer},
    retry::{Failure, RetrySchedule},
    store::ObjectStore,
};

/// Syncs start at most this often unless configured otherwise. A sync
/// writes only what changed (a few map entries per EndpointSlice update),
/// so the interval only needs to gather what a burst queued while the last
/// sync ran; it bounds the time from a change to its maps written during
/// churn (docs/performance.md, "The control plane": the churn's p99 follows
/// this period), where kube-proxy's 1 s pays for whole-ruleset restores.
pub(crate) const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_millis(5);

/// Watch events and errors since start (each error is retried, see
/// `super::retry`).
#[derive(Debug, Default)]
pub(crate) struct WatchCounters {
    pub(crate) errors: AtomicU64,
    pub(crate) events: AtomicU64,
    /// Full relists after a watch position expired (410 Gone).
    pub(crate) relists: AtomicU64,
    /// Bytes of the Service and EndpointSlice lists and watches.
    pub(crate) bytes: Arc<ApiBytes>,
}

pub(crate) struct KubeSource {
    /// What the watch tasks write and a snapshot reads.
    store: Arc<Mutex<ObjectStore>>,
    listed: watch::Receiver<bool>,
    changed: Arc<Notify>,
    pub(crate) counters: Arc<WatchCounters>,
    tasks: Vec<JoinHandle<()>>,
    client: Client,
    /// Where the client dials (to explain a silence before the lists).
    endpoint: ApiEndpoint,
    node_name: String,
    /// Syncs start at most this often: a change after a quiet spell is
    /// applied at once, and the changes of a burst are gathered into one
    /// sync per interval (kube-proxy's minSyncPeriod, on the leading edge).
    min_sync_period: Duration,
}

impl ChangeSource for KubeSource {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn ready(&mut self) -> anyhow::Result<()> {
        info!("waiting for the initial lists of Services and EndpointSlices before the first write");
        // When the lists are slow to come, says why the API server does not
        // answer (see `super::bootstrap`).
        let listed = self.listed.wait_for(|listed| *listed);
        super::bootstrap::explain_while_waiting(listed, &self.endpoint, super::bootstrap::PROBE_AFTER).await?;
        let (services, slices) = self.store.lock().expect("store lock").counts();
        info!(services, slices, "initial lists complete");
        Ok(())
    }

    async fn changed(&mut self) {
        self.changed.notified().await;
    }

    async fn gather(&mut self, last_sync: Option<Instant>) {
        if let Some(wait) = last_sync.and_then(|at| self.min_sync_period.checked_sub(at.elapsed())) {
            tokio::time::sleep(wait).await;
        }
        // Drops a pending change notice: its change is in the next snapshot.
        let _ = futures::FutureExt::now_or_never(self.changed.notified());
    }

    fn snapshot(&mut self) -> Option<Delivery> {
        Some(self.store.lock().expect("store lock").take())
    }

    fn everything(&mut self) -> Option<Delivery> {
        Some(self.store.lock().expect("store lock").everything())
    }

    fn pending(&self) -> (usize, usize) {
        self.store.lock().expect("store lock").pending_events()
    }

    fn inputs(&self, service: &crate::model::ServiceId) -> Option<super::change_source::ServiceInputs> {
        self.store.lock().expect("store lock").inputs(service)
    }

    fn started(&self, frontends: usize) {
        let note = format!("ebpf-proxy translates {frontends} service frontends on this node");
        announce(&self.client, &self.node_name, "Starting", note);
    }
}

impl KubeSource {
    /// Starts the watches: all Services and EndpointSlices (asked for in
    /// `content_type`), and the Node named `node_name`; `reachability` is
    /// the one `client` was built with.
    #[must_use]
    pub(crate) fn start(
        client: &Client,
        endpoint: ApiEndpoint,
        node_name: &str,
        reachability: Arc<Reachability>,
        content_type: ContentType,
    ) -> Self {
        let changed = Arc::new(Notify::new());
        let counters = Arc::new(WatchCounters::default());
        let store = Arc::new(Mutex::new(ObjectStore::default()));
        let (listed_tx, listed) = watch::channel(false);
        // The store converts each Service and EndpointSlice into the
        // model's form as it arrives (`convert`); the Node is slimmed.
        // kube-proxy's selector: Services of another proxy and headless
        // ones never leave the API server.
        // Decoded lean: only what the store converts, and boxed until the
        // store takes it (`super::lean`, `super::protobuf`).
        let list_watch = |url: &str, labels: Option<String>| {
            ListWatch::new(client.clone(), url, labels, content_type, counters.bytes.clone())
        };
        let svc_url = Api::<LeanService>::all(client.clone()).resource_url().to_owned();
        let svc_stream = list_watch(&svc_url, Some(super::labels::selector()))
            .stream::<LeanService>()
            .map_ok(|event| lean::unwrap_event(event, |s| s.0));
        let eps_url = Api::<LeanSlice>::all(client.clone()).resource_url().to_owned();
        let eps_stream =
            list_watch(&eps_url, None).stream::<LeanSlice>().map_ok(|event| lean::unwrap_event(event, |s| s.0));
        let node_config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
        let node_stream = watcher(Api::<Node>::all(client.clone()), node_config);
        let feed = Feed { store: store.clone(), changed: changed.clone(), listed: Arc::new(listed_tx) };
        let tasks = vec![
            tokio::spawn(drive(
                svc_stream,
                "Service",
                feed.to(|store, event| store.service_event(lean::unwrap_event(event, lean::unboxed))),
                counters.clone(),
                reachability.clone(),
            )),
            tokio::spawn(drive(
                eps_stream,
                "EndpointSlice",
                feed.to(|store, event| store.slice_event(lean::unwrap_event(event, lean::unboxed))),
                counters.clone(),
                reachability.clone(),
            )),
            tokio::spawn(drive(node_stream, "Node", feed.to(ObjectStore::node_event), counters.clone(), reachability)),
        ];
        Self {
            store,
            listed,
            changed,
            counters,
            tasks,
            client: client.clone(),
            endpoint,
            node_name: node_name.to_owned(),
            min_sync_period: DEFAULT_MIN_SYNC_PERIOD,
        }
    }

    /// Syncs start at most every `period` (kube-proxy's minSyncPeriod).
    #[must_use]
    pub(crate) const fn with_min_sync_period(mut self, period: Duration) -> Self {
        self.min_sync_period = period;
        self
    }
}

/// Hands a watch's events to the store, and tells the pipeline.
struct Feed {
    store: Arc<Mutex<ObjectStore>>,
    changed: Arc<Notify>,
    listed: Arc<watch::Sender<bool>>,
}

impl Feed {
    /// An event handler that gives each event of a batch to `apply` (under
    /// one hold of the store's lock), marks the store listed once every
    /// first list is complete, and wakes the pipeline for all but list
    /// progress.
    fn to<K: 'static>(
        &self,
        apply: fn(&mut ObjectStore, watcher::Event<K>),
    ) -> impl FnMut(&mut Vec<watcher::Event<K>>) + Send + 'static {
        let (store, changed, listed) = (self.store.clone(), self.changed.clone(), self.listed.clone());
        move |events| {
            let wakes = events.iter().any(|e| !matches!(e, watcher::Event::Init | watcher::Event::InitApply(_)));
            let mut s = store.lock().expect("store lock");
            for event in events.drain(..) {
                apply(&mut s, event);
            }
            let is_listed = s.is_listed();
            drop(s);
            mark_listed(&listed, is_listed);
            if wakes {
                changed.notify_one();
            }
        }
    }
}

/// Tells `ready` the first lists are complete, once. The three watch
/// tasks each read `is_listed` under the store's lock but send after
/// releasing it, so a task's stale `false` can arrive after another's
/// `true`: the flag only ever goes from false to true (a kind stays listed
/// once listed), or a late `false` would hide the lists from `ready` for
/// good and the agent would never write.
fn mark_listed(listed: &watch::Sender<bool>, is_listed: bool) {
    listed.send_if_modified(|l| {
        let newly = is_listed && !*l;
        *l |= is_listed;
        newly
    });
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Events a watch hands over at most at once, and holds ready for the
/// store beside those, so that the list goes on being read and decoded
/// while the store takes a batch. Beside the store a list then holds a few
/// hundred decoded objects: those the list's decoder holds ready
/// (`super::listwatch`), those waiting here, and the batch the store
/// takes.
const AHEAD: usize = 100;

/// Follows one watch, handing its events to `handle` as they come, all
/// that are there at once (up to `AHEAD`; `handle` takes them all). The
/// watch runs in a task of its own (`pump`) that stays up to `AHEAD`
/// events ahead; a full list is logged with how long it took.
async fn drive<K: Send + 'static>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    kind: &'static str,
    mut handle: impl FnMut(&mut Vec<watcher::Event<K>>),
    counters: Arc<WatchCounters>,
    reachability: Arc<Reachability>,
) {
    let (events_tx, mut events_rx) = tokio::sync::mpsc::channel(AHEAD);
    let _pump = AbortOnDrop(tokio::spawn(pump(stream, kind, events_tx, counters, reachability)));
    let mut list = ListProgress::default();
    let mut events = Vec::with_capacity(AHEAD);
    while events_rx.recv_many(&mut events, AHEAD).await > 0 {
        for event in &events {
            list.follow(kind, event);
        }
        // The relist's freed pages go back to the kernel by themselves
        // (the allocator's background thread: observe/memory.rs).
        handle(&mut events);
        events.clear();
    }
}

/// Polls one watch and sends its events to `events`. A failure is
/// counted, logged the first time and then as a reminder every 30 s
/// (`Reachability`, which also logs when the watch is back) and retried
/// after the delay `RetrySchedule` gives, or at once when the server was
/// unreachable and another watch is back.
async fn pump<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    kind: &'static str,
    events: tokio::sync::mpsc::Sender<watcher::Event<K>>,
    counters: Arc<WatchCounters>,
    reachability: Arc<Reachability>,
) {
    let mut stream = std::pin::pin!(stream);
    let mut schedule = RetrySchedule::default();
    loop {
        // Read before the attempt the next event may make (`back_since`).
        let generation = reachability.generation(kind);
        let Some(event) = stream.next().await else { break };
        match event {
            Ok(event) => {
                // `Init` only says a list starts: the watcher sends it
                // before the list request, also before each retry of a
                // list that failed. Taken as a success, it started the
                // schedule afresh (and logged the next failure as a first
                // one) on every retry, so an unreachable server was tried
                // at the first delay for ever.
                if !matches!(event, watcher::Event::Init) {
                    schedule.reset();
                    reachability.succeeded(kind);
                }
                counters.events.fetch_add(1, Ordering::Relaxed);
                if events.send(event).await.is_err() {
                    return;
                }
            }
            Err(err) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                let failure = Failure::of(&err);
                if failure == Failure::Expired {
                    counters.relists.fetch_add(1, Ordering::Relaxed);
                    info!(kind, %err, "watch position expired (410 Gone): listing everything again");
                } else {
                    if !reachability.is_failing(kind) {
                        // The first failure since a request of this kind
                        // succeeded (the request observer clears the mark,
                        // also for a watch that succeeded with no event).
                        schedule.reset();
                    }
                    reachability.failed(kind, &err);
                    debug!(kind, %err, "watch still failing");
                }
                let delay = tokio::time::sleep(schedule.next_delay(failure, fastrand::f64()));
                if failure == Failure::Unreachable {
                    // Another watch back means the server is: try now.
                    tokio::select! {
                        () = delay => {}
                        () = reachability.back_since(kind, generation) => {
                            debug!(kind, "the API server answers again: retrying now");
                        }
                    }
                } else {
                    delay.await;
                }
            }
        }
    }
}

/// Aborts a task when dropped (the watch of a `drive` that ended).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A list in progress (the first, or a relist), for its log line.
#[derive(Default)]
struct ListProgress {
    started: Option<Instant>,
    objects: usize,
    lists: u64,
}

impl ListProgress {
    /// Follows one event, logging each list's end.
    fn follow<K>(&mut self, kind: &'static str, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Init => {
                self.started = Some(Instant::now());
                self.objects = 0;
            }
            watcher::Event::InitApply(_) => self.objects += 1,
            watcher::Event::InitDone => {
                let seconds = self.started.take().map_or(0.0, |s| s.elapsed().as_secs_f64());
                let relist = self.lists > 0;
                self.lists += 1;
                info!(kind, objects = self.objects, seconds, relist, "{kind} list complete");
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {}
        }
    }
}

/// Publishes a Normal event on this node's Node object, as kube-proxy
/// records its start; a failure is logged, never fatal.
pub(crate) fn announce(client: &Client, node_name: &str, reason: &str, note: String) {
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
    /// `--kube-api-content-type`: what Services and EndpointSlices are
    /// asked for in.
    pub content_type: ContentType,
}

/// The one place the Kubernetes client is built: from `--kubeconfig` when
/// given, else the in-cluster service account when in a pod
/// (`KUBERNETES_SERVICE_HOST` set), else `KUBECONFIG` / `~/.kube/config`;
/// `api_server_endpoint` then replaces the server's address; `observers`
/// see the outcome of each of its requests. Returns the client and where
/// it dials.
pub async fn client(options: &ClientOptions, observers: Vec<Observer>) -> anyhow::Result<(Client, ApiEndpoint)> {
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
    let host = config.cluster_url.authority().map(ToString::to_string).unwrap_or_default();
    let builder = kube::client::ClientBuilder::try_from(config).context("building the Kubernetes client")?;
    Ok((builder.with_layer(&ObserveLayer::new(observers, &host)).build(), endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node
    }

    fn name(event: &watcher::Event<Node>) -> String {
        match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) | watcher::Event::Delete(n) => {
                n.metadata.name.clone().unwrap_or_default()
            }
            watcher::Event::Init => "init".into(),
            watcher::Event::InitDone => "done".into(),
        }
    }

    /// The watch runs ahead in a task of its own; the handler still gets
    /// every event once, in the watch's order, in batches of at most a
    /// page; and a `drive` that is dropped (`KubeSource` aborts it) takes
    /// its watch down with it.
    #[tokio::test]
    async fn drive_hands_over_every_event_in_order_and_ends_its_watch_when_dropped() {
        let mut events = vec![watcher::Event::Init];
        events.extend((0..250).map(|i| watcher::Event::InitApply(node(&format!("n{i}")))));
        events.push(watcher::Event::InitDone);
        events.push(watcher::Event::Apply(node("later")));
        let want: Vec<String> = events.iter().map(name).collect();
        // Held by the stream: gone once the watch is dropped.
        let held = Arc::new(());
        let guard = held.clone();
        let stream =
            futures::stream::iter(events.into_iter().map(Ok)).chain(futures::stream::pending()).map(move |e| {
                let _ = &guard;
                e
            });
        let seen = Arc::new(Mutex::new((Vec::new(), 0usize)));
        let record = seen.clone();
        let handle = move |batch: &mut Vec<watcher::Event<Node>>| {
            let mut seen = record.lock().unwrap();
            seen.1 = seen.1.max(batch.len());
            seen.0.extend(batch.drain(..).map(|e| name(&e)));
        };
        let counters = Arc::new(WatchCounters::default());
        let task = tokio::spawn(drive(stream, "Node", handle, counters.clone(), Arc::new(Reachability::default())));
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().0.len() < want.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (got, largest) = seen.lock().unwrap().clone();
        assert_eq!(got, want);
        assert!(largest <= AHEAD, "a batch of {largest}");
        assert_eq!(counters.events.load(Ordering::Relaxed), 253);
        assert!(Arc::strong_count(&held) > 1, "the watch is still up");
        task.abort();
        let _ = task.await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&held) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(Arc::strong_count(&held), 1, "the watch ended with its drive");
    }

    /// A loopback server that counts connections and answers each with
    /// `answer` (nothing: the connection is closed at once, as a server
    /// that is not up yet), and the real watch loop (kube-runtime's
    /// watcher, through `pump`) of Nodes against it, for `window`: the
    /// attempts made, the loop's failures, whether the watch counts as
    /// failing at the end, and how each failure was classified.
    async fn watch_against(answer: Option<&'static str>, window: Duration) -> (u64, u64, bool, Vec<Failure>) {
        let (outcome, ()) = watch_against_while(answer, |_, _| tokio::time::sleep(window)).await;
        outcome
    }

    /// `watch_against`, for as long as `during` (given the attempts so far
    /// and the watches' reachability) runs; also what it returned.
    async fn watch_against_while<F: Future>(
        answer: Option<&'static str>,
        during: impl FnOnce(Arc<AtomicU64>, Arc<Reachability>) -> F,
    ) -> ((u64, u64, bool, Vec<Failure>), F::Output) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let attempts = Arc::new(AtomicU64::new(0));
        let accepted = attempts.clone();
        let server = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                if let Some(answer) = answer {
                    tokio::spawn(answer_once(conn, answer));
                }
            }
        });
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let stream = watcher(Api::<Node>::all(Client::try_from(config).unwrap()), watcher::Config::default()).inspect(
            move |event| {
                if let Err(err) = event {
                    record.lock().unwrap().push(Failure::of(err));
                }
            },
        );
        let (events, mut received) = tokio::sync::mpsc::channel(16);
        let counters = Arc::new(WatchCounters::default());
        let reachability = Arc::new(Reachability::default());
        let pump = tokio::spawn(pump(stream, "Node", events, counters.clone(), reachability.clone()));
        let out = during(attempts.clone(), reachability.clone()).await;
        let made = attempts.load(Ordering::Relaxed);
        pump.abort();
        server.abort();
        while let Ok(event) = received.try_recv() {
            assert!(matches!(event, watcher::Event::Init), "only list starts, no objects");
        }
        let seen = seen.lock().unwrap().clone();
        ((made, counters.errors.load(Ordering::Relaxed), reachability.is_failing("Node"), seen), out)
    }

    /// Waits until `attempts` reaches `n` (at most 20 s), then for the next
    /// attempt, so that the watch has just begun a delay; returns the count.
    async fn just_after_attempt(attempts: &AtomicU64, n: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while attempts.load(Ordering::Relaxed) < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let at = attempts.load(Ordering::Relaxed);
        while attempts.load(Ordering::Relaxed) == at && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        attempts.load(Ordering::Relaxed)
    }

    /// Reads a request's head (a GET has no body), writes `answer` (short
    /// enough for the socket's buffer) and waits for the client to close.
    async fn answer_once(conn: tokio::net::TcpStream, answer: &'static str) {
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut buf = [0; 4096];
            if conn.readable().await.is_err() {
                return;
            }
            match conn.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
        let _ = conn.writable().await;
        let _ = conn.try_write(answer.as_bytes());
        loop {
            if conn.readable().await.is_err() {
                return;
            }
            match conn.try_read(&mut [0; 64]) {
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// The most attempts `RetrySchedule` allows for `failure` in `window`:
    /// the first, and one after each delay that fits when the jitter makes
    /// every delay as short as it can be.
    fn most_attempts(failure: Failure, window: Duration) -> u64 {
        let mut schedule = RetrySchedule::default();
        let (mut elapsed, mut most) = (Duration::ZERO, 1);
        loop {
            elapsed += schedule.next_delay(failure, 1.0);
            if elapsed > window {
                return most;
            }
            most += 1;
        }
    }

    /// The watch loop follows `RetrySchedule` for a server that is not up
    /// (0.1 s doubling to 1 s) and for one answering 500 (client-go's 0.8 s
    /// doubling to 30 s), each list attempt one connection: the schedule
    /// is not started afresh by the watcher's `Init` before each retry.
    /// The bound is what the schedule allows at the most jitter; a slow
    /// machine makes fewer attempts, never more. Each watch logs its first
    /// failure only (the next line would be the reminder, 30 s on).
    #[tokio::test]
    async fn failing_lists_are_retried_on_the_schedule_through_the_watch_loop() {
        const WINDOW: Duration = Duration::from_secs(5);
        const ERROR: &str = "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        // A current-thread runtime: the watches' tasks log on this thread.
        let (log, _guard) = crate::source::log_capture::Captured::start();
        let (down, answering) = tokio::join!(watch_against(None, WINDOW), watch_against(Some(ERROR), WINDOW));
        assert_eq!(log.count("watch failed"), 2, "one line per watch:\n{}", log.text());
        assert_eq!(log.count("watch still failing"), 0, "{}", log.text());
        for ((made, errors, failing, seen), failure) in [(down, Failure::Unreachable), (answering, Failure::Answered)] {
            assert!(seen.iter().all(|f| *f == failure), "{failure:?}: the server's failures were {seen:?}");
            let most = most_attempts(failure, WINDOW);
            assert!(made >= 2, "{failure:?}: the watch did not try again: {made} attempts");
            assert!(made <= most, "{failure:?}: {made} attempts in {WINDOW:?}; the schedule allows {most}");
            assert!(errors >= made - 1, "{failure:?}: {errors} failures of {made} attempts");
            assert!(failing, "{failure:?}: an attempt that failed is not a success");
        }
    }

    /// A watch waiting out its delay for an unreachable server retries at
    /// once when another watch is back (the server answers again), so the
    /// watches come back together after an outage; one waiting after an
    /// error the server answered (500) keeps its delay. After the fifth
    /// failure the unreachable schedule's delay is at least 0.5 s (1 s at
    /// the most jitter), after the second the answered one's at least 0.8 s:
    /// the next attempt coming sooner than that was woken.
    #[tokio::test]
    async fn a_watch_of_an_unreachable_server_retries_when_another_is_back() {
        const ERROR: &str = "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        const SOONEST: Duration = Duration::from_millis(400);
        // Logging to a subscriber of this thread, as the test above does:
        // a callsite first hit where none is set is cached as disabled for
        // every thread, and that test, run beside this one, missed its lines.
        let (_log, _guard) = crate::source::log_capture::Captured::start();
        for (answer, after, woken) in [(None, 5, true), (Some(ERROR), 2, false)] {
            let (_, next) = watch_against_while(answer, move |attempts, reachability| async move {
                let made = just_after_attempt(&attempts, after).await;
                // The Service watch was failing and is back.
                reachability.failed("Service", &"connection refused");
                let woke = Instant::now();
                reachability.succeeded("Service");
                while attempts.load(Ordering::Relaxed) == made && woke.elapsed() < SOONEST {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                attempts.load(Ordering::Relaxed) > made
            })
            .await;
            assert_eq!(next, woken, "answer {answer:?}: tried again within {SOONEST:?} of another watch being back");
        }
    }

    /// The order two watch tasks can send in: one saw every list complete,
    /// the other (which read the store just before) did not.
    #[test]
    fn a_late_not_listed_does_not_hide_the_lists() {
        let (tx, mut rx) = watch::channel(false);
        mark_listed(&tx, false);
        assert!(!rx.has_changed().unwrap(), "nothing to tell yet");
        mark_listed(&tx, true);
        assert!(rx.has_changed().unwrap() && *rx.borrow_and_update());
        mark_listed(&tx, false);
        mark_listed(&tx, true);
        assert!(!rx.has_changed().unwrap(), "told once");
        assert!(*rx.borrow(), "still listed after a stale false");
    }
}
