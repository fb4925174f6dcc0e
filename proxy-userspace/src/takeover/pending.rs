//! The agent's side of a takeover (`--take-over-from-kube-proxy`): the
//! handover of traffic from outside, the first attempt after the first
//! sync that wrote everything, then one every `RETRY` while the maps hold
//! the table (a sync that wrote everything once `RETRY` has passed counts
//! as that). Dropped once done.
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{Outcome, RETRY, Takeover, log_outcome};
use crate::{
    datapath::{handover::OutsideHandover, loader::Datapath},
    model::ServiceTable,
    observe::metrics::Metrics,
};

pub(crate) struct Pending {
    takeover: Takeover,
    /// When the handover of traffic from outside ends
    /// (`--outside-handover-seconds`; `None`: at the next start).
    ends_after: Option<Duration>,
    /// The last sync wrote everything: the maps hold the model's table.
    maps_complete: bool,
    /// Traffic from outside handed over: new flows are the programs'.
    handed_over: bool,
    /// The rules (of this many frontends) agreed with the table once: what
    /// is left of them is removed without comparing again.
    agreed: Option<usize>,
    retry_at: Option<Instant>,
}

impl Pending {
    /// A takeover due (kube-proxy's rules are on the node): the programs
    /// were loaded deferring traffic from outside to them (`agent`,
    /// `takeover_due`), until the maps hold the whole table.
    pub(crate) fn start(takeover: Takeover, ends_after: Option<Duration>, metrics: &Metrics) -> Self {
        metrics.takeover_differences.set(-1);
        tracing::info!("taking over from kube-proxy once the maps hold the whole table");
        Self { takeover, ends_after, maps_complete: false, handed_over: false, agreed: None, retry_at: None }
    }

    /// When the next attempt is due without a sync (`None`: not before a
    /// sync that writes everything).
    #[must_use]
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at.filter(|_| self.maps_complete)
    }

    /// After a sync (`complete`: it wrote everything) or when the retry is
    /// due: one attempt against `desired` when the maps hold it. `Ok(true)`:
    /// done, the takeover is over.
    pub(crate) fn attempt(
        &mut self,
        complete: Option<bool>,
        desired: &ServiceTable,
        datapath: &mut Datapath,
        metrics: &Metrics,
    ) -> anyhow::Result<bool> {
        if let Some(complete) = complete {
            self.maps_complete = complete;
            // After a refusal, a sync does not bring the next attempt
            // forward: reading and comparing the rules of a big cluster
            // takes seconds (10,000 services of 10 endpoints: 6 s in a
            // debug build), and syncs may come every second.
            if self.retry_at.is_some_and(|at| Instant::now() < at) {
                return Ok(false);
            }
        }
        if !self.maps_complete {
            return Ok(false);
        }
        // The maps hold the table: new flows from outside are ours from now
        // on, whatever the rules' check says (kube-proxy's rules, stopped,
        // no longer follow the cluster); the flows they translated go on
        // through conntrack. Before the removal, so no packet ever finds
        // neither the rules nor the programs serving it.
        if !self.handed_over {
            // Marks of flows silent since the attach may have expired (a UDP
            // entry lives 60 s): conntrack's DNATed flows are marked again.
            datapath.mark_netfilter_flows_or_warn("a flow silent while deferring may be taken over");
            datapath
                .set_outside_handover(OutsideHandover::Handover { ends_after: self.ends_after })
                .context("handing traffic from outside over to the programs")?;
            self.handed_over = true;
        }
        let outcome = self.takeover.attempt(desired, &mut self.agreed);
        metrics.takeover_differences.set(log_outcome(&outcome));
        match outcome {
            Ok(Outcome::NothingFound { .. } | Outcome::Removed { .. }) => Ok(true),
            Ok(Outcome::Refused { .. }) | Err(_) => {
                self.retry_at = Some(Instant::now() + RETRY);
                Ok(false)
            }
        }
    }
}
