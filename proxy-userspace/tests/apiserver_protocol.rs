//! The test API server answers in the shapes a real kube-apiserver does:
//! its list pages, watch events and 410 bodies are compared with the
//! captures in tests/fixtures/real-apiserver, its protobuf with those in
//! tests/fixtures/real-apiserver-protobuf. The agent's lists and watches
//! (`source::listwatch`) are run against it at the end.
mod common;

use std::{collections::BTreeSet, path::Path};

use proxy_testkit::apiserver::TestApiServer;
use serde_json::Value;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-apiserver").join(name))
        .expect("fixture")
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

/// The captured Services, loaded into a fresh test server.
fn server_with_fixture_services() -> TestApiServer {
    let server = TestApiServer::start();
    let list: Value = serde_norway::from_str(&fixture("services.yaml")).unwrap();
    for item in list["items"].as_array().unwrap() {
        server.put(item.clone());
    }
    server
}

fn get(server: &TestApiServer, path_and_query: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "3"])
        .arg(format!("{}{path_and_query}", server.url()))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.parse().expect("status code"), body.to_owned())
}

#[test]
fn list_pages_look_like_the_real_ones() {
    let server = server_with_fixture_services();
    let real: Value = serde_json::from_str(&fixture("services-list-page1.json")).unwrap();
    let (code, body) = get(&server, "/api/v1/services?limit=2");
    assert_eq!(code, 200);
    let ours: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(keys(&ours), keys(&real));
    assert_eq!(ours["kind"], real["kind"]);
    assert_eq!(ours["apiVersion"], real["apiVersion"]);
    assert_eq!(keys(&ours["metadata"]), keys(&real["metadata"]), "resourceVersion, continue, remainingItemCount");
    assert_eq!(ours["items"].as_array().unwrap().len(), 2);
    // Items of a list carry no kind or apiVersion, as in the capture.
    for (o, r) in ours["items"].as_array().unwrap().iter().zip(real["items"].as_array().unwrap()) {
        assert_eq!(keys(o), keys(r));
        assert_eq!(o["metadata"]["name"], r["metadata"]["name"]);
    }
    assert_eq!(ours["metadata"]["remainingItemCount"], real["metadata"]["remainingItemCount"]);
}

#[test]
fn an_expired_continue_token_gets_the_real_410() {
    let server = server_with_fixture_services();
    let (_, body) = get(&server, "/api/v1/services?limit=2");
    let page: Value = serde_json::from_str(&body).unwrap();
    let token = page["metadata"]["continue"].as_str().unwrap().to_owned();
    server.put(serde_json::json!({"kind": "Service", "metadata": {"name": "new", "namespace": "x"}, "spec": {}}));
    server.compact();
    let (code, body) = get(&server, &format!("/api/v1/services?limit=2&continue={token}"));
    assert_eq!(code, 410);
    let real: Value = serde_json::from_str(&fixture("list-expired-resourceversion-410.json")).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), real);
}

#[test]
fn watch_events_look_like_the_real_ones() {
    let server = TestApiServer::start();
    let real: Vec<Value> =
        fixture("watch-endpointslices-changes.jsonl").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // Replay the captured changes into the server, then watch from rv 0
    // (current state) with bookmarks, for a moment.
    for event in &real {
        let object = event["object"].clone();
        match event["type"].as_str().unwrap() {
            "ADDED" | "MODIFIED" => {
                server.put(object);
            }
            "DELETED" => {
                let meta = &object["metadata"];
                server.delete(
                    proxy_testkit::apiserver::Kind::EndpointSlice,
                    meta["namespace"].as_str().unwrap(),
                    meta["name"].as_str().unwrap(),
                );
            }
            _ => {}
        }
    }
    let (code, body) =
        get(&server, "/apis/discovery.k8s.io/v1/endpointslices?watch=true&allowWatchBookmarks=true&timeoutSeconds=1");
    assert_eq!(code, 200);
    let ours: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let added: Vec<&Value> = ours.iter().filter(|e| e["type"] == "ADDED").collect();
    assert_eq!(added.len(), 4, "five slices, one deleted");
    let real_added = real.iter().find(|e| e["type"] == "ADDED").unwrap();
    assert_eq!(keys(added[0]), keys(real_added));
    assert_eq!(added[0]["object"]["kind"], real_added["object"]["kind"]);
    assert_eq!(added[0]["object"]["apiVersion"], real_added["object"]["apiVersion"]);
    let bookmark = ours.iter().find(|e| e["type"] == "BOOKMARK").expect("a bookmark within 1 s");
    let real_bookmark = real.iter().find(|e| e["type"] == "BOOKMARK").unwrap();
    assert_eq!(bookmark["object"]["kind"], real_bookmark["object"]["kind"]);
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());

    // A watch from before a compaction gets an ERROR event with a 410 Status.
    server.compact();
    let (code, body) = get(&server, "/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion=1");
    assert_eq!(code, 200);
    let error: Value = serde_json::from_str(body.lines().next().unwrap()).unwrap();
    assert_eq!(error["type"], "ERROR");
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
}

