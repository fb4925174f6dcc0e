//! Problems found in input objects: each names the object and the field, so
//! an operator can find and fix it.
use std::fmt;

/// What an object without a namespace reads as (the API's default).
pub const DEFAULT_NAMESPACE: &str = "default";
/// What an object without a name reads as.
pub const UNNAMED: &str = "<unnamed>";

/// `Kind namespace/name` of a Kubernetes object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub(crate) kind: &'static str,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl ObjectRef {
    #[must_use]
    pub(crate) fn new(kind: &'static str, namespace: Option<&str>, name: Option<&str>) -> Self {
        Self {
            kind,
            namespace: namespace.unwrap_or(DEFAULT_NAMESPACE).to_owned(),
            name: name.unwrap_or(UNNAMED).to_owned(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// How much of an object a problem leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Part of the object is left out; the rest is programmed.
    Warning,
    /// The object (or the part named by the field) is rejected.
    Error,
}

/// Something in an object the proxy cannot program as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub(crate) object: ObjectRef,
    /// Path of the field, as in the object's YAML (`spec.ports[1].protocol`).
    pub(crate) field: String,
    pub(crate) message: String,
    pub(crate) severity: Severity,
}

impl Problem {
    pub(crate) fn error(object: &ObjectRef, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { object: object.clone(), field: field.into(), message: message.into(), severity: Severity::Error }
    }

    pub(crate) fn warning(object: &ObjectRef, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { object: object.clone(), field: field.into(), message: message.into(), severity: Severity::Warning }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}
