//! The flows netfilter's conntrack holds with a destination NAT (kube-proxy's
//! DNAT), read from the kernel over ctnetlink: a takeover marks them as
//! netfilter's in `CT` (`ct_flags::KERNEL`) while the programs defer, so
//! that a flow silent all through the defer (a UDP flow the programs never
//! saw) still goes to the kernel after the switch to handover
//! (docs/design.md, "Taking over from kube-proxy"). No crate: one dump
//! request and a reader of the few attributes needed.
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use super::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, Netlink};

/// `(NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET`.
const CT_GET: u16 = (1 << 8) | 1;
/// Attributes (linux/netfilter/nfnetlink_conntrack.h).
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_STATUS: u16 = 3;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
/// `IPS_DST_NAT` (linux/netfilter/nf_conntrack_common.h).
const IPS_DST_NAT: u32 = 1 << 5;
/// `struct nfgenmsg`.
const NFGENMSG_LEN: usize = 4;

/// The original direction of a conntrack entry (client to the address it
/// asked for), TCP or UDP. Ports in host order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NatFlow {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DumpError {
    #[error("cannot read the kernel's connection tracking (ctnetlink): {0}; is nf_conntrack_netlink available?")]
    Io(#[from] io::Error),
    #[error("the kernel answered the conntrack dump with error {0}")]
    Kernel(i32),
}

/// The TCP and UDP flows conntrack holds in this network namespace with a
/// destination NAT.
pub(crate) fn dump() -> Result<Vec<NatFlow>, DumpError> {
    let socket = Netlink::open(libc::NETLINK_NETFILTER)?;
    // nfgenmsg: AF_UNSPEC (every family), version 0, resource id 0.
    socket.send(CT_GET, NLM_F_REQUEST | NLM_F_DUMP, &[0, 0, 0, 0])?;
    let mut flows = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = socket.recv(&mut buf)?;
        if parse_messages(&buf[..n], &mut flows)? {
            return Ok(flows);
        }
    }
}

/// Reads one datagram of netlink messages into `flows`; whether the dump
/// is done.
pub(crate) fn parse_messages(data: &[u8], flows: &mut Vec<NatFlow>) -> Result<bool, DumpError> {
    for message in netlink::messages(data) {
        let Ok((kind, payload)) = message else { return Ok(true) };
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = netlink::error_code(payload);
                if code != 0 {
                    return Err(DumpError::Kernel(code));
                }
            }
            _ => {
                if let Some(flow) = payload.get(NFGENMSG_LEN..).and_then(parse_entry) {
                    flows.push(flow);
                }
            }
        }
    }
    Ok(false)
}

/// The attributes in `data`: (type without its flag bits, payload).
fn attributes(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let kind = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
        if len < 4 || len > data.len() {
            return None;
        }
        let payload = &data[4..len];
        data = data.get(netlink::align(len)..).unwrap_or(&[]);
        Some((kind, payload))
    })
}

fn find(data: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(data).find(|(k, _)| *k == kind).map(|(_, p)| p)
}

/// A DNATed TCP or UDP entry's original tuple; `None` for anything else.
fn parse_entry(attrs: &[u8]) -> Option<NatFlow> {
    let status = u32::from_be_bytes(find(attrs, CTA_STATUS)?.get(0..4)?.try_into().ok()?);
    if status & IPS_DST_NAT == 0 {
        return None;
    }
    let tuple = find(attrs, CTA_TUPLE_ORIG)?;
    let ip = find(tuple, CTA_TUPLE_IP)?;
    let proto = find(tuple, CTA_TUPLE_PROTO)?;
    let v4 = |kind| -> Option<IpAddr> { Some(Ipv4Addr::from(<[u8; 4]>::try_from(find(ip, kind)?).ok()?).into()) };
    let v6 = |kind| -> Option<IpAddr> { Some(Ipv6Addr::from(<[u8; 16]>::try_from(find(ip, kind)?).ok()?).into()) };
    let (src, dst) = match (v4(CTA_IP_V4_SRC), v4(CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (s, d),
        _ => (v6(CTA_IP_V6_SRC)?, v6(CTA_IP_V6_DST)?),
    };
    let port = |kind| -> Option<u16> { Some(u16::from_be_bytes(find(proto, kind)?.try_into().ok()?)) };
    let number = *find(proto, CTA_PROTO_NUM)?.first()?;
    if number != proxy_common::proto::TCP && number != proxy_common::proto::UDP {
        return None;
    }
    Some(NatFlow { src, dst, sport: port(CTA_PROTO_SRC_PORT)?, dport: port(CTA_PROTO_DST_PORT)?, proto: number })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::netlink::NLMSG_HDRLEN;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + payload.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(payload);
        out.resize(netlink::align(out.len()), 0);
        out
    }

    const NESTED: u16 = 0x8000;

    fn entry(status: u32, proto: u8) -> Vec<u8> {
        let ip = [attr(CTA_IP_V4_SRC, &[172, 30, 0, 100]), attr(CTA_IP_V4_DST, &[172, 30, 0, 11])].concat();
        let ports = [
            attr(CTA_PROTO_NUM, &[proto]),
            attr(CTA_PROTO_SRC_PORT, &21000u16.to_be_bytes()),
            attr(CTA_PROTO_DST_PORT, &30053u16.to_be_bytes()),
        ]
        .concat();
        let tuple = [attr(CTA_TUPLE_IP | NESTED, &ip), attr(CTA_TUPLE_PROTO | NESTED, &ports)].concat();
        let body = [
            vec![2, 0, 0, 0], // nfgenmsg: AF_INET
            attr(CTA_TUPLE_ORIG | NESTED, &tuple),
            attr(CTA_STATUS | 0x4000, &status.to_be_bytes()),
        ]
        .concat();
        // IPCTNL_MSG_CT_NEW of subsystem CTNETLINK, as a dump answers.
        message(1 << 8, &body)
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u32::try_from(NLMSG_HDRLEN + body.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&[0; 10]);
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn a_dump_gives_the_dnat_flows_of_tcp_and_udp_only() {
        let datagram =
            [entry(IPS_DST_NAT | 0b1110, 17), entry(0b1110, 6), entry(IPS_DST_NAT, 1), entry(IPS_DST_NAT, 6)].concat();
        let mut flows = Vec::new();
        assert!(!parse_messages(&datagram, &mut flows).unwrap(), "not done yet");
        let flow = |proto| NatFlow {
            src: "172.30.0.100".parse().unwrap(),
            dst: "172.30.0.11".parse().unwrap(),
            sport: 21000,
            dport: 30053,
            proto,
        };
        assert_eq!(flows, vec![flow(17), flow(6)]);
        assert!(parse_messages(&message(NLMSG_DONE, &[0; 4]), &mut flows).unwrap());
        let refused = message(NLMSG_ERROR, &(-1i32).to_ne_bytes());
        assert!(matches!(parse_messages(&refused, &mut flows), Err(DumpError::Kernel(-1))));
    }
}
