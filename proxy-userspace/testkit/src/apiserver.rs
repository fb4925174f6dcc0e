//! A test API server that speaks the list/watch protocol a kube-rs client
//! uses, for `v1` Services, `discovery.k8s.io/v1` EndpointSlices, Nodes and
//! Namespaces, on loopback, over plain HTTP (`fieldSelector` on
//! `metadata.name` is honoured):
//!
//! - list (cluster-wide or per namespace) as kube-apiserver serves it:
//!   with a `resourceVersion` (`0`, or one with `resourceVersionMatch=
//!   NotOlderThan`) from its watch cache, the whole list in one response
//!   whatever `limit` says; without one, a quorum read from etcd in
//!   `limit`/`continue` pages, each slower by `QUORUM_READ` per object; a
//!   continue token older than the last compaction gets `410 Gone` with the
//!   Status body a real kube-apiserver sends;
//! - each in protobuf (`k8s\0` and `runtime.Unknown`, watch events in
//!   length-prefixed frames) for Services and EndpointSlices when `Accept`
//!   asks for `application/vnd.kubernetes.protobuf`, else JSON
//!   (`apiserver/protobuf.rs`; `serve_json_only` answers every request in
//!   JSON, as a server or proxy that speaks no protobuf);
//! - watch as a chunked stream of `ADDED`/`MODIFIED`/`DELETED` events from
//!   the asked resourceVersion on, with `BOOKMARK`s when asked for, ending
//!   at `timeoutSeconds`; a watch from a compacted resourceVersion gets an
//!   `ERROR` event carrying a 410 Status, as kube-apiserver does;
//! - create, replace, get and delete of single objects; a write gets what
//!   kube-apiserver adds (API defaults, the writer's `managedFields` entry,
//!   `generation` on EndpointSlices: see `on_write`), and Services get a
//!   ClusterIP from 10.96.0.0/16 when not given, their IP family fields,
//!   node ports and an empty status, so objects are served as large as a
//!   real server's (tests/apiserver_protocol.rs compares the sizes);
//! - `stop()` drops the listener and every open connection mid-stream;
//!   `start_again()` serves the same state on the same port; `compact()`
//!   forgets history like an etcd compaction.
//!
//! Response shapes follow the captures in `tests/fixtures/real-apiserver`.
use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{Method, Request, Response, StatusCode, body::Frame, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

mod on_write;
pub mod protobuf;

/// What a quorum list costs the test server per object, on top of what it
/// serves from memory: kube-apiserver (v1.24, loopback, 2 cores) read
/// 60,000 EndpointSlices in protobuf from etcd in pages in 3.65 s, and from
/// its watch cache in 0.53 s (issue 36), about 50 µs more per object. The
/// test server holds everything in memory either way, so without this its
/// quorum list would cost what its cache list does.
pub const QUORUM_READ: Duration = Duration::from_micros(50);

/// The field manager of objects put with [`TestApiServer::put`]: what
/// `kubectl apply` writes as (the captures were made that way).
pub const KUBECTL_APPLY: &str = "kubectl-client-side-apply";

/// The kinds this server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Namespace,
    Node,
    Event,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Self::Service | Self::Namespace | Self::Node => "v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
            Self::Event => "events.k8s.io/v1",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Namespace => "Namespace",
            Self::Node => "Node",
            Self::Event => "Event",
        }
    }

    fn cluster_scoped(self) -> bool {
        matches!(self, Self::Namespace | Self::Node)
    }
}

/// A change, as the history and the watches share it (one copy of the
/// object for all of them).
#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    kind: Kind,
    change: &'static str,
    object: Arc<Value>,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// (kind, namespace, name) -> object (with kind, apiVersion, metadata).
    objects: BTreeMap<(Kind, String, String), Value>,
    /// Each object's list item as JSON, serialized once when written (as
    /// kube-apiserver's watch cache keeps objects serialized): a list page
    /// joins them instead of copying and serializing every object again,
    /// so the server is not what bounds a benchmark's list of 100,000.
    items: HashMap<(Kind, String, String), Bytes>,
    /// The same in protobuf, for the kinds served in it.
    pb_items: HashMap<(Kind, String, String), Bytes>,
    /// Every answer in JSON, whatever `Accept` asks for.
    json_only: bool,
    history: Vec<Event>,
    /// Events at or below this resourceVersion are forgotten.
    compacted: u64,
    next_cluster_ip: u32,
    next_node_port: u32,
    /// The keys of the paged lists being read, the most recent last.
    lists: Vec<ListKeys>,
}

