//! Round trips of the codec: a table per enum, every flag word, and
//! proptests over keys, backends and source ranges.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use proptest::prelude::*;
use proxy_common::{
    Addr, Backend as BackendValue, ServiceKey, backend_flags, backend_state, proto, scope, service_flags,
};

use super::*;
use crate::model::{Backend, Forwarding, Frontend, FrontendKind, LbAlgorithm};

const KINDS: [(FrontendKind, u16); 4] = [
    (FrontendKind::ClusterIp, service_flags::CLUSTER_IP),
    (FrontendKind::NodePort, service_flags::NODE_PORT),
    (FrontendKind::LoadBalancer, service_flags::LOAD_BALANCER),
    (FrontendKind::ExternalIp, service_flags::EXTERNAL_IP),
];

#[test]
fn each_kind_is_one_flag_and_back() {
    for (kind, flag) in KINDS {
        assert_eq!(kind_flag(kind), flag, "{kind:?}");
        assert_eq!(FrontendFlags::decode(flag).map(|f| f.kind), Ok(kind), "{flag:#x}");
    }
}

#[test]
fn each_scope_protocol_state_and_locality_round_trips() {
    for (s, n) in [(Scope::All, scope::ALL), (Scope::External, scope::EXTERNAL)] {
        assert_eq!(scope_number(s), n);
        assert_eq!(scope_of(n), Ok(s));
    }
    for (p, n) in [(Protocol::Tcp, proto::TCP), (Protocol::Udp, proto::UDP)] {
        assert_eq!(protocol_number(p), n);
        assert_eq!(protocol_of(n), Ok(p));
    }
    for (s, n) in
        [(BackendState::Active, backend_state::ACTIVE), (BackendState::Terminating, backend_state::TERMINATING)]
    {
        assert_eq!(state_number(s), n);
        assert_eq!(state_of(n), Ok(s));
    }
    for (local, n) in [(false, 0), (true, backend_flags::LOCAL)] {
        assert_eq!(local_flags(local), n);
        assert_eq!(local_of(n), Ok(local));
    }
}

#[test]
fn numbers_the_agent_never_writes_are_errors() {
    // DCCP (33) is not a protocol of Services, so it never reaches the maps.
    for n in [0, 1, 33, 255] {
        assert_eq!(protocol_of(n), Err(DecodeError::Protocol(n)));
    }
    for n in [2, 255] {
        assert_eq!(scope_of(n), Err(DecodeError::Scope(n)));
        assert_eq!(state_of(n), Err(DecodeError::BackendState(n)));
    }
    for n in [2, 0x80, 0x81] {
        assert_eq!(local_of(n), Err(DecodeError::BackendFlags(n)));
    }
    // The programs serve an entry without a kind bit as a ClusterIP.
    assert_eq!(FrontendFlags::decode(0).map(|f| f.kind), Ok(FrontendKind::ClusterIp), "no kind");
    let two = service_flags::CLUSTER_IP | service_flags::NODE_PORT;
    assert_eq!(FrontendFlags::decode(two), Err(DecodeError::Kind(two)), "two kinds");
    let unknown = service_flags::CLUSTER_IP | 1 << 12;
    assert_eq!(FrontendFlags::decode(unknown), Err(DecodeError::FrontendFlags(1 << 12)));
    let both = service_flags::FORWARD_SNAT | service_flags::FORWARD_DSR;
    assert_eq!(FrontendFlags::decode(both), Err(DecodeError::Forwarding(both)), "two forwarding modes");
    let both = service_flags::LEAST_CONNECTIONS | service_flags::MAGLEV;
    assert_eq!(FrontendFlags::decode(both), Err(DecodeError::Algorithm(both)), "two algorithms");
}

#[test]
fn every_flag_word_decodes_without_panic_and_known_ones_round_trip() {
    let mut decoded = 0;
    for bits in 0..=u16::MAX {
        if let Ok(flags) = FrontendFlags::decode(bits) {
            // Written back with the ClusterIP bit a kind-less word lacks.
            let kindless = bits & (service_flags::CLUSTER_IP | service_flags::EXTERNAL_KINDS) == 0;
            let expected = if kindless { bits | service_flags::CLUSTER_IP } else { bits };
            assert_eq!(flags.encode(), expected, "{bits:#x}");
            decoded += 1;
        }
    }
    // Four kinds and no kind, times the four other bits each set or not,
    // times three algorithms, times three forwarding modes (none, SNAT, DSR).
    assert_eq!(decoded, 5 * 16 * 3 * 3);
}

