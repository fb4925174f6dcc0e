//! Which services are proxied, on which addresses and ports.
use std::net::IpAddr;

use super::{
    Forwarding, LB_ALGORITHM_ANNOTATION, LbAlgorithm, NODEPORT_MODE_ANNOTATION, ObjectRef, Problem, Protocol,
    input::{Annotation, ServiceSpec, ServiceType},
};

/// Why a service is not programmed at all (not an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    Headless,
    ExternalName,
    OtherProxy,
    NoSpec,
    NoClusterIp,
    NoPorts,
}

impl SkipReason {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Headless => "headless (clusterIP: None)",
            Self::ExternalName => "type ExternalName",
            Self::OtherProxy => "handed to another proxy by service.kubernetes.io/service-proxy-name",
            Self::NoSpec => "the object has no spec",
            Self::NoClusterIp => "no clusterIP allocated",
            Self::NoPorts => "no ports in spec.ports",
        }
    }
}

/// One port of a service that the proxy serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PortSpec {
    /// The port's name (`""` when unnamed), matched against slice ports.
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
    /// For NodePort and LoadBalancer services.
    pub(crate) node_port: Option<u16>,
}

/// What the proxy must serve for one service.
#[derive(Clone, Debug)]
pub(crate) struct ServiceFrontends {
    pub(crate) object: ObjectRef,
    /// Its ClusterIPs, of either family (dual-stack services have two).
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) ports: Vec<PortSpec>,
    /// `internalTrafficPolicy: Local`.
    pub(crate) internal_local: bool,
    /// `sessionAffinity: ClientIP` timeout in seconds.
    pub(crate) affinity_timeout: Option<u32>,
    /// `status.loadBalancer.ingress[].ip` (except `ipMode: Proxy` ones,
    /// which the load balancer itself proxies).
    pub(crate) lb_ips: Vec<IpAddr>,
    /// `spec.externalIPs`.
    pub(crate) external_ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: traffic from outside goes only to
    /// this node's endpoints, with the client's address kept.
    pub(crate) external_local: bool,
    /// `spec.loadBalancerSourceRanges` (LoadBalancer services); `None`
    /// when it has none. Fails closed: ranges that are all invalid give
    /// `Some(vec![])`, which admits no source.
    pub(crate) source_ranges: Option<Vec<ipnet::IpNet>>,
    /// `spec.healthCheckNodePort` (LoadBalancer, externalTrafficPolicy: Local).
    pub(crate) health_check_node_port: Option<u16>,
    /// The `ebpf-proxy.io/lb-algorithm` annotation (`None`: unset, or a
    /// value it does not name, reported: the node's default).
    pub(crate) lb_algorithm: Option<LbAlgorithm>,
    /// The `ebpf-proxy.io/nodeport-mode` annotation (`None`: unset, or a
    /// value it does not name, reported: the node's `--nodeport-mode`).
    pub(crate) forwarding: Option<Forwarding>,
}

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub(crate) const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
/// The API server's upper bound for it (one day).
pub(crate) const MAX_AFFINITY_TIMEOUT: u32 = 86_400;