/// What a list asks for: kind, namespace, `fieldSelector` name and
/// `labelSelector`.
type ListQuery = (Kind, Option<String>, Option<String>, Option<String>);

/// The keys a paged list walks, taken at its first page and used by the
/// pages after it (kube-apiserver serves every page of a list from the
/// snapshot of its first). Filtering every object again for each page made
/// a list of N objects in pages of P cost N²/P: minutes for 100,000
/// Services in the agent's pages of 100.
struct ListKeys {
    rv: u64,
    query: ListQuery,
    keys: Vec<(Kind, String, String)>,
}

/// Lists whose keys are kept (the agent reads two at once).
const LISTS_KEPT: usize = 8;

/// One request the server answered: method, path, whether it watched,
/// its query and its `Accept` header.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub watch: bool,
    pub query: String,
    pub accept: String,
}

pub struct TestApiServer {
    state: Arc<Mutex<State>>,
    log: Arc<Mutex<Vec<Logged>>>,
    events: broadcast::Sender<Event>,
    addr: SocketAddr,
    stop: Option<watch::Sender<bool>>,
    runtime: tokio::runtime::Runtime,
}

impl TestApiServer {
    /// Starts on a free loopback port.
    #[must_use]
    pub fn start() -> Self {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let (events, _) = broadcast::channel(4096);
        let state = Arc::new(Mutex::new(State { next_cluster_ip: 1, ..State::default() }));
        let log = Arc::default();
        let mut server = Self { state, log, events, addr: SocketAddr::from(([127, 0, 0, 1], 0)), stop: None, runtime };
        server.serve();
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    /// Stops serving: the listener closes and open watches break.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }

    /// Serves the same state on the same port again.
    pub fn start_again(&mut self) {
        assert!(self.stop.is_none(), "still running");
        self.serve();
    }

    /// Forgets every event so far, as an etcd compaction does: watches and
    /// continue tokens from before now get 410 Gone.
    pub fn compact(&self) {
        let mut st = self.state.lock().unwrap();
        st.compacted = st.rv;
        st.history.clear();
    }

    /// Creates or replaces an object directly (also while stopped), as
    /// `kubectl apply` would ([`KUBECTL_APPLY`] in its managed fields).
    pub fn put(&self, object: Value) -> Value {
        self.put_by(KUBECTL_APPLY, object)
    }

    /// Creates or replaces an object directly as field manager `manager`
    /// (`kube-controller-manager` for what the EndpointSlice controller
    /// writes, say).
    pub fn put_by(&self, manager: &str, object: Value) -> Value {
        let kind = kind_of(&object).expect("object with a known kind");
        write(&self.state, &self.events, kind, object, None, manager)
    }

    /// Answers every request in JSON from now on, whatever `Accept` asks
    /// for (a server or proxy that speaks no protobuf).
    pub fn serve_json_only(&self) {
        self.state.lock().unwrap().json_only = true;
    }

    /// Deletes an object directly (also while stopped).
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) -> bool {
        remove(&self.state, &self.events, kind, namespace, name).is_some()
    }

