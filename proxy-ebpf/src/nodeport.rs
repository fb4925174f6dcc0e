//! Translation of traffic from outside the node to NodePorts, LoadBalancer
//! IPs and externalIPs, with no netfilter rule: written once against
//! `Frame`, run by the TC programs on the node's external devices and by
//! the XDP program (`xdp.rs`) in front of them.
//!
//! Ingress: a reply to a flow this node source-NATed is sent back to its
//! client; a packet to a frontend gets a backend (Maglev, so a flow picks
//! the same backend on every node) and its destination rewritten. When the
//! backend is on another node the source becomes the node's address too,
//! so the replies come back here, and the packet is routed out directly.
//! A frontend without any endpoint is rejected (`reject.rs`), one whose
//! endpoints are all elsewhere while it wants this node's (externalTraffic
//! Policy: Local) drops the packet, as kube-proxy does.
//! Egress (TC only): a reply from a backend on this node gets the frontend
//! as its source again.
//! While the agent takes over from a running kube-proxy
//! (`handover_mode`), flows netfilter serves are left to the kernel
//! untouched (docs/design.md, "Taking over from kube-proxy").
//!
//! Direct server return (`--nodeport-mode dsr`, or `hybrid` for TCP): a
//! flow to a backend on another node keeps its source; its destination
//! becomes the backend and the frontend rides along in an IPv4 option (an
//! IPv6 Destination Options header), on every TCP SYN and every UDP
//! datagram. The backend's node checks that option (the frontend must be
//! one it knows, with this backend for this flow), records the flow in
//! the reply direction, and its egress gives the replies the frontend as
//! source: they go straight to the client, never through the entry node.
//!
//! A packet to be forwarded is routed before it is rewritten: a hook that
//! cannot send it (XDP without the next hop's link-layer address) leaves
//! it untouched to the next one (`Frame::unfinished`), which then finds
//! the flow in `CT` and does the same.
//!
//! The pods' own traffic on pod-facing devices takes the same steps
//! (`Frame::FROM_POD`); `pod.rs` says where it differs.
use proxy_common::{
    Addr, CtValue, SLOTS_PER_ENTRY, ServiceKey, ServiceValue, backend_flags, cluster_cidr, ct_dir, ct_flags,
    dsr_dispatch, external_stat, flow_hash, handover_mode, maglev_index, nodeport_mode, proto, scope, service_flags,
    snat_ports,
};

use crate::{
    CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, DSR_DISPATCH, MAGLEV_SIZE, NODEPORT_MODE, ROUTED_CLUSTER_IPS,
    access::{ROUTE_FRAG_NEEDED, ROUTE_NOT_FORWARDED, Route, local_socket_owns, now_ns, route_status},
    balance, ct, encap,
    frame::{Frame, drop_packet},
    icmp,
    maps::{backend, count_connection, maglev_entry, outside_handover_mode, service, source_allowed},
    packet::{End, Packet},
    pod,
};

/// Why a packet is dropped: an `external_stat` index.
type DropReason = u32;

/// `reply_to_client`: the packet is not a reply of a source-NATed flow.
const NOT_A_REPLY: i32 = -1;

#[inline(always)]
pub fn ingress<F: Frame>(ctx: &F) -> i32 {
    // Used in place: moved out of the `Option`, the packet would take a
    // second slot on this frame, at the root of every call chain.
    let mut parsed = Packet::parse(ctx);
    let Some(pkt) = parsed.as_mut() else {
        // Maybe a DSR flow's packet inside an outer header (`encap.rs`), on
        // a node that sends them so too (every node runs one dispatch):
        // others need not take another tunnel's packets apart to see.
        let ipip = DSR_DISPATCH.load() == dsr_dispatch::IPIP;
        return if F::FROM_POD || !F::GROWS || !ipip { F::PASS } else { ipip_arrival(ctx) };
    };
    if pkt.dsr_port != 0 {
        // A pod's packet with a DSR option is not a DSR arrival: only the
        // node's devices receive those.
        return if F::FROM_POD { F::PASS } else { dsr_arrival(ctx, pkt) };
    }
    let action = reply_to_client(ctx, pkt);
    if action != NOT_A_REPLY {
        return action;
    }
    to_frontend(ctx, pkt)
}

