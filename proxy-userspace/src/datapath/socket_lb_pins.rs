//! Which sockets the attached socket programs translate (`--socket-lb`),
//! read back from the kernel for `status` and `explain` (the agent need
//! not be running): the `SOCKET_LB_NETNS` global of the program behind
//! the pinned `connect4` link, in that program's `.rodata` map, at the
//! offset the eBPF object's symbol table gives. What the kernel runs is
//! the answer, whatever the agent's flags say.
use std::{os::fd::AsFd as _, path::Path};

use aya::{maps::MapInfo, programs::loaded_programs};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::{links, loader::SocketLb, sys};

/// The pinned link whose program is read (any socket program would do:
/// one object, one value).
const LINK: &str = "connect4";

/// Why the mode cannot be told.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("no socket program is attached (no pinned {LINK} link)")]
    NotAttached,
    #[error("reading the pinned {LINK} link: {0}")]
    Link(std::io::Error),
    #[error("program {0} of the {LINK} link is not loaded")]
    NoProgram(u32),
    #[error("the program's maps: {0}")]
    Maps(String),
    #[error("the program has no .rodata map holding {}", proxy_common::SOCKET_LB_NETNS)]
    NoRodata,
    #[error("this build's eBPF object has no {} symbol", proxy_common::SOCKET_LB_NETNS)]
    NoSymbol,
    #[error(
        "the attached programs are another build's (their .rodata is {theirs} bytes, this build's {ours}): ask that build's ebpf-proxy"
    )]
    OtherBuild { theirs: usize, ours: usize },
}

/// The mode the programs run with: `HostNamespace` with the cookie of the
/// namespace whose sockets they translate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    All,
    HostNamespace { netns_cookie: u64 },
}

impl Seen {
    #[must_use]
    pub(crate) const fn mode(self) -> SocketLb {
        match self {
            Self::All => SocketLb::All,
            Self::HostNamespace { .. } => SocketLb::HostNamespace,
        }
    }

    /// Whether a socket of the namespace with `cookie` is translated at
    /// the socket (else its packets are, on a pod-facing device).
    #[must_use]
    pub(crate) const fn translates_socket_of(self, cookie: u64) -> bool {
        match self {
            Self::All => true,
            Self::HostNamespace { netns_cookie } => netns_cookie == cookie,
        }
    }
}

/// Reads the mode of the socket programs attached through `pin_dir`.
pub(crate) fn read(pin_dir: &Path) -> Result<Seen, ReadError> {
    let pin = pin_dir.join(crate::paths::LINKS_SUBDIR).join(LINK);
    if !pin.exists() {
        return Err(ReadError::NotAttached);
    }
    let program_id = links::pinned_link_info(&pin).map_err(ReadError::Link)?.program_id;
    let program = loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == program_id)
        .ok_or(ReadError::NoProgram(program_id))?;
    let (offset, section) = symbol_in_rodata(super::loader::object(), proxy_common::SOCKET_LB_NETNS)?;
    let map_ids = program.map_ids().map_err(|e| ReadError::Maps(e.to_string()))?.unwrap_or_default();
    for id in map_ids {
        let Ok(info) = MapInfo::from_id(id) else { continue };
        let value_size = info.value_size() as usize;
        if !info.name_as_str().is_some_and(|n| n.ends_with(".rodata")) {
            continue;
        }
        // Another build's globals may sit elsewhere: its section would
        // rarely be the same size.
        if value_size != section {
            return Err(ReadError::OtherBuild { theirs: value_size, ours: section });
        }
        let fd = info.fd().map_err(|e| ReadError::Maps(e.to_string()))?;
        let mut value = vec![0u8; value_size];
        if !sys::map_lookup(fd.as_fd(), &0u32.to_ne_bytes(), &mut value).map_err(|e| ReadError::Maps(e.to_string()))? {
            continue;
        }
        let mut cookie = [0u8; 8];
        cookie.copy_from_slice(&value[offset..offset + 8]);
        return Ok(match u64::from_ne_bytes(cookie) {
            0 => Seen::All,
            netns_cookie => Seen::HostNamespace { netns_cookie },
        });
    }
    Err(ReadError::NoRodata)
}

/// The pod-facing devices with the per-packet programs attached through
/// `pin_dir` (their pinned links, `pod-DEVICE-ingress`).
#[must_use]
pub(crate) fn pod_devices(pin_dir: &Path) -> Vec<String> {
    let mut devices: Vec<String> = std::fs::read_dir(pin_dir.join(crate::paths::LINKS_SUBDIR))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some(name.strip_prefix(super::loader::POD_LINK_PREFIX)?.strip_suffix("-ingress")?.to_owned())
        })
        .collect();
    devices.sort();
    devices
}

/// Offset of the 8-byte global `name` in the object's `.rodata`, and the
/// section's size.
fn symbol_in_rodata(elf: &[u8], name: &str) -> Result<(usize, usize), ReadError> {
    let file = object::File::parse(elf).map_err(|_| ReadError::NoSymbol)?;
    let symbol = file.symbols().find(|s| s.name() == Ok(name)).ok_or(ReadError::NoSymbol)?;
    let section = symbol.section_index().and_then(|i| file.section_by_index(i).ok()).ok_or(ReadError::NoSymbol)?;
    if section.name() != Ok(".rodata") || symbol.size() != 8 {
        return Err(ReadError::NoSymbol);
    }
    // A relocatable object: a symbol's value is its offset in its section.
    let offset = usize::try_from(symbol.address()).map_err(|_| ReadError::NoSymbol)?;
    let size = usize::try_from(section.size()).map_err(|_| ReadError::NoSymbol)?;
    if offset + 8 > size {
        return Err(ReadError::NoSymbol);
    }
    Ok((offset, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The object the agent loads has the global where this module reads
    /// it (a rename or a move to another section would make `status` say
    /// it cannot tell).
    #[test]
    fn the_object_holds_the_global_in_rodata() {
        let (offset, section) =
            symbol_in_rodata(super::super::loader::object(), proxy_common::SOCKET_LB_NETNS).unwrap();
        assert_eq!(offset % 8, 0);
        assert!(offset + 8 <= section, "{offset} in {section} bytes");
        assert!(matches!(symbol_in_rodata(super::super::loader::object(), "NO_SUCH_GLOBAL"), Err(ReadError::NoSymbol)));
    }

    #[test]
    fn which_namespace_is_translated_at_the_socket() {
        assert!(Seen::All.translates_socket_of(7));
        let host = Seen::HostNamespace { netns_cookie: 7 };
        assert!(host.translates_socket_of(7));
        assert!(!host.translates_socket_of(8));
        assert_eq!(host.mode(), SocketLb::HostNamespace);
    }
}
