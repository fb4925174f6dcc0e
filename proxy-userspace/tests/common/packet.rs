//! Crafted Ethernet + IPv4/IPv6 + TCP/UDP/SCTP frames for
//! `BPF_PROG_TEST_RUN`, and a parser that checks every checksum of what
//! comes back (SCTP's CRC32c too), computed from scratch.
use std::net::{IpAddr, SocketAddr};

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const SCTP: u8 = 132;
/// SCTP chunk types.
pub const SCTP_INIT: u8 = 1;
pub const SCTP_DATA: u8 = 0;
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;
pub const RST: u8 = 0x04;
/// IPv6 next header: Destination Options.
const DSTOPTS: u8 = 60;
/// The acknowledgment number of crafted segments with ACK set (0 without).
pub const ACK_NUMBER: u32 = 7000;
/// The sequence number of crafted segments.
pub const SEQ_NUMBER: u32 = 1000;

/// One's-complement sum of `data` (16-bit big-endian words) onto `sum`.
fn sum(mut acc: u32, data: &[u8]) -> u32 {
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 { u16::from_be_bytes([chunk[0], chunk[1]]) } else { u16::from(chunk[0]) << 8 };
        acc += u32::from(word);
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !u16::try_from(acc).expect("folded to 16 bits")
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The L4 checksum over the pseudo header and `segment` (with its checksum
/// field zeroed by the caller, or left in to verify: then 0 means valid).
fn l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, segment: &[u8]) -> u16 {
    let mut acc = sum(0, &ip_bytes(src));
    acc = sum(acc, &ip_bytes(dst));
    let len = u32::try_from(segment.len()).unwrap();
    if src.is_ipv4() {
        acc += u32::from(proto) + len;
    } else {
        acc = sum(acc, &len.to_be_bytes());
        acc += u32::from(proto);
    }
    fold(sum(acc, segment))
}

/// CRC32c (Castagnoli), as SCTP computes it over its packet with the
/// checksum field 0 (RFC 9260 appendix A), bit by bit.
#[must_use]
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    !crc
}

/// An SCTP packet from `src` to `dst` with one chunk of `kind` (INIT or
/// DATA) carrying `payload`, its CRC32c right. Verification tag 0 on an
/// INIT, as RFC 9260 wants.
pub fn sctp(src: SocketAddr, dst: SocketAddr, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&src.port().to_be_bytes());
    l4.extend_from_slice(&dst.port().to_be_bytes());
    let tag: u32 = if kind == SCTP_INIT { 0 } else { 0x0bad_cafe };
    l4.extend_from_slice(&tag.to_be_bytes());
    l4.extend_from_slice(&[0; 4]); // checksum
    let chunk_len = u16::try_from(4 + payload.len()).unwrap();
    l4.extend_from_slice(&[kind, if kind == SCTP_DATA { 0x03 } else { 0 }]);
    l4.extend_from_slice(&chunk_len.to_be_bytes());
    l4.extend_from_slice(payload);
    l4.resize(l4.len().next_multiple_of(4), 0);
    let crc = crc32c(&l4);
    l4[8..12].copy_from_slice(&crc.to_le_bytes());
    wrap(src.ip(), dst.ip(), SCTP, &l4)
}

/// A frame from `src` to `dst`: TCP with `flags`, or UDP (`tcp_flags`
/// `None`) with a checksum unless `udp_zero_checksum`.
pub fn frame(src: SocketAddr, dst: SocketAddr, tcp_flags: Option<u8>, payload: &[u8]) -> Vec<u8> {
    build(src, dst, tcp_flags, payload, false)
}

/// A UDP/IPv4 frame without a UDP checksum (0, allowed for IPv4).
pub fn udp4_without_checksum(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    build(src, dst, None, payload, true)
}

fn build(src: SocketAddr, dst: SocketAddr, tcp_flags: Option<u8>, payload: &[u8], zero_udp_csum: bool) -> Vec<u8> {
    let proto = if tcp_flags.is_some() { TCP } else { UDP };
    let mut l4 = Vec::new();
    l4.extend_from_slice(&src.port().to_be_bytes());
    l4.extend_from_slice(&dst.port().to_be_bytes());
    if let Some(flags) = tcp_flags {
        l4.extend_from_slice(&SEQ_NUMBER.to_be_bytes());
        let ack = if flags & ACK != 0 { ACK_NUMBER } else { 0 };
        l4.extend_from_slice(&ack.to_be_bytes());
        l4.push(5 << 4); // data offset
        l4.push(flags);
        l4.extend_from_slice(&64_000u16.to_be_bytes()); // window
        l4.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
    } else {
        let len = u16::try_from(8 + payload.len()).unwrap();
        l4.extend_from_slice(&len.to_be_bytes());
        l4.extend_from_slice(&[0, 0]);
    }
    l4.extend_from_slice(payload);
    let csum_at = if proto == TCP { 16 } else { 6 };
    if !zero_udp_csum {
        let mut c = l4_checksum(src.ip(), dst.ip(), proto, &l4);
        if c == 0 && proto == UDP {
            c = 0xffff;
        }
        l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    }
    wrap(src.ip(), dst.ip(), proto, &l4)
}

