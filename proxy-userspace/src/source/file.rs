//! The services file: a YAML stream of `v1/Service` and
//! `discovery.k8s.io/v1/EndpointSlice` objects (and `v1/Node` objects, of
//! which the agent's own gives its zone), as `kubectl get -o yaml`
//! prints them. `kind: List` documents and typed lists (`ServiceList`, as the
//! API returns them) are unpacked.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_yaml::Value;

use super::Objects;

/// Why the file, or one object of it, was not applied: the `reason` label
/// of `ebpf_proxy_services_file_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejection {
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
}

impl Rejection {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unreadable => "unreadable",
            Self::NotYaml => "not_yaml",
            Self::Empty => "empty",
            Self::UnknownKind => "unknown_kind",
            Self::InvalidObject => "invalid_object",
        }
    }
}

/// The file as a whole could not be read; nothing from it is used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read services file {path}: {source}; the last good content stays in effect")]
    Read { path: PathBuf, source: io::Error },
    #[error("services file {path} is not valid YAML: {source}; the last good content stays in effect")]
    Yaml { path: PathBuf, source: serde_yaml::Error },
}

impl FileError {
    #[must_use]
    pub const fn rejection(&self) -> Rejection {
        match self {
            Self::Read { .. } => Rejection::Unreadable,
            Self::Yaml { .. } => Rejection::NotYaml,
        }
    }
}

/// One object of the file that is skipped, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectError {
    /// 1-based index of the YAML document in the stream.
    pub document: usize,
    /// `Kind namespace/name` where the object says so.
    pub object: String,
    /// Path of the offending field, `.` when the object as a whole is wrong.
    pub field: String,
    pub message: String,
    pub rejection: Rejection,
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "document {}: {}: {}: {}; object skipped", self.document, self.object, self.field, self.message)
    }
}

/// The parsed file: the objects that are valid and the ones that are not.
#[derive(Debug, Default)]
pub struct Parsed {
    pub objects: Objects,
    pub errors: Vec<ObjectError>,
}

impl Parsed {
    /// The file held no object at all, good or bad (empty, only comments or
    /// `---`).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        let Objects { services, slices, nodes } = &self.objects;
        services.is_empty() && slices.is_empty() && nodes.is_empty() && self.errors.is_empty()
    }
}

/// Reads and parses `path`.
pub fn load(path: &Path) -> Result<Parsed, FileError> {
    let text = fs::read_to_string(path).map_err(|source| FileError::Read { path: path.into(), source })?;
    parse(&text).map_err(|source| FileError::Yaml { path: path.into(), source })
}

/// Parses a YAML stream. A syntax error fails the whole stream (its extent is
/// unknown); an object of the wrong shape is skipped and reported.
pub fn parse(text: &str) -> Result<Parsed, serde_yaml::Error> {
    let mut parsed = Parsed::default();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
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
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("<unnamed>");
    let ns = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or("default");
    format!("{kind} {ns}/{name}")
}

fn add_object(parsed: &mut Parsed, document: usize, prefix: &str, value: Value) {
    let object = describe(&value);
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    let invalid = |(field, message)| (field, message, Rejection::InvalidObject);
    let result = match (api_version, kind_of(&value)) {
        (Some("v1"), Some("Service")) => {
            typed::<Service>(value).map(|s| parsed.objects.services.push(s)).map_err(invalid)
        }
        (Some("discovery.k8s.io/v1"), Some("EndpointSlice")) => {
            typed::<EndpointSlice>(value).map(|s| parsed.objects.slices.push(s)).map_err(invalid)
        }
        (Some("v1"), Some("Node")) => typed::<Node>(value).map(|n| parsed.objects.nodes.push(n)).map_err(invalid),
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
pub struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

/// The file's stamp, or `None` when it cannot be read.
#[must_use]
pub fn stamp(path: &Path) -> Option<Stamp> {
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

    #[test]
    fn a_syntax_error_fails_the_whole_stream() {
        assert!(parse("apiVersion: v1\nkind: Service\nmetadata: {name: [\n").is_err());
    }
}