#[test]
fn every_frontend_flags_value_round_trips() {
    for (kind, _) in KINDS {
        let forwardings = [None, Some(Forwarding::Snat), Some(Forwarding::Dsr)];
        for (bits, algorithm) in (0..16u8).flat_map(|b| LbAlgorithm::ALL.map(|a| (b, a))) {
            for forwarding in forwardings {
                let flags = FrontendFlags {
                    kind,
                    affinity: bits & 1 != 0,
                    outside_only: bits & 2 != 0,
                    two_scopes: bits & 4 != 0,
                    source_ranges: bits & 8 != 0,
                    algorithm,
                    forwarding,
                };
                assert_eq!(FrontendFlags::decode(flags.encode()), Ok(flags));
                assert_eq!(says_two_scopes(flags.encode()), flags.two_scopes);
            }
        }
    }
}

#[test]
fn only_scope_all_entries_say_outside_only_or_two_scopes() {
    let key = FrontendKey::new(Ipv4Addr::new(192, 0, 2, 1).into(), 30080, Protocol::Tcp);
    let frontend = Frontend {
        reach: Reach::Outside,
        affinity_timeout: Some(10),
        source_ranges: Some(Vec::new()),
        ..Frontend::new(ServicePort::new("ns", "web", "http"), FrontendKind::NodePort, Vec::<Backend>::new())
    };
    let all = FrontendFlags::of(key, &frontend, true);
    assert_eq!(
        all,
        FrontendFlags {
            kind: FrontendKind::NodePort,
            affinity: true,
            outside_only: true,
            two_scopes: true,
            source_ranges: true,
            algorithm: LbAlgorithm::Random,
            forwarding: None,
        }
    );
    let external = FrontendFlags::of(key.with_scope(Scope::External), &frontend, true);
    assert!(!external.outside_only && !external.two_scopes && external.affinity && external.source_ranges);
    let plain = Frontend::new(ServicePort::default(), FrontendKind::ClusterIp, Vec::<Backend>::new());
    assert_eq!(FrontendFlags::of(key, &plain, false).encode(), service_flags::CLUSTER_IP);
}

#[test]
fn an_ipv4_mapped_ipv6_address_comes_back_as_ipv4() {
    // The maps have one form for both (proxy-common's `Addr`).
    let mapped = FrontendKey::new(IpAddr::V6(Ipv4Addr::new(10, 96, 0, 1).to_ipv6_mapped()), 80, Protocol::Tcp);
    let (back, _) = frontend_of(&service_key(mapped, 0)).unwrap();
    assert_eq!(back.addr, IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)));
}

#[test]
fn keys_hold_ports_in_network_order_and_zero_padding() {
    let key = FrontendKey::new(Ipv4Addr::new(10, 96, 0, 10).into(), 53, Protocol::Udp).with_scope(Scope::External);
    let k = service_key(key, 3);
    assert_eq!(k.port, 53u16.to_be());
    assert_eq!((k.slot, k.proto, k.scope, k.pad), (3, proto::UDP, scope::EXTERNAL, [0; 2]));
    assert_eq!(k.addr, proxy_common::mapped_v4([10, 96, 0, 10]));
}

#[test]
fn names_round_trip_zero_padded() {
    let port = ServicePort::new("kube-system", "kube-dns", "dns-tcp");
    let name = service_name(&port);
    assert_eq!(&name.namespace[..12], b"kube-system\0");
    assert!(name.port[7..].iter().all(|b| *b == 0));
    assert_eq!(service_port_of(&name), port);
    let unnamed = ServicePort::new("default", "web", "");
    assert_eq!(service_port_of(&service_name(&unnamed)), unnamed);
}

