//! Maps that grow with the cluster: after a sync, when the services or
//! backends map cannot hold the table (or refused a write as full), or is
//! bigger than its bound (a lowered flag), the agent moves to a set of
//! maps of the size `reconcile::sizing` plans, the way a layout upgrade
//! does: the new set is filled beside the old one, the programs are
//! swapped into the pinned links atomically, and the old set is unpinned.
//! No moment exists where a service the old maps held is missing.
//!
//! Before the first write (a start, with maps just made or pinned by the
//! previous agent) the same plan is made from the translated table, so a
//! start with a big cluster writes once, into maps that hold it, instead of
//! filling small maps, having writes refused and moving on.
//!
//! The same swap grows a `CT` sized from memory that filled up
//! (`grow_ct`): the set stays, only `CT` is made anew, twice as big.
use proxy_common::{CtValue, map_names};
use tracing::{info, warn};

use crate::{
    datapath::{
        handover::OutsideHandover,
        loader::{Datapath, LoadError, LoadOptions},
    },
    pipeline::Pipeline,
    reconcile::{
        Reconciler, Report,
        failures::summarise,
        remap::IdRemap,
        sizing::{self, Full, Sizes},
    },
};

/// Moves `datapath` to maps of other sizes when the plan says so; the
/// report of writing the whole table there (`None`: stayed). The table is
/// measured only after a sync that compared all of it (a relist, a
/// periodic sync; not the first, whose maps were sized for it) or that a
/// full map refused writes in, so a sync of one change costs nothing
/// more. When the programs are `attached` already the new ones take over
/// at once (the TC programs' links are left to the caller); otherwise the
/// first `attach` does it.
pub(crate) fn after_sync(
    datapath: &mut Datapath,
    pipeline: &mut Pipeline,
    opts: &LoadOptions,
    report: &Report,
    whole_table: bool,
    attached: bool,
) -> anyhow::Result<Option<Report>> {
    let summary = summarise(&report.failures);
    let full_map = |name| summary.full.contains_key(name);
    let full = Full {
        services: full_map(map_names::SERVICES),
        backends: full_map(map_names::BACKENDS),
        frontends: full_map(map_names::REVNAT) || full_map(map_names::SERVICE_NAMES),
    };
    // Before the first attach, `before_first_write` sized the maps for
    // this very table (the agent's loop plans every write before it):
    // only a full map moves them (measuring it again would sort every
    // backend once more).
    if (!whole_table || !attached) && full == Full::default() {
        return Ok(None);
    }
    let demand = sizing::demand(pipeline.model().table());
    let current = datapath.sizes();
    let Some(next) = sizing::plan(current, demand, full, opts.bounds()) else { return Ok(None) };
    log_resizing(current, next, demand, false);
    // The new set's `CT` is made anew: of the size this one has now.
    let opts = &datapath.options_for_next(opts);
    let mut moved = Datapath::load_sized(opts, next, &datapath.sessions_to_carry())?;
    moved.copy_outside_handover(datapath)?;
    // Loaded beside the write of the whole table.
    moved.start_loading_programs()?;
    let (mut reconciler, _) = Reconciler::recover(&mut moved.maps)?;
    reconciler.reserve_backends(demand.backends);
    let (written, old) = pipeline.move_to(reconciler, &mut moved.maps);
    if attached {
        // The flows in the old `CT` name the old set's ids.
        let remap = IdRemap::new(&old, pipeline.reconciler());
        // The TC programs' links are swapped by the caller, after the sync.
        carry_flows(datapath, &mut moved, |v| remap.flow(v), "before the swap");
        swap_programs(datapath, &mut moved, |v| remap.flow(v), |_| {})?;
    }
    *datapath = moved;
    info!(
        services_map_size = next.services,
        backends_map_size = next.backends,
        frontend_maps_size = next.frontends,
        failures = written.failures.len(),
        "moved to the new maps"
    );
    Ok(Some(written))
}

/// Swaps the programs of `moved` (loaded beside `datapath`, `CT`'s flows
/// already in it) into the pinned links, then carries into `moved`'s `CT`,
/// with the ids `flow` gives them, the flows the old programs opened
/// meanwhile; `tc` swaps the TC programs' links in before that carry when
/// the caller wants them in.
fn swap_programs(
    datapath: &Datapath,
    moved: &mut Datapath,
    flow: impl Fn(CtValue) -> Option<CtValue>,
    tc: impl FnOnce(&mut Datapath),
) -> Result<(), LoadError> {
    moved.attach()?;
    tc(moved);
    carry_flows(datapath, moved, &flow, "after the swap");
    // The new maps come with a `CT` of their own (`loader::Sessions`):
    // flows netfilter translated (a takeover from kube-proxy) are marked
    // again from conntrack.
    if !matches!(moved.outside_handover(), Ok(Some(OutsideHandover::Off))) {
        moved.mark_netfilter_flows_or_warn("flows kube-proxy translated may be taken over in the new maps");
    }
    Ok(())
}