/// What `kubectl apply` sends to create a captured object: its
/// last-applied configuration with that annotation added (everything else
/// in the capture is what the server added).
fn as_kubectl_sent(captured: &Value) -> Value {
    let applied = captured["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .expect("a captured object written by kubectl apply");
    let mut sent: Value = serde_json::from_str(applied).unwrap();
    sent["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = Value::from(applied);
    sent
}

fn post(server: &TestApiServer, path_and_query: &str, object: &Value) -> u16 {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "3",
            "-H",
            "content-type: application/json",
        ])
        .args(["--data-binary", &object.to_string()])
        .arg(format!("{}{path_and_query}", server.url()))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).parse().expect("status code")
}

/// Served and captured sizes (compact JSON, bytes) of each captured list
/// item, after writing what kubectl sent for it as kubectl does
/// (`fieldManager=kubectl-client-side-apply`) and listing it back.
fn sizes(server: &TestApiServer, captured_list: &str, collection: &str) -> Vec<(String, usize, usize)> {
    let real: Value = serde_json::from_str(&fixture(captured_list)).unwrap();
    let items = real["items"].as_array().unwrap();
    for item in items {
        let ns = item["metadata"]["namespace"].as_str().unwrap();
        let path = collection.replace("{ns}", ns);
        assert_eq!(
            post(server, &format!("{path}?fieldManager=kubectl-client-side-apply"), &as_kubectl_sent(item)),
            201
        );
    }
    let (code, body) = get(server, &collection.replace("{ns}", "shop"));
    assert_eq!(code, 200);
    let ours: Value = serde_json::from_str(&body).unwrap();
    items
        .iter()
        .map(|r| {
            let name = r["metadata"]["name"].as_str().unwrap();
            let o = ours["items"].as_array().unwrap().iter().find(|o| o["metadata"]["name"] == name).expect("served");
            let managers: Vec<&Value> =
                o["metadata"]["managedFields"].as_array().unwrap().iter().map(|e| &e["manager"]).collect();
            assert_eq!(managers, [&Value::from("kubectl-client-side-apply")], "{name}: the writer's entry");
            assert_eq!(
                o["metadata"]["managedFields"][0]["fieldsV1"], r["metadata"]["managedFields"][0]["fieldsV1"],
                "{name}: the writer's field set"
            );
            (name.to_owned(), o.to_string().len(), r.to_string().len())
        })
        .collect()
}

#[test]
fn objects_are_served_as_large_as_a_real_server_serves_them() {
    let server = TestApiServer::start();
    let mut all = sizes(&server, "services-list-page1.json", "/api/v1/namespaces/{ns}/services");
    all.extend(sizes(&server, "endpointslices-list.json", "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"));
    assert_eq!(all.len(), 7, "two services, five slices");
    // Within 15% object by object (resourceVersions, allocated addresses
    // and uids differ in length, nothing else should).
    for (name, ours, real) in &all {
        eprintln!("{name}: served {ours} bytes, captured {real}");
        let ratio = f64::from(u32::try_from(*ours).unwrap()) / f64::from(u32::try_from(*real).unwrap());
        assert!((0.85..=1.15).contains(&ratio), "{name}: served {ours} bytes, the real server {real} ({ratio:.2}×)");
    }
}

fn protobuf_fixture(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-apiserver-protobuf").join(name))
        .expect("fixture")
}

/// A protobuf varint at the start of `b`, and its length.
fn varint(b: &[u8]) -> (u64, usize) {
    let mut value = 0;
    for (i, byte) in b.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if *byte < 0x80 {
            return (value, i + 1);
        }
    }
    panic!("a varint");
}

/// The length-delimited fields numbered `tag` of message `b`, as bytes
/// (the other fields skipped).
fn fields(b: &[u8], tag: u64) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let (key, n) = varint(&b[at..]);
        at += n;
        match key & 7 {
            0 => at += varint(&b[at..]).1,
            2 => {
                let (len, n) = varint(&b[at..]);
                let field = &b[at + n..at + n + usize::try_from(len).unwrap()];
                if key >> 3 == tag {
                    out.push(field);
                }
                at += n + field.len();
            }
            wire => panic!("wire type {wire}"),
        }
    }
    out
}