/// Egress (TC only): on a node device, a reply of a backend on this node
/// to a client outside; on a pod-facing device, a reply to a pod's flow
/// from its backend, wherever that is: it gets the frontend as source.
#[inline(always)]
pub fn egress<F: Frame>(ctx: &F) -> i32 {
    let mut parsed = Packet::parse(ctx);
    let Some(pkt) = parsed.as_mut() else {
        // Not TCP, UDP or SCTP: maybe an ICMP error about such a flow.
        if icmp::translate_error(ctx).is_err() {
            return drop_packet::<F>(external_stat::REWRITE_FAILED);
        }
        return F::PASS;
    };
    // (Replies of source-NATed flows come back to this node's address and
    // are handled at ingress.)
    if let Some(entry) = ct::lookup(pkt, ct_dir::REPLY).as_ref()
        && entry.flags & ct_flags::SNAT == 0
        && pkt.rewrite(ctx, End::Src, &entry.addr, entry.port).is_err()
    {
        return drop_packet::<F>(external_stat::REWRITE_FAILED);
    }
    F::PASS
}

/// `nodeport_dsr_to_snat`, tail-called for a datagram `ingress` answered
/// with `BY_SNAT`: its DSR flow (the entry `ingress` found or made) goes by
/// source NAT from now on, as a flow to a backend elsewhere does without
/// DSR, and the datagram with it (no outer header or option: it fits).
/// Later datagrams of the flow find it source-NATed. Dropped and counted
/// (`dsr_too_big`) if the flow is gone or no port is free.
#[inline(always)]
pub fn dsr_to_snat<F: Frame>(ctx: &F) -> i32 {
    let mut parsed = Packet::parse(ctx);
    let Some(pkt) = parsed.as_mut() else { return drop_packet::<F>(external_stat::DSR_TOO_BIG) };
    let mut flow = CtValue::default();
    if pkt.proto != proto::UDP || !ct::lookup_into(pkt, ct_dir::ORIGINAL, &mut flow) || flow.flags & ct_flags::DSR == 0
    {
        return drop_packet::<F>(external_stat::DSR_TOO_BIG);
    }
    if snat_address_apart(ctx, pkt, &mut flow) != Way::Routed {
        return drop_packet::<F>(external_stat::NO_ROUTE);
    }
    if !ct::dsr_to_snat(pkt, &mut flow) {
        return drop_packet::<F>(external_stat::NO_SNAT_PORT);
    }
    F::count(external_stat::DSR_TO_SNAT);
    forward(ctx, pkt, &flow, ct_dir::ORIGINAL)
}

/// `snat_address` on a frame of its own: its route stays off the frame of
/// `dsr_to_snat`, which holds the packet and its flow (the kernel allows
/// 512 bytes of stack down the deepest chain).
#[inline(never)]
fn snat_address_apart<F: Frame>(ctx: &F, pkt: &Packet, flow: &mut CtValue) -> Way {
    snat_address(ctx, pkt, flow)
}

/// A backend on another node answers a flow this node source-NATed: back
/// to the client, from the frontend. Such a reply comes to a port of
/// `snat_ports` (`ct::snat_port`): every other packet arriving (the node's
/// own traffic, replies to pods' flows and to local backends' clients)
/// skips the conntrack lookup.
#[inline(never)]
fn reply_to_client<F: Frame>(ctx: &F, pkt: &mut Packet) -> i32 {
    if u16::from_be(pkt.dport) < snat_ports::MIN {
        return NOT_A_REPLY;
    }
    // Used in place (no `filter`, which copies): the frame is on the
    // programs' deepest chain.
    let found = ct::lookup(pkt, ct_dir::REPLY);
    let Some(flow) = found.as_ref() else { return NOT_A_REPLY };
    if flow.flags & ct_flags::SNAT == 0 {
        return NOT_A_REPLY;
    }
    forward(ctx, pkt, flow, ct_dir::REPLY)
}

