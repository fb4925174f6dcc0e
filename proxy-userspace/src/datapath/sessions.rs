//! Session memos the programs keep in LRU maps: a client's affine backend
//! (`AFFINITY`), an unconnected UDP socket's backend (`SOCK_BACKEND`), and
//! the connection tracking of traffic from outside (`CT`). When a backend
//! leaves a service, its memos are deleted (of `CT`, the UDP flows: TCP
//! connections drain, as kube-proxy leaves them), so the next connection or
//! datagram picks a live backend.
use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapError as AyaMapError};
use proxy_common::{
    AffinityKey, AffinityValue, CtKey, CtValue, RevNatId, SockBackendKey, SockRevNat, SockRevNatKey, ct_flags, proto,
};

use super::maps::MapError;
use crate::model::{FrontendKey, Protocol};
use crate::reconcile::{Liveness, codec};

pub(crate) struct SessionMaps {
    affinity: BpfHashMap<MapData, AffinityKey, AffinityValue>,
    sock_backend: BpfHashMap<MapData, SockBackendKey, u32>,
    sock_revnat: BpfHashMap<MapData, SockRevNatKey, SockRevNat>,
    ct: BpfHashMap<MapData, CtKey, CtValue>,
    /// `CT` again, for batch reads and lookup-and-delete (which aya lacks).
    ct_fd: std::os::fd::OwnedFd,
}

/// `BPF_NOEXIST` (linux/bpf.h): insert only a new key.
const BPF_NOEXIST: u64 = 1;

fn aya_err(map: &'static str) -> impl Fn(AyaMapError) -> MapError {
    move |source| MapError::Session { map, source }
}

impl SessionMaps {
    pub(crate) fn from_maps(affinity: Map, sock_backend: Map, sock_revnat: Map, ct: Map) -> Result<Self, MapError> {
        let ct_fd = match &ct {
            Map::LruHashMap(data) | Map::HashMap(data) => {
                use std::os::fd::AsFd as _;
                data.fd().as_fd().try_clone_to_owned().map_err(|e| MapError::Session {
                    map: "CT",
                    source: AyaMapError::SyscallError(aya::sys::SyscallError { call: "dup", io_error: e }),
                })?
            }
            _ => return Err(MapError::Session { map: "CT", source: AyaMapError::InvalidMapType { map_type: 0 } }),
        };
        Ok(Self {
            ct_fd,
            affinity: BpfHashMap::try_from(affinity).map_err(aya_err("AFFINITY"))?,
            sock_backend: BpfHashMap::try_from(sock_backend).map_err(aya_err("SOCK_BACKEND"))?,
            sock_revnat: BpfHashMap::try_from(sock_revnat).map_err(aya_err("SOCK_REVNAT"))?,
            ct: BpfHashMap::try_from(ct).map_err(aya_err("CT"))?,
        })
    }

