//! API objects into the model's inputs (`crate::model::ServiceSpec`,
//! `crate::model::SliceSpec`): the one place a Service or an EndpointSlice
//! is read field by field. Each object is converted once, as it arrives;
//! the store keeps the converted form. A field the model starts to read is
//! added to the model's input type and filled here.
use k8s_openapi::{
    api::{
        core::v1::{Service, ServicePort},
        discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::stored_slice::SliceId;
use crate::model::{
    Address, AddressType, Annotation, DEFAULT_NAMESPACE, EndpointHints, EndpointSpec, Forwarding, IngressSpec,
    LB_ALGORITHM_ANNOTATION, LbAlgorithm, NODEPORT_MODE_ANNOTATION, ServiceId, ServicePortSpec, ServiceSpec,
    ServiceType, SlicePortSpec, SliceSpec, UNNAMED,
};

/// Label naming the service a slice belongs to.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The id of a Service: what its converted form's `id()` is.
#[must_use]
pub(crate) fn service_id(svc: &Service) -> ServiceId {
    let (namespace, name) = names(&svc.metadata);
    ServiceId::new(namespace, name)
}

/// The id of an EndpointSlice: what its stored form's `id()` is.
#[must_use]
pub(crate) fn slice_id(slice: &EndpointSlice) -> SliceId {
    let (namespace, name) = names(&slice.metadata);
    SliceId::new(namespace, name)
}

/// Namespace and name, as `crate::model::ObjectRef` names an object.
fn names(meta: &ObjectMeta) -> (&str, &str) {
    (meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE), meta.name.as_deref().unwrap_or(UNNAMED))
}

impl From<&Service> for ServiceSpec {
    fn from(svc: &Service) -> Self {
        let meta = &svc.metadata;
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).map(|v| v.as_str().into());
        let mut out = Self {
            id: service_id(svc),
            service_proxy_name: label(super::labels::SERVICE_PROXY_NAME),
            ..Self::default()
        };
        out.no_spec = svc.spec.is_none();
        if let Some(spec) = &svc.spec {
            out.service_type = match spec.type_.as_deref() {
                Some("NodePort") => ServiceType::NodePort,
                Some("LoadBalancer") => ServiceType::LoadBalancer,
                Some("ExternalName") => ServiceType::ExternalName,
                _ => ServiceType::ClusterIp,
            };
            out.cluster_ip = spec.cluster_ip.as_deref().map(Into::into);
            out.cluster_ips = boxed(spec.cluster_ips.as_deref());
            out.ports = spec.ports.iter().flatten().map(service_port).collect();
            out.internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
            out.external_local = spec.external_traffic_policy.as_deref() == Some("Local");
            out.client_ip_affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
                spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref()).and_then(|c| c.timeout_seconds)
            });
            out.external_ips = boxed(spec.external_ips.as_deref());
            out.source_ranges = boxed(spec.load_balancer_source_ranges.as_deref());
            out.health_check_node_port = spec.health_check_node_port;
        }
        let annotation = |name| meta.annotations.as_ref().and_then(|a| a.get(name)).map(String::as_str);
        out.lb_algorithm = Annotation::read(annotation(LB_ALGORITHM_ANNOTATION), LbAlgorithm::parse);
        out.nodeport_mode = Annotation::read(annotation(NODEPORT_MODE_ANNOTATION), Forwarding::parse);
        let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
        out.lb_ingress = ingress
            .into_iter()
            .flatten()
            .map(|i| IngressSpec {
                ip: i.ip.as_deref().map(Into::into),
                proxy_mode: i.ip_mode.as_deref() == Some("Proxy"),
            })
            .collect();
        out
    }
}

/// A list of strings as the model holds them (an unset list: empty).
fn boxed(list: Option<&[String]>) -> Box<[Box<str>]> {
    list.unwrap_or_default().iter().map(|s| s.as_str().into()).collect()
}

fn service_port(port: &ServicePort) -> ServicePortSpec {
    ServicePortSpec {
        name: port.name.as_deref().unwrap_or_default().into(),
        protocol: port.protocol.as_deref().unwrap_or("TCP").into(),
        port: port.port,
        node_port: port.node_port,
    }
}