/// A packet to a frontend (or not, then it is left alone): to its flow's
/// backend.
#[inline(never)]
fn to_frontend<F: Frame>(ctx: &F, pkt: &mut Packet) -> i32 {
    let found = if F::FROM_POD { pod::frontend(pkt) } else { external_frontend(pkt) };
    let Some((key, frontend, has_endpoints)) = found else { return F::PASS };
    let mut flow = CtValue::default();
    // A new connection on the tuple of a closing one starts afresh.
    let found =
        ct::lookup_into(pkt, ct_dir::ORIGINAL, &mut flow) && !(pkt.is_syn() && flow.flags & ct_flags::CLOSING != 0);
    if found && flow.flags & ct_flags::KERNEL != 0 {
        return ctx.left_to_kernel();
    }
    if !found && netfilter_serves(pkt, frontend.rev_nat) {
        return ctx.left_to_kernel();
    }
    if !found && !F::FROM_POD && node_owns_flow(ctx, pkt) {
        return F::PASS;
    }
    // A flow whose backend is gone picks another.
    let known = found && backend(flow.backend_id).is_some();
    if !known {
        let stat = new_flow(ctx, pkt, &key, &frontend, &mut flow);
        if stat == external_stat::NO_BACKEND && !has_endpoints {
            // kube-proxy's KUBE-EXTERNAL-SERVICES (and KUBE-SERVICES for
            // pods): REJECT when the service has no endpoints at all; with
            // endpoints on other nodes only (externalTrafficPolicy: Local)
            // it drops (new_flow's NO_BACKEND), and so do we.
            return ctx.reject(pkt);
        }
        if stat != ADMITTED {
            return drop_packet::<F>(stat);
        }
    }
    // A pod's flow is never DSR (`new_flow`): the pods' programs need not
    // have it verified.
    if !F::FROM_POD && flow.flags & ct_flags::DSR != 0 {
        // Each way on its own frame below this one: the chain to
        // `route_status` is at the verifier's bound.
        if DSR_DISPATCH.load() == dsr_dispatch::IPIP {
            return match forward_encapsulated(ctx, pkt, &flow) {
                #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "an MTU below it")]
                too_big if too_big >= FRAG_NEEDED => ctx.too_big(pkt, (too_big - FRAG_NEEDED) as u16),
                action => action,
            };
        }
        return forward_dsr(ctx, pkt, &flow);
    }
    if flow.flags & ct_flags::SNAT == 0 {
        return to_local_backend(ctx, pkt, &flow);
    }
    forward(ctx, pkt, &flow, ct_dir::ORIGINAL)
}

/// Whether a packet to a frontend, of a flow without an entry in `CT`, is
/// for a connection the node itself opened: a reply to a local port that
/// is also a NodePort (the node's ephemeral ports may reach into the range
/// when `ip_local_port_range` is wide). kube-proxy's conntrack finds such
/// a reply in the node's own flow, so DNAT never sees it; here the
/// socket's own lookup answers. Out of line: the tuple is on its own frame.
#[inline(never)]
fn node_owns_flow<F: Frame>(ctx: &F, pkt: &Packet) -> bool {
    (pkt.proto == proto::TCP || pkt.proto == proto::UDP)
        && local_socket_owns(ctx, pkt.proto == proto::TCP, &pkt.src, pkt.sport, &pkt.dst, pkt.dport)
}

/// Whether a packet to a frontend of a flow without an entry in `CT` is
/// netfilter's while the agent takes over from kube-proxy
/// (`handover_mode`; a flow with an entry of ours stays ours, so only such
/// a packet pays for reading the mode): in `DEFER` every one is (and its
/// flow is marked, so that it stays netfilter's after the switch to
/// `HANDOVER`); in `HANDOVER` a TCP packet without SYN belongs to a
/// connection netfilter set up.
#[inline(always)]
fn netfilter_serves(pkt: &Packet, rev_nat: u32) -> bool {
    match outside_handover_mode(now_ns()) {
        handover_mode::DEFER => {
            ct::leave_to_kernel(pkt, rev_nat);
            true
        }
        handover_mode::HANDOVER => pkt.proto == proto::TCP && !pkt.is_syn(),
        _ => false,
    }
}

/// Whether a new flow of protocol `protocol` to a backend on another node
/// goes by direct server return: the frontend's `nodeport-mode`
/// annotation (`flags`), else the node's `--nodeport-mode`.
#[inline(always)]
fn wants_dsr(protocol: u8, flags: u16) -> bool {
    if flags & (service_flags::FORWARD_SNAT | service_flags::FORWARD_DSR) != 0 {
        return flags & service_flags::FORWARD_DSR != 0;
    }
    let mode = NODEPORT_MODE.load();
    mode == nodeport_mode::DSR || (mode == nodeport_mode::HYBRID && protocol == proto::TCP)
}

