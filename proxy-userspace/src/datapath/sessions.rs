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
    AffinityKey, AffinityValue, CtKey, CtValue, SockBackendKey, SockRevNat, SockRevNatKey,
    net::{decode, encode},
    proto,
};

use super::maps::MapError;
use crate::model::{FrontendKey, Protocol};

pub struct SessionMaps {
    affinity: BpfHashMap<MapData, AffinityKey, AffinityValue>,
    sock_backend: BpfHashMap<MapData, SockBackendKey, u32>,
    sock_revnat: BpfHashMap<MapData, SockRevNatKey, SockRevNat>,
    ct: BpfHashMap<MapData, CtKey, CtValue>,
}

fn aya_err(map: &'static str) -> impl Fn(AyaMapError) -> MapError {
    move |source| MapError::Session { map, source }
}

impl SessionMaps {
    pub fn from_maps(affinity: Map, sock_backend: Map, sock_revnat: Map, ct: Map) -> Result<Self, MapError> {
        Ok(Self {
            affinity: BpfHashMap::try_from(affinity).map_err(aya_err("AFFINITY"))?,
            sock_backend: BpfHashMap::try_from(sock_backend).map_err(aya_err("SOCK_BACKEND"))?,
            sock_revnat: BpfHashMap::try_from(sock_revnat).map_err(aya_err("SOCK_REVNAT"))?,
            ct: BpfHashMap::try_from(ct).map_err(aya_err("CT"))?,
        })
    }

    /// The frontend a socket asked for, if the programs translated it to
    /// this backend.
    #[must_use]
    pub fn service_of(&self, cookie: u64, addr: IpAddr, port: u16, protocol: Protocol) -> Option<FrontendKey> {
        let key = SockRevNatKey { cookie, addr: encode(addr), port: port.to_be(), pad: [0; 6] };
        let value = self.sock_revnat.get(&key, 0).ok()?;
        Some(FrontendKey::new(decode(&value.addr), u16::from_be(value.port), protocol))
    }

    /// Deletes memos whose backend no longer serves their frontend; returns
    /// how many.
    pub fn purge(&mut self, live: &HashMap<FrontendKey, (u16, HashSet<u32>)>) -> Result<usize, MapError> {
        let by_rev_nat: HashMap<u16, &HashSet<u32>> = live.values().map(|(r, set)| (*r, set)).collect();
        let stale_affinity: Vec<AffinityKey> = self
            .affinity
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| !by_rev_nat.get(&k.rev_nat).is_some_and(|set| set.contains(&v.backend_id)))
            .map(|(k, _)| k)
            .collect();
        let stale_sockets: Vec<SockBackendKey> = self
            .sock_backend
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, id)| {
                let frontend = Protocol::from_number(k.proto)
                    .map(|protocol| FrontendKey::new(decode(&k.addr), u16::from_be(k.port), protocol));
                !frontend.and_then(|f| live.get(&f)).is_some_and(|(_, set)| set.contains(id))
            })
            .map(|(k, _)| k)
            .collect();
        let stale_flows: Vec<CtKey> = self
            .ct
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| {
                k.proto == proto::UDP && !by_rev_nat.get(&v.rev_nat).is_some_and(|set| set.contains(&v.backend_id))
            })
            .map(|(k, _)| k)
            .collect();
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