    fn serve(&mut self) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let listener = self.runtime.block_on(tokio::net::TcpListener::bind(self.addr)).expect("bind test API server");
        self.addr = listener.local_addr().expect("local addr");
        let (state, events, log) = (self.state.clone(), self.events.clone(), self.log.clone());
        self.runtime.spawn(async move {
            let mut stop = stop_rx.clone();
            loop {
                let (stream, _) = tokio::select! {
                    _ = stop.changed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                };
                // As a real kube-apiserver (Go sets TCP_NODELAY on every
                // connection): a watch event goes out at once, not after the
                // client acknowledges the previous one.
                let _ = stream.set_nodelay(true);
                let (state, events, mut stop) = (state.clone(), events.clone(), stop_rx.clone());
                let (for_requests, log) = (stop_rx.clone(), log.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let watch = req
                            .uri()
                            .query()
                            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
                        let accept = req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok());
                        log.lock().unwrap().push(Logged {
                            method: req.method().to_string(),
                            path: req.uri().path().to_owned(),
                            watch,
                            query: req.uri().query().unwrap_or_default().to_owned(),
                            accept: accept.unwrap_or_default().to_owned(),
                        });
                        let (state, events, stop) = (state.clone(), events.clone(), for_requests.clone());
                        async move { Ok::<_, Infallible>(handle(req, &state, &events, stop).await) }
                    });
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = stop.changed() => {}
                    }
                });
            }
        });
        self.stop = Some(stop_tx);
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn kind_of(object: &Value) -> Option<Kind> {
    match object.get("kind")?.as_str()? {
        "Service" => Some(Kind::Service),
        "EndpointSlice" => Some(Kind::EndpointSlice),
        "Namespace" => Some(Kind::Namespace),
        "Node" => Some(Kind::Node),
        "Event" => Some(Kind::Event),
        _ => None,
    }
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object.pointer(&format!("/metadata/{field}")).and_then(Value::as_str).unwrap_or("")
}

/// Stores `object` written by `manager` (filling in what the server owns
/// and adds, as kube-apiserver does: see `on_write`) and emits its event.
fn write(
    state: &Mutex<State>,
    events: &broadcast::Sender<Event>,
    kind: Kind,
    mut object: Value,
    namespace: Option<&str>,
    manager: &str,
) -> Value {
    let mut st = state.lock().unwrap();
    st.rv += 1;
    let rv = st.rv;
    let name = meta_str(&object, "name").to_owned();
    let ns = if kind.cluster_scoped() {
        String::new()
    } else {
        let ns = namespace.map_or_else(|| meta_str(&object, "namespace").to_owned(), str::to_owned);
        if ns.is_empty() { "default".to_owned() } else { ns }
    };
    let key = (kind, ns.clone(), name.clone());
    // Taken out, not copied: the new version goes in its place below.
    let existing = st.objects.remove(&key);
    object["kind"] = json!(kind.name());
    object["apiVersion"] = json!(kind.api_version());
    on_write::apply_defaults(kind, &mut object);
    on_write::record_manager(&mut object, existing.as_ref(), manager);
    on_write::set_generation(kind, &mut object, existing.as_ref());
    let meta = object["metadata"].as_object_mut().expect("metadata");
    if !kind.cluster_scoped() {
        meta.insert("namespace".into(), json!(ns));
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    let uid = existing
        .as_ref()
        .map_or_else(|| format!("00000000-0000-4000-8000-{rv:012}"), |e| meta_str(e, "uid").to_owned());
    meta.insert("uid".into(), json!(uid));
    meta.entry("creationTimestamp").or_insert(json!(on_write::TIMESTAMP));
    if kind == Kind::Service {
        allocate(&mut st, &mut object, existing.as_ref());
    }
    let change = if existing.is_some() { "MODIFIED" } else { "ADDED" };
    // The list item is the object without kind and apiVersion: they are
    // taken off while it is encoded, rather than encoding a copy (a
    // benchmark's churn writes thousands of objects a second).
    let map = object.as_object_mut().expect("an object");
    map.remove("kind");
    map.remove("apiVersion");
    st.items.insert(key.clone(), Bytes::from(serde_json::to_vec(&object).expect("JSON")));
    if protobuf::speaks(kind) {
        st.pb_items.insert(key.clone(), Bytes::from(protobuf::item(kind, &object)));
    }
    object["kind"] = json!(kind.name());
    object["apiVersion"] = json!(kind.api_version());
    st.objects.insert(key, object.clone());
    let event = Event { rv, kind, change, object: Arc::new(object.clone()) };
    st.history.push(event.clone());
    let _ = events.send(event);
    object
}

/// What the Service registry allocates and fills in: a ClusterIP from
/// 10.96.0.0/16 when none is given (kept across replaces; none for
/// ExternalName), the IP family fields, node ports for NodePort and
/// LoadBalancer services, and an empty status.
fn allocate(st: &mut State, object: &mut Value, existing: Option<&Value>) {
    if object.get("spec").is_none_or(|s| !s.is_object()) {
        object["spec"] = json!({});
    }
    let spec = object["spec"].as_object_mut().expect("spec");
    let kind = spec.entry("type").or_insert(json!("ClusterIP")).as_str().unwrap_or("").to_owned();
    if kind != "ExternalName" {
        let kept = existing.and_then(|e| e.pointer("/spec/clusterIP")).cloned();
        if spec.get("clusterIP").and_then(Value::as_str).is_none_or(str::is_empty) {
            let ip = kept.unwrap_or_else(|| {
                let n = st.next_cluster_ip;
                st.next_cluster_ip += 1;
                json!(format!("10.96.{}.{}", 200 + (n >> 8), n & 0xff))
            });
            spec.insert("clusterIP".into(), ip);
        }
        let ip = spec["clusterIP"].clone();
        spec.entry("clusterIPs").or_insert(json!([ip]));
        spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
        spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
    }
    if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        spec.entry("externalTrafficPolicy").or_insert(json!("Cluster"));
        for port in spec.get_mut("ports").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(port) = port.as_object_mut().filter(|p| !p.contains_key("nodePort")) {
                st.next_node_port += 1;
                port.insert("nodePort".into(), json!(30000 + st.next_node_port % 2768));
            }
        }
    }
    if kind == "LoadBalancer" {
        spec.entry("allocateLoadBalancerNodePorts").or_insert(json!(true));
    }
    if object.get("status").is_none() {
        object["status"] = json!({"loadBalancer": {}});
    }
}