impl From<&EndpointSlice> for SliceSpec {
    fn from(slice: &EndpointSlice) -> Self {
        let id = slice_id(slice);
        let owner = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
        Self {
            owner: owner.map(|owner| ServiceId::new(id.namespace(), owner)),
            id,
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
    let hinted = e.hints.as_ref();
    let zones = hint_names(hinted.and_then(|h| h.for_zones.as_ref()), |z| &z.name);
    let nodes = hint_names(hinted.and_then(|h| h.for_nodes.as_ref()), |n| &n.name);
    let address = e.addresses.first().map(|a| Address::new(a));
    let hints = EndpointHints { zones, nodes };
    let mut out = EndpointSpec::new(address, e.node_name.as_deref(), hints, super::placements::shared);
    out.ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    out.serving = conditions.and_then(|c| c.serving).unwrap_or(true);
    out.terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    out
}

/// The names of one list of hints, as written.
fn hint_names<T>(hints: Option<&Vec<T>>, name: fn(&T) -> &str) -> Box<[Box<str>]> {
    hints.into_iter().flatten().map(|h| name(h).into()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file;

    /// A Service and an EndpointSlice (two YAML documents), converted.
    /// Not through the services file: it leaves out Services labelled for
    /// another proxy, and this test converts one.
    fn one(yaml: &str) -> (Vec<ServiceSpec>, Vec<SliceSpec>) {
        let (service, slice) = yaml.split_once("---\n").expect("two documents");
        let service: Service = serde_norway::from_str(service).expect("a Service");
        let slice: EndpointSlice = serde_norway::from_str(slice).expect("an EndpointSlice");
        (vec![ServiceSpec::from(&service)], vec![SliceSpec::from(&slice)])
    }

    #[test]
    fn the_lb_algorithm_annotation_is_read_exactly_as_written() {
        for (written, read) in [
            (None, Annotation::Unset),
            (Some("random"), Annotation::Set(LbAlgorithm::Random)),
            (Some("least-connections"), Annotation::Set(LbAlgorithm::LeastConnections)),
            (Some("maglev"), Annotation::Set(LbAlgorithm::Maglev)),
            (Some("Least-Connections"), Annotation::Unknown),
            (Some(""), Annotation::Unknown),
        ] {
            let mut svc = Service::default();
            svc.metadata.annotations =
                written.map(|v| [(LB_ALGORITHM_ANNOTATION.to_owned(), v.to_owned())].into_iter().collect());
            assert_eq!(ServiceSpec::from(&svc).lb_algorithm, read, "{written:?}");
        }
    }

    #[test]
    fn the_nodeport_mode_annotation_is_read_exactly_as_written() {
        for (written, read) in [
            (None, Annotation::Unset),
            (Some("snat"), Annotation::Set(Forwarding::Snat)),
            (Some("dsr"), Annotation::Set(Forwarding::Dsr)),
            (Some("DSR"), Annotation::Unknown),
            (Some("hybrid"), Annotation::Unknown),
        ] {
            let mut svc = Service::default();
            svc.metadata.annotations =
                written.map(|v| [(NODEPORT_MODE_ANNOTATION.to_owned(), v.to_owned())].into_iter().collect());
            assert_eq!(ServiceSpec::from(&svc).nodeport_mode, read, "{written:?}");
        }
    }

    #[test]
    fn defaults_the_api_documents_are_applied_once_here() {
        let (services, slices) = one(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: {service.kubernetes.io/service-proxy-name: other}}\n\
             spec:\n  type: Weird\n  sessionAffinity: ClientIP\n  ports: [{port: 80}]\n\
             status: {loadBalancer: {ingress: [{ip: 10.0.0.9, ipMode: Proxy}, {hostname: lb.example}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: ns\n  labels: {kubernetes.io/service-name: web}\n\
             addressType: FQDN\nports: [{name: http}]\nendpoints:\n- addresses: [a.example, b.example]\n- addresses: [\"10.0.0.1\"]\n  conditions: {ready: false, terminating: true}\n  hints: {forZones: [{name: z1}], forNodes: [{name: n1}]}\n",
        );
        let svc = &services[0];
        assert_eq!((svc.id.namespace(), svc.id.name()), ("default", "web"));
        assert_eq!(svc.service_proxy_name.as_deref(), Some("other"));
        assert_eq!(svc.service_type, ServiceType::ClusterIp, "an unknown type is served as ClusterIP");
        assert_eq!(svc.client_ip_affinity, Some(None));
        assert_eq!(&*svc.ports[0].protocol, "TCP");
        assert_eq!(
            *svc.lb_ingress,
            [
                IngressSpec { ip: Some("10.0.0.9".into()), proxy_mode: true },
                IngressSpec { ip: None, proxy_mode: false }
            ]
        );
        let slice = &slices[0];
        assert_eq!(slice.owner, Some(ServiceId::new("ns", "web")));
        assert_eq!(slice.address_type, AddressType::Other);
        assert_eq!((&*slice.ports[0].name, &*slice.ports[0].protocol, slice.ports[0].port), ("http", "TCP", None));
        let [first, second] = &*slice.endpoints else { panic!("two endpoints") };
        assert_eq!(first.address(), Some(Address::Raw("a.example".into())), "the first address only");
        assert!(first.ready && first.serving && !first.terminating, "unset conditions");
        assert!(!second.ready && second.serving && second.terminating);
        assert_eq!(second.zone_hints(), [Box::from("z1")]);
        assert_eq!(second.node_hints(), [Box::from("n1")]);
        let placed = |e: &EndpointSpec| e.placement().map(|p| (**p).clone());
        assert_eq!(placed(first).and_then(|p| p.raw_address), Some("a.example".into()), "kept as written");
        assert_eq!(placed(second).map(|p| p.hints.zones.len()), Some(1));
        assert_eq!(std::mem::size_of::<EndpointSpec>(), 32, "a million of them at 100,000 services");
        // The store holds each Service between syncs: 200 and 64 bytes with
        // `String`s and `Vec`s.
        assert_eq!((std::mem::size_of::<ServiceSpec>(), std::mem::size_of::<ServicePortSpec>()), (144, 48));
    }

    #[test]
    fn endpoints_on_one_node_share_its_name() {
        let slice = |name: &str| -> SliceSpec {
            let yaml = format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}}}\naddressType: IPv4\n\
                 endpoints:\n- {{addresses: [10.0.0.1], nodeName: shared-node}}\n- {{addresses: [10.0.0.2], nodeName: shared-node}}\n"
            );
            SliceSpec::from(&serde_norway::from_str::<EndpointSlice>(&yaml).expect("an EndpointSlice"))
        };
        let (a, b) = (slice("a"), slice("b"));
        let placed: Vec<&crate::model::Placement> =
            a.endpoints.iter().chain(&b.endpoints).map(|e| e.placement().expect("a placement")).collect();
        assert_eq!(placed[0].node_name.as_deref(), Some("shared-node"));
        assert!(
            placed.iter().all(|p| crate::model::Placement::ptr_eq(p, placed[0])),
            "one copy across endpoints and slices"
        );
        // Without a node name, hints or an address written otherwise, an
        // endpoint holds no placement at all.
        let bare: EndpointSlice = serde_norway::from_str(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: c}\naddressType: IPv4\n\
             endpoints:\n- {addresses: [10.0.0.3]}\n",
        )
        .expect("an EndpointSlice");
        assert!(SliceSpec::from(&bare).endpoints[0].placement().is_none());
    }

    #[test]
    fn real_apiserver_slices_name_their_service() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-apiserver/endpointslices.yaml");
        let objects = file::load(&path).unwrap().objects;
        assert!(!objects.slices.is_empty());
        for (object, spec) in objects.slices.iter().zip(objects.inputs().1) {
            let label = object.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
            assert_eq!(spec.owner.as_ref().map(|o| o.name().to_owned()).as_ref(), label);
            assert_eq!(spec.endpoints.len(), object.endpoints.as_ref().map_or(0, Vec::len));
        }
    }
}