/// A packet of a DSR flow on its entry node: to the backend's node with
/// the client's source kept, the frontend in a DSR option on every TCP SYN
/// and every UDP datagram (UDP has no handshake: any datagram may be the
/// first to arrive, or come after the backend node's entry expired). A
/// hook that cannot grow the packet (XDP) leaves those to the next one.
#[inline(never)]
fn forward_dsr<F: Frame>(ctx: &F, pkt: &mut Packet, flow: &CtValue) -> i32 {
    let with_option = pkt.proto != proto::TCP || pkt.is_syn();
    if with_option && !F::GROWS {
        return ctx.unfinished(external_stat::REWRITE_FAILED);
    }
    let mut to = Route::new(pkt.proto, &pkt.src, pkt.sport, &flow.addr, flow.port);
    if with_option && pkt.proto == proto::UDP {
        // A datagram the option makes too long for the route would be
        // dropped by the device, unseen: it goes by source NAT instead.
        to.tot_len = pkt.ip_len_with_dsr_option(ctx).unwrap_or(0);
    }
    match route_status(ctx, &mut to) {
        0 if ctx.can_send(&to) => {}
        ROUTE_FRAG_NEEDED if to.tot_len != 0 => return BY_SNAT,
        _ => return ctx.unfinished(external_stat::NO_ROUTE),
    }
    // The option first, while the destination is still the frontend.
    if with_option && pkt.add_dsr_option(ctx).is_err() {
        return drop_packet::<F>(external_stat::REWRITE_FAILED);
    }
    if let Err(stat) = rewrite(ctx, pkt, End::Dst, &flow.addr, flow.port) {
        return drop_packet::<F>(stat);
    }
    if pkt.decrement_ttl(ctx).is_err() {
        return drop_packet::<F>(external_stat::NO_ROUTE);
    }
    ctx.translated();
    ctx.send(&to)
}

/// `ingress` (through `forward_dsr` or `forward_encapsulated`): a UDP
/// datagram of a DSR flow its DSR option or outer header would make too
/// long for the route (it would be dropped by the device, unseen, and UDP
/// has no path MTU discovery to make it shorter). The TC program hands it
/// to `nodeport_dsr_to_snat` (`dsr_to_snat`), which moves the flow to
/// source NAT: by tail call, with a verification budget of its own, which
/// the ingress programs have no room left for. Never a verdict (those are
/// -1..=7), and below `FRAG_NEEDED`. XDP never returns it: it leaves a
/// DSR flow's packets that would grow to TC.
pub const BY_SNAT: i32 = -0x100;

/// `forward_encapsulated`: the packet must be answered with fragmentation
/// needed, naming the MTU above this. The caller answers (`Frame::too_big`):
/// the answer's frames below this function's would pass the verifier's
/// bound.
const FRAG_NEEDED: i32 = 1 << 16;

/// A packet of a DSR flow on its entry node with `--dsr-dispatch ipip`:
/// untouched inside an outer header from this node to the backend
/// (`encap.rs`), every packet of the flow alike. One the header would make
/// too long for the route is answered with ICMP fragmentation needed
/// (TCP, `FRAG_NEEDED`: the client's path MTU discovery then sends smaller
/// segments) or goes by source NAT (UDP, `BY_SNAT`).
#[inline(never)]
fn forward_encapsulated<F: Frame>(ctx: &F, pkt: &mut Packet, flow: &CtValue) -> i32 {
    if !F::GROWS {
        return ctx.unfinished(external_stat::REWRITE_FAILED);
    }
    let mut to = Route::new(pkt.proto, &pkt.src, pkt.sport, &flow.addr, flow.port);
    to.want_src = true;
    // A GSO packet leaves as segments: each must fit.
    let len = match ctx.segment_len(pkt.l3(), pkt.l4, pkt.proto == proto::TCP) {
        0 => pkt.ip_len(ctx).unwrap_or(0),
        seg => u16::try_from(seg).unwrap_or(u16::MAX),
    };
    to.tot_len = len.saturating_add(encap::overhead(pkt.family()));
    match route_status(ctx, &mut to) {
        0 => {}
        ROUTE_FRAG_NEEDED if pkt.proto == proto::TCP => {
            return FRAG_NEEDED + i32::from(to.tot_len.saturating_sub(encap::overhead(pkt.family())));
        }
        ROUTE_FRAG_NEEDED => return BY_SNAT,
        _ => return ctx.unfinished(external_stat::NO_ROUTE),
    }
    if pkt.decrement_ttl(ctx).is_err() {
        return drop_packet::<F>(external_stat::NO_ROUTE);
    }
    if encap::encapsulate(ctx, pkt, &to.src, &flow.addr).is_err() {
        return drop_packet::<F>(external_stat::REWRITE_FAILED);
    }
    ctx.translated();
    ctx.send(&to)
}