fn remove(state: &Mutex<State>, events: &broadcast::Sender<Event>, kind: Kind, ns: &str, name: &str) -> Option<Value> {
    let mut st = state.lock().unwrap();
    let key = (kind, ns.to_owned(), name.to_owned());
    let mut object = st.objects.remove(&key)?;
    st.items.remove(&key);
    st.pb_items.remove(&key);
    st.rv += 1;
    let rv = st.rv;
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    let event = Event { rv, kind, change: "DELETED", object: Arc::new(object.clone()) };
    st.history.push(event.clone());
    let _ = events.send(event);
    Some(object)
}

type Body = BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

/// An error Status, in protobuf when the client asked for it.
fn status_answer(status: StatusCode, body: &Value, protobuf: bool) -> Response<Body> {
    if !protobuf {
        return full(status, body);
    }
    Response::builder()
        .status(status)
        .header("content-type", protobuf::MEDIA_TYPE)
        .body(Full::new(Bytes::from(protobuf::status(body))).boxed())
        .expect("response")
}

/// Whether to answer a request for `kind` in protobuf: `Accept` asks for
/// it, and the server speaks it for `kind`.
fn answers_protobuf(req: &Request<hyper::body::Incoming>, kind: Kind, state: &Mutex<State>) -> bool {
    let accept = req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.contains(protobuf::MEDIA_TYPE) && protobuf::speaks(kind) && !state.lock().unwrap().json_only
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

/// Legacy discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/G/V`), so
/// that kubectl can map the kinds the repository's manifests use. Only the
/// kinds served above, and those of deploy/, are listed.
fn discovery(path: &str) -> Option<Value> {
    let resource = |name: &str, kind: &str, namespaced: bool| {
        json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
               "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
    };
    let list = |gv: &str, resources: Vec<Value>| json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources});
    let group = |name: &str| {
        let gv = format!("{name}/v1");
        json!({"name": name, "versions": [{"groupVersion": gv, "version": "v1"}], "preferredVersion": {"groupVersion": gv, "version": "v1"}})
    };
    Some(match path.trim_end_matches('/') {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            group("apps"), group("discovery.k8s.io"), group("rbac.authorization.k8s.io")]}),
        "/api/v1" => list(
            "v1",
            vec![
                resource("services", "Service", true),
                resource("namespaces", "Namespace", false),
                resource("nodes", "Node", false),
                resource("serviceaccounts", "ServiceAccount", true),
                resource("configmaps", "ConfigMap", true),
            ],
        ),
        "/apis/apps/v1" => list("apps/v1", vec![resource("daemonsets", "DaemonSet", true)]),
        "/apis/discovery.k8s.io/v1" => {
            list("discovery.k8s.io/v1", vec![resource("endpointslices", "EndpointSlice", true)])
        }
        "/apis/rbac.authorization.k8s.io/v1" => list(
            "rbac.authorization.k8s.io/v1",
            vec![
                resource("clusterroles", "ClusterRole", false),
                resource("clusterrolebindings", "ClusterRoleBinding", false),
            ],
        ),
        _ => return None,
    })
}

