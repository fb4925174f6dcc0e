//! The test API server answers in the shapes a real kube-apiserver does:
//! its list pages, watch events and 410 bodies are compared with the
//! captures in tests/fixtures/real-apiserver.
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