    /// `CT`, for `ActiveConns::sweep_ended_flows`.
    #[must_use]
    pub(crate) fn ct_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.ct_fd.as_fd()
    }

    /// The frontend a socket asked for, if the programs translated it to
    /// this backend.
    #[must_use]
    pub(crate) fn service_of(&self, cookie: u64, addr: IpAddr, port: u16, protocol: Protocol) -> Option<FrontendKey> {
        let value = self.sock_revnat.get(&codec::sock_revnat_key(cookie, addr, port), 0).ok()?;
        Some(codec::sock_revnat_frontend(&value, protocol))
    }

    /// Marks `flows` (conntrack's DNATed flows, `netfilter_flows::dump`)
    /// as netfilter's in `CT` (`ct_flags::KERNEL`), unless a flow has an
    /// entry already; `now_ns` is their last use (CLOCK_MONOTONIC). Returns
    /// how many were marked.
    pub(crate) fn mark_netfilter_flows(
        &mut self,
        flows: &[super::netfilter_flows::NatFlow],
        now_ns: u64,
    ) -> Result<usize, MapError> {
        let mut marked = 0;
        for flow in flows {
            let key = CtKey {
                src: proxy_common::net::encode(flow.src),
                dst: proxy_common::net::encode(flow.dst),
                sport: flow.sport.to_be(),
                dport: flow.dport.to_be(),
                proto: flow.proto,
                dir: proxy_common::ct_dir::ORIGINAL,
                pad: [0; 2],
            };
            let value = CtValue { flags: ct_flags::KERNEL, last_seen_ns: now_ns, ..CtValue::default() };
            // BPF_NOEXIST: a flow the programs saw keeps its entry.
            match self.ct.insert(key, value, BPF_NOEXIST) {
                Ok(()) => marked += 1,
                Err(AyaMapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(source) => return Err(MapError::Session { map: "CT", source }),
            }
        }
        Ok(marked)
    }

    /// Every flow in `CT`.
    pub(crate) fn flows(&self) -> Result<Vec<(CtKey, CtValue)>, MapError> {
        let io = |e: std::io::Error| MapError::Session {
            map: "CT",
            source: AyaMapError::SyscallError(aya::sys::SyscallError { call: "bpf_map_lookup_batch", io_error: e }),
        };
        match super::sys::read_hash_map::<CtKey, CtValue>(self.ct_fd(), 1024).map_err(io)? {
            Some(flows) => Ok(flows),
            None => Ok(self.ct.iter().filter_map(Result::ok).collect()),
        }
    }

    /// Carries the flows of `from` (another set's `CT`) into this one,
    /// each with the ids `remap` gives it; a flow this `CT` holds already
    /// keeps its entry, and one `remap` refuses (its frontend or backend is
    /// gone) is left behind. Returns how many were carried and left.
    pub(crate) fn carry_flows(
        &mut self,
        from: &Self,
        remap: impl Fn(CtValue) -> Option<CtValue>,
    ) -> Result<(usize, usize), MapError> {
        let (mut carried, mut left) = (0, 0);
        for (key, value) in from.flows()? {
            let Some(value) = remap(value) else {
                left += 1;
                continue;
            };
            // BPF_NOEXIST: a flow the new programs saw first keeps its entry.
            match self.ct.insert(key, value, BPF_NOEXIST) {
                Ok(()) => carried += 1,
                Err(AyaMapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(source) => return Err(MapError::Session { map: "CT", source }),
            }
        }
        Ok((carried, left))
    }

    /// Deletes memos whose backend no longer serves their frontend; returns
    /// how many. `live` answers per memo, so a sync at 10,000 services pays
    /// for the memos there are, not for the whole table.
    pub(crate) fn purge(&mut self, live: &impl Liveness) -> Result<usize, MapError> {
        let affinity: Vec<(AffinityKey, AffinityValue)> = self.affinity.iter().filter_map(Result::ok).collect();
        // Flows marked netfilter's (taking over from kube-proxy,
        // `ct_flags::KERNEL`) have no backend of ours: the kernel's
        // conntrack keeps their way, so they are not the agent's to forget.
        let udp_flows: Vec<(CtKey, CtValue)> = self
            .ct
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| k.proto == proto::UDP && v.flags & ct_flags::KERNEL == 0)
            .collect();
        let rev_nats: HashSet<RevNatId> =
            affinity.iter().map(|(k, _)| k.rev_nat).chain(udp_flows.iter().map(|(_, v)| v.rev_nat)).collect();
        let by_rev_nat = if rev_nats.is_empty() { HashMap::new() } else { live.by_rev_nat(&rev_nats) };
        let serves_rev_nat = |rev_nat: RevNatId, id: u32| by_rev_nat.get(&rev_nat).is_some_and(|set| set.contains(&id));
        let stale_affinity: Vec<AffinityKey> =
            affinity.into_iter().filter(|(k, v)| !serves_rev_nat(k.rev_nat, v.backend_id)).map(|(k, _)| k).collect();
        let stale_sockets: Vec<SockBackendKey> = self
            .sock_backend
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, id)| {
                // A protocol the agent never writes serves nothing: deleted.
                !codec::sock_backend_frontend(k).is_ok_and(|f| live.serves(&f, *id))
            })
            .map(|(k, _)| k)
            .collect();
        let stale_flows: Vec<CtKey> =
            udp_flows.into_iter().filter(|(_, v)| !serves_rev_nat(v.rev_nat, v.backend_id)).map(|(k, _)| k).collect();
        for key in &stale_affinity {
            remove_ok(self.affinity.remove(key)).map_err(aya_err("AFFINITY"))?;
        }
        for key in &stale_sockets {
            remove_ok(self.sock_backend.remove(key)).map_err(aya_err("SOCK_BACKEND"))?;
        }
        for key in &stale_flows {
            remove_ok(self.ct.remove(key)).map_err(aya_err("CT"))?;
        }
        Ok(stale_affinity.len() + stale_sockets.len() + stale_flows.len())
    }
}

/// A key the LRU dropped meanwhile is as good as deleted.
fn remove_ok(result: Result<(), AyaMapError>) -> Result<(), AyaMapError> {
    match result {
        Err(AyaMapError::KeyNotFound | AyaMapError::ElementNotFound) => Ok(()),
        Err(AyaMapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}
