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
    let list: Value = serde_yaml::from_str(&fixture("services.yaml")).unwrap();
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