/// An IPIP or IP6IP6 packet on the backend's node (`--dsr-dispatch ipip`
/// on the entry node): the outer header taken off, the inner packet (to
/// the frontend) checked as a DSR option is (`dsr_accept`, the outer
/// destination standing for the backend), translated to the backend and
/// its replies recorded. Anything else in such a header (another tunnel's
/// packet) goes on as it came.
#[inline(never)]
fn ipip_arrival<F: Frame>(ctx: &F) -> i32 {
    if !encap::take_outer(ctx) {
        return F::PASS;
    }
    // The field-by-field parse: `read_plain`'s frame would put this chain
    // past the verifier's bound.
    let mut parsed = Packet::parse_fields(ctx);
    let outcome = match parsed.as_mut() {
        Some(pkt) if pkt.dsr_port == 0 => ipip_translate(ctx, pkt),
        _ => IPIP_NOT_OURS,
    };
    match outcome {
        IPIP_NOT_OURS => {
            if encap::restore(ctx).is_ok() {
                F::PASS
            } else {
                drop_packet::<F>(external_stat::REWRITE_FAILED)
            }
        }
        IPIP_TRANSLATED => {
            ctx.translated();
            F::PASS
        }
        stat => drop_packet::<F>(stat),
    }
}

/// `ipip_translate`: the inner packet is not a DSR flow's (put back as
/// it came), or was translated.
const IPIP_NOT_OURS: DropReason = u32::MAX;
const IPIP_TRANSLATED: DropReason = u32::MAX - 1;

/// The inner packet of an IPIP arrival (`ipip_arrival`): translated to the
/// outer header's destination, if that is a backend of this node the
/// frontend picks for the flow, and its replies recorded. Returns
/// `IPIP_TRANSLATED`, `IPIP_NOT_OURS`, or why it is dropped. Inline: a
/// frame of its own would put the chain below it (to `route_status`) past
/// the verifier's bound.
#[inline(always)]
fn ipip_translate<F: Frame>(ctx: &F, pkt: &mut Packet) -> DropReason {
    let Some(at) = encap::outer_dst() else { return IPIP_NOT_OURS };
    pkt.dsr_port = pkt.dport;
    match dsr_accept(ctx, pkt, &pkt.dst, at, 0) {
        0 => IPIP_NOT_OURS,
        accepted => to_dsr_backend(ctx, pkt, accepted),
    }
}

/// Translates an accepted DSR packet to the frontend its destination is
/// (`dsr_accept`'s answer) to its backend, and records its replies, which
/// leave from that frontend. Out of line: its temporaries stay off
/// `ipip_arrival`'s frame.
#[inline(never)]
fn to_dsr_backend<F: Frame>(ctx: &F, pkt: &mut Packet, accepted: u64) -> DropReason {
    let (rev_nat, backend_id) = split(accepted);
    let Some(b) = backend(backend_id) else { return IPIP_NOT_OURS };
    let named = pkt.dst;
    if let Err(stat) = rewrite(ctx, pkt, End::Dst, &b.addr, b.port) {
        return stat;
    }
    if !ct::record_dsr(pkt, &named, rev_nat, backend_id) {
        return external_stat::DSR_REFUSED;
    }
    IPIP_TRANSLATED
}

/// Slots of a frontend `dsr_arrival` searches for the packet's backend
/// when the frontend's Maglev table picks another for the flow (the
/// tables of the entry node and of this one differ for a moment while a
/// change reaches both): a bound for the verifier.
const DSR_SLOTS_SEARCHED: u16 = 32;

/// A packet carrying a DSR option, on the backend's node: recorded (its
/// replies then leave with the frontend as source) and passed to the stack
/// with the option left in (Linux ignores an unknown IPv4 option and skips
/// the IPv6 one, whose type says so), or dropped when the option does not
/// name an external frontend (externalTrafficPolicy Cluster) that has the
/// packet's destination, a backend on this node, for this flow: a packet
/// from outside cannot make the node answer from any frontend's address
/// it likes (a NodePort's address is not checked, only its port: the
/// programs do not know the other nodes' addresses; docs/services.md, DSR).
#[inline(never)]
fn dsr_arrival<F: Frame>(ctx: &F, pkt: &Packet) -> i32 {
    let Ok(named) = pkt.dsr_addr(ctx) else { return drop_packet::<F>(external_stat::DSR_REFUSED) };
    let (rev_nat, backend_id) = split(dsr_accept(ctx, pkt, &named, &pkt.dst, pkt.dport));
    if backend_id == 0 || !ct::record_dsr(pkt, &named, rev_nat, backend_id) {
        return drop_packet::<F>(external_stat::DSR_REFUSED);
    }
    F::PASS
}