/// `(kind, namespace, name)` addressed by a path, or `None` when unknown.
fn route(path: &str) -> Option<(Kind, Option<String>, Option<String>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest): (&str, &[&str]) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group @ ("discovery.k8s.io" | "events.k8s.io"), "v1", rest @ ..] => (group, rest),
        _ => return None,
    };
    let group_is_core = group.is_empty();
    let kind = |plural: &str| match (plural, group) {
        ("services", "") => Some(Kind::Service),
        ("namespaces", "") => Some(Kind::Namespace),
        ("nodes", "") => Some(Kind::Node),
        ("endpointslices", "discovery.k8s.io") => Some(Kind::EndpointSlice),
        ("events", "events.k8s.io") => Some(Kind::Event),
        _ => None,
    };
    match rest {
        [plural] => Some((kind(plural)?, None, None)),
        ["namespaces", name] if group_is_core => Some((Kind::Namespace, None, Some((*name).to_owned()))),
        ["nodes", name] if group_is_core => Some((Kind::Node, None, Some((*name).to_owned()))),
        ["namespaces", ns, plural] => Some((kind(plural)?, Some((*ns).to_owned()), None)),
        ["namespaces", ns, plural, name] => Some((kind(plural)?, Some((*ns).to_owned()), Some((*name).to_owned()))),
        _ => None,
    }
}

fn query(req: &Request<hyper::body::Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (percent_decode(k), percent_decode(v))))
        .collect()
}

/// A query component with its `%XX` escapes (and `+` for space) decoded,
/// as clients encode continue tokens and selectors.
fn percent_decode(text: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| Some(hex(bytes[i + 1])? * 16 + hex(bytes[i + 2])?))
            .flatten();
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    state: &Arc<Mutex<State>>,
    events: &broadcast::Sender<Event>,
    stop: watch::Receiver<bool>,
) -> Response<Body> {
    if let Some(body) = discovery(req.uri().path()) {
        return full(StatusCode::OK, &body);
    }
    let Some((kind, ns, name)) = route(req.uri().path()) else {
        return full(
            StatusCode::NOT_FOUND,
            &status_body(404, "NotFound", "the server could not find the requested resource"),
        );
    };
    let q = query(&req);
    let method = req.method().clone();
    let pb = answers_protobuf(&req, kind, state);
    match (method, name) {
        (Method::GET, None) if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) => {
            watch_stream(state, events, kind, ns, &q, stop, pb)
        }
        (Method::GET, None) => {
            let (response, read_from_etcd) = list(state, kind, ns.as_deref(), &q, pb);
            tokio::time::sleep(read_from_etcd).await;
            response
        }
        (Method::GET, Some(name)) => {
            let st = state.lock().unwrap();
            match st.objects.get(&(kind, ns.unwrap_or_default(), name.clone())) {
                Some(obj) => full(StatusCode::OK, obj),
                None => full(
                    StatusCode::NOT_FOUND,
                    &status_body(404, "NotFound", &format!("{} \"{name}\" not found", kind.name())),
                ),
            }
        }
        (Method::POST | Method::PUT, _) => {
            let manager = field_manager(&req, &q);
            let body = req.into_body().collect().await.map(http_body_util::Collected::to_bytes).unwrap_or_default();
            match serde_json::from_slice::<Value>(&body) {
                Ok(object) if object.get("metadata").is_some() => {
                    let created = write(state, events, kind, object, ns.as_deref(), &manager);
                    full(StatusCode::CREATED, &created)
                }
                _ => full(StatusCode::BAD_REQUEST, &status_body(400, "BadRequest", "body is not an object")),
            }
        }
        (Method::DELETE, Some(name)) => match remove(state, events, kind, &ns.unwrap_or_default(), &name) {
            Some(obj) => full(StatusCode::OK, &obj),
            None => full(
                StatusCode::NOT_FOUND,
                &status_body(404, "NotFound", &format!("{} \"{name}\" not found", kind.name())),
            ),
        },
        _ => full(
            StatusCode::METHOD_NOT_ALLOWED,
            &status_body(405, "MethodNotAllowed", "not supported by the test server"),
        ),
    }
}

