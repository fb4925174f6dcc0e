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
use crate::datapath::loader::Datapath;

/// The datapath's switch for traffic from outside during a takeover.
pub trait OutsideHandover: Send {
    /// Before kube-proxy's rules are checked (and before the TC programs
    /// attach): leave traffic from outside to netfilter.
    fn defer_outside(&mut self, datapath: &mut Datapath) -> anyhow::Result<()>;
    /// After kube-proxy's rules are removed: serve new flows from outside,
    /// leaving mid-flow packets of flows conntrack translated to it.
    fn take_outside(&mut self, datapath: &mut Datapath) -> anyhow::Result<()>;
}

/// No switch: the TC programs serve traffic from outside from the start
/// (flows from outside that kube-proxy translated may move to another
/// backend at the takeover). The integration of the datapath's switch
/// replaces this.
#[derive(Debug, Default)]
pub struct NoHandover;

impl OutsideHandover for NoHandover {
    fn defer_outside(&mut self, _datapath: &mut Datapath) -> anyhow::Result<()> {
        tracing::debug!("no datapath switch for traffic from outside: the TC programs serve it from the start");
        Ok(())
    }

    fn take_outside(&mut self, _datapath: &mut Datapath) -> anyhow::Result<()> {
        Ok(())
    }
}