/// The id of the backend on this node at `at`:`port` (port 0: any) that
/// the external frontend `named`:`pkt.dsr_port` (externalTrafficPolicy
/// Cluster) picks for this flow, or has in its first slots, with the
/// frontend's id above it (`split`); 0 when there is none.
#[inline(never)]
fn dsr_accept<F: Frame>(ctx: &F, pkt: &Packet, named: &Addr, at: &Addr, port: u16) -> u64 {
    let mut key = ServiceKey::new(*named, pkt.dsr_port, pkt.proto, 0);
    let mut frontend = service(&key);
    if frontend.is_none() {
        // A NodePort on the entry node's address: this node has it on its
        // own address (the one towards the client). The programs do not
        // know the other nodes' addresses, so for a NodePort the named
        // address itself is not checked, only that its port is a NodePort
        // whose service has the backend.
        let mut here = Addr::default();
        if !address_towards_client(ctx, pkt, &mut here) {
            return 0;
        }
        key.addr = here;
        frontend = service(&key).filter(|f| f.flags & service_flags::NODE_PORT != 0);
    }
    let Some(frontend) = frontend else { return 0 };
    if frontend.flags & service_flags::EXTERNAL_KINDS == 0 || frontend.flags & service_flags::TWO_SCOPES != 0 {
        return 0;
    }
    match dsr_backend(pkt, &key, &frontend, (at, port)) {
        0 => 0,
        id => u64::from(frontend.rev_nat) << 32 | u64::from(id),
    }
}

/// `dsr_accept`'s answer: the frontend's id and the backend's.
#[inline(always)]
const fn split(accepted: u64) -> (u32, u32) {
    #[expect(clippy::cast_possible_truncation, reason = "two 32-bit halves")]
    ((accepted >> 32) as u32, accepted as u32)
}

/// Sets `out` to this node's address on the route back to the packet's
/// source; false when there is none.
#[inline(never)]
fn address_towards_client<F: Frame>(ctx: &F, pkt: &Packet, out: &mut Addr) -> bool {
    let mut back = Route::new(pkt.proto, &pkt.dst, pkt.dport, &pkt.src, pkt.sport);
    back.want_src = true;
    if route_status(ctx, &mut back) != 0 {
        return false;
    }
    *out = back.src;
    true
}

/// The id of the backend at `at` (address, port; port 0: any) among
/// `frontend`'s backends, if it is on this node and the frontend's Maglev
/// table picks it for the flow (or, failing that, one of its first
/// `DSR_SLOTS_SEARCHED` slots names it); 0 otherwise. Out of line:
/// `address_towards_client`'s route lookup is the deepest call under
/// `dsr_accept`, whose frame stays small.
#[inline(never)]
fn dsr_backend(pkt: &Packet, key: &ServiceKey, frontend: &ServiceValue, at: (&Addr, u16)) -> u32 {
    let picked = pick_backend(pkt, pkt.dsr_port, key, frontend);
    if is_here(picked, at) {
        return picked;
    }
    // One lookup per slots entry, then its four ids.
    let mut entry = ServiceValue::default();
    for index in 0..DSR_SLOTS_SEARCHED {
        if index >= frontend.count {
            break;
        }
        if index % SLOTS_PER_ENTRY == 0 {
            entry = service(&key.slots_of(index)).unwrap_or_default();
        }
        let id = entry.slot_id(index);
        if is_here(id, at) {
            return id;
        }
    }
    0
}

/// Whether backend `id` is on this node at `at` (address, port; port 0:
/// any: an encapsulated packet names only the backend's address).
#[inline(always)]
fn is_here(id: u32, (addr, port): (&Addr, u16)) -> bool {
    backend(id).is_some_and(|b| b.flags & backend_flags::LOCAL != 0 && b.addr == *addr && (port == 0 || b.port == port))
}

/// A backend on this node: the stack delivers the packet, and the replies
/// pass the egress program. Out of line, so that `to_frontend`'s frame
/// stays small (the deepest call chain, to `route_status`, starts there).
#[inline(never)]
fn to_local_backend<F: Frame>(ctx: &F, pkt: &mut Packet, flow: &CtValue) -> i32 {
    if let Err(stat) = rewrite(ctx, pkt, End::Dst, &flow.addr, flow.port) {
        return drop_packet::<F>(stat);
    }
    ctx.translated();
    F::PASS
}

#[inline(always)]
fn rewrite<F: Frame>(ctx: &F, pkt: &mut Packet, end: End, addr: &Addr, port: u16) -> Result<(), DropReason> {
    pkt.rewrite(ctx, end, addr, port).map_err(|_| external_stat::REWRITE_FAILED)
}