/// The field manager of a write, as kube-apiserver names it: the
/// `fieldManager` parameter, else the User-Agent up to its first `/`.
fn field_manager(req: &Request<hyper::body::Incoming>, q: &BTreeMap<String, String>) -> String {
    if let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return manager.clone();
    }
    let agent = req.headers().get(hyper::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown");
    agent.split('/').next().unwrap_or(agent).to_owned()
}

fn in_scope(key: &(Kind, String, String), kind: Kind, ns: Option<&str>) -> bool {
    key.0 == kind && ns.is_none_or(|n| key.1 == n)
}

/// The name a `fieldSelector=metadata.name=NAME` asks for (the only field
/// selector the agent uses).
fn selected_name(q: &BTreeMap<String, String>) -> Option<String> {
    q.get("fieldSelector")?.strip_prefix("metadata.name=").map(str::to_owned)
}

/// One requirement of a `labelSelector`: `key`, `!key`, `key=value`
/// (`==`), `key!=value`, as kube-apiserver parses the equality-based form.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
}

/// The requirements of the request's `labelSelector` (all must hold).
fn label_selector(q: &BTreeMap<String, String>) -> Vec<LabelRequirement> {
    let Some(selector) = q.get("labelSelector") else { return Vec::new() };
    selector
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| {
            if let Some((k, v)) = r.split_once("!=") {
                LabelRequirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
                LabelRequirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = r.strip_prefix('!') {
                LabelRequirement::NotExists(k.trim().to_owned())
            } else {
                LabelRequirement::Exists(r.to_owned())
            }
        })
        .collect()
}

fn labels_match(selector: &[LabelRequirement], object: &Value) -> bool {
    let label = |k: &str| object.get("metadata").and_then(|m| m.get("labels")).and_then(|l| l.get(k));
    selector.iter().all(|r| match r {
        LabelRequirement::Exists(k) => label(k).is_some(),
        LabelRequirement::NotExists(k) => label(k).is_none(),
        LabelRequirement::Equals(k, v) => label(k).and_then(Value::as_str) == Some(v),
        // kube-apiserver: `!=` also matches objects without the label.
        LabelRequirement::NotEquals(k, v) => label(k).and_then(Value::as_str) != Some(v),
    })
}