/// Ethernet and an IPv4 or IPv6 header around `l4`.
fn wrap(src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut out = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend_from_slice(&0x0800u16.to_be_bytes());
            let total = u16::try_from(20 + l4.len()).unwrap();
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&total.to_be_bytes());
            ip.extend_from_slice(&[0x12, 0x34, 0x40, 0]); // id, don't fragment
            ip.extend_from_slice(&[64, proto, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let c = fold(sum(0, &ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            out.extend_from_slice(&0x86ddu16.to_be_bytes());
            out.extend_from_slice(&[0x60, 0, 0, 0]);
            out.extend_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
            out.extend_from_slice(&[proto, 64]);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        _ => panic!("mixed families"),
    }
    out.extend_from_slice(l4);
    out
}

/// What a frame says, with its checksums verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub proto: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// The UDP checksum field was 0 (none).
    pub udp_checksum_zero: bool,
    /// TCP only.
    pub tcp: Option<TcpSeen>,
}

/// A TCP segment's control fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSeen {
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    /// Data offset, in bytes.
    pub header_len: usize,
    /// Bytes after the header.
    pub data_len: usize,
}

/// An ICMP or ICMPv6 message, with its checksums verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcmpSeen {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Type and code.
    pub kind: (u8, u8),
    /// What follows the 8-byte ICMP header: the packet it is about.
    pub quoted: Vec<u8>,
}

/// The IP header's addresses, protocol, TTL and payload of `frame`,
/// panicking unless the IPv4 header checksum is right and the frame holds
/// exactly the IP packet.
fn ip_parts(frame: &[u8]) -> (IpAddr, IpAddr, u8, u8, &[u8]) {
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let ip = &frame[14..];
    match ethertype {
        0x0800 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            assert_eq!(fold(sum(0, &ip[..ihl])), 0, "IPv4 header checksum is wrong: {frame:02x?}");
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            assert!(total <= ip.len(), "IPv4 total length {total} beyond the frame: {frame:02x?}");
            let src = IpAddr::from(<[u8; 4]>::try_from(&ip[12..16]).unwrap());
            let dst = IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).unwrap());
            (src, dst, ip[9], ip[8], &ip[ihl..total])
        }
        0x86dd => {
            let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let src = IpAddr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
            let dst = IpAddr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
            if ip[6] == DSTOPTS {
                // A Destination Options header (DSR's): skipped.
                let ext = (usize::from(ip[41]) + 1) * 8;
                return (src, dst, ip[40], ip[7], &ip[40 + ext..40 + len]);
            }
            (src, dst, ip[6], ip[7], &ip[40..40 + len])
        }
        other => panic!("ethertype {other:#x}"),
    }
}

/// An ICMP (ICMPv6) error of `kind` (type, code) from `sender` to `to`,
/// quoting `frame`'s IP header and the first 8 bytes after it, as a router
/// or a host sends one; its checksum right.
#[must_use]
pub fn icmp_error(sender: IpAddr, to: IpAddr, kind: (u8, u8), frame: &[u8]) -> Vec<u8> {
    let ip = &frame[14..];
    let header = if sender.is_ipv4() { usize::from(ip[0] & 0x0f) * 4 } else { 40 };
    let mut icmp = vec![kind.0, kind.1, 0, 0];
    // Unused, or the next hop's MTU (fragmentation needed, packet too big).
    let mtu: u32 = if (sender.is_ipv4() && kind == (3, 4)) || (sender.is_ipv6() && kind.0 == 2) { 1400 } else { 0 };
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&ip[..header + 8]);
    let c = if sender.is_ipv4() { fold(sum(0, &icmp)) } else { l4_checksum(sender, to, 58, &icmp) };
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    wrap(sender, to, if sender.is_ipv4() { 1 } else { 58 }, &icmp)
}