/// Moves `datapath` to a `CT` of `to` entries (docs/design.md, "Growing
/// `CT`"), the way a move to bigger service maps does (`after_sync`), on
/// the same set: its service and session maps are opened again from their
/// pins and only `CT` is made anew (`crate::datapath::ct_resize`, which
/// copies its entries at the load), so every id stays and the flows are
/// carried as they are. `tc` swaps the TC programs' links in (see
/// `swap_programs`). On an error `datapath` is the one that runs; its old
/// `CT` is no longer pinned (the next start takes the new one, which
/// holds a copy of its flows).
pub(crate) fn grow_ct(
    datapath: &mut Datapath,
    opts: &LoadOptions,
    to: u32,
    tc: impl FnOnce(&mut Datapath),
) -> Result<(), LoadError> {
    // The load writes the options' handover mode into the set's pinned
    // map, which the running programs read: the mode they follow now.
    let mode = datapath.outside_handover().ok().flatten().unwrap_or(opts.outside_handover);
    let opts = LoadOptions { ct_map_size: to, outside_handover: mode, ..opts.clone() };
    let mut moved = Datapath::load_sized(&opts, datapath.sizes(), &datapath.sessions_to_carry())?;
    moved.copy_outside_handover(datapath)?;
    moved.start_loading_programs()?;
    // No carry before the swap: the load copied `CT`'s entries.
    swap_programs(datapath, &mut moved, Some, tc)?;
    *datapath = moved;
    Ok(())
}

/// Carries the flows of `from`'s `CT` into `to`'s (`SessionMaps::carry_flows`)
/// with the ids `flow` gives them; a failure costs only the flows, so it
/// is a warning.
fn carry_flows(from: &Datapath, to: &mut Datapath, flow: impl Fn(CtValue) -> Option<CtValue>, when: &str) {
    match to.sessions.carry_flows(&from.sessions, flow) {
        Ok((carried, left)) => info!(carried, left_behind = left, when, "flows carried into the new maps"),
        Err(err) => warn!(%err, when, "cannot carry the flows into the new maps; flows from outside may break"),
    }
}

/// The sizes to move to before the first write, when the maps of
/// `current` cannot hold the table `pipeline` translated (or are above
/// their bound), with what the table needs: `None` keeps them. The need
/// is counted once (a sorted list of every backend, and a sort).
#[must_use]
pub fn before_first_write_sizes(pipeline: &Pipeline, current: Sizes, bounds: Sizes) -> (Option<Sizes>, sizing::Demand) {
    let demand = sizing::demand(pipeline.model().table());
    (sizing::plan(current, demand, Full::default(), bounds), demand)
}

/// Before the first write (nothing attached yet): moves `datapath` to maps
/// sized for the table `pipeline` translated, when its maps cannot hold
/// it; the write that follows fills them, and the first `attach` swaps the
/// programs over. Whether it moved. Either way the reconciler makes room
/// for the table's backends at once.
pub(crate) fn before_first_write(
    datapath: &mut Datapath,
    pipeline: &mut Pipeline,
    opts: &LoadOptions,
) -> anyhow::Result<bool> {
    let current = datapath.sizes();
    let (next, demand) = before_first_write_sizes(pipeline, current, opts.bounds());
    let Some(next) = next else {
        pipeline.reserve_backends(demand.backends);
        return Ok(false);
    };
    log_resizing(current, next, demand, true);
    let opts = &datapath.options_for_next(opts);
    let mut moved = Datapath::load_sized(opts, next, &datapath.sessions_to_carry())?;
    moved.copy_outside_handover(datapath)?;
    let (reconciler, _) = Reconciler::recover(&mut moved.maps)?;
    pipeline.write_through(reconciler);
    pipeline.reserve_backends(demand.backends);
    *datapath = moved;
    Ok(true)
}

fn log_resizing(current: Sizes, next: Sizes, demand: sizing::Demand, first_write: bool) {
    info!(
        services_map_size = next.services,
        backends_map_size = next.backends,
        frontend_maps_size = next.frontends,
        was_services = current.services,
        was_backends = current.backends,
        was_frontends = current.frontends,
        services_needed = demand.services,
        backends_needed = demand.backends,
        frontends_needed = demand.frontends,
        first_write,
        "{RESIZING}"
    );
}

/// The message logged when the agent starts moving to maps of other
/// sizes (fields: `services_map_size`, `backends_map_size`,
/// `frontend_maps_size`, `was_services`,
/// `was_backends`, `first_write`: before the first write of a start, ...).
pub const RESIZING: &str = "maps resized: filling a new set beside the current one, then swapping the programs over";
