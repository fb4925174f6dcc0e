//! API objects into the model's inputs (`crate::model::ServiceSpec`,
//! `crate::model::SliceSpec`): the one place a Service or an EndpointSlice
//! is read field by field. Each object is converted once, as it arrives;
//! the store keeps the converted form. A field the model starts to read is
//! added to the model's input type and filled here.
use k8s_openapi::api::{
    core::v1::{Service, ServicePort},
    discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
};

use crate::model::{
    Address, AddressType, EndpointSpec, IngressSpec, ServicePortSpec, ServiceSpec, ServiceType, SlicePortSpec,
    SliceSpec,
};

/// Label naming the service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Label that hands a service to another proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// What an unset namespace and name read as (as `crate::model::ObjectRef`
/// names them).
const DEFAULT_NAMESPACE: &str = "default";
const UNNAMED: &str = "<unnamed>";

impl From<&Service> for ServiceSpec {
    fn from(svc: &Service) -> Self {
        let meta = &svc.metadata;
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
        let mut out = Self {
            namespace: meta.namespace.clone().unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
            name: meta.name.clone().unwrap_or_else(|| UNNAMED.into()),
            service_proxy_name: label(SERVICE_PROXY_NAME_LABEL),
            ..Self::default()
        };
        if let Some(spec) = &svc.spec {
            out.service_type = match spec.type_.as_deref() {
                Some("NodePort") => ServiceType::NodePort,
                Some("LoadBalancer") => ServiceType::LoadBalancer,
                Some("ExternalName") => ServiceType::ExternalName,
                _ => ServiceType::ClusterIp,
            };
            out.cluster_ip.clone_from(&spec.cluster_ip);
            out.cluster_ips = spec.cluster_ips.clone().unwrap_or_default();
            out.ports = spec.ports.iter().flatten().map(service_port).collect();
            out.internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
            out.external_local = spec.external_traffic_policy.as_deref() == Some("Local");
            out.client_ip_affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
                spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref()).and_then(|c| c.timeout_seconds)
            });
            out.external_ips = spec.external_ips.clone().unwrap_or_default();
            out.source_ranges = spec.load_balancer_source_ranges.clone().unwrap_or_default();
            out.health_check_node_port = spec.health_check_node_port;
        }
        let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
        out.lb_ingress = ingress
            .into_iter()
            .flatten()
            .map(|i| IngressSpec { ip: i.ip.clone(), proxy_mode: i.ip_mode.as_deref() == Some("Proxy") })
            .collect();
        out
    }
}

fn service_port(port: &ServicePort) -> ServicePortSpec {
    ServicePortSpec {
        name: port.name.clone().unwrap_or_default(),
        protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
        port: port.port,
        node_port: port.node_port,
    }
}

impl From<&EndpointSlice> for SliceSpec {
    fn from(slice: &EndpointSlice) -> Self {
        let meta = &slice.metadata;
        let namespace = meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
        let owner = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
        Self {
            namespace: namespace.into(),
            name: meta.name.as_deref().unwrap_or(UNNAMED).into(),
            owner: owner.map(|name| (namespace.to_owned(), name.clone())),
            address_type: match slice.address_type.as_str() {
                "IPv4" => AddressType::IPv4,
                "IPv6" => AddressType::IPv6,
                _ => AddressType::Other,
            },
            ports: slice.ports.iter().flatten().map(slice_port).collect(),
            endpoints: slice.endpoints.iter().flatten().map(endpoint).collect(),
        }
    }
}

fn slice_port(port: &EndpointPort) -> SlicePortSpec {
    SlicePortSpec {
        name: port.name.as_deref().unwrap_or_default().into(),
        protocol: port.protocol.as_deref().unwrap_or("TCP").into(),
        port: port.port,
    }
}

fn endpoint(e: &Endpoint) -> EndpointSpec {
    let conditions = e.conditions.as_ref();
    let zones = e.hints.as_ref().and_then(|h| h.for_zones.as_ref());
    EndpointSpec {
        address: e.addresses.first().map(|a| Address::new(a)),
        ready: conditions.and_then(|c| c.ready).unwrap_or(true),
        serving: conditions.and_then(|c| c.serving).unwrap_or(true),
        terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
        node_name: e.node_name.as_deref().map(Into::into),
        zone_hints: zones.into_iter().flatten().map(|z| z.name.as_str().into()).collect(),
    }
}
