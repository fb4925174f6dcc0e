//! Where traffic from outside is handed from netfilter to the TC programs.
//!
//! Flows from outside that kube-proxy's DNAT already translated live in
//! netfilter's conntrack; were the TC programs to take their next packet,
//! Maglev could send it to another backend. So while a takeover runs, the
//! TC programs leave traffic from outside to the kernel (`defer_outside`,
//! called before the first sync attaches them), and after kube-proxy's
//! rules are gone they serve new flows but keep leaving the packets of
//! flows conntrack already translated (`take_outside`). The switch itself
//! lives in the eBPF programs; this trait is the agent's side of it.
use crate::datapath::{handover::OutsideHandover as Mode, loader::Datapath};

/// The datapath's switch for traffic from outside during a takeover.
pub trait OutsideHandover: Send {
    /// Before the TC programs attach (the maps are not written yet): leave
    /// traffic from outside to netfilter.
    fn defer_outside(&mut self, datapath: &mut Datapath) -> anyhow::Result<()>;
    /// Once the maps hold the table (before kube-proxy's rules are checked
    /// and removed): serve new flows from outside, leaving mid-flow packets
    /// of flows conntrack translated to it.
    fn take_outside(&mut self, datapath: &mut Datapath) -> anyhow::Result<()>;
}

/// The eBPF programs' switch (`crate::datapath::handover`): `Defer` while
/// taking over (flows the programs see pass untouched to netfilter and are
/// remembered as its own; once the programs attach, the agent also marks
/// the flows conntrack already holds), then `Handover`: new flows are the
/// programs', netfilter's go on through conntrack, until `ends_after`
/// (`--outside-handover-seconds`; none: until the next start).
#[derive(Debug, Default)]
pub struct DatapathHandover {
    pub ends_after: Option<std::time::Duration>,
}

impl OutsideHandover for DatapathHandover {
    fn defer_outside(&mut self, datapath: &mut Datapath) -> anyhow::Result<()> {
        // Before the first sync attaches the programs; the attach marks
        // the flows conntrack holds (`agent`, mark_netfilter_flows_when_deferring).
        datapath.set_outside_handover(Mode::Defer)?;
        Ok(())
    }

    fn take_outside(&mut self, datapath: &mut Datapath) -> anyhow::Result<()> {
        // The marks of flows silent since the attach may have expired (a UDP
        // entry lives 60 s): conntrack's DNATed flows are marked again.
        if datapath.serves_external_traffic()
            && let Err(err) = datapath.mark_netfilter_flows()
        {
            tracing::warn!(%err, "cannot mark netfilter's flows again: a flow silent while deferring may be taken over");
        }
        datapath.set_outside_handover(Mode::Handover { ends_after: self.ends_after })?;
        Ok(())
    }
}
