//! The services file: a YAML stream of `v1/Service` and
//! `discovery.k8s.io/v1/EndpointSlice` objects (and `v1/Node` objects, of
//! which the agent's own gives its zone), as `kubectl get -o yaml`
//! prints them. `kind: List` documents and typed lists (`ServiceList`, as the
//! API returns them) are unpacked.
use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_norway::Value;

use super::Objects;

/// Why the file, or one object of it, was not applied: the `reason` label
/// of `ebpf_proxy_services_file_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Rejection {
    /// The file cannot be read (missing, no permission).
    Unreadable,
    /// The file is not YAML.
    NotYaml,
    /// The file holds no object; applied only once it stays so.
    Empty,
    /// An object of a kind the agent does not read.
    UnknownKind,
    /// An object of a known kind whose fields are wrong.
    InvalidObject,
    /// A second object of the same kind, namespace and name (the first
    /// one in the file is used).
    Duplicate,
    /// YAML aliases that expand too far, or nesting too deep (a YAML bomb).
    YamlBomb,
    /// A file larger than `MAX_BYTES`.
    TooLarge,
    /// A file with objects none of which is usable (each rejected for its
    /// own reason): refused whole, as garbage that happens to parse as
    /// YAML would otherwise remove every service.
    NoUsableObject,
}

impl Rejection {
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Unreadable => "unreadable",
            Self::NotYaml => "not_yaml",
            Self::Empty => "empty",
            Self::UnknownKind => "unknown_kind",
            Self::InvalidObject => "invalid_object",
            Self::Duplicate => "duplicate",
            Self::YamlBomb => "yaml_bomb",
            Self::TooLarge => "too_large",
            Self::NoUsableObject => "no_usable_object",
        }
    }
}

/// The file as a whole could not be read; nothing from it is used.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's #[error] message")]
pub enum FileError {
    /// The file cannot be read.
    #[error("cannot read services file {path}: {source}; the last good content stays in effect")]
    Read { path: PathBuf, source: io::Error },
    /// The file is not valid YAML.
    #[error("services file {path} is not valid YAML: {source}; the last good content stays in effect")]
    Yaml { path: PathBuf, source: serde_norway::Error },
    /// The file's aliases expand too far.
    #[error(
        "services file {path} is a YAML bomb ({source}: its aliases expand to over 100 times the document, or it nests too deep); write the objects out without aliases; the last good content stays in effect"
    )]
    Bomb { path: PathBuf, source: serde_norway::Error },
    /// The file is too large.
    #[error(
        "services file {path} is {size} bytes, more than the {max} bytes a services file may have; the last good content stays in effect"
    )]
    TooLarge { path: PathBuf, size: u64, max: u64 },
}

impl FileError {
    #[must_use]
    pub(crate) const fn rejection(&self) -> Rejection {
        match self {
            Self::Read { .. } => Rejection::Unreadable,
            Self::Yaml { .. } => Rejection::NotYaml,
            Self::Bomb { .. } => Rejection::YamlBomb,
            Self::TooLarge { .. } => Rejection::TooLarge,
        }
    }
}

/// One object of the file that is skipped, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectError {
    /// 1-based index of the YAML document in the stream.
    pub(crate) document: usize,
    /// `Kind namespace/name` where the object says so.
    pub(crate) object: String,
    /// Path of the offending field, `.` when the object as a whole is wrong.
    pub(crate) field: String,
    pub(crate) message: String,
    pub(crate) rejection: Rejection,
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "document {}: {}: {}: {}; object skipped", self.document, self.object, self.field, self.message)
    }
}

/// The parsed file: the objects that are valid and the ones that are not.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The valid objects.
    pub objects: Objects,
    /// The objects left out, and why.
    pub errors: Vec<ObjectError>,
    /// Services left out as kube-proxy leaves them out (its label
    /// selector): `Kind namespace/name` and the label.
    pub not_proxied: Vec<(String, &'static str)>,
    /// `Kind namespace/name` of each object taken -> where it was.
    taken: HashMap<String, String>,
}

impl Parsed {
    /// Notes `object` as taken from `document`; the first of a kind,
    /// namespace and name wins (a later one is an error naming both). An
    /// EndpointSlice of a name taken is dropped whole, not merged.
    fn take(&mut self, object: &str, document: usize, prefix: &str) -> Result<(), (String, String, Rejection)> {
        let here = match prefix.trim_end_matches('.') {
            "" => format!("document {document}"),
            item => format!("document {document} {item}"),
        };
        match self.taken.get(object) {
            Some(first) if !object.ends_with("/<unnamed>") => Err((
                ".".into(),
                format!("{here} has the same kind, namespace and name as {first}; the first one is used"),
                Rejection::Duplicate,
            )),
            _ => {
                self.taken.entry(object.to_owned()).or_insert(here);
                Ok(())
            }
        }
    }