/// The frontends of `svc`, or why it has none. Problems with parts of the
/// service (a bad address, an unsupported protocol) go to `problems`.
pub(crate) fn service_frontends(
    svc: &ServiceSpec,
    problems: &mut Vec<Problem>,
) -> Result<ServiceFrontends, SkipReason> {
    let object = svc.object_ref();
    if svc.service_proxy_name.is_some() {
        return Err(SkipReason::OtherProxy);
    }
    if svc.no_spec {
        return Err(SkipReason::NoSpec);
    }
    if svc.service_type == ServiceType::ExternalName {
        return Err(SkipReason::ExternalName);
    }
    let addrs = cluster_ips(&object, svc.cluster_ip.as_deref(), &svc.cluster_ips, problems)?;
    // kube-proxy makes one service port per `spec.ports` entry: none, nothing
    // to serve.
    if svc.ports.is_empty() {
        return Err(SkipReason::NoPorts);
    }
    let mut ports: Vec<PortSpec> = Vec::new();
    for (i, port) in svc.ports.iter().enumerate() {
        let field = |f: &str| format!("spec.ports[{i}].{f}");
        let protocol = match &*port.protocol {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            other => {
                problems.push(Problem::error(
                    &object,
                    field("protocol"),
                    format!("unknown protocol {other:?}; expected TCP, UDP or SCTP"),
                ));
                continue;
            }
        };
        let Some(number) = valid_port(port.port) else {
            problems.push(Problem::error(
                &object,
                field("port"),
                format!("{} is not a port number (1-65535)", port.port),
            ));
            continue;
        };
        let name = port.name.to_string();
        let wants_node_port = matches!(svc.service_type, ServiceType::NodePort | ServiceType::LoadBalancer);
        let node_port = port.node_port.filter(|_| wants_node_port).and_then(|n| {
            let valid = valid_port(n);
            if valid.is_none() {
                problems.push(Problem::error(&object, field("nodePort"), format!("{n} is not a port number")));
            }
            valid
        });
        if ports.iter().any(|p| p.port == number && p.protocol == protocol) {
            problems.push(Problem::error(
                &object,
                field("port"),
                format!("{number}/{protocol} is listed twice; the first one is used"),
            ));
            continue;
        }
        ports.push(PortSpec { name, port: number, protocol, node_port });
    }
    let affinity_timeout = affinity_timeout(svc, &object, problems);
    let lb_algorithm = annotation(
        svc.lb_algorithm,
        LB_ALGORITHM_ANNOTATION,
        &LbAlgorithm::ALL.map(LbAlgorithm::as_str),
        "the node's --lb-algorithm",
        &object,
        problems,
    );
    let forwarding = annotation(
        svc.nodeport_mode,
        NODEPORT_MODE_ANNOTATION,
        &Forwarding::ALL.map(Forwarding::as_str),
        "the node's --nodeport-mode",
        &object,
        problems,
    );
    let (lb_ips, external_ips) = external_addresses(svc, &object, problems);
    let is_load_balancer = svc.service_type == ServiceType::LoadBalancer;
    let source_ranges = if is_load_balancer { source_ranges(svc, &object, problems) } else { None };
    let health_check_node_port =
        if is_load_balancer && svc.external_local { health_check_node_port(svc, &object, problems) } else { None };
    Ok(ServiceFrontends {
        object,
        addrs,
        ports,
        internal_local: svc.internal_local,
        affinity_timeout,
        lb_ips,
        external_ips,
        external_local: svc.external_local,
        source_ranges,
        health_check_node_port,
        lb_algorithm,
        forwarding,
    })
}

/// One of ebpf-proxy's annotations (`name`); a value it does not name
/// (`known` lists those it does) is reported (once, as every problem) and
/// `fallback` is used.
fn annotation<T>(
    read: Annotation<T>,
    name: &str,
    known: &[&str],
    fallback: &str,
    object: &ObjectRef,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    match read {
        Annotation::Unset => None,
        Annotation::Set(value) => Some(value),
        Annotation::Unknown => {
            problems.push(Problem::warning(
                object,
                format!("metadata.annotations[{name}]"),
                format!("names none of {}; {fallback} is used", known.join(", ")),
            ));
            None
        }
    }
}

/// `sessionAffinity: ClientIP`: the timeout in seconds (the default when
/// unset, and when out of range, which is reported).
fn affinity_timeout(svc: &ServiceSpec, object: &ObjectRef, problems: &mut Vec<Problem>) -> Option<u32> {
    svc.client_ip_affinity.map(|asked| match asked {
        None => DEFAULT_AFFINITY_TIMEOUT,
        Some(t) => match u32::try_from(t) {
            Ok(t) if (1..=MAX_AFFINITY_TIMEOUT).contains(&t) => t,
            _ => {
                problems.push(Problem::warning(
                    object,
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!("{t} is not within 1-{MAX_AFFINITY_TIMEOUT}; {DEFAULT_AFFINITY_TIMEOUT} is used"),
                ));
                DEFAULT_AFFINITY_TIMEOUT
            }
        },
    })
}

/// `spec.healthCheckNodePort`, when it is a port number (else reported).
fn health_check_node_port(svc: &ServiceSpec, object: &ObjectRef, problems: &mut Vec<Problem>) -> Option<u16> {
    let port = svc.health_check_node_port?;
    let valid = valid_port(port);
    if valid.is_none() {
        problems.push(Problem::error(object, "spec.healthCheckNodePort", format!("{port} is not a port number")));
    }
    valid
}

