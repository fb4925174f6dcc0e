//! Makes veths behave like NICs for XDP, for the kernel tests and the
//! benchmark's outside path (`--nodeport-acceleration`):
//! - a sender towards an XDP device fills in its TCP/UDP checksums
//!   (`tx_checksum(.., false)`): a veth otherwise hands on a partial
//!   checksum, which XDP cannot see and a rewritten frame would keep (a NIC
//!   never does);
//! - the peer of a veth whose XDP program sends frames back out
//!   (`XDP_TX`) runs an XDP program itself (`pass_all`): the kernel wakes a
//!   veth for the frames its peer sends that way only then, else they wait
//!   in its queue.
//!
//! Both by hand through python3's ctypes (the machine has no ethtool, and
//! the pass program is two instructions).
use std::{
    io::{self, BufRead as _, BufReader},
    process::{Child, Stdio},
};

use ebpf_proxy::sandbox::{NetNs, spawn_in};

/// `ETHTOOL_STXCSUM` (linux/ethtool.h).
const ETHTOOL_STXCSUM: u32 = 0x17;

/// Turns TX checksum offload of `device` in `ns` on or off with the legacy
/// `SIOCETHTOOL` ioctl.
///
/// # Errors
/// When python3 cannot run or the ioctl fails.
pub fn tx_checksum(ns: &NetNs, device: &str, on: bool) -> io::Result<()> {
    const SCRIPT: &str = "import ctypes, fcntl, socket, struct, sys
value = ctypes.create_string_buffer(struct.pack('II', int(sys.argv[2]), int(sys.argv[3])))
ifreq = struct.pack('16sP16x', sys.argv[1].encode(), ctypes.addressof(value))
sock = socket.socket()
fcntl.ioctl(sock.fileno(), 0x8946, ifreq)";
    let status = spawn_in(ns, None, "/usr/bin/python3")?
        .args(["-c", SCRIPT, device, &ETHTOOL_STXCSUM.to_string(), if on { "1" } else { "0" }])
        .status()?;
    if status.success() { Ok(()) } else { Err(io::Error::other(format!("tx checksum offload of {device}: {status}"))) }
}

/// An XDP program that passes everything, attached (native on a veth) to
/// some devices through links a python3 process holds: dropping it ends
/// the process, which detaches them.
pub struct PassAll(Child);

impl Drop for PassAll {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Attaches `PassAll` to `devices` of `ns`.
///
/// # Errors
/// When python3 cannot run, or the program cannot be loaded or attached.
pub fn pass_all(ns: &NetNs, devices: &[&str]) -> io::Result<PassAll> {
    // bpf(2) by hand (r0 = XDP_PASS; exit): BPF_PROG_LOAD (5) of type
    // XDP (6), then BPF_LINK_CREATE (28) with attach type BPF_XDP (37).
    const SCRIPT: &str = "import ctypes, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr + bytes(128 - len(attr)))
    fd = libc.syscall(ctypes.c_long(321), ctypes.c_long(cmd), buf, ctypes.c_long(128))
    if fd < 0:
        sys.exit('bpf(%d): errno %d' % (cmd, ctypes.get_errno()))
    return fd
insns = ctypes.create_string_buffer(struct.pack('<BBhiBBhi', 0xb7, 0, 0, 2, 0x95, 0, 0, 0))
license = ctypes.create_string_buffer(b'GPL')
prog = bpf(5, struct.pack('IIQQIIQII16s', 6, 2, ctypes.addressof(insns), ctypes.addressof(license), 0, 0, 0, 0, 0, b'xdp_pass'))
links = [bpf(28, struct.pack('IIII', prog, socket.if_nametoindex(d), 37, 0)) for d in sys.argv[1:]]
print('attached', flush=True)
time.sleep(1e9)";
    let mut child =
        spawn_in(ns, None, "/usr/bin/python3")?.args(["-c", SCRIPT]).args(devices).stdout(Stdio::piped()).spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let guard = PassAll(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() == "attached" {
        Ok(guard)
    } else {
        Err(io::Error::other(format!("the XDP pass program did not attach to {devices:?}")))
    }
}
