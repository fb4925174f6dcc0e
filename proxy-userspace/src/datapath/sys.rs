//! Raw bpf(2) calls aya 0.14 does not expose: opening a pinned link, reading
//! a link's info, linking a program known by its fd alone, swapping a
//! link's program, element access to a map
//! whose value size is known only at run time (the Maglev tables), and
//! batch writes and reads. Numbers and layouts are those of `union
//! bpf_attr` and `struct bpf_link_info` in linux/bpf.h. Also the cookie
//! of the agent's network namespace, which the programs compare sockets'
//! with (`--socket-lb`).
use std::{
    ffi::CString,
    io,
    mem::MaybeUninit,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// bpf(cmd, attr, size): with `read_hash_map` taking what it filled in,
/// the only `unsafe` of this module.
fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zeroed, 8-byte aligned buffer of the size
    // passed, laid out as the command's part of `union bpf_attr`; the
    // pointers stored in it outlive the call.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of_val(attr)) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

fn fd_u64(fd: BorrowedFd<'_>) -> u64 {
    u64::from(u32::try_from(fd.as_raw_fd()).expect("fds are non-negative"))
}

/// Opens a pinned object.
pub(crate) fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // { __aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags; ... }
    let mut attr = [path.as_ptr() as u64, 0, 0, 0];
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins the object `fd` at `path` (another pin of an object: bpffs has no
/// rename).
pub(crate) fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = [path.as_ptr() as u64, fd_u64(fd), 0, 0];
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// A link as `BPF_OBJ_GET_INFO_BY_FD` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkInfo {
    /// `enum bpf_link_type`.
    pub(crate) link_type: u32,
    pub(crate) id: u32,
    pub(crate) prog_id: u32,
    /// The first 8 bytes of the type's part: a cgroup link's cgroup id; a
    /// tcx link's ifindex (low 32 bits) and attach type (high 32 bits).
    pub(crate) target: u64,
}

/// `BPF_LINK_TYPE_CGROUP` and `BPF_LINK_TYPE_TCX` of `enum bpf_link_type`.
pub(crate) const LINK_TYPE_CGROUP: u32 = 3;
pub(crate) const LINK_TYPE_TCX: u32 = 11;

pub(crate) fn link_info(link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    // struct bpf_link_info { u32 type, id, prog_id; union { ... } } — the
    // union starts at byte 16 (8-byte aligned).
    let mut info = [0u64; 8];
    let info_len = size_of_val(&info) as u64;
    // { __u32 bpf_fd; __u32 info_len; __aligned_u64 info; }
    let mut attr = [fd_u64(link) | (info_len << 32), info.as_mut_ptr() as u64, 0, 0];
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    #[expect(clippy::cast_possible_truncation, reason = "u32 fields packed in u64 words")]
    Ok(LinkInfo { link_type: info[0] as u32, id: (info[0] >> 32) as u32, prog_id: info[1] as u32, target: info[2] })
}

/// The key and value sizes of `map` (`struct bpf_map_info { u32 type, id,
/// key_size, value_size, ... }`).
fn map_kv_sizes(map: BorrowedFd<'_>) -> io::Result<(usize, usize)> {
    let info = map_info(map)?;
    #[expect(clippy::cast_possible_truncation, reason = "u32 fields packed in a u64 word")]
    Ok(((info[1] as u32) as usize, ((info[1] >> 32) as u32) as usize))
}

/// The first words of `bpf_map_info`: type and id; key and value sizes;
/// `max_entries` and flags.
fn map_info(map: BorrowedFd<'_>) -> io::Result<[u64; 3]> {
    let mut info = [0u64; 3];
    let info_len = size_of_val(&info) as u64;
    let mut attr = [fd_u64(map) | (info_len << 32), info.as_mut_ptr() as u64, 0, 0];
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// The most entries `map` holds (`max_entries` of `bpf_map_info`).
pub(crate) fn map_max_entries(map: BorrowedFd<'_>) -> io::Result<u32> {
    #[expect(clippy::cast_possible_truncation, reason = "the low u32 of the word")]
    Ok(map_info(map)?[2] as u32)
}

/// Links the loaded program `prog` to the cgroup `cgroup` at
/// `attach_type` (`enum bpf_attach_type`): the new link (kernel 5.7+). Flags
/// 0: the link runs beside other programs on the cgroup (a CNI's).
pub(crate) fn link_create(prog: BorrowedFd<'_>, cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<OwnedFd> {
    // { __u32 prog_fd; __u32 target_fd; __u32 attach_type; __u32 flags; ... }
    let mut attr = [fd_u64(prog) | (fd_u64(cgroup) << 32), u64::from(attach_type), 0, 0, 0, 0];
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `link` run `prog` instead of its current program, atomically.
pub(crate) fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    // { __u32 link_fd; __u32 new_prog_fd; __u32 flags; __u32 old_prog_fd; }
    let mut attr = [fd_u64(link) | (fd_u64(prog) << 32), 0, 0, 0];
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// `{ __u32 map_fd; __aligned_u64 key; __aligned_u64 value; __u64 flags }`.
fn elem_attr(map: BorrowedFd<'_>, key: &[u8], value: u64, flags: u64) -> [u64; 4] {
    [fd_u64(map), key.as_ptr() as u64, value, flags]
}

/// Writes `value` (exactly the map's value size) under `key`.
pub(crate) fn map_update(map: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut attr = elem_attr(map, key, value.as_ptr() as u64, 0);
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Reads the value of `key` into `value` (exactly the map's value size);
/// false when there is none.
pub(crate) fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut attr = elem_attr(map, key, value.as_mut_ptr() as u64, 0);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Writes `count` entries in one call: `keys` and `values` point at
/// `count` packed keys and values of the map's sizes. Returns how many the
/// kernel wrote (in order) and the error that stopped it, if one did.
/// (Kernels before 5.6 answer `EINVAL`, having written none.)
pub(crate) fn map_update_batch<K, V>(map: BorrowedFd<'_>, keys: &[K], values: &[V]) -> (usize, io::Result<()>) {
    assert_eq!(keys.len(), values.len(), "one value per key");
    update_batch(map, keys, values.as_ptr() as u64)
}

/// `BPF_MAP_UPDATE_BATCH` of `keys` and the values at `values`.
fn update_batch<K>(map: BorrowedFd<'_>, keys: &[K], values: u64) -> (usize, io::Result<()>) {
    let count = u32::try_from(keys.len()).expect("batches are small");
    // struct { __aligned_u64 in_batch, out_batch, keys, values;
    //          __u32 count, map_fd; __u64 elem_flags, flags; } batch
    let mut attr = [0, 0, keys.as_ptr() as u64, values, u64::from(count) | (fd_u64(map) << 32), 0, 0];
    let result = bpf(BPF_MAP_UPDATE_BATCH, &mut attr).map(drop);
    // The kernel writes back how many it wrote when an entry fails (fewer
    // than `count`), and nothing when it refuses the call before the first
    // entry (a kernel without batch writes, a bad argument): then the
    // count is still ours, and none was written.
    #[expect(clippy::cast_possible_truncation, reason = "count is the low 32 bits")]
    let written_back = attr[4] as u32;
    let done = if written_back < count { written_back as usize } else { 0 };
    (if result.is_ok() { keys.len() } else { done }, result)
}

/// One step of reading a hash map in batches: up to `keys.len()` entries
/// after the position in `token` (none: from the start) into `keys` and
/// `values`, the next position back into `token`. Returns how many were
/// read and whether the map is done. The kernel hands out whole buckets:
/// `ENOSPC` means a bucket holds more entries than `keys` has room for.
/// (Kernels before 5.6 answer `EINVAL`.)
fn map_lookup_batch<K, V>(
    map: BorrowedFd<'_>,
    token: &mut Option<u64>,
    keys: &mut [MaybeUninit<K>],
    values: &mut [MaybeUninit<V>],
) -> io::Result<(usize, bool)> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let count = u32::try_from(keys.len()).expect("batches are small");
    // The position is a bucket number (`u32`) for hash maps; 8 bytes hold it.
    let mut in_batch = token.unwrap_or(0);
    let mut out_batch = 0u64;
    let in_ptr = if token.is_some() { std::ptr::from_mut(&mut in_batch) as u64 } else { 0 };
    // struct { __aligned_u64 in_batch, out_batch, keys, values;
    //          __u32 count, map_fd; __u64 elem_flags, flags; } batch
    let mut attr = [
        in_ptr,
        std::ptr::from_mut(&mut out_batch) as u64,
        keys.as_mut_ptr() as u64,
        values.as_mut_ptr() as u64,
        u64::from(count) | (fd_u64(map) << 32),
        0,
        0,
    ];
    let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
    #[expect(clippy::cast_possible_truncation, reason = "count is the low 32 bits")]
    let read = (attr[4] as u32).min(count) as usize;
    match result {
        Ok(_) => {
            *token = Some(out_batch);
            Ok((read, false))
        }
        // The end: what was read before it is valid.
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok((read, true)),
        Err(err) => Err(err),
    }
}

/// The `u64` values at indexes `start..start + out.len()` of the array
/// `fd` (8-byte values) into `out`, with `BPF_MAP_LOOKUP_BATCH` (an array's
/// batch position is its last index read); `Ok(false)`: the kernel has no
/// batch reads. `start` must be below the array's length (the kernel
/// starts again from index 0 past it); a range that runs past the end
/// fails.
pub(crate) fn read_u64_range(fd: BorrowedFd<'_>, start: u32, out: &mut [u64]) -> io::Result<bool> {
    // The kernel reads the position as a key: the index's 4 bytes first.
    let position = |index: u32| {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&index.to_ne_bytes());
        u64::from_ne_bytes(bytes)
    };
    let mut token = start.checked_sub(1).map(position);
    let mut done = 0;
    while done < out.len() {
        let want = out.len() - done;
        let mut keys = vec![MaybeUninit::<u32>::uninit(); want];
        let mut values = vec![MaybeUninit::<u64>::uninit(); want];
        let (read, end) = match map_lookup_batch(fd, &mut token, &mut keys, &mut values) {
            Ok(step) => step,
            Err(err) if done == 0 && err.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
            Err(err) => return Err(err),
        };
        for (slot, value) in out[done..].iter_mut().zip(&values[..read]) {
            // SAFETY: the kernel wrote `read` whole 8-byte values.
            *slot = unsafe { value.assume_init() };
        }
        done += read;
        if end && done < out.len() {
            return Err(io::Error::other(format!("indexes {start}.. run past the array's end at {done}")));
        }
    }
    Ok(true)
}

/// Every entry of the hash map `fd` (keys `K`, values `V`, exactly the
/// map's sizes) with `BPF_MAP_LOOKUP_BATCH`: one call per `chunk` entries
/// instead of two per entry (an agent restart at 100,000 services reads
/// 2,300,000 back). `Ok(None)`: the kernel has no batch reads.
pub fn read_hash_map<K: aya::Pod, V: aya::Pod>(fd: BorrowedFd<'_>, chunk: usize) -> io::Result<Option<Vec<(K, V)>>> {
    read_map_where(fd, chunk, |_, _| true)
}

/// As `read_hash_map`, keeping only the entries `keep` takes, chunk by
/// chunk (an array's empty entries are never all held at once). Any map
/// with batch reads: an array's position is its last index (`u32`).
pub(crate) fn read_map_where<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    chunk: usize,
    mut keep: impl FnMut(&K, &V) -> bool,
) -> io::Result<Option<Vec<(K, V)>>> {
    let mut out = Vec::new();
    let read = for_each_entry(fd, chunk, |k: K, v: V| {
        if keep(&k, &v) {
            out.push((k, v));
        }
    })?;
    Ok(read.then_some(out))
}

/// Hands every entry of the map `fd` (keys `K`, values `V`, exactly the
/// map's sizes) to `each`, read `chunk` at a time with
/// `BPF_MAP_LOOKUP_BATCH`: only a chunk is held at once. `Ok(false)`: the
/// kernel has no batch reads (nothing was handed over). Any map with batch
/// reads: an array's position is its last index (`u32`).
pub(crate) fn for_each_entry<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    chunk: usize,
    mut each: impl FnMut(K, V),
) -> io::Result<bool> {
    // The kernel writes whole keys and values of the map's sizes: they
    // must be those of `K` and `V`.
    let (key_size, value_size) = map_kv_sizes(fd)?;
    if (key_size, value_size) != (size_of::<K>(), size_of::<V>()) {
        return Err(io::Error::other(format!(
            "the map's keys and values are {key_size} and {value_size} bytes, not {} and {}",
            size_of::<K>(),
            size_of::<V>()
        )));
    }
    let mut token = None;
    // Batches grow to `chunk` as they come full: a map of a few entries
    // (the fresh maps a start reads) takes small lists.
    let mut size = chunk.clamp(1, 256);
    let mut keys = Vec::new();
    let mut values = Vec::new();
    loop {
        keys.resize(size, MaybeUninit::<K>::uninit());
        values.resize(size, MaybeUninit::<V>::uninit());
        match map_lookup_batch(fd, &mut token, &mut keys, &mut values) {
            Ok((read, done)) => {
                if read == size {
                    size = (size * 2).min(chunk.max(size));
                }
                for (k, v) in keys[..read].iter().zip(&values[..read]) {
                    // SAFETY: the kernel wrote `read` whole keys and values
                    // of the map's sizes, checked above to be those of `K`
                    // and `V`, from the start; any bytes are a valid `Pod`.
                    each(unsafe { k.assume_init() }, unsafe { v.assume_init() });
                }
                if done {
                    return Ok(true);
                }
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => size *= 2,
            Err(err) if token.is_none() && err.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
            Err(err) => return Err(err),
        }
    }
}

/// Deletes `key` and returns the value it held, in one call (hash maps,
/// kernel 5.14+): what is returned is exactly what was deleted, so a
/// concurrent writer's new value is never lost unseen. `None`: no such key.
pub(crate) fn map_lookup_and_delete<K: aya::Pod, V: aya::Pod + Default>(
    map: BorrowedFd<'_>,
    key: &K,
) -> io::Result<Option<V>> {
    let mut value = V::default();
    let mut attr = [fd_u64(map), std::ptr::from_ref(key) as u64, std::ptr::from_mut(&mut value) as u64, 0];
    match bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr) {
        Ok(_) => Ok(Some(value)),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Inserts `value` under `key` unless the key exists (`BPF_NOEXIST`);
/// an existing key is success (its value is kept).
pub(crate) fn map_insert_new<K: aya::Pod, V: aya::Pod>(map: BorrowedFd<'_>, key: &K, value: &V) -> io::Result<()> {
    const BPF_NOEXIST: u64 = 1;
    let mut attr = [fd_u64(map), std::ptr::from_ref(key) as u64, std::ptr::from_ref(value) as u64, BPF_NOEXIST];
    match bpf(BPF_MAP_UPDATE_ELEM, &mut attr) {
        Err(err) if err.raw_os_error() != Some(libc::EEXIST) => Err(err),
        _ => Ok(()),
    }
}

/// Deletes `key`; a missing key is success.
pub(crate) fn map_delete(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    let mut attr = elem_attr(map, key, 0, 0);
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(err) if err.raw_os_error() != Some(libc::ENOENT) => Err(err),
        _ => Ok(()),
    }
}

/// The key after `key` (the first key for `None`) into `next`; false at
/// the end.
pub(crate) fn map_next_key(map: BorrowedFd<'_>, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let mut attr = elem_attr(map, key.unwrap_or(&[]), next.as_mut_ptr() as u64, 0);
    if key.is_none() {
        attr[1] = 0;
    }
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(true),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The cookie of this process's network namespace (`SO_NETNS_COOKIE` on a
/// socket of it, Linux 5.14), which `bpf_get_netns_cookie` gives the
/// programs for a socket there.
pub(crate) fn own_netns_cookie() -> io::Result<u64> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let fd = if fd < 0 {
        // A node without IPv6.
        // SAFETY: as above.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }
    } else {
        fd
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut cookie = 0u64;
    let mut len = libc::socklen_t::try_from(size_of::<u64>()).expect("8");
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(cookie) }
}