/// Rewrites a packet of source-NATed `flow` in direction `dir` (original:
/// from the node's address to the backend; reply: from the frontend to
/// the client) and sends it on its route (the stack would drop it as
/// martian: its source is a local address); returns the verdict. The route
/// is asked first: a hook that cannot send it leaves it untouched.
#[inline(never)]
fn forward<F: Frame>(ctx: &F, pkt: &mut Packet, flow: &CtValue, dir: u8) -> i32 {
    let ((src, sport), (dst, dport)) = if dir == ct_dir::REPLY {
        ((&flow.addr, flow.port), (&flow.nat_addr, flow.nat_port))
    } else {
        ((&flow.nat_addr, flow.nat_port), (&flow.addr, flow.port))
    };
    let mut to = Route::new(pkt.proto, src, sport, dst, dport);
    if route_status(ctx, &mut to) != 0 || !ctx.can_send(&to) {
        return ctx.unfinished(external_stat::NO_ROUTE);
    }
    if let Err(stat) = rewrite(ctx, pkt, End::Src, src, sport).and_then(|()| rewrite(ctx, pkt, End::Dst, dst, dport)) {
        return drop_packet::<F>(stat);
    }
    if pkt.decrement_ttl(ctx).is_err() {
        return drop_packet::<F>(external_stat::NO_ROUTE);
    }
    ctx.translated();
    ctx.send(&to)
}

/// The frontend traffic from outside reaches at the packet's destination:
/// a NodePort, LoadBalancer IP or externalIP, in its external scope when
/// it has two, or a ClusterIP routed to the node when the cluster's CIDR
/// is known (`--cluster-cidr`, as kube-proxy serves them from PREROUTING);
/// and whether the service has any endpoint (the scope `ALL` entry has
/// every endpoint of the cluster).
#[inline(always)]
fn external_frontend(pkt: &Packet) -> Option<(ServiceKey, ServiceValue, bool)> {
    let mut key = ServiceKey::new(pkt.dst, pkt.dport, pkt.proto, 0);
    let frontend = service(&key)?;
    if frontend.flags & service_flags::EXTERNAL_KINDS == 0 {
        if frontend.flags & service_flags::EXTERNAL_ONLY == 0 && cluster_cidr_known() {
            return Some((key, frontend, frontend.count != 0));
        }
        return None;
    }
    let has_endpoints = frontend.count != 0;
    if frontend.flags & service_flags::TWO_SCOPES != 0 {
        key.scope = scope::EXTERNAL;
        return Some((key, service(&key)?, has_endpoints));
    }
    Some((key, frontend, has_endpoints))
}

/// Whether `--cluster-cidr` gave a CIDR (one byte: read into a register,
/// not onto the frame of `to_frontend`, whose stack is at the bound).
#[inline(always)]
fn cluster_cidr_known() -> bool {
    ROUTED_CLUSTER_IPS.load() != 0
}

/// Whether a new flow to `backend` (`local`: on this node) takes source
/// NAT (see `new_flow`). Out of line: the CIDRs are read onto its own
/// frame, not onto the deepest chain's.
#[inline(never)]
fn needs_snat<F: Frame>(pkt: &Packet, frontend: &ServiceValue, backend: &CtValue, local: bool) -> bool {
    if F::FROM_POD {
        return backend.addr == pkt.src;
    }
    if frontend.flags & service_flags::EXTERNAL_KINDS == 0 {
        // A ClusterIP routed here.
        let v4 = CLUSTER_CIDR_V4.load();
        return !cluster_cidr::contains_v4(v4, &pkt.src)
            && !cluster_cidr::contains_v6(CLUSTER_CIDR_V6.load(), &pkt.src);
    }
    !local
}

/// `new_flow`: the flow was admitted.
const ADMITTED: DropReason = u32::MAX;

