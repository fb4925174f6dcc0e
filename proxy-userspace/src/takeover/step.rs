//! The takeover sequence the agent runs after a sync that wrote
//! everything: read kube-proxy's rules, compare, remove only when nothing
//! differs. The agent retries a refused or failed attempt every `RETRY`
//! until it is done.
use std::time::Duration;

use tracing::{error, info, warn};

use super::{Difference, Error, Removed, Tools, compare, keep_conntrack, read_rules, remove_rules};
use crate::model::ServiceTable;

/// How long a refused or failed takeover waits before it is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(10);

/// How one attempt ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// No rule of kube-proxy's in any table (any more): nothing to take
    /// over; `kept`: the families whose conntrack keeper table was added.
    NothingFound { kept: Vec<&'static str> },
    /// kube-proxy's rules and the desired table differ: the rules stay.
    Refused { frontends: usize, differences: Vec<Difference> },
    /// The rules were the same and are gone.
    Removed { frontends: usize, removed: Removed },
}

/// The takeover: the tools it reads and removes with.
#[derive(Debug, Clone)]
pub(crate) struct Takeover {
    tools: Tools,
}

impl Takeover {
    #[must_use]
    pub(crate) const fn new(tools: Tools) -> Self {
        Self { tools }
    }

    /// Whether any rule of kube-proxy's is in place (in any table it uses).
    pub(crate) fn rules_present(&self) -> Result<bool, Error> {
        Ok(!read_rules(&self.tools)?.found.is_empty())
    }

    /// One attempt against `desired` (the table the maps hold). `agreed`:
    /// the frontends of the rules, once an earlier attempt found them equal
    /// to the table and began to remove them (it failed part way): this one finishes the removal
    /// without comparing again (what is left no longer matches the table).
    /// Set here once the rules agree.
    pub(crate) fn attempt(&self, desired: &ServiceTable, agreed: &mut Option<usize>) -> Result<Outcome, Error> {
        if agreed.is_none() {
            let rules = read_rules(&self.tools)?;
            if rules.found.is_empty() {
                // Gone since the start (`kube-proxy --cleanup` by hand): the
                // flows they translated still need conntrack in this
                // namespace.
                let kept = keep_conntrack(&self.tools)?;
                return Ok(Outcome::NothingFound { kept });
            }
            let frontends = rules.table.len();
            let differences = compare(desired, &rules.table, &rules.unserved);
            if !differences.is_empty() {
                return Ok(Outcome::Refused { frontends, differences });
            }
            info!(frontends, found = %rules.found.join(", "), "kube-proxy's rules serve what the maps hold: removing them");
            *agreed = Some(frontends);
        }
        let frontends = agreed.unwrap_or_default();
        Ok(Outcome::Removed { frontends, removed: remove_rules(&self.tools)? })
    }
}

/// Logs how an attempt ended and returns the number of differences for
/// the metric (-1: it failed). A difference is one warning each, then a
/// summary.
pub(crate) fn log(outcome: &Result<Outcome, Error>) -> i64 {
    match outcome {
        Ok(Outcome::NothingFound { kept }) => {
            info!(
                conntrack_kept_by = %kept.iter().map(|f| format!("{f} {}", super::KEEPER)).collect::<Vec<_>>().join(", "),
                "no rule of kube-proxy's found any more (iptables nat/filter of either backend, nft kube-proxy tables): nothing to take over"
            );
            0
        }
        Ok(Outcome::Refused { frontends, differences }) => {
            for difference in differences {
                warn!(%difference, "kube-proxy's rules differ from ebpf-proxy's table");
            }
            warn!(
                differences = differences.len(),
                frontends,
                retry_seconds = RETRY.as_secs(),
                "not taking over from kube-proxy: its rules stay in place and keep serving flows they translated; \
                 ebpf-proxy serves new connections (from outside too); checking again every retry_seconds \
                 (make sure kube-proxy is stopped and its rules are up to date, or fix what differs)"
            );
            i64::try_from(differences.len()).unwrap_or(i64::MAX)
        }
        Ok(Outcome::Removed { frontends, removed }) => {
            info!(
                frontends,
                iptables_chains = removed.chains,
                jump_rules = removed.jumps,
                nft_tables = %removed.nft_tables.join(", "),
                conntrack_kept_by = %removed.kept.iter().map(|f| format!("{f} {}", super::KEEPER)).collect::<Vec<_>>().join(", "),
                "took over from kube-proxy: its rules are removed"
            );
            0
        }
        Err(e) => {
            error!(error = %e, retry_seconds = RETRY.as_secs(), "taking over from kube-proxy failed; trying again");
            -1
        }
    }
}