#[test]
fn the_longest_kubernetes_names_fit_and_longer_ones_are_cut() {
    let longest = ServicePort::new("n".repeat(63), "s".repeat(63), "p".repeat(15));
    assert_eq!(service_port_of(&service_name(&longest)), longest);
    let long = ServicePort::new("n".repeat(70), "s".repeat(64), "p".repeat(16));
    assert_eq!(service_port_of(&service_name(&long)), longest);
    // Never in the middle of a character: 31 two-byte letters and a half.
    let wide = ServicePort::new("é".repeat(40), "web", "http");
    assert_eq!(service_port_of(&service_name(&wide)).namespace(), "é".repeat(31));
}

#[test]
fn a_name_that_is_not_utf8_decodes_lossily() {
    let mut name = service_name(&ServicePort::new("ns", "web", "http"));
    name.name[0] = 0xff;
    assert_eq!(service_port_of(&name).name(), "\u{fffd}eb");
}

#[test]
fn source_range_prefixes_the_agent_never_writes_are_none() {
    let (_, key) = source_range(7, "10.0.0.0/8".parse().unwrap());
    assert_eq!(source_range_of(SOURCE_RANGE_ID_BITS - 1, &key), None, "shorter than the id");
    assert_eq!(source_range_of(SOURCE_RANGE_ID_BITS + 95, &key), None, "IPv4 above the mapped prefix");
    assert_eq!(source_range_of(SOURCE_RANGE_ID_BITS + 96 + 33, &key), None, "IPv4 longer than /32");
    let (_, v6) = source_range(7, "2001:db8::/32".parse().unwrap());
    assert_eq!(source_range_of(SOURCE_RANGE_ID_BITS + 129, &v6), None, "IPv6 longer than /128");
}

/// Any address but the IPv4-mapped IPv6 ones (those come back as IPv4).
fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|o| IpAddr::V4(Ipv4Addr::from(o))),
        any::<[u8; 16]>()
            .prop_map(|o| IpAddr::V6(Ipv6Addr::from(o)))
            .prop_filter("IPv4-mapped", |a| a.to_canonical().is_ipv6()),
    ]
}

fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)]
}

fn frontend_key() -> impl Strategy<Value = FrontendKey> {
    (address(), any::<u16>(), protocol(), prop_oneof![Just(Scope::All), Just(Scope::External)])
        .prop_map(|(addr, port, protocol, scope)| FrontendKey { addr, port, protocol, scope })
}

fn backend() -> impl Strategy<Value = BackendEntry> {
    (
        address(),
        any::<u16>(),
        protocol(),
        prop_oneof![Just(BackendState::Active), Just(BackendState::Terminating)],
        any::<bool>(),
    )
        .prop_map(|(addr, port, protocol, state, local)| BackendEntry {
            addr: BackendAddr { addr, port, protocol },
            state,
            local,
        })
}

/// The byte image the programs read: slot 0's fields at their offsets (the
/// first word the affinity timeout), a slot's first word its backend id.
fn service_value_bytes(v: &proxy_common::ServiceValue) -> Vec<u8> {
    // SAFETY: `ServiceValue` is `repr(C)`, 16 bytes of integers with its
    // padding spelled out, so every byte is initialised.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), size_of_val(v)) }.to_vec()
}

#[test]
fn service_values_hold_32_bit_frontend_ids_in_16_bytes() {
    use proxy_common::ServiceValue;
    let id = u32::from(u16::MAX) + 2;
    let slot_zero = ServiceValue::frontend(7, id, service_flags::CLUSTER_IP | service_flags::AFFINITY, 3, 10_800);
    assert_eq!(
        (slot_zero.count, slot_zero.rev_nat, slot_zero.maglev, slot_zero.affinity_timeout()),
        (7, id, 3, 10_800)
    );
    let mut want = 10_800u32.to_ne_bytes().to_vec();
    want.extend(id.to_ne_bytes());
    for n in [7, service_flags::CLUSTER_IP | service_flags::AFFINITY, 3, 0] {
        want.extend(u16::to_ne_bytes(n));
    }
    assert_eq!(service_value_bytes(&slot_zero), want);
    // A slots entry: four backend ids, one to each 32-bit word in order
    // (as `bpftool map dump` shows them).
    let ids = [1 << 20, 0x0001_ffff, u32::MAX, 0];
    let slots = ServiceValue::slots(ids);
    assert_eq!(service_value_bytes(&slots), ids.iter().flat_map(|id| id.to_ne_bytes()).collect::<Vec<u8>>());
    assert_eq!(slots_value(&[5, 6, 7, 8, 9], 1), ServiceValue::slots([9, 0, 0, 0]));
}

