//! `SERVICE_NAMES`: rev-NAT id -> the service port of the frontend, pinned
//! beside the other maps so `ebpf-proxy service` names services with the
//! agent stopped. The programs never read it: the agent creates and pins
//! it itself (it is not in the eBPF object).
use std::path::Path;

use aya::maps::{HashMap, Map, MapData};
use proxy_common::{ServiceName, map_names, map_sizes};

use super::maps::{MapError, MapName};
use crate::model::ServicePort;

/// `BPF_MAP_TYPE_HASH` and `BPF_F_NO_PREALLOC` (linux/bpf.h).
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;

/// The map pinned at `path`, made and pinned first when there is none; a
/// pin of another key or value size is refused.
pub fn open_or_create(path: &Path) -> Result<HashMap<MapData, u16, ServiceName>, MapError> {
    let open_err = |source| MapError::Open { path: path.display().to_string(), source };
    let map = if path.exists() {
        MapData::from_pin(path).map_err(open_err)?
    } else {
        let obj = aya_obj::Map::new_from_params(
            BPF_MAP_TYPE_HASH,
            u32::try_from(size_of::<u16>()).expect("small"),
            u32::try_from(size_of::<ServiceName>()).expect("small"),
            map_sizes::SERVICE_NAMES,
            BPF_F_NO_PREALLOC,
        );
        let map = MapData::create(obj, map_names::SERVICE_NAMES, None)
            .map_err(|source| MapError::Aya { map: MapName::Names, source })?;
        map.pin(path).map_err(|e| {
            open_err(aya::maps::MapError::PinError { name: Some(map_names::SERVICE_NAMES.into()), error: e })
        })?;
        map
    };
    // aya checks the key and value sizes against the types here.
    HashMap::try_from(Map::HashMap(map)).map_err(open_err)
}

/// `text` cut to at most `N - 1` bytes (at a character boundary), zero-padded.
fn field<const N: usize>(text: &str) -> [u8; N] {
    let mut end = text.len().min(N - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = [0; N];
    out[..end].copy_from_slice(&text.as_bytes()[..end]);
    out
}

/// The text of a zero-padded field.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// The map's form of a service port (longer parts than Kubernetes allows
/// are cut).
#[must_use]
pub fn encode(port: &ServicePort) -> ServiceName {
    ServiceName { namespace: field(&port.namespace), name: field(&port.name), port: field(&port.port) }
}

/// The service port a map value names.
#[must_use]
pub fn decode(name: &ServiceName) -> ServicePort {
    ServicePort { namespace: text(&name.namespace), name: text(&name.name), port: text(&name.port) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_zero_padded() {
        let port = ServicePort::new("kube-system", "kube-dns", "dns-tcp");
        let name = encode(&port);
        assert_eq!(&name.namespace[..12], b"kube-system\0");
        assert!(name.port[7..].iter().all(|b| *b == 0));
        assert_eq!(decode(&name), port);
        let unnamed = ServicePort::new("default", "web", "");
        assert_eq!(decode(&encode(&unnamed)), unnamed);
    }

    #[test]
    fn the_longest_kubernetes_names_fit_and_longer_ones_are_cut() {
        let longest = ServicePort::new("n".repeat(63), "s".repeat(63), "p".repeat(15));
        assert_eq!(decode(&encode(&longest)), longest);
        let long = ServicePort::new("n".repeat(70), "s".repeat(64), "p".repeat(16));
        assert_eq!(decode(&encode(&long)), longest);
        // Never in the middle of a character: 31 two-byte letters and a half.
        let wide = ServicePort::new("é".repeat(40), "web", "http");
        assert_eq!(decode(&encode(&wide)).namespace, "é".repeat(31));
    }
}