/// Admits a new flow into `flow`: checks the source ranges, picks a backend
/// and records the flow (with source NAT when the backend is elsewhere).
/// Returns `ADMITTED`, or why the packet is dropped.
#[inline(never)]
fn new_flow<F: Frame>(
    ctx: &F,
    pkt: &Packet,
    key: &ServiceKey,
    frontend: &ServiceValue,
    flow: &mut CtValue,
) -> DropReason {
    if frontend.flags & service_flags::SOURCE_RANGES != 0 && !source_allowed(frontend.rev_nat, &pkt.src) {
        return external_stat::SOURCE_DENIED;
    }
    if frontend.count == 0 {
        // No (local) endpoint: dropped, as kube-proxy drops it.
        return external_stat::NO_BACKEND;
    }
    let backend_id = choose_backend::<F>(pkt, key, frontend);
    let Some(target) = backend(backend_id) else { return external_stat::NO_BACKEND };
    *flow =
        CtValue { addr: target.addr, port: target.port, rev_nat: frontend.rev_nat, backend_id, ..CtValue::default() };
    // A pod's flow keeps its source (the stack routes it to the backend),
    // unless the backend is the pod itself (hairpin): then the node's
    // address towards it. Traffic from outside takes it whenever the
    // backend is on another node, so that the replies come back here; to
    // a ClusterIP (routed here) whenever it comes from outside the
    // cluster's CIDR, as kube-proxy masquerades it.
    if needs_snat::<F>(pkt, frontend, flow, target.flags & backend_flags::LOCAL != 0) {
        // The node's address on the way to the backend is the new source.
        match snat_address(ctx, pkt, flow) {
            Way::Routed => {
                let routed_cluster_ip = frontend.flags & service_flags::EXTERNAL_KINDS == 0;
                let dsr = !F::FROM_POD && !routed_cluster_ip && wants_dsr(pkt.proto, frontend.flags);
                flow.flags = if dsr { ct_flags::DSR } else { ct_flags::SNAT };
            }
            // An endpoint at one of this node's own addresses without
            // `nodeName` (hostNetwork, or a hand-made EndpointSlice): the
            // routes say it is here, so it is delivered here like one
            // whose nodeName is this node's.
            Way::Here => {}
            Way::Unroutable => return external_stat::NO_ROUTE,
        }
    }
    if !ct::create(pkt, flow) {
        return external_stat::NO_SNAT_PORT;
    }
    F::count(external_stat::NEW_FLOW);
    count_connection(frontend.rev_nat);
    ADMITTED
}

/// Where the route to a backend goes (`snat_address`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Forwarded to another machine.
    Routed,
    /// The backend's address is this node's own.
    Here,
    Unroutable,
}

/// Sets `flow.nat_addr` to the address the route to the backend
/// (`flow.addr`) prefers: the node's address on that way; or says that
/// there is no such way.
#[inline(always)]
fn snat_address<F: Frame>(ctx: &F, pkt: &Packet, flow: &mut CtValue) -> Way {
    let mut to = Route::new(pkt.proto, &pkt.src, pkt.sport, &flow.addr, flow.port);
    to.want_src = true;
    match route_status(ctx, &mut to) {
        0 => {
            flow.nat_addr = to.src;
            Way::Routed
        }
        ROUTE_NOT_FORWARDED => Way::Here,
        _ => Way::Unroutable,
    }
}

/// The backend id of a new flow (0: none). Out of line, one call in
/// `new_flow`, whose frame is on the deepest call chain.
#[inline(never)]
fn choose_backend<F: Frame>(pkt: &Packet, key: &ServiceKey, frontend: &ServiceValue) -> u32 {
    if F::FROM_POD {
        // As the socket programs choose (`balance`), affinity first.
        pod::pick_backend(pkt, key, frontend)
    } else if frontend.flags & service_flags::LEAST_CONNECTIONS != 0 && !wants_dsr(pkt.proto, frontend.flags) {
        // By load. Not with DSR: the backend's node accepts a DSR flow
        // only to the backend the frontend's Maglev table picks for it
        // (or one in its first slots, `dsr_backend`).
        least_loaded(key, frontend)
    } else {
        pick_backend(pkt, pkt.dport, key, frontend)
    }
}

/// The backend id of a new flow to a `least-connections` frontend
/// (`balance::least_connections`); 0 when none. Out of line, so that
/// `new_flow`'s frame (on the deepest call chain, to the source NAT
/// port's search) does not hold its key and lookups.
#[inline(never)]
fn least_loaded(key: &ServiceKey, frontend: &ServiceValue) -> u32 {
    let mut slots = *key;
    balance::least_connections(&mut slots, frontend).unwrap_or(0)
}

/// The backend id of a new flow of `pkt` to frontend port `port` (the
/// packet's destination port; on a backend's node, its DSR option's): its
/// entry in the frontend's Maglev table, or (no table written) the slot its
/// hash selects; 0 when none.
#[inline(never)]
fn pick_backend(pkt: &Packet, port: u16, key: &ServiceKey, frontend: &ServiceValue) -> u32 {
    let hash = flow_hash(&pkt.src, pkt.sport, port, pkt.proto);
    let size = MAGLEV_SIZE.load();
    if frontend.maglev != 0
        && size != 0
        && let Some(id) = maglev_entry(frontend.maglev, maglev_index(hash, size), size)
    {
        return id;
    }
    // `checked_rem`: a plain `%` would carry a panic path for a zero count
    // (ruled out by the caller), which the verifier refuses.
    let Some(index) = hash.checked_rem(u32::from(frontend.count)) else { return 0 };
    #[expect(clippy::cast_possible_truncation, reason = "below count, a u16")]
    let index = index as u16;
    service(&key.slots_of(index)).map_or(0, |v| v.slot_id(index))
}