/// The items of a protobuf list body: `k8s\0`, Unknown's raw (2), the
/// list's items (2).
fn protobuf_items(body: &[u8]) -> Vec<&[u8]> {
    let unknown = body.strip_prefix(b"k8s\0").expect("the protobuf envelope");
    fields(fields(unknown, 2)[0], 2)
}

/// The test server's protobuf for each object a real kube-apiserver sent
/// is the real protobuf but for the empty strings and zeros Go writes and
/// JSON leaves out: the same size within 10%, and the agent decodes the
/// two alike.
#[test]
fn protobuf_objects_are_encoded_as_a_real_server_encodes_them() {
    use ebpf_proxy::source::{
        lean::{LeanService, LeanSlice},
        protobuf::Decode,
    };
    use proxy_testkit::apiserver::{Kind, protobuf};
    for (kind, name) in [(Kind::Service, "services-list"), (Kind::EndpointSlice, "endpointslices-list")] {
        let real_pb = protobuf_fixture(&format!("{name}.pb"));
        let real_json: Value = serde_json::from_slice(&protobuf_fixture(&format!("{name}.json"))).unwrap();
        let real_items = protobuf_items(&real_pb);
        let json_items = real_json["items"].as_array().unwrap();
        assert_eq!(real_items.len(), json_items.len());
        for (real, json) in real_items.iter().zip(json_items) {
            let ours = protobuf::item(kind, json);
            let ratio = f64::from(u32::try_from(ours.len()).unwrap()) / f64::from(u32::try_from(real.len()).unwrap());
            let what = &json["metadata"]["name"];
            assert!(
                (0.9..=1.0).contains(&ratio),
                "{what}: {} bytes, the real server's {} ({ratio:.3}×)",
                ours.len(),
                real.len()
            );
            if kind == Kind::Service {
                assert_eq!(
                    LeanService::from_protobuf(&ours).unwrap(),
                    LeanService::from_protobuf(real).unwrap(),
                    "{what}"
                );
            } else {
                assert_eq!(LeanSlice::from_protobuf(&ours).unwrap(), LeanSlice::from_protobuf(real).unwrap(), "{what}");
            }
        }
    }
}

fn get_as(server: &TestApiServer, path_and_query: &str, accept: &str) -> (u16, String, Vec<u8>) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "-", "-D", "/dev/stderr", "--max-time", "3", "-H", &format!("accept: {accept}")])
        .arg(format!("{}{path_and_query}", server.url()))
        .output()
        .expect("curl");
    let headers = String::from_utf8_lossy(&out.stderr).to_lowercase();
    let code = headers.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    let content_type = headers.lines().find_map(|l| l.strip_prefix("content-type: ")).unwrap_or_default();
    (code, content_type.trim().to_owned(), out.stdout)
}

const PROTOBUF_FIRST: &str = "application/vnd.kubernetes.protobuf, application/json";

fn slice_object(i: usize, address: &str) -> Value {
    serde_json::json!({
        "kind": "EndpointSlice",
        "metadata": {"name": format!("s{i}"), "namespace": "ns", "labels": {"kubernetes.io/service-name": "svc"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}, "nodeName": "n1"}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })
}

