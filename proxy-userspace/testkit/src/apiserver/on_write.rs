//! What a real kube-apiserver adds to an object on write, so that the test
//! server serves objects as large as a real one (the captures in
//! `tests/fixtures/real-apiserver` are ~1.7× the bare objects, mostly
//! `metadata.managedFields`):
//!
//! - the defaults of the versioned API (a Service's `type`,
//!   `sessionAffinity`, `internalTrafficPolicy`, each port's `protocol` and
//!   `targetPort`), which count as the writer's fields;
//! - the `metadata.managedFields` entry of the writer (operation `Update`,
//!   `FieldsV1`), computed from the fields it wrote, replacing its previous
//!   entry and keeping the other managers' entries;
//! - `metadata.generation` on EndpointSlices (1, then one more per write;
//!   Services have none in the captures, as in Kubernetes 1.24).
//!
//! What the registry allocates afterwards (ClusterIPs, IP families, node
//! ports) is not in the writer's set, as in the captures.
use serde_json::{Map, Value, json};

use super::Kind;

/// The timestamp every write carries (a fixed one: the size is what
/// matters, and tests stay reproducible).
pub const TIMESTAMP: &str = "2026-11-22T00:00:00Z";

/// Fills in the versioned API's defaults for `kind`.
pub fn apply_defaults(kind: Kind, object: &mut Value) {
    if kind != Kind::Service {
        return;
    }
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("type").or_insert(json!("ClusterIP"));
    spec.entry("sessionAffinity").or_insert(json!("None"));
    spec.entry("internalTrafficPolicy").or_insert(json!("Cluster"));
    for port in spec.get_mut("ports").and_then(Value::as_array_mut).into_iter().flatten() {
        let Some(port) = port.as_object_mut() else { continue };
        port.entry("protocol").or_insert(json!("TCP"));
        if let Some(number) = port.get("port").cloned() {
            port.entry("targetPort").or_insert(number);
        }
    }
}

/// Stores the writer's `managedFields` entry for `object` (whose
/// `apiVersion` is set), keeping other managers' entries from `previous`.
pub fn record_manager(object: &mut Value, previous: Option<&Value>, manager: &str) {
    let fields = fields_v1(object);
    let api_version = object.get("apiVersion").cloned().unwrap_or(Value::Null);
    let mut entries: Vec<Value> = previous
        .and_then(|p| p.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("manager").and_then(Value::as_str) != Some(manager))
        .cloned()
        .collect();
    entries.push(json!({
        "manager": manager, "operation": "Update", "apiVersion": api_version,
        "time": TIMESTAMP, "fieldsType": "FieldsV1", "fieldsV1": fields,
    }));
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// `metadata.generation` after a write: 1 for a new EndpointSlice, one
/// more than before for a replaced one; none for the other kinds.
pub fn set_generation(kind: Kind, object: &mut Value, previous: Option<&Value>) {
    if kind != Kind::EndpointSlice {
        return;
    }
    let before = previous.and_then(|p| p.pointer("/metadata/generation")).and_then(Value::as_u64).unwrap_or(0);
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("generation".into(), json!(before + 1));
    }
}

/// Metadata fields the server owns: never in a writer's field set.
const SERVER_OWNED: [&str; 7] =
    ["name", "namespace", "uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"];

/// The `FieldsV1` set of the fields `object` carries, in the structured
/// merge diff's notation: `f:NAME` per field, `.` for a nested map that is
/// itself owned, `k:{...}` per item of a list merged by key (a Service's
/// ports by port and protocol, owner references by uid); atomic lists and
/// maps (`selector`, a slice's `endpoints` and `ports`) are one leaf.
#[must_use]
pub fn fields_v1(object: &Value) -> Value {
    let mut out = Map::new();
    for (key, value) in object.as_object().into_iter().flatten() {
        match key.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                let mut meta = Map::new();
                for (k, v) in value.as_object().into_iter().flatten() {
                    if !SERVER_OWNED.contains(&k.as_str()) {
                        meta.insert(format!("f:{k}"), owned(&[key, k], v));
                    }
                }
                if !meta.is_empty() {
                    out.insert("f:metadata".into(), Value::Object(meta));
                }
            }
            _ => {
                let set = match value.as_object() {
                    Some(map) => Value::Object(children(&[key], map)),
                    None => owned(&[key], value),
                };
                out.insert(format!("f:{key}"), set);
            }
        }
    }
    Value::Object(out)
}

