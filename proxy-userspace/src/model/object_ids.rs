//! Services and EndpointSlices by namespace and name.
//!
//! A service's id is held in many places: the source's store (its key, and the
//! converted Service), the model's per-service outputs and the claims on
//! each frontend, the index of a service's slices and each slice's owner.
//! As two `String`s each of those was a copy of its own (~70 bytes and two
//! allocations, ~5 times a service); this is one shared copy (an `Arc` of
//! the two strings) that every holder points at, compared and hashed by
//! its text. A slice's id
//! likewise (the store's key, the converted slice, the index).
use std::{fmt, sync::Arc};

/// Namespace, then name: the order ids sort in.
#[derive(PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Names {
    namespace: Box<str>,
    name: Box<str>,
}

/// A shared namespace and name (`ServiceId`, `SliceId`).
macro_rules! namespaced_id {
    ($(#[$doc:meta])* $id:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $id(Arc<Names>);

        impl $id {
            #[must_use]
            pub(crate) fn new(namespace: &str, name: &str) -> Self {
                Self(Arc::new(Names { namespace: namespace.into(), name: name.into() }))
            }

            #[must_use]
            pub(crate) fn namespace(&self) -> &str {
                &self.0.namespace
            }

            /// The name.
            #[must_use]
            pub fn name(&self) -> &str {
                &self.0.name
            }

            /// Whether `self` and `other` share one allocation (tests of
            /// the sharing).
            #[must_use]
            #[allow(dead_code, reason = "generated for both ids; only ServiceId's is used outside the tests")]
            pub(crate) fn shares(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0)
            }
        }

        /// What an object without namespace and name reads as (as
        /// `crate::model::ObjectRef` names it).
        impl Default for $id {
            fn default() -> Self {
                Self::new(super::problem::DEFAULT_NAMESPACE, super::problem::UNNAMED)
            }
        }

        impl fmt::Debug for $id {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", (self.namespace(), self.name()))
            }
        }

        impl fmt::Display for $id {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}/{}", self.namespace(), self.name())
            }
        }
    };
}

namespaced_id!(
    /// A Service by namespace and name, as its EndpointSlices name it.
    ServiceId
);
namespaced_id!(
    /// An EndpointSlice by namespace and name: held by the store (its key
    /// and the converted slice) and by the index of its service's slices.
    SliceId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_compare_by_namespace_then_name_whoever_made_them() {
        let a = ServiceId::new("a", "z");
        assert_eq!(a, ServiceId::new("a", "z"));
        assert!(!a.shares(&ServiceId::new("a", "z")) && a.shares(&a.clone()));
        let mut ids = [ServiceId::new("b", "a"), a.clone(), ServiceId::new("a", "b")];
        ids.sort();
        assert_eq!(ids.iter().map(ToString::to_string).collect::<Vec<_>>(), ["a/b", "a/z", "b/a"]);
        let hashed: std::collections::HashSet<ServiceId> = [a, ServiceId::new("a", "z")].into();
        assert_eq!(hashed.len(), 1);
        assert_eq!(SliceId::default().to_string(), "default/<unnamed>");
    }
}
