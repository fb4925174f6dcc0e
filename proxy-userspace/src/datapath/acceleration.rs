//! `--nodeport-acceleration`: whether the XDP program runs in front of the
//! TC ingress program on the devices traffic from outside arrives on, and
//! what a device whose driver has no native XDP gets.

/// The acceleration of traffic from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acceleration {
    /// The TC programs alone.
    #[default]
    Disabled,
    /// XDP on every device; a device without native XDP is an error (it is
    /// served by the TC programs alone, and the error is logged).
    Native,
    /// XDP on the devices with native XDP; the others are served by the TC
    /// programs alone, with a warning.
    BestEffort,
}

/// Kinds of device (`IFLA_INFO_KIND`) where XDP was measured slower than
/// the TC programs alone: a veth runs native XDP, but an XDP program there
/// takes GRO and the page reuse of its peer away, and bulk transfers ran at
/// 0.16x direct against TC's 0.97x (docs/performance.md, "The outside
/// path"). `best-effort` leaves them to TC; `native` warns.
const XDP_SLOWER_THAN_TC: &[&str] = &["veth"];

/// Whether XDP on a device of `kind` costs more than it saves.
#[must_use]
pub(crate) fn xdp_slower_than_tc(kind: &str) -> bool {
    XDP_SLOWER_THAN_TC.contains(&kind)
}

/// Whether to try XDP on a device of `kind` (`Acceleration::plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not asked for.
    No,
    /// Tried.
    Try,
    /// Tried, with a warning that it is slower there (`native`).
    TrySlower,
    /// Left to TC, which is faster there (`best-effort`).
    TcFaster,
}

/// What a device gets (`Acceleration::on_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceXdp {
    /// XDP runs there, TC behind it.
    Attached,
    /// TC alone, as asked (`Disabled`).
    NotWanted,
    /// TC alone, with a warning: no native XDP there (`BestEffort`).
    TcOnly,
    /// TC alone, and an error: native XDP was required (`Native`).
    Failed,
}

impl Acceleration {
    /// Whether the XDP program is loaded and attached at all.
    #[must_use]
    pub(crate) const fn wants_xdp(self) -> bool {
        !matches!(self, Self::Disabled)
    }

    /// Whether to try XDP on a device of `kind` (empty: a physical one).
    #[must_use]
    pub(crate) fn plan(self, kind: &str) -> Plan {
        match (self, xdp_slower_than_tc(kind)) {
            (Self::Disabled, _) => Plan::No,
            (Self::Native | Self::BestEffort, false) => Plan::Try,
            (Self::Native, true) => Plan::TrySlower,
            (Self::BestEffort, true) => Plan::TcFaster,
        }
    }

    /// What a device gets when its XDP attach `attached` (true) or the
    /// device has no native XDP (false; with `Disabled` nothing is tried).
    #[must_use]
    pub(crate) const fn on_device(self, attached: bool) -> DeviceXdp {
        match (self, attached) {
            (Self::Disabled, _) => DeviceXdp::NotWanted,
            (_, true) => DeviceXdp::Attached,
            (Self::BestEffort, false) => DeviceXdp::TcOnly,
            (Self::Native, false) => DeviceXdp::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Acceleration::*, DeviceXdp, Plan};

    /// `best-effort` never picks XDP where it is slower than TC (a veth);
    /// `native` tries it everywhere, and warns there.
    #[test]
    fn best_effort_leaves_veths_to_tc() {
        for (acceleration, kind, plan) in [
            (Disabled, "", Plan::No),
            (Disabled, "veth", Plan::No),
            (Native, "", Plan::Try),
            (Native, "veth", Plan::TrySlower),
            (Native, "bridge", Plan::Try),
            (BestEffort, "", Plan::Try),
            (BestEffort, "veth", Plan::TcFaster),
            (BestEffort, "vxlan", Plan::Try),
        ] {
            assert_eq!(acceleration.plan(kind), plan, "{acceleration:?} on {kind:?}");
        }
    }

    /// Cilium's `loadBalancer.acceleration` semantics: `native` insists,
    /// `best-effort` takes XDP where the driver has it.
    #[test]
    fn a_device_without_native_xdp_is_an_error_only_when_native_is_required() {
        for (acceleration, attached, wanted) in [
            (Disabled, false, DeviceXdp::NotWanted),
            (Disabled, true, DeviceXdp::NotWanted),
            (Native, true, DeviceXdp::Attached),
            (Native, false, DeviceXdp::Failed),
            (BestEffort, true, DeviceXdp::Attached),
            (BestEffort, false, DeviceXdp::TcOnly),
        ] {
            assert_eq!(acceleration.on_device(attached), wanted, "{acceleration:?}, attached: {attached}");
        }
        assert!(!Disabled.wants_xdp());
        assert!(Native.wants_xdp() && BestEffort.wants_xdp());
    }
}