/// The source and destination an ICMP error's quote names (`IcmpSeen::
/// quoted`), panicking unless a quoted IPv4 header's checksum is right.
#[must_use]
pub fn quoted_ends(quoted: &[u8]) -> (SocketAddr, SocketAddr) {
    let port = |at: usize| u16::from_be_bytes([quoted[at], quoted[at + 1]]);
    if quoted[0] >> 4 == 4 {
        let ihl = usize::from(quoted[0] & 0x0f) * 4;
        assert_eq!(fold(sum(0, &quoted[..ihl])), 0, "quoted IPv4 header checksum is wrong: {quoted:02x?}");
        let src = IpAddr::from(<[u8; 4]>::try_from(&quoted[12..16]).unwrap());
        let dst = IpAddr::from(<[u8; 4]>::try_from(&quoted[16..20]).unwrap());
        (SocketAddr::new(src, port(ihl)), SocketAddr::new(dst, port(ihl + 2)))
    } else {
        let src = IpAddr::from(<[u8; 16]>::try_from(&quoted[8..24]).unwrap());
        let dst = IpAddr::from(<[u8; 16]>::try_from(&quoted[24..40]).unwrap());
        (SocketAddr::new(src, port(40)), SocketAddr::new(dst, port(42)))
    }
}

/// Parses an ICMP (IPv4) or ICMPv6 frame, panicking unless its checksums
/// are right and it is exactly as long as its IP header says.
#[must_use]
pub fn parse_icmp(frame: &[u8]) -> IcmpSeen {
    let (src, dst, proto, _, icmp) = ip_parts(frame);
    let (header, ipv6) = if src.is_ipv4() { (20, false) } else { (40, true) };
    assert_eq!(frame.len(), 14 + header + icmp.len(), "trailing bytes after the ICMP message: {frame:02x?}");
    if ipv6 {
        assert_eq!(proto, 58, "not ICMPv6: {frame:02x?}");
        assert_eq!(l4_checksum(src, dst, proto, icmp), 0, "ICMPv6 checksum is wrong: {frame:02x?}");
    } else {
        assert_eq!(proto, 1, "not ICMP: {frame:02x?}");
        assert_eq!(fold(sum(0, icmp)), 0, "ICMP checksum is wrong: {frame:02x?}");
    }
    IcmpSeen { src, dst, kind: (icmp[0], icmp[1]), quoted: icmp[8..].to_vec() }
}

/// Parses `frame`, panicking unless its IPv4 header checksum and its
/// TCP/UDP checksum are right.
#[must_use]
pub fn parse(frame: &[u8]) -> Seen {
    let (src, dst, proto, ttl, l4) = ip_parts(frame);
    let csum_at = if proto == TCP { 16 } else { 6 };
    let field = u16::from_be_bytes([l4[csum_at], l4[csum_at + 1]]);
    let udp_checksum_zero = proto == UDP && field == 0;
    if proto == SCTP {
        let mut zeroed = l4.to_vec();
        zeroed[8..12].fill(0);
        let stored = u32::from_le_bytes(l4[8..12].try_into().unwrap());
        assert_eq!(stored, crc32c(&zeroed), "SCTP CRC32c is wrong: {frame:02x?}");
    } else if !udp_checksum_zero {
        assert_eq!(l4_checksum(src, dst, proto, l4), 0, "{proto} checksum is wrong: {frame:02x?}");
    }
    let port = |at: usize| u16::from_be_bytes([l4[at], l4[at + 1]]);
    let word = |at: usize| u32::from_be_bytes([l4[at], l4[at + 1], l4[at + 2], l4[at + 3]]);
    let tcp = (proto == TCP).then(|| {
        let header_len = usize::from(l4[12] >> 4) * 4;
        TcpSeen { flags: l4[13], seq: word(4), ack: word(8), header_len, data_len: l4.len() - header_len }
    });
    Seen { src: SocketAddr::new(src, port(0)), dst: SocketAddr::new(dst, port(2)), proto, ttl, udp_checksum_zero, tcp }
}

/// The frontend a frame's DSR option names (an IPv4 option 0x9a of 8 bytes
/// first among the options; an IPv6 Destination Options header with option
/// 0x1b), or `None` without one. Panics on a malformed one.
#[must_use]
pub fn dsr_option(frame: &[u8]) -> Option<SocketAddr> {
    let ip = &frame[14..];
    if frame[12..14] == [0x08, 0x00] {
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ihl < 28 || ip[20] != 0x9a {
            return None;
        }
        assert_eq!(ip[21], 8, "DSR option length: {frame:02x?}");
        let port = u16::from_be_bytes([ip[22], ip[23]]);
        let addr = IpAddr::from(<[u8; 4]>::try_from(&ip[24..28]).unwrap());
        return Some(SocketAddr::new(addr, port));
    }
    if ip[6] != DSTOPTS {
        return None;
    }
    assert_eq!(ip[41..44], [2, 0x1b, 20], "DSR destination options header: {frame:02x?}");
    let addr = IpAddr::from(<[u8; 16]>::try_from(&ip[44..60]).unwrap());
    Some(SocketAddr::new(addr, u16::from_be_bytes([ip[60], ip[61]])))
}