#[test]
fn frontend_ids_past_16_bits_round_trip_in_every_map_that_carries_them() {
    use proxy_common::{AffinityKey, CtValue, SockRevNat};
    let id: proxy_common::RevNatId = 100_000;
    let net: IpNet = "10.0.0.0/8".parse().unwrap();
    let (prefix, key) = source_range(id, net);
    assert_eq!(key.rev_nat.to_ne_bytes(), id.to_be_bytes(), "the trie reads the id's bytes in order");
    assert_eq!(source_range_of(prefix, &key), Some((id, net)));
    // The session and tracking values keep the id whole, with no padding
    // byte left to chance (a key is compared bytewise).
    let sock = SockRevNat { addr: Addr::default(), port: 80u16.to_be(), pad: 0, rev_nat: id };
    assert_eq!(sock_revnat_frontend(&sock, Protocol::Tcp).port, 80);
    assert_eq!((sock.rev_nat, size_of::<SockRevNat>()), (id, 24));
    let affinity = AffinityKey { client: 1, rev_nat: id, pad: 0 };
    assert_eq!((affinity.rev_nat, size_of::<AffinityKey>()), (id, 16));
    let ct = CtValue { rev_nat: id, backend_id: 9, ..CtValue::default() };
    assert_eq!((ct.rev_nat, ct.backend_id, size_of::<CtValue>()), (id, 9, 56));
}

proptest! {
    #[test]
    fn frontend_keys_round_trip(key in frontend_key(), slot in any::<u16>()) {
        prop_assert_eq!(frontend_of(&service_key(key, slot)), Ok((key, slot)));
        prop_assert_eq!(rev_nat_of(&rev_nat_value(key)), (key.addr, key.port));
    }

    #[test]
    fn backends_round_trip(entry in backend()) {
        let value = backend_value(entry);
        prop_assert_eq!(value.pad, [0; 3]);
        prop_assert_eq!(backend_entry(&value), Ok(entry));
        prop_assert_eq!(backend_addr(&value), Ok(entry.addr));
    }

    #[test]
    fn source_ranges_round_trip(addr in address(), len in 0u8..=128, rev_nat in any::<proxy_common::RevNatId>()) {
        let len = if addr.is_ipv4() { len % 33 } else { len };
        let net = IpNet::new(addr, len).unwrap().trunc();
        let (prefix, key) = source_range(rev_nat, net);
        prop_assert_eq!(source_range_of(prefix, &key), Some((rev_nat, net)));
    }

    /// Any bytes decode to a key or an error, and a key with zeroed padding
    /// that decodes is written back byte for byte.
    #[test]
    fn any_service_key_decodes_without_panic(
        addr in any::<[u8; 16]>(), port in any::<u16>(), slot in any::<u16>(), proto in any::<u8>(), scope in any::<u8>(),
    ) {
        let key = ServiceKey { addr: Addr(addr), port, slot, proto, scope, pad: [0; 2] };
        match frontend_of(&key) {
            Ok((frontend, slot)) => prop_assert_eq!(service_key(frontend, slot), key),
            Err(DecodeError::Protocol(n)) => prop_assert_eq!(n, proto),
            Err(e) => prop_assert_eq!(e, DecodeError::Scope(scope)),
        }
    }

    #[test]
    fn any_backend_value_decodes_without_panic(
        addr in any::<[u8; 16]>(), port in any::<u16>(), proto in any::<u8>(), state in any::<u8>(), flags in any::<u8>(),
    ) {
        let value = BackendValue { addr: Addr(addr), port, proto, state, flags, pad: [0; 3] };
        if let Ok(entry) = backend_entry(&value) {
            prop_assert_eq!(backend_value(entry), value);
        }
    }
}
