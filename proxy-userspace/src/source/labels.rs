//! Services that are not this proxy's, by label, as kube-proxy selects
//! them (cmd/kube-proxy/app/server.go: `!service.kubernetes.io/service-proxy-name`
//! and `!service.kubernetes.io/headless` on its Service informer): the
//! Kubernetes source asks the API server for the others only, the file
//! source applies the same rule.
use std::collections::BTreeMap;

/// Names the proxy a Service is for (another one than this).
pub(crate) const SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";

/// A Service with any of these labels (whatever its value) is not proxied.
pub(crate) const NOT_PROXIED: [&str; 2] = [SERVICE_PROXY_NAME, "service.kubernetes.io/headless"];

/// The label selector of the Service list and watch requests.
#[must_use]
pub(crate) fn selector() -> String {
    NOT_PROXIED.iter().map(|key| format!("!{key}")).collect::<Vec<_>>().join(",")
}

/// The label that keeps a Service with `labels` from being proxied, if any.
#[must_use]
pub(crate) fn not_proxied_by(labels: Option<&BTreeMap<String, String>>) -> Option<&'static str> {
    let labels = labels?;
    NOT_PROXIED.into_iter().find(|key| labels.contains_key(*key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_is_kube_proxys() {
        assert_eq!(selector(), "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless");
    }

    /// kube-proxy's selector asks only whether the label exists: an empty
    /// value excludes the Service too.
    #[test]
    fn any_value_of_either_label_excludes() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        assert_eq!(not_proxied_by(None), None);
        assert_eq!(not_proxied_by(Some(&labels(&[("app", "web")]))), None);
        let headless = labels(&[("service.kubernetes.io/headless", "")]);
        assert_eq!(not_proxied_by(Some(&headless)), Some("service.kubernetes.io/headless"));
        let other = labels(&[("app", "web"), ("service.kubernetes.io/service-proxy-name", "cilium")]);
        assert_eq!(not_proxied_by(Some(&other)), Some("service.kubernetes.io/service-proxy-name"));
    }
}