/// As kube-apiserver: a list with a resourceVersion comes from the watch
/// cache whole (`limit` ignored), one without is paged; protobuf when
/// asked for, as the real envelope has it; an expired continue token's
/// 410 in protobuf too.
#[test]
fn lists_are_paged_only_from_etcd_and_served_in_protobuf_when_asked() {
    let server = TestApiServer::start();
    for i in 0..7 {
        server.put(slice_object(i, "10.0.0.1"));
    }
    let path = "/apis/discovery.k8s.io/v1/endpointslices";
    let (code, content_type, body) = get_as(&server, &format!("{path}?limit=3&resourceVersion=0"), PROTOBUF_FIRST);
    assert_eq!((code, content_type.as_str()), (200, "application/vnd.kubernetes.protobuf"));
    let real = protobuf_fixture("endpointslices-list.pb");
    let unknown = |b: &[u8]| fields(b.strip_prefix(b"k8s\0").unwrap(), 1)[0].to_vec();
    assert_eq!(unknown(&body), unknown(&real), "the typeMeta: discovery.k8s.io/v1, EndpointSliceList");
    assert_eq!(protobuf_items(&body).len(), 7, "the whole list from the cache");
    let mut decoded = 0;
    ebpf_proxy::source::protobuf::read_list::<ebpf_proxy::source::lean::LeanSlice>(&body[..], |listed| {
        decoded += usize::from(matches!(listed, ebpf_proxy::source::protobuf::Listed::Item(_)));
        assert!(decoded < 100, "runs on");
        true
    })
    .unwrap();
    assert_eq!(decoded, 7, "the agent reads it");
    let (_, _, page) = get_as(&server, &format!("{path}?limit=3"), PROTOBUF_FIRST);
    assert_eq!(protobuf_items(&page).len(), 3, "a page from etcd");
    let (code, content_type, json) = get_as(&server, &format!("{path}?limit=3"), "application/json");
    assert_eq!((code, content_type.as_str()), (200, "application/json"));
    let json: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(json["items"].as_array().unwrap().len(), 3);
    let token = json["metadata"]["continue"].as_str().unwrap().to_owned();
    server.put(slice_object(8, "10.0.0.1"));
    server.compact();
    let (code, content_type, body) = get_as(&server, &format!("{path}?limit=3&continue={token}"), PROTOBUF_FIRST);
    assert_eq!((code, content_type.as_str()), (410, "application/vnd.kubernetes.protobuf"));
    let status = ebpf_proxy::source::protobuf::status(&body).unwrap();
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    // Nodes are answered in JSON, which the client accepts besides.
    server.put(serde_json::json!({"kind": "Node", "metadata": {"name": "n1"}}));
    assert_eq!(get_as(&server, "/api/v1/nodes", PROTOBUF_FIRST).1, "application/json");
}

mod list_watch {
    use std::{pin::pin, sync::Arc, time::Duration};

    use ebpf_proxy::source::{
        lean::LeanSlice,
        listwatch::{ApiBytes, ContentType, ListWatch},
    };
    use futures::{Stream, StreamExt as _};
    use kube::runtime::watcher::{Error, Event};
    use proxy_testkit::{apiserver::TestApiServer, kubeconfig_yaml};

    use super::slice_object;

    const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

    type Events = dyn Stream<Item = Result<Event<LeanSlice>, Error>> + Send;

    fn address(slice: &LeanSlice) -> String {
        slice.0.endpoints.as_ref().unwrap()[0].addresses[0].clone()
    }