/// A list, and how long its quorum read from etcd would have taken
/// (nothing for a list from the watch cache).
fn list(
    state: &Mutex<State>,
    kind: Kind,
    ns: Option<&str>,
    q: &BTreeMap<String, String>,
    pb: bool,
) -> (Response<Body>, Duration) {
    let mut guard = state.lock().unwrap();
    let st = &mut *guard;
    let continued = q.get("continue").filter(|c| !c.is_empty());
    // kube-apiserver serves a list with a resourceVersion from its watch
    // cache, whole (`limit` is ignored there), at its latest version; one
    // without, or a continued one, is read from etcd in pages.
    let version = q.get("resourceVersion").filter(|v| !v.is_empty());
    let from_cache = continued.is_none() && version.is_some();
    let not_older_than = version.and_then(|v| v.parse::<u64>().ok()).filter(|v| *v > 0);
    if from_cache && not_older_than.is_some_and(|v| v > st.rv) {
        let ahead = status_body(504, "Timeout", "Too large resource version");
        return (status_answer(StatusCode::GATEWAY_TIMEOUT, &ahead, pb), Duration::ZERO);
    }
    // Continue tokens are "rv:offset"; they expire with a compaction.
    let (list_rv, offset) = match continued {
        Some(token) => {
            let Some((rv, off)) =
                token.split_once(':').and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<usize>().ok()?)))
            else {
                let invalid = status_body(400, "BadRequest", "invalid continue token");
                return (status_answer(StatusCode::BAD_REQUEST, &invalid, pb), Duration::ZERO);
            };
            if rv < st.compacted {
                let expired = status_body(410, "Expired", "The resourceVersion for the provided list is too old.");
                return (status_answer(StatusCode::GONE, &expired, pb), Duration::ZERO);
            }
            (rv, off)
        }
        None => (st.rv, 0),
    };
    let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0 && !from_cache);
    let limit = limit.unwrap_or(usize::MAX);
    let name = selected_name(q);
    let selector = label_selector(q);
    let query: ListQuery = (kind, ns.map(str::to_owned), name.clone(), q.get("labelSelector").cloned());
    let kept = st.lists.iter().position(|l| l.rv == list_rv && l.query == query).filter(|_| offset > 0);
    let at = kept.unwrap_or_else(|| {
        let keys = st
            .objects
            .iter()
            .filter(|(k, v)| {
                in_scope(k, kind, ns) && name.as_ref().is_none_or(|n| &k.2 == n) && labels_match(&selector, v)
            })
            .map(|(k, _)| k.clone())
            .collect();
        if st.lists.len() == LISTS_KEPT {
            st.lists.remove(0);
        }
        st.lists.push(ListKeys { rv: list_rv, query, keys });
        st.lists.len() - 1
    });
    let keys = &st.lists[at].keys;
    let end = offset.saturating_add(limit).min(keys.len());
    let next = end.max(offset);
    let read = if from_cache { Duration::ZERO } else { QUORUM_READ * u32::try_from(next - offset).unwrap_or(u32::MAX) };
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if next < keys.len() {
        metadata["continue"] = json!(format!("{list_rv}:{next}"));
        metadata["remainingItemCount"] = json!(keys.len() - next);
    }
    // An object deleted since the first page is left out. The items are
    // taken (shared, not copied) under the lock and the body is written
    // after it is released, as it is sent: the lists of several kinds are
    // served at once, and a list of 100,000 objects is never one buffer
    // (kube-apiserver streams a large list's encoding too).
    let page = keys.get(offset..end).unwrap_or_default();
    let stored = if pb { &st.pb_items } else { &st.items };
    let items: Vec<Bytes> = page.iter().filter_map(|k| stored.get(k)).cloned().collect();
    drop(guard);
    let (head, tail, content_type) = if pb {
        let (head, tail) = protobuf::list_frame(kind, &metadata, items.iter().map(Bytes::len));
        (head, tail, protobuf::MEDIA_TYPE)
    } else {
        let head =
            json!({"kind": format!("{}List", kind.name()), "apiVersion": kind.api_version(), "metadata": metadata});
        let mut head = head.to_string().into_bytes();
        head.pop(); // the closing brace: the items follow
        head.extend_from_slice(br#","items":["#);
        (head, b"]}".to_vec(), "application/json")
    };
    let response = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .body(BodyExt::boxed(StreamBody::new(list_chunks(head, items, tail, pb))))
        .expect("response");
    (response, read)
}

/// A list body in chunks of about [`LIST_CHUNK`] bytes: `head`, the items
/// (length-delimited in protobuf, comma-separated in JSON), `tail`.
fn list_chunks(
    head: Vec<u8>,
    items: Vec<Bytes>,
    tail: Vec<u8>,
    pb: bool,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    let mut rest = items.into_iter().enumerate().peekable();
    let mut head = Some(head);
    let mut tail = Some(tail);
    futures::stream::iter(std::iter::from_fn(move || {
        let mut chunk = head.take()?;
        while chunk.len() < LIST_CHUNK {
            let Some((i, item)) = rest.next() else { break };
            if pb {
                protobuf::list_item(&item, &mut chunk);
            } else {
                if i > 0 {
                    chunk.push(b',');
                }
                chunk.extend_from_slice(&item);
            }
        }
        if rest.peek().is_none() {
            chunk.extend_from_slice(&tail.take().unwrap_or_default());
        } else {
            head = Some(Vec::with_capacity(LIST_CHUNK + 4096));
        }
        Some(Ok(Frame::data(Bytes::from(chunk))))
    }))
}

/// About how much of a list body goes out at once.
const LIST_CHUNK: usize = 256 * 1024;