    /// The file held no object at all, good or bad (empty, only comments or
    /// `---`).
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        let Objects { services, slices, nodes } = &self.objects;
        services.is_empty()
            && slices.is_empty()
            && nodes.is_empty()
            && self.errors.is_empty()
            && self.not_proxied.is_empty()
    }

    /// The file held objects but every one was rejected: nothing in it is
    /// a Service, EndpointSlice or Node the agent can use, nor a Service
    /// deliberately left out by label.
    #[must_use]
    pub(crate) fn nothing_usable(&self) -> bool {
        let Objects { services, slices, nodes } = &self.objects;
        !self.errors.is_empty()
            && services.is_empty()
            && slices.is_empty()
            && nodes.is_empty()
            && self.not_proxied.is_empty()
    }
}

/// Reads and parses `path`.
pub fn load(path: &Path) -> Result<Parsed, FileError> {
    load_at_most(path, MAX_BYTES)
}

/// A services file may be this large: 256 MiB, about eight times 10,000
/// Services with 10 endpoints each as `kubectl get -o yaml` prints them
/// (managedFields included). A larger file is refused whole, so a runaway
/// writer cannot make the agent hold it in memory.
pub(crate) const MAX_BYTES: u64 = 256 << 20;

/// Reads and parses `path`, refusing it when it is larger than `max` bytes.
pub(crate) fn load_at_most(path: &Path, max: u64) -> Result<Parsed, FileError> {
    use std::io::Read as _;
    let read = |source| FileError::Read { path: path.into(), source };
    let file = fs::File::open(path).map_err(read)?;
    let mut text = String::new();
    // One byte more than allowed tells a file over the limit, also one that
    // grows while it is read.
    file.take(max.saturating_add(1)).read_to_string(&mut text).map_err(read)?;
    let size = text.len() as u64;
    if size > max {
        let size = fs::metadata(path).map_or(size, |m| m.len().max(size));
        return Err(FileError::TooLarge { path: path.into(), size, max });
    }
    parse(&text).map_err(|source| {
        // serde_norway's limits on alias expansion and nesting (it names
        // them only in the message).
        let message = source.to_string();
        if message.starts_with("repetition limit exceeded") || message.starts_with("recursion limit exceeded") {
            FileError::Bomb { path: path.into(), source }
        } else {
            FileError::Yaml { path: path.into(), source }
        }
    })
}

/// Parses a YAML stream. A syntax error fails the whole stream (its extent is
/// unknown); an object of the wrong shape is skipped and reported.
pub fn parse(text: &str) -> Result<Parsed, serde_norway::Error> {
    let mut parsed = Parsed::default();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc)?;
        let document = i + 1;
        if value.is_null() {
            continue; // an empty document, e.g. a trailing `---`
        }
        if let Some(kind) = kind_of(&value).filter(|k| k.ends_with("List")) {
            // `kind: List` from kubectl, or a typed list (`ServiceList`) as
            // the API returns it, whose items carry no kind or apiVersion.
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty()).map(str::to_owned);
            let api_version = value.get("apiVersion").cloned();
            match value.get("items").and_then(Value::as_sequence) {
                Some(items) => {
                    for (j, item) in items.iter().enumerate() {
                        let mut item = item.clone();
                        if let (Some(map), Some(k)) = (item.as_mapping_mut(), &item_kind) {
                            map.entry("kind".into()).or_insert_with(|| k.as_str().into());
                            if let Some(v) = &api_version {
                                map.entry("apiVersion".into()).or_insert_with(|| v.clone());
                            }
                        }
                        add_object(&mut parsed, document, &format!("items[{j}]."), item);
                    }
                }
                None => parsed.errors.push(ObjectError {
                    document,
                    object: kind.to_owned(),
                    field: "items".into(),
                    message: "a list needs an `items` sequence".into(),
                    rejection: Rejection::InvalidObject,
                }),
            }
        } else {
            add_object(&mut parsed, document, "", value);
        }
    }
    Ok(parsed)
}

fn kind_of(value: &Value) -> Option<&str> {
    value.get("kind").and_then(Value::as_str)
}