    /// The events up to the end of the next list: the names listed, and
    /// the errors before.
    async fn next_list(events: &mut std::pin::Pin<&mut Events>) -> (Vec<String>, Vec<Error>) {
        let (mut names, mut errors) = (Vec::new(), Vec::new());
        loop {
            match events.next().await.expect("the stream goes on") {
                Ok(Event::Init) => names.clear(),
                Ok(Event::InitApply(slice)) => names.push(slice.0.metadata.name.clone().unwrap()),
                Ok(Event::InitDone) => return (names, errors),
                Ok(_) => {}
                Err(err) => {
                    errors.push(err);
                    assert!(errors.len() < 50, "failing again and again: {errors:?}");
                    // As the watch tasks do (`source::retry`), a little.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// The next change a watch brings.
    async fn next_change(events: &mut std::pin::Pin<&mut Events>) -> Event<LeanSlice> {
        loop {
            if let Ok(event @ (Event::Apply(_) | Event::Delete(_))) = events.next().await.expect("the stream goes on") {
                return event;
            }
        }
    }

    fn lists(server: &TestApiServer) -> Vec<proxy_testkit::apiserver::Logged> {
        server.requests().into_iter().filter(|r| r.path == SLICES && !r.watch).collect()
    }

    /// The agent's lists and watches against the test server: the first
    /// list from the watch cache in one protobuf response, changes through
    /// a protobuf watch, a relist after 410 Gone from the cache at no older
    /// than what was seen, and JSON from a server that answers in it.
    #[test]
    fn lists_come_from_the_watch_cache_in_protobuf_and_json_is_still_read() {
        let mut server = TestApiServer::start();
        let many = usize::try_from(ebpf_proxy::source::listwatch::QUORUM_PAGE_SIZE).unwrap() * 2 + 17;
        for i in 0..many {
            server.put(slice_object(i, "10.0.0.1"));
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&server.url())).unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let options =
                ebpf_proxy::source::kube::ClientOptions { kubeconfig: Some(kubeconfig.clone()), ..Default::default() };
            let (client, _) = ebpf_proxy::source::kube::client(&options, Vec::new()).await.unwrap();
            let bytes = Arc::new(ApiBytes::default());
            let lw = ListWatch::new(client.clone(), SLICES, None, ContentType::Protobuf, bytes.clone());
            let mut events: std::pin::Pin<&mut Events> = pin!(lw.stream::<LeanSlice>());
            let guard = Duration::from_mins(1);

            let (names, errors) = tokio::time::timeout(guard, next_list(&mut events)).await.expect("listed");
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(names.len(), many);
            let first = lists(&server);
            assert_eq!(first.len(), 1, "one request: {first:?}");
            assert!(first[0].query.contains("resourceVersion=0"), "{first:?}");
            assert!(first[0].accept.starts_with("application/vnd.kubernetes.protobuf"), "{first:?}");
            let listed = bytes.list_protobuf.load(std::sync::atomic::Ordering::Relaxed);
            assert!(listed > 0);
            assert_eq!(bytes.list_json.load(std::sync::atomic::Ordering::Relaxed), 0);

            server.put(slice_object(3, "10.0.0.2"));
            let Event::Apply(changed) = tokio::time::timeout(guard, next_change(&mut events)).await.expect("a change")
            else {
                panic!("an update")
            };
            assert_eq!((changed.0.metadata.name.as_deref(), address(&changed).as_str()), (Some("s3"), "10.0.0.2"));
            assert!(bytes.watch_protobuf.load(std::sync::atomic::Ordering::Relaxed) > 0);

            // The server goes away; what the watch saw is compacted away
            // meanwhile: 410 Gone, and a relist.
            server.stop();
            // The watch breaks first: a change written before would still
            // reach it through its closing connection.
            let broke = async { while events.next().await.expect("the stream goes on").is_ok() {} };
            tokio::time::timeout(guard, broke).await.expect("the watch broke");
            server.put(slice_object(many, "10.0.0.1"));
            server.compact();
            // (The server's own runtime cannot be entered from this one.)
            std::thread::scope(|s| s.spawn(|| server.start_again()).join().unwrap());
            let (names, errors) = tokio::time::timeout(guard, next_list(&mut events)).await.expect("relisted");
            assert_eq!(names.len(), many + 1);
            assert!(
                errors.iter().any(|e| matches!(e, Error::WatchError(s) if s.code == 410)),
                "a watch from a compacted version: {errors:?}"
            );
            let relist = lists(&server).pop().unwrap();
            assert!(relist.query.contains("resourceVersionMatch=NotOlderThan"), "{relist:?}");
            assert!(!relist.query.contains("limit="), "the cache, whole: {relist:?}");
            assert!(!relist.query.contains("resourceVersion=0"), "{relist:?}");

            // A server that answers in JSON only.
            server.serve_json_only();
            let lw = ListWatch::new(client, SLICES, None, ContentType::Protobuf, bytes.clone());
            let mut events: std::pin::Pin<&mut Events> = pin!(lw.stream::<LeanSlice>());
            let (names, _) = tokio::time::timeout(guard, next_list(&mut events)).await.expect("listed in JSON");
            assert_eq!(names.len(), many + 1);
            assert!(bytes.list_json.load(std::sync::atomic::Ordering::Relaxed) > 0);
            server.put(slice_object(5, "10.0.0.3"));
            let Event::Apply(changed) = tokio::time::timeout(guard, next_change(&mut events)).await.expect("a change")
            else {
                panic!("an update")
            };
            assert_eq!(address(&changed), "10.0.0.3");
        });
    }

    /// Until the API server answers, a list is an error alone, never an
    /// `Init` between errors (each event starts the watch's retry delays
    /// afresh, `source::retry`, so they would never grow).
    #[test]
    fn a_list_nobody_answers_is_an_error_alone() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&format!("http://127.0.0.1:{port}"))).unwrap();
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let options =
                ebpf_proxy::source::kube::ClientOptions { kubeconfig: Some(kubeconfig.clone()), ..Default::default() };
            let (client, _) = ebpf_proxy::source::kube::client(&options, Vec::new()).await.unwrap();
            let lw = ListWatch::new(client, SLICES, None, ContentType::Protobuf, Arc::new(ApiBytes::default()));
            let mut events: std::pin::Pin<&mut Events> = pin!(lw.stream::<LeanSlice>());
            for _ in 0..3 {
                let next = tokio::time::timeout(Duration::from_secs(30), events.next()).await.expect("an answer");
                assert!(matches!(next, Some(Err(Error::InitialListFailed(_)))), "{next:?}");
            }
        });
    }
}