fn event_line(change: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": change, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch_stream(
    state: &Mutex<State>,
    events: &broadcast::Sender<Event>,
    kind: Kind,
    ns: Option<String>,
    q: &BTreeMap<String, String>,
    mut stop: watch::Receiver<bool>,
    pb: bool,
) -> Response<Body> {
    // One event: a JSON line, or a protobuf frame.
    let event_line = move |change: &str, object: &Value| {
        if pb { Bytes::from(protobuf::watch_frame(kind, change, object)) } else { event_line(change, object) }
    };
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = Duration::from_secs(q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(300));
    let name = selected_name(q);
    let selector = label_selector(q);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    // Subscribe before reading history, so no event falls between them.
    let mut live = events.subscribe();
    let (replay, current_rv, expired) = {
        let st = state.lock().unwrap();
        let expired = from != 0 && from < st.compacted;
        let replay: Vec<Event> = if from == 0 {
            // rv 0: the current state as ADDED events.
            st.objects
                .iter()
                .filter(|(k, _)| in_scope(k, kind, ns.as_deref()))
                .map(|(_, o)| Event { rv: st.rv, kind, change: "ADDED", object: Arc::new(o.clone()) })
                .collect()
        } else {
            st.history.iter().filter(|e| e.rv > from && e.kind == kind).cloned().collect()
        };
        (replay, st.rv, expired)
    };
    tokio::spawn(async move {
        if expired {
            let status = status_body(410, "Expired", &format!("too old resource version: {from} ({current_rv})"));
            let _ = tx.send(event_line("ERROR", &status)).await;
            return;
        }
        let in_watch = |e: &Event| {
            e.kind == kind
                && ns.as_deref().is_none_or(|n| meta_str(&e.object, "namespace") == n)
                && name.as_deref().is_none_or(|n| meta_str(&e.object, "name") == n)
        };
        // An object whose labels stop matching the selector leaves the
        // watch as DELETED, as kube-apiserver sends it (its old labels are
        // not kept here, so one that never matched is "deleted" too: a
        // client ignores a delete of what it does not hold).
        let change = |e: &Event| match (labels_match(&selector, &e.object), e.change) {
            (true, change) => Some(change),
            (false, "MODIFIED") => Some("DELETED"),
            (false, _) => None,
        };
        let matches = |e: &Event| in_watch(e) && change(e).is_some();
        let mut last_rv = from.max(current_rv);
        for e in replay.iter().filter(|e| matches(e)) {
            if tx.send(event_line(change(e).unwrap_or(e.change), &e.object)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                () = &mut deadline => return,
                _ = stop.changed() => return,
                _ = tick.tick(), if bookmarks => {
                    let mark = json!({"kind": kind.name(), "apiVersion": kind.api_version(), "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(event_line("BOOKMARK", &mark)).await.is_err() { return; }
                }
                event = live.recv() => match event {
                    Ok(e) => {
                        last_rv = last_rv.max(e.rv);
                        if e.rv > from && matches(&e) && tx.send(event_line(change(&e).unwrap_or(e.change), &e.object)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let status = status_body(410, "Expired", "watch fell behind");
                        let _ = tx.send(event_line("ERROR", &status)).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(Frame::data(b)), rx)) });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", if pb { protobuf::WATCH_MEDIA_TYPE } else { "application/json" })
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}

/// A kubeconfig for a plain-HTTP API server at `server` (the test server).
#[must_use]
pub fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"{server}\"}}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\ncurrent-context: test\n"
    )
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn label_selectors_select_as_kube_apiserver_does() {
        use super::{label_selector, labels_match};
        let q = |s: &str| [("labelSelector".to_owned(), s.to_owned())].into_iter().collect();
        let obj = |labels: serde_json::Value| serde_json::json!({"metadata": {"labels": labels}});
        let kube_proxy =
            label_selector(&q("!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"));
        assert!(labels_match(&kube_proxy, &obj(serde_json::json!({"app": "web"}))));
        assert!(labels_match(&kube_proxy, &serde_json::json!({"metadata": {}})));
        assert!(!labels_match(&kube_proxy, &obj(serde_json::json!({"service.kubernetes.io/headless": ""}))));
        let eq = label_selector(&q("app=web,tier!=db,zone"));
        assert!(labels_match(&eq, &obj(serde_json::json!({"app": "web", "zone": "a"}))));
        assert!(!labels_match(&eq, &obj(serde_json::json!({"app": "web", "zone": "a", "tier": "db"}))));
        assert!(!labels_match(&eq, &obj(serde_json::json!({"app": "web"}))));
        assert!(labels_match(&label_selector(&q("app==web")), &obj(serde_json::json!({"app": "web"}))));
    }

    #[test]
    fn query_components_are_decoded() {
        assert_eq!(percent_decode("12%3A500"), "12:500");
        assert_eq!(percent_decode("metadata.name%3Dn1"), "metadata.name=n1");
        assert_eq!(percent_decode("a+b%2"), "a b%2", "a broken escape stays as it is");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