fn describe(value: &Value) -> String {
    let kind = kind_of(value).unwrap_or("<no kind>");
    let meta = value.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or(crate::model::UNNAMED);
    let ns = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or(crate::model::DEFAULT_NAMESPACE);
    format!("{kind} {ns}/{name}")
}

fn add_object(parsed: &mut Parsed, document: usize, prefix: &str, value: Value) {
    let object = describe(&value);
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    let invalid = |(field, message)| (field, message, Rejection::InvalidObject);
    let result = match (api_version, kind_of(&value)) {
        (Some("v1"), Some("Service")) => typed::<Service>(value).map_err(invalid).and_then(|s| {
            parsed.take(&object, document, prefix)?;
            match super::labels::not_proxied_by(s.metadata.labels.as_ref()) {
                Some(label) => parsed.not_proxied.push((object.clone(), label)),
                None => parsed.objects.services.push(s),
            }
            Ok(())
        }),
        (Some("discovery.k8s.io/v1"), Some("EndpointSlice")) => {
            typed::<EndpointSlice>(value).map_err(invalid).and_then(|s| {
                parsed.take(&object, document, prefix)?;
                parsed.objects.slices.push(s);
                Ok(())
            })
        }
        (Some("v1"), Some("Node")) => typed::<Node>(value).map_err(invalid).and_then(|n| {
            parsed.take(&object, document, prefix)?;
            parsed.objects.nodes.push(n);
            Ok(())
        }),
        (_, Some("Endpoints")) => Err((
            ".".into(),
            "legacy v1/Endpoints are not read; use discovery.k8s.io/v1 EndpointSlices".into(),
            Rejection::UnknownKind,
        )),
        (api, kind) => Err((
            ".".into(),
            format!(
                "apiVersion {:?} kind {:?} is not a v1/Service, discovery.k8s.io/v1/EndpointSlice or v1/Node",
                api.unwrap_or(""),
                kind.unwrap_or("")
            ),
            Rejection::UnknownKind,
        )),
    };
    if let Err((field, message, rejection)) = result {
        let field = if field == "." && !prefix.is_empty() {
            prefix.trim_end_matches('.').to_owned()
        } else {
            format!("{prefix}{field}")
        };
        parsed.errors.push(ObjectError { document, object, field, message, rejection });
    }
}

/// Deserializes with the failing field's path in the error.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        (path, message)
    })
}

/// Identity of the file's content on disk, to notice changes cheaply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