/// The set under a field at `path` that is owned itself (so a nested map
/// gets `.`).
fn owned(path: &[&String], value: &Value) -> Value {
    let names: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
    let atomic = matches!(names.as_slice(), ["spec", "selector"]);
    match value {
        Value::Object(map) if !atomic => {
            let mut set = children(path, map);
            set.insert(".".into(), json!({}));
            Value::Object(set)
        }
        Value::Array(items) => match list_keys(&names) {
            Some((keys, expand)) => {
                let mut set = Map::new();
                set.insert(".".into(), json!({}));
                for item in items {
                    let key: Map<String, Value> =
                        keys.iter().filter_map(|k| Some(((*k).to_owned(), item.get(*k)?.clone()))).collect();
                    let entry = match item.as_object() {
                        Some(fields) if expand => {
                            let mut entry = children(path, fields);
                            entry.insert(".".into(), json!({}));
                            Value::Object(entry)
                        }
                        _ => json!({}),
                    };
                    set.insert(format!("k:{}", Value::Object(key)), entry);
                }
                Value::Object(set)
            }
            None => json!({}),
        },
        _ => json!({}),
    }
}

fn children(path: &[&String], map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .map(|(k, v)| {
            let mut below: Vec<&String> = path.to_vec();
            below.push(k);
            (format!("f:{k}"), owned(&below, v))
        })
        .collect()
}

/// The merge keys of a keyed list at `path`, and whether its items' own
/// fields are listed (as for a Service's ports) or the item is one leaf
/// (as for owner references in the captures).
fn list_keys(path: &[&str]) -> Option<(&'static [&'static str], bool)> {
    match path {
        ["spec", "ports"] => Some((&["port", "protocol"], true)),
        ["metadata", "ownerReferences"] => Some((&["uid"], false)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_field_set_is_the_captured_one() {
        // tests/fixtures/real-apiserver/services-list-page1.json, service db.
        let mut db = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "db", "namespace": "shop", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}], "selector": {"app": "db"}}});
        apply_defaults(Kind::Service, &mut db);
        let expected = json!({
            "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
            "f:spec": {"f:clusterIP": {}, "f:internalTrafficPolicy": {},
                "f:ports": {".": {}, "k:{\"port\":5432,\"protocol\":\"TCP\"}": {
                    ".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}});
        assert_eq!(fields_v1(&db), expected);
    }

    #[test]
    fn a_writer_replaces_its_own_entry_and_keeps_the_others() {
        let mut slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "s", "ownerReferences": [{"uid": "u1", "kind": "Service"}]},
            "addressType": "IPv4", "endpoints": [], "ports": []});
        record_manager(&mut slice, None, "a");
        set_generation(Kind::EndpointSlice, &mut slice, None);
        let first = slice.clone();
        record_manager(&mut slice, Some(&first), "b");
        set_generation(Kind::EndpointSlice, &mut slice, Some(&first));
        let again = slice.clone();
        record_manager(&mut slice, Some(&again), "a");
        let managers: Vec<&str> = slice["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, ["b", "a"]);
        assert_eq!(slice["metadata"]["generation"], 2);
        assert_eq!(
            slice["metadata"]["managedFields"][1]["fieldsV1"],
            json!({"f:addressType": {}, "f:endpoints": {}, "f:ports": {},
                   "f:metadata": {"f:ownerReferences": {".": {}, "k:{\"uid\":\"u1\"}": {}}}})
        );
    }
}