/// `frame` with a DSR option naming `frontend` inserted after its fixed IP
/// header, as an entry node sends it (IPv4: the header length, total length
/// and checksum updated).
#[must_use]
pub fn with_dsr_option(frame: &[u8], frontend: SocketAddr) -> Vec<u8> {
    let port = frontend.port().to_be_bytes();
    let mut out = frame[..14].to_vec();
    let ip = &frame[14..];
    match frontend.ip() {
        IpAddr::V4(a) => {
            let mut head = ip[..20].to_vec();
            head[0] += 2;
            let total = u16::from_be_bytes([head[2], head[3]]) + 8;
            head[2..4].copy_from_slice(&total.to_be_bytes());
            head.extend_from_slice(&[0x9a, 8, port[0], port[1]]);
            head.extend_from_slice(&a.octets());
            head[10..12].copy_from_slice(&[0, 0]);
            let c = fold(sum(0, &head));
            head[10..12].copy_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&head);
            out.extend_from_slice(&ip[20..]);
        }
        IpAddr::V6(a) => {
            let mut head = ip[..40].to_vec();
            let len = u16::from_be_bytes([head[4], head[5]]) + 24;
            head[4..6].copy_from_slice(&len.to_be_bytes());
            let next = head[6];
            head[6] = DSTOPTS;
            out.extend_from_slice(&head);
            out.extend_from_slice(&[next, 2, 0x1b, 20]);
            out.extend_from_slice(&a.octets());
            out.extend_from_slice(&[port[0], port[1], 0, 0]);
            out.extend_from_slice(&ip[40..]);
        }
    }
    out
}

/// `frame` inside an outer IP header from `src` to `dst` of its own family
/// (IPIP, IP6IP6), as an entry node with `--dsr-dispatch ipip` sends it.
#[must_use]
pub fn encapsulated(frame: &[u8], src: IpAddr, dst: IpAddr) -> Vec<u8> {
    let inner = &frame[14..];
    let mut out = frame[..14].to_vec();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = u16::try_from(inner.len() + 20).unwrap().to_be_bytes();
            let mut head = vec![0x45, 0, total[0], total[1], 0, 0, 0x40, 0, 64, 4, 0, 0];
            head.extend_from_slice(&s.octets());
            head.extend_from_slice(&d.octets());
            let c = fold(sum(0, &head));
            head[10..12].copy_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&head);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let len = u16::try_from(inner.len()).unwrap().to_be_bytes();
            out.extend_from_slice(&[0x60, 0, 0, 0, len[0], len[1], 41, 64]);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        _ => panic!("one family"),
    }
    out.extend_from_slice(inner);
    out
}

/// An IPIP or IP6IP6 frame's outer source and destination and its inner
/// frame (the Ethernet header kept), panicking unless the outer header is
/// well formed: its IPv4 checksum right, its length that of the frame.
#[must_use]
pub fn decapsulated(frame: &[u8]) -> (IpAddr, IpAddr, Vec<u8>) {
    let ip = &frame[14..];
    let (src, dst, header) = if frame[12..14] == [0x08, 0x00] {
        assert_eq!(ip[0], 0x45, "outer IPv4 header: {frame:02x?}");
        assert_eq!(ip[9], 4, "not IPIP: {frame:02x?}");
        assert_eq!(fold(sum(0, &ip[..20])), 0, "outer IPv4 header checksum is wrong: {frame:02x?}");
        assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len(), "outer total length");
        let addr = |at: usize| IpAddr::from(<[u8; 4]>::try_from(&ip[at..at + 4]).unwrap());
        (addr(12), addr(16), 20)
    } else {
        assert_eq!(ip[6], 41, "not IP6IP6: {frame:02x?}");
        assert_eq!(usize::from(u16::from_be_bytes([ip[4], ip[5]])), ip.len() - 40, "outer payload length");
        let addr = |at: usize| IpAddr::from(<[u8; 16]>::try_from(&ip[at..at + 16]).unwrap());
        (addr(8), addr(24), 40)
    };
    let mut inner = frame[..14].to_vec();
    inner.extend_from_slice(&ip[header..]);
    (src, dst, inner)
}