/// The file's stamp, or `None` when it cannot be read.
#[must_use]
pub(crate) fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = fs::metadata(path).ok()?;
    Some(Stamp { modified: meta.modified().ok(), len: meta.len(), inode: meta.ino() })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_type_error_names_document_object_and_field() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: x}\nspec:\n  ports:\n  - {port: eighty}\n";
        let parsed = parse(yaml).unwrap();
        assert_eq!(parsed.objects.services.len(), 1);
        let err = &parsed.errors[0];
        assert_eq!((err.document, err.object.as_str(), err.field.as_str()), (2, "Service x/bad", "spec.ports[0].port"));
    }

    #[test]
    fn other_kinds_and_legacy_endpoints_are_rejected() {
        let yaml = "apiVersion: v1\nkind: Endpoints\nmetadata: {name: e}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n";
        let parsed = parse(yaml).unwrap();
        assert_eq!(parsed.errors.len(), 2);
        assert!(parsed.errors[0].message.contains("EndpointSlices"));
        assert!(parsed.errors[1].message.contains("apps/v1"));
        assert!(parsed.errors.iter().all(|e| e.rejection == super::Rejection::UnknownKind));
    }

    #[test]
    fn list_items_are_unpacked_with_their_path() {
        let yaml = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a}}\n- {apiVersion: v1, kind: Service, metadata: {name: b}, spec: {ports: 3}}\n";
        let parsed = parse(yaml).unwrap();
        assert_eq!(parsed.objects.services.len(), 1);
        assert_eq!(parsed.errors[0].field, "items[1].spec.ports");
    }

    /// No kube-proxy counterpart (the API server cannot hold two objects of
    /// one name); the first wins, so appending to a file never changes what
    /// is already served.
    #[test]
    fn the_first_of_two_objects_of_one_name_wins_and_the_second_is_named() {
        let svc = |ip: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: x}}\nspec: {{clusterIP: {ip}}}\n---\n"
            )
        };
        let slice = |ip: &str| {
            format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: x}}\naddressType: IPv4\nendpoints: [{{addresses: [{ip}]}}]\n---\n"
            )
        };
        let other_ns = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: y}\n---\n";
        let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: x}}\n";
        let yaml = svc("10.96.0.1") + &slice("10.0.0.1") + &svc("10.96.0.2") + &slice("10.0.0.2") + other_ns + list;
        let parsed = parse(&yaml).unwrap();
        let ips: Vec<_> =
            parsed.objects.services.iter().map(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.clone())).collect();
        assert_eq!(ips, vec![Some("10.96.0.1".into()), None], "the first x/web and y/web");
        assert_eq!(parsed.objects.slices.len(), 1);
        assert_eq!(
            parsed.objects.slices[0].endpoints.as_ref().unwrap()[0].addresses,
            vec!["10.0.0.1"],
            "replaced, not merged"
        );
        let dups: Vec<_> =
            parsed.errors.iter().map(|e| (e.document, e.object.as_str(), e.message.as_str(), e.rejection)).collect();
        let first = "has the same kind, namespace and name as document";
        assert_eq!(dups.len(), 3, "{dups:?}");
        assert!(dups.iter().all(|d| d.3 == super::Rejection::Duplicate && d.2.contains(first)), "{dups:?}");
        assert_eq!((dups[0].0, dups[0].1), (3, "Service x/web"));
        assert!(dups[0].2.starts_with("document 3 has") && dups[0].2.contains("as document 1;"), "{}", dups[0].2);
        assert!(dups[1].2.contains("as document 2;"), "{}", dups[1].2);
        assert!(dups[2].2.starts_with("document 6 items[0] has"), "{}", dups[2].2);
    }

    /// Each file that is refused whole is told apart by its reason.
    #[test]
    fn bombs_oversize_and_non_yaml_files_are_refused_with_their_reason() {
        use super::{Rejection, load_at_most};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("services.yaml");
        let reason = |text: &str, max: u64| {
            std::fs::write(&path, text).unwrap();
            load_at_most(&path, max).map(|_| ()).map_err(|e| (e.rejection(), e.to_string()))
        };
        // The billion laughs: each level ten aliases of the one before.
        let level = |i: usize| format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(", "));
        let bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned() + &(1..9).map(level).collect::<String>();
        let (rejection, message) = reason(&bomb, 1 << 20).unwrap_err();
        assert_eq!(rejection, Rejection::YamlBomb, "{message}");
        assert!(message.contains("without aliases"), "{message}");
        // A few aliases are fine (the API server takes them too).
        let aliased =
            "apiVersion: v1\nkind: Service\nmetadata: {name: a, labels: &l {app: web}}\nspec: {selector: *l}\n";
        assert_eq!(reason(aliased, 1 << 20), Ok(()));
        let (rejection, message) = reason(aliased, 10).unwrap_err();
        assert_eq!(rejection, Rejection::TooLarge);
        assert!(message.contains(&format!("is {} bytes, more than the 10 bytes", aliased.len())), "{message}");
        assert_eq!(reason("kind: [\n", 1 << 20).unwrap_err().0, Rejection::NotYaml);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(load_at_most(&path, 10).unwrap_err().rejection(), Rejection::Unreadable);
    }

    /// kube-proxy's Service informer selects
    /// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`
    /// (cmd/kube-proxy/app/server.go); the file source leaves the same out.
    #[test]
    fn services_labelled_headless_or_for_another_proxy_are_left_out() {
        let svc = |name: &str, labels: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, labels: {{{labels}}}}}\n---\n")
        };
        let yaml = svc("a", "app: web")
            + &svc("b", "service.kubernetes.io/headless: ''")
            + &svc("c", "service.kubernetes.io/service-proxy-name: other");
        let parsed = parse(&yaml).unwrap();
        let names: Vec<_> = parsed.objects.services.iter().map(|s| s.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["a"]);
        assert_eq!(
            parsed.not_proxied,
            vec![
                ("Service default/b".to_owned(), "service.kubernetes.io/headless"),
                ("Service default/c".to_owned(), "service.kubernetes.io/service-proxy-name")
            ]
        );
        assert!(parsed.errors.is_empty());
    }

    #[test]
    fn a_syntax_error_fails_the_whole_stream() {
        let err = parse("apiVersion: v1\nkind: Service\nmetadata: {name: [\n").unwrap_err();
        assert!(err.location().is_some_and(|l| l.line() >= 3), "the error keeps its position: {err}");
        assert!(err.to_string().contains("at line 4 column 1"), "{err}");
    }
}