/// `spec.loadBalancerSourceRanges` as networks (host bits cleared); a
/// range that is not a CIDR is reported and left out.
fn source_ranges(svc: &ServiceSpec, object: &ObjectRef, problems: &mut Vec<Problem>) -> Option<Vec<ipnet::IpNet>> {
    let listed = Some(&svc.source_ranges).filter(|r| !r.is_empty())?;
    let mut out = Vec::new();
    for (i, raw) in listed.iter().enumerate() {
        let raw = raw.trim();
        let parsed = raw.parse::<ipnet::IpNet>().or_else(|_| raw.parse::<IpAddr>().map(ipnet::IpNet::from));
        match parsed {
            Ok(net) if !out.contains(&net.trunc()) => out.push(net.trunc()),
            Ok(_) => {}
            Err(_) => problems.push(Problem::error(
                object,
                format!("spec.loadBalancerSourceRanges[{i}]"),
                format!("{raw:?} is not a CIDR; this range is ignored"),
            )),
        }
    }
    if out.is_empty() {
        problems.push(Problem::error(
            object,
            "spec.loadBalancerSourceRanges",
            "no valid range: traffic from outside is refused until one is given",
        ));
    }
    Some(out)
}

/// `status.loadBalancer.ingress[].ip` (LoadBalancer services only, without
/// `ipMode: Proxy` ones, which the load balancer itself proxies) and
/// `spec.externalIPs`.
fn external_addresses(
    svc: &ServiceSpec,
    object: &ObjectRef,
    problems: &mut Vec<Problem>,
) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let mut external_ips = Vec::new();
    for (i, ip) in svc.external_ips.iter().enumerate() {
        match ip.parse::<IpAddr>() {
            Ok(ip) => external_ips.push(ip),
            Err(_) => problems.push(Problem::error(
                object,
                format!("spec.externalIPs[{i}]"),
                format!("{ip:?} is not an IP address"),
            )),
        }
    }
    let mut lb_ips = Vec::new();
    for (i, ing) in svc.lb_ingress.iter().enumerate() {
        if ing.proxy_mode {
            continue;
        }
        match ing.ip.as_deref().map(str::parse::<IpAddr>) {
            Some(Ok(ip)) => lb_ips.push(ip),
            Some(Err(_)) => problems.push(Problem::error(
                object,
                format!("status.loadBalancer.ingress[{i}].ip"),
                "not an IP address",
            )),
            None => {} // hostname-only ingress: nothing to program
        }
    }
    if svc.service_type != ServiceType::LoadBalancer {
        lb_ips.clear();
    }
    (lb_ips, external_ips)
}

fn cluster_ips(
    object: &ObjectRef,
    cluster_ip: Option<&str>,
    cluster_ips: &[Box<str>],
    problems: &mut Vec<Problem>,
) -> Result<Vec<IpAddr>, SkipReason> {
    // `clusterIPs` is authoritative when set; `clusterIP` is its first entry.
    let (field, list): (&str, Vec<&str>) = if cluster_ips.is_empty() {
        ("spec.clusterIP", cluster_ip.into_iter().collect())
    } else {
        ("spec.clusterIPs", cluster_ips.iter().map(AsRef::as_ref).collect())
    };
    if list.first().is_some_and(|ip| *ip == "None") {
        return Err(SkipReason::Headless);
    }
    if list.iter().all(|ip| ip.is_empty()) {
        return Err(SkipReason::NoClusterIp);
    }
    let mut addrs = Vec::new();
    for (i, ip) in list.iter().enumerate() {
        let path = if field == "spec.clusterIPs" { format!("{field}[{i}]") } else { field.to_owned() };
        match ip.parse::<IpAddr>() {
            Ok(ip) if !addrs.contains(&ip) => addrs.push(ip),
            Ok(_) => {}
            Err(_) => problems.push(Problem::error(object, path, format!("{ip:?} is not an IP address"))),
        }
    }
    if addrs.is_empty() {
        return Err(SkipReason::NoClusterIp);
    }
    Ok(addrs)
}

pub(super) fn valid_port(port: i32) -> Option<u16> {
    u16::try_from(port).ok().filter(|p| *p != 0)
}
