//! Keeps the maps equal to the desired table by writing only the difference,
//! in an order that never lets a reader in the kernel see a `count` that
//! points at an unwritten slot or a removed backend (docs/design.md):
//!
//! 1. upsert the backends the table needs;
//! 2. per frontend (scope `External` twins before the entries that point
//!    at them): add its new source ranges, write the slots entries whose
//!    backends `1..=N` change and its Maglev table, then slot 0 with the
//!    new count, flags and table (the switch-over), then delete the slots
//!    entries above `N` (and clear the slots past `N` of the last one)
//!    and ranges no longer listed (new frontends that need no more than slots, slot 0 and
//!    their rev-NAT entry and name: a chunk at a time, each map's entries
//!    in one batch, see `new_frontends`);
//! 3. per removed frontend: slot 0 first, then its slots, ranges and rev-NAT;
//! 4. delete Maglev tables no slot 0 names, then backends no slot and no
//!    table refers to any more.
//!
//! The applied state mirrors what the maps hold, write by write, so a failed
//! write leaves a state the next `apply` diffs against and retries.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::Duration,
};

use ipnet::IpNet;
use proxy_common::{Backend as BackendValue, RevNatId, ServiceKey, ServiceValue};

pub mod audit;
mod backend_table;
pub mod codec;
pub(crate) mod failures;
pub mod fake_maps;
mod ids;
pub mod inspect;
pub mod maglev;
mod maglev_tables;
mod map_error;
pub(crate) mod maps;
pub(crate) mod remap;
pub mod sizing;

#[cfg(test)]
mod tests;

pub(crate) use self::codec::BackendAddr;
pub use self::maps::{Dump, Entry, MapError, MapName, READ_MAPS, ServiceMaps};
use self::{
    backend_table::{BackendTable, Wanted},
    codec::FrontendFlags,
    ids::IdPool,
    maglev_tables::MaglevTables,
};
use crate::model::{Frontend, FrontendKey, Scope, ServicePort, ServiceTable};

mod new_frontends;
use new_frontends::WantedIds;

#[derive(Clone, Debug)]
struct AppliedFrontend {
    service_port: ServicePort,
    /// Whether `SERVICE_NAMES[rev_nat]` holds `service_port`.
    name_written: bool,
    /// Allocated rev-NAT id (0: none yet).
    rev_nat: RevNatId,
    /// Whether `REVNAT[rev_nat]` holds this frontend's address.
    rev_nat_written: bool,
    /// Slot 0 as it is in the map.
    slot_zero: Option<ServiceValue>,
    /// `slots[i]` is the backend id of slot `i + 1` (0: unknown id), held
    /// in word `i % 4` of slots entry `i / 4` (`codec::slots_key`); the
    /// words of that entry past the last slot are 0.
    slots: Vec<u32>,
    /// Source ranges in `SOURCE_RANGES` for this frontend's rev-NAT id.
    ranges: BTreeSet<IpNet>,
    /// How the desired table wanted each backend of `slots` when it was
    /// last applied (what this frontend added to their want counts).
    wanted: Box<[Wanted]>,
}

impl AppliedFrontend {
    fn new(service_port: ServicePort) -> Self {
        Self {
            service_port,
            name_written: false,
            rev_nat: 0,
            rev_nat_written: false,
            slot_zero: None,
            slots: Vec::new(),
            ranges: BTreeSet::new(),
            wanted: Box::default(),
        }
    }

    /// Takes the model's service port (`ServicePort::adopt`: its shared
    /// strings, also when equal to the ones held after a restart or an
    /// earlier translation); the name is written again only when it
    /// differs.
    fn set_service_port(&mut self, service_port: &ServicePort) {
        if self.service_port.adopt(service_port) {
            self.name_written = false;
        }
    }

    /// Writes the name when it is not in the map. Only `ebpf-proxy
    /// service` reads it: a failure is reported (and retried) but does not
    /// hold the frontend back.
    fn write_name(&mut self, maps: &mut impl ServiceMaps, key: FrontendKey, report: &mut Report) {
        if self.name_written {
            return;
        }
        report.writes += 1;
        match maps.set_name(self.rev_nat, &codec::service_name(&self.service_port)) {
            Ok(()) => self.name_written = true,
            Err(error) => report.failures.push(Failure { subject: format!("{} {key} name", self.service_port), error }),
        }
    }

    /// Takes how `frontend` wants its backends (kept only when it differs:
    /// a full sync passes every frontend here).
    fn set_wanted(&mut self, key: FrontendKey, frontend: &Frontend) {
        if !self.wanted.iter().copied().eq(wanted_of(key, frontend).map(|(_, w)| w)) {
            self.wanted = wanted_of(key, frontend).map(|(_, w)| w).collect();
        }
    }

    /// Whether the maps hold `frontend` as it is, with its source ranges
    /// `ranges`, slot 0's `flags` and backends `targets`, so that
    /// `Reconciler::update_frontend` would write nothing: its rev-NAT
    /// entry, ranges, slots, slot 0 and name.
    /// Not known here for a frontend with a Maglev table (the table's id
    /// is the tables' to give).
    fn holds(
        &self,
        frontend: &Frontend,
        ranges: &BTreeSet<IpNet>,
        (flags, targets): (u16, &[(BackendAddr, u32)]),
    ) -> bool {
        let maglev = frontend.reach.from_outside() && !targets.is_empty();
        !maglev
            && self.rev_nat != 0
            && self.rev_nat_written
            && self.name_written
            && self.slots.len() == targets.len()
            && self.slots.iter().zip(targets).all(|(id, (_, target))| id == target)
            && *ranges == self.ranges
            && self.slot_zero == Some(codec::slot_zero_value(frontend, targets.len(), self.rev_nat, flags, 0))
    }

    /// Backend ids reachable by readers (slots `1..=count`).
    fn live_slots(&self) -> &[u32] {
        let count = self.slot_zero.map_or(0, |m| usize::from(m.count));
        &self.slots[..count.min(self.slots.len())]
    }
}

/// What happened to one frontend, for the logs and the observers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) service_port: ServicePort,
    pub(crate) frontend: FrontendKey,
    /// The frontend's rev-NAT id, which it keeps while it exists (a
    /// removed one: the id it had; 0: it never had one).
    pub(crate) rev_nat: RevNatId,
    pub(crate) kind: ChangeKind,
    pub(crate) backends: usize,
    pub(crate) added: Vec<BackendAddr>,
    pub(crate) removed: Vec<BackendAddr>,
}

impl Change {
    /// A change of frontend `key`, now of `backends` backends, from
    /// backends `before` to `after`.
    fn new(
        service_port: ServicePort,
        frontend: FrontendKey,
        rev_nat: RevNatId,
        kind: ChangeKind,
        before: Vec<BackendAddr>,
        (after, backends): (Vec<BackendAddr>, usize),
    ) -> Self {
        // A new frontend (every one, on a first sync) adds all it has: its
        // list is moved, not copied.
        let (added, removed) = if before.is_empty() {
            (after, before)
        } else {
            let added = after.iter().filter(|a| !before.contains(a)).copied().collect();
            (added, before.iter().filter(|a| !after.contains(a)).copied().collect())
        };
        Self { service_port, frontend, rev_nat, kind, backends, added, removed }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Updated,
    Removed,
}

/// A write that failed; the rest of the table was still applied.
#[derive(Debug)]
pub struct Failure {
    /// The frontend or backend the write was for.
    pub(crate) subject: String,
    pub(crate) error: MapError,
}

/// A sync that adds more frontends than this reports them by key only
/// (`Report::added_unlisted`); the pipeline logs each change of a sync of
/// at most this many changes at info.
pub(crate) const LIST_NEW_FRONTENDS_UP_TO: usize = 64;

/// The outcome of one `apply`.
#[derive(Debug, Default)]
pub struct Report {
    /// Each frontend changed, with what changed; in a sync that adds more
    /// than `LIST_NEW_FRONTENDS_UP_TO` frontends (a start) the new ones
    /// are in `added_unlisted` instead.
    pub(crate) changes: Vec<Change>,
    /// Whether new frontends are in `changes`, each with its backends
    /// (`added`): in a sync that adds at most `LIST_NEW_FRONTENDS_UP_TO`.
    pub(crate) new_listed: bool,
    /// The new frontends of a sync that adds more, by key, in the order
    /// written: the desired table and the reconciler hold the rest. A
    /// `Change` each would add to a start's peak what the table holds
    /// already.
    pub(crate) added_unlisted: Vec<FrontendKey>,
    /// Writes that failed (retried later).
    pub failures: Vec<Failure>,
    /// Map writes and deletes issued.
    pub writes: usize,
    pub(crate) backends_added: usize,
    pub(crate) backends_removed: usize,
}

impl Report {
    /// How many frontends changed this way, listed in `changes` or not.
    #[must_use]
    pub(crate) fn count(&self, kind: ChangeKind) -> usize {
        let unlisted = if kind == ChangeKind::Added { self.added_unlisted.len() } else { 0 };
        self.changes.iter().filter(|c| c.kind == kind).count() + unlisted
    }

    #[cfg(test)]
    /// How many frontends changed, listed in `changes` or not.
    #[must_use]
    pub(crate) const fn changed(&self) -> usize {
        self.changes.len() + self.added_unlisted.len()
    }

    /// Records a change of frontend `key`: listed, unless it is new in a
    /// sync that does not list new ones.
    fn record(&mut self, change: impl FnOnce() -> Change, key: FrontendKey, new: bool) {
        if new && !self.new_listed {
            self.added_unlisted.push(key);
        } else {
            self.changes.push(change());
        }
    }
}

/// What `recover` found in the maps and removed as unreachable.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub(crate) frontends: usize,
    pub(crate) backends: usize,
    pub(crate) stale_entries_removed: usize,
}

/// Entries a recovery found that no reader can reach, to delete.
#[derive(Default)]
struct Stale {
    // A set: an entry of no backend is found as such and may be an
    // orphan's too.
    services: BTreeSet<ServiceKey>,
    rev_nat: Vec<RevNatId>,
    ranges: Vec<(RevNatId, IpNet)>,
    names: Vec<RevNatId>,
    /// With the value read (a removal writes it back emptied).
    backends: Vec<(u32, BackendValue)>,
}

impl Stale {
    /// Deletes every entry.
    fn remove(&self, maps: &mut impl ServiceMaps) -> Result<(), MapError> {
        for key in &self.services {
            maps.remove_service(key)?;
        }
        for id in &self.rev_nat {
            maps.remove_rev_nat(*id)?;
        }
        for (id, net) in &self.ranges {
            maps.remove_source_range(*id, *net)?;
        }
        for id in &self.names {
            maps.remove_name(*id)?;
        }
        for (id, value) in &self.backends {
            maps.remove_backend(*id, value)?;
        }
        Ok(())
    }

    fn count(&self) -> usize {
        self.services.len() + self.rev_nat.len() + self.backends.len() + self.ranges.len() + self.names.len()
    }
}

/// Keeps the maps equal to the desired table, writing only the difference (see the module's doc).
#[derive(Debug, Default)]
pub struct Reconciler {
    frontends: BTreeMap<FrontendKey, AppliedFrontend>,
    /// Every backend in the map (and those about to be), by id and address.
    backends: BackendTable,
    rev_nat_pool: IdPool<RevNatId>,
    maglev: MaglevTables,
    /// Whether the want counts of `backends` and each frontend's `wanted`
    /// describe the last table applied, so that `apply_changes` can update
    /// them one frontend at a time (a full `apply` without failures counts
    /// them).
    indexed: bool,
    /// When to try again after failed writes.
    retry: RetryBackoff,
    /// What `frontends` holds, summed: kept as `apply_keys` changes
    /// frontends, so that reporting a sync (every sync: the log line, the
    /// metrics) does not walk 100,000 frontends.
    counts: Counts,
    /// The frontends were read back and their names not yet
    /// (`read_names`, by the next `apply`).
    names_unread: bool,
}

/// Frontends served (slot 0 written) and `SERVICES` entries in use.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    served: usize,
    entries: usize,
}

impl Counts {
    fn of(fe: Option<&AppliedFrontend>) -> Self {
        fe.map_or_else(Self::default, |f| {
            let served = usize::from(f.slot_zero.is_some());
            Self { served, entries: served + codec::slot_entries(f.slots.len()) }
        })
    }

    fn sum(counts: impl Iterator<Item = Self>) -> Self {
        counts.fold(Self::default(), |a, b| Self { served: a.served + b.served, entries: a.entries + b.entries })
    }
}

/// Delays between retries of failed map writes.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The retry policy after failed writes: 1 s doubling to 30 s while writes
/// keep failing; the sync after a failure compares the whole table, since a
/// failed write may have left any of the frontends it touched behind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryBackoff {
    /// The delay before the next retry (`None`: the last sync wrote all).
    delay: Option<Duration>,
}

impl RetryBackoff {
    /// Records the outcome of a sync.
    pub(crate) fn record(&mut self, failed: bool) {
        self.delay = failed.then(|| self.delay.map_or(RETRY_MIN, |d| (d * 2).min(RETRY_MAX)));
    }

    /// How long to wait before the next retry; `None`: nothing to retry.
    #[must_use]
    pub(crate) const fn delay(&self) -> Option<Duration> {
        self.delay
    }
}

/// How frontend `key`'s backends are wanted, in slot order.
fn wanted_of(key: FrontendKey, frontend: &Frontend) -> impl Iterator<Item = (BackendAddr, Wanted)> + '_ {
    frontend.backends.iter().map(move |b| {
        (BackendAddr { addr: b.addr, port: b.port, protocol: key.protocol }, Wanted { state: b.state, local: b.local })
    })
}

/// `slots[i] = id`, keeping the slot counts of `backends` right.
fn set_slot(slots: &mut Vec<u32>, backends: &mut BackendTable, i: usize, id: u32) {
    let old = if i < slots.len() {
        std::mem::replace(&mut slots[i], id)
    } else {
        slots.push(id);
        0
    };
    backends.add_slot(id);
    backends.remove_slot(old);
}

/// Drops the slots from `len` on, keeping the slot counts of `backends`
/// right.
fn truncate_slots(slots: &mut Vec<u32>, backends: &mut BackendTable, len: usize) {
    for old in slots.drain(len.min(slots.len())..) {
        backends.remove_slot(old);
    }
}

/// Deletes frontend `key`'s slots entries from the last down to those its
/// first `keep` slots take, forgetting their slots as each goes; stops at
/// a failed delete (what is left stays recorded).
fn remove_slot_entries(
    maps: &mut impl ServiceMaps,
    key: FrontendKey,
    slots: &mut Vec<u32>,
    backends: &mut BackendTable,
    keep: usize,
    writes: &mut usize,
) -> Result<(), MapError> {
    while codec::slot_entries(slots.len()) > codec::slot_entries(keep) {
        let last = codec::slot_entries(slots.len()) - 1;
        *writes += 1;
        maps.remove_service(&codec::slots_key(key, last))?;
        truncate_slots(slots, backends, last * codec::SLOTS_PER_ENTRY);
    }
    Ok(())
}

/// The slots entry `entry` to write before slot 0 switches to the backend
/// ids `ids`: theirs below `ids.len()`, past it those `held` still has (a
/// reader of the slot 0 before may still count them).
fn entry_before_switch(ids: &[u32], held: &[u32], entry: usize) -> ServiceValue {
    let first = entry * codec::SLOTS_PER_ENTRY;
    let mut words = [0; codec::SLOTS_PER_ENTRY];
    for (i, word) in (first..).zip(&mut words) {
        *word = ids.get(i).or_else(|| held.get(i)).copied().unwrap_or(0);
    }
    ServiceValue::slots(words)
}

/// The slot indexes slots entry `entry` holds, of a frontend of `len`.
fn entry_slots(entry: usize, len: usize) -> std::ops::Range<usize> {
    let first = entry * codec::SLOTS_PER_ENTRY;
    first.min(len)..(first + codec::SLOTS_PER_ENTRY).min(len)
}

/// The frontends by rev-NAT id, while entries kept by that id are read
/// back (sorted: a few bytes a frontend, for the read only).
struct ByRevNat(Vec<(RevNatId, FrontendKey)>);

impl ByRevNat {
    fn of(frontends: &BTreeMap<FrontendKey, AppliedFrontend>) -> Self {
        let mut ids: Vec<(RevNatId, FrontendKey)> =
            frontends.iter().filter(|(_, f)| f.rev_nat != 0).map(|(k, f)| (f.rev_nat, *k)).collect();
        ids.sort_unstable();
        Self(ids)
    }

    /// The frontends whose slot 0 names `id` (two may, after a crash:
    /// each takes the entry).
    fn named(&self, id: RevNatId) -> impl Iterator<Item = FrontendKey> + '_ {
        let at = self.0.partition_point(|(r, _)| *r < id);
        self.0[at..].iter().take_while(move |(r, _)| *r == id).map(|(_, k)| *k)
    }
}

impl Reconciler {
    #[cfg(test)]
    /// A reconciler for empty maps.
    #[must_use]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Rebuilds the applied state from the maps (after a restart), and
    /// deletes entries no reader can reach: slots without a slot 0, rev-NAT
    /// entries of no frontend, entries of unknown protocols. The maps are
    /// read one entry at a time into the records kept (`ServiceMaps::read`):
    /// besides them, only the entries to delete and, for a moment, the
    /// frontends' rev-NAT ids are held.
    pub fn recover(maps: &mut impl ServiceMaps) -> Result<(Self, Recovery), MapError> {
        let mut this = Self::default();
        let mut stale = Stale::default();
        let mut backends = BackendTable::recovering(maps.capacity(MapName::Backends));
        maps.read(MapName::Backends, &mut |entry| {
            if let Entry::Backend(id, value) = entry
                && !backends.recover(id, value)
            {
                stale.backends.push((id, value));
            }
        })?;
        this.backends = backends;
        // Every frontend's service port until its name is read (`read_names`).
        let unnamed = ServicePort::default();
        maps.read(MapName::Services, &mut |entry| {
            if let Entry::Service(key, value) = entry {
                this.recover_entry(key, value, &unnamed, &mut stale.services);
            }
        })?;
        this.drop_orphan_slots(&mut stale.services);
        this.pack_frontends();
        this.recover_by_rev_nat(maps, &mut stale)?;
        this.recover_maglev_tables(maps)?;
        stale.remove(maps)?;
        this.backends.reserve_recovered();
        this.names_unread = !this.frontends.is_empty();
        this.rev_nat_pool = IdPool::with_used(this.frontends.values().map(|f| f.rev_nat).filter(|id| *id != 0));
        this.counts = this.recount();
        let recovery = Recovery {
            frontends: this.frontends.len(),
            backends: this.backends.len(),
            stale_entries_removed: stale.count(),
        };
        Ok((this, recovery))
    }

    /// Takes one `SERVICES` entry into its frontend (slot 0, or a slots
    /// entry); one that is no frontend's goes to `stale`.
    fn recover_entry(
        &mut self,
        key: ServiceKey,
        value: ServiceValue,
        unnamed: &ServicePort,
        stale: &mut BTreeSet<ServiceKey>,
    ) {
        let Ok((fk, slot)) = codec::frontend_of(&key) else {
            stale.insert(key);
            return;
        };
        if slot == 0 {
            let fe = self.frontends.entry(fk).or_insert_with(|| AppliedFrontend::new(unnamed.clone()));
            fe.slot_zero = Some(value);
            fe.rev_nat = value.rev_nat;
            return;
        }
        let ids = value.slot_ids();
        // An entry naming no backend is none a writer leaves.
        let Some(last) = ids.iter().rposition(|id| *id != 0) else {
            stale.insert(key);
            return;
        };
        let fe = self.frontends.entry(fk).or_insert_with(|| AppliedFrontend::new(unnamed.clone()));
        let first = (usize::from(slot) - 1) * codec::SLOTS_PER_ENTRY;
        if fe.slots.len() <= first + last {
            fe.slots.resize(first + last + 1, 0);
        }
        for (i, id) in ids[..=last].iter().enumerate() {
            fe.slots[first + i] = *id;
            self.backends.add_slot(*id);
        }
    }

    /// Forgets the frontends without slot 0, whose slots are unreachable,
    /// and adds their slots entries to `stale`.
    fn drop_orphan_slots(&mut self, stale: &mut BTreeSet<ServiceKey>) {
        let orphans: Vec<FrontendKey> =
            self.frontends.iter().filter(|(_, f)| f.slot_zero.is_none()).map(|(k, _)| *k).collect();
        for fk in orphans {
            let fe = self.frontends.remove(&fk).expect("listed above");
            for id in &fe.slots {
                self.backends.remove_slot(*id);
            }
            // An entry read names a backend in one of its slots (one that
            // named none is stale already); the others were not read.
            let read = (0..codec::slot_entries(fe.slots.len()))
                .filter(|e| entry_slots(*e, fe.slots.len()).any(|i| fe.slots[i] != 0));
            stale.extend(read.map(|e| codec::slots_key(fk, e)));
        }
    }

    /// Reads the entries kept by rev-NAT id (`REVNAT`, the source ranges)
    /// into the frontends whose slot 0 names that id; those of no frontend
    /// go to `stale`, with the names of none (the others are read by the
    /// first sync: `read_names`).
    fn recover_by_rev_nat(&mut self, maps: &impl ServiceMaps, stale: &mut Stale) -> Result<(), MapError> {
        let by_rev_nat = ByRevNat::of(&self.frontends);
        let frontends = &mut self.frontends;
        maps.read(MapName::RevNat, &mut |entry| {
            let Entry::RevNat(id, value) = entry else { return };
            let mut any = false;
            for fk in by_rev_nat.named(id) {
                let fe = frontends.get_mut(&fk).expect("listed above");
                fe.rev_nat_written = value == codec::rev_nat_value(fk);
                any = true;
            }
            if !any {
                stale.rev_nat.push(id);
            }
        })?;
        maps.read(MapName::Names, &mut |entry| {
            if let Entry::Name(id, _) = entry
                && by_rev_nat.named(id).next().is_none()
            {
                stale.names.push(id);
            }
        })?;
        maps.read(MapName::SourceRanges, &mut |entry| {
            let Entry::SourceRange(id, net) = entry else { return };
            // A range is the first frontend's of its id.
            match by_rev_nat.named(id).next() {
                Some(fk) => {
                    frontends.get_mut(&fk).expect("listed above").ranges.insert(net);
                }
                None => stale.ranges.push((id, net)),
            }
        })
    }

    /// Takes the names the maps hold for the frontends read back, with the
    /// desired table at hand (the first sync after `recover`): a name
    /// equal to the table's takes the table's service port, its shared
    /// strings (a restart allocates no service port per frontend); another
    /// one is decoded (the frontend's removal reports it). A frontend
    /// without one has its name written. After a read that fails, every
    /// name not read is written again (or deleted with its frontend).
    fn read_names(&mut self, maps: &impl ServiceMaps, desired: &ServiceTable, report: &mut Report) {
        if !std::mem::take(&mut self.names_unread) {
            return;
        }
        let by_rev_nat = ByRevNat::of(&self.frontends);
        let frontends = &mut self.frontends;
        let read = maps.read(MapName::Names, &mut |entry| {
            let Entry::Name(id, name) = entry else { return };
            for fk in by_rev_nat.named(id) {
                let fe = frontends.get_mut(&fk).expect("listed above");
                fe.service_port = match desired.get(&fk) {
                    Some(f) if codec::service_name(&f.service_port) == *name => f.service_port.clone(),
                    _ => codec::service_port_of(name),
                };
                fe.name_written = true;
            }
        });
        if let Err(error) = read {
            // Unread, the service port differs from the table's: the name
            // is written again, or deleted (a missing one is no failure).
            for fe in frontends.values_mut() {
                fe.name_written = true;
            }
            report.failures.push(Failure { subject: "the names read back".to_owned(), error });
        }
    }

    /// Takes back the Maglev tables the frontends' slots 0 name.
    fn recover_maglev_tables(&mut self, maps: &impl ServiceMaps) -> Result<(), MapError> {
        // A table a frontend's slot 0 names was built from that frontend's
        // slots (checked when recovering it).
        let lists: BTreeMap<u16, Vec<u32>> = self
            .frontends
            .values()
            .filter_map(|f| Some((f.slot_zero?.maglev, f.live_slots().to_vec())))
            .filter(|(id, _)| *id != 0)
            .collect();
        let size = maps.maglev_size();
        let mut tables = MaglevTables::default();
        let backends = &self.backends;
        let addr = |id: u32| backends.is_written(id).then(|| backends.addr(id)).flatten();
        maps.read(MapName::Maglev, &mut |entry| {
            if let Entry::Maglev(id, content) = entry {
                tables.recover(id, content, lists.get(&id), addr, size);
            }
        })?;
        tables.recovered();
        self.maglev = tables;
        for fe in self.frontends.values() {
            self.maglev.slot_zero_changed(0, fe.slot_zero.map_or(0, |m| m.maglev));
        }
        Ok(())
    }

    /// Number of frontends in the maps: those whose slot 0 is written (a
    /// frontend whose writes failed is tracked but not served).
    #[must_use]
    pub const fn frontend_count(&self) -> usize {
        self.counts.served
    }

    /// Entries of the services map in use: slot 0 and the slots of each
    /// frontend.
    #[must_use]
    pub(crate) const fn service_entries(&self) -> usize {
        self.counts.entries
    }

    /// `counts`, from every frontend.
    fn recount(&self) -> Counts {
        Counts::sum(self.frontends.values().map(Some).map(Counts::of))
    }

    /// Makes room at once for a table of `backends` distinct backends
    /// (`reconcile::sizing::Demand`), before writing it whole.
    pub(crate) fn reserve_backends(&mut self, backends: usize) {
        self.backends.reserve_for(backends);
    }

    /// Number of backends in the maps.
    #[must_use]
    pub(crate) fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// Every frontend's rev-NAT id, with its key and service port.
    pub(crate) fn frontend_ids(&self) -> impl Iterator<Item = (RevNatId, FrontendKey, ServicePort)> + '_ {
        self.frontends.iter().filter(|(_, f)| f.rev_nat != 0).map(|(k, f)| (f.rev_nat, *k, f.service_port.clone()))
    }

    /// The service port of frontend `key` and how many backends it
    /// serves.
    #[must_use]
    pub(crate) fn describe(&self, key: &FrontendKey) -> Option<(&ServicePort, usize)> {
        self.frontends.get(key).map(|f| (&f.service_port, f.live_slots().len()))
    }

    /// The rev-NAT id of frontend `key`, once it has one.
    #[must_use]
    pub(crate) fn frontend_id(&self, key: &FrontendKey) -> Option<RevNatId> {
        self.frontends.get(key).map(|f| f.rev_nat).filter(|id| *id != 0)
    }

    /// Whether the applied slot 0 of `key` sends traffic from outside to
    /// its external twin.
    fn says_two_scopes(&self, key: FrontendKey) -> bool {
        self.frontends.get(&key).and_then(|f| f.slot_zero).is_some_and(|m| codec::says_two_scopes(m.flags))
    }

    /// Number of Maglev tables in the maps.
    #[must_use]
    pub(crate) fn maglev_tables(&self) -> usize {
        self.maglev.count()
    }

    /// Makes the maps hold `desired`: only the frontends at `changed` are
    /// compared when given, unless the last sync failed a write (then, as
    /// with `None`, the whole table is). Owns the retry policy: after a
    /// failed write `retry_delay` says when to call again.
    pub(crate) fn sync(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        changed: Option<&BTreeSet<FrontendKey>>,
    ) -> Report {
        let report = match changed {
            Some(keys) if self.retry.delay().is_none() => self.apply_changes(maps, desired, keys),
            _ => self.apply(maps, desired),
        };
        self.retry.record(!report.failures.is_empty());
        report
    }

    /// When failed writes are to be tried again (`None`: none failed).
    #[must_use]
    pub(crate) const fn retry_delay(&self) -> Option<Duration> {
        self.retry.delay()
    }

    /// Makes the maps hold `desired`, writing only what differs; the whole
    /// table is compared (see `apply_changes` for a few frontends).
    pub fn apply(&mut self, maps: &mut impl ServiceMaps, desired: &ServiceTable) -> Report {
        let mut report = Report::default();
        let frontends_before = self.frontends.len();
        self.backends.index_recovered();
        self.read_names(maps, desired, &mut report);
        self.backends.clear_wants();
        // The ids of new frontends are kept for their bulk write (all of
        // them on a start; a relist or an audit keeps next to none).
        let mut wanted = if self.frontends.is_empty() { WantedIds::for_table(desired) } else { WantedIds::default() };
        let mut scratch = Vec::new();
        for (key, frontend) in desired {
            let ids = if self.frontends.contains_key(key) {
                scratch.clear();
                &mut scratch
            } else {
                wanted.start(*key)
            };
            self.want(*key, frontend, ids, &mut report);
        }
        // Every id in order, without a list of them: only the ids the
        // table wants have a value to write (a second id of one address,
        // left by a crash, is wanted by none), and the removal goes over
        // every id.
        self.upsert_backends(maps, 1..self.backends.bound(), &mut report);
        let updates: Vec<FrontendKey> = desired.keys().copied().collect();
        let removals = self.frontends.keys().filter(|k| !desired.contains_key(k)).copied().collect();
        self.apply_keys(maps, desired, (updates, removals), wanted, &mut report);
        self.remove_unused_backends(maps, 1..self.backends.bound(), &mut report);
        self.indexed = report.failures.is_empty();
        // Packed where many were added (a start's, in key order). Not
        // after a restart, a relist or an audit, whose tree was packed or
        // read back packed: the list `pack` makes would be held at the
        // agent's largest moment, for the few frontends they add.
        if self.frontends.len() > frontends_before + frontends_before / 8 {
            self.pack_frontends();
        }
        report
    }

    /// Rebuilds the frontends' tree in order, every node full
    /// (`model::packed`): frontends inserted one by one in key order, or
    /// read back in no order, leave nodes partly empty.
    fn pack_frontends(&mut self) {
        crate::model::packed::pack(&mut self.frontends);
    }

    /// Makes the maps hold `desired` when it differs from the table last
    /// applied only at `changed`: the work is proportional to those
    /// frontends, not to the table. (Before any full `apply`, or after a
    /// sync that failed a write, it is one.)
    pub(crate) fn apply_changes(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        changed: &BTreeSet<FrontendKey>,
    ) -> Report {
        if !self.indexed {
            return self.apply(maps, desired);
        }
        let mut report = Report::default();
        let mut keys: BTreeSet<FrontendKey> = changed.clone();
        // An entry's TWO_SCOPES flag follows its twin.
        keys.extend(changed.iter().filter(|k| k.scope == Scope::External).map(|k| k.with_scope(Scope::All)));
        let mut ids: Vec<u32> = Vec::new();
        for key in &keys {
            // The last sync wrote every frontend: its slots are the
            // backends the table gave it, in order.
            if let Some(fe) = self.frontends.get(key) {
                for (id, way) in fe.slots.iter().zip(&fe.wanted) {
                    self.backends.want(*id, *way, false);
                    ids.push(*id);
                }
            }
            if let Some(frontend) = desired.get(key) {
                self.want(*key, frontend, &mut ids, &mut report);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        self.upsert_backends(maps, ids.iter().copied(), &mut report);
        let keys = keys.into_iter().partition(|k| desired.contains_key(k));
        self.apply_keys(maps, desired, keys, WantedIds::default(), &mut report);
        self.remove_unused_backends(maps, ids, &mut report);
        self.indexed = report.failures.is_empty();
        report
    }

    /// Counts what frontend `key` of the desired table wants of its
    /// backends, reserving ids for the new ones; adds their ids to `ids`.
    fn want(&mut self, key: FrontendKey, frontend: &Frontend, ids: &mut Vec<u32>, report: &mut Report) {
        let Self { frontends, backends, .. } = self;
        let held = frontends.get(&key).map_or(&[][..], |f| &f.slots);
        for (i, (addr, way)) in wanted_of(key, frontend).enumerate() {
            let Some(id) = backends.reserve_at(addr, held.get(i).copied()) else {
                let error = MapError::Full { map: MapName::Backends };
                let subject = format!("backend {addr}/{}", addr.protocol);
                if !report.failures.iter().any(|f| f.subject == subject) {
                    report.failures.push(Failure { subject, error });
                }
                continue;
            };
            backends.want(id, way, true);
            ids.push(id);
        }
    }

    /// Brings frontends `updates` (keys of `desired`) to what `desired`
    /// says (their backends are written already) and removes frontends
    /// `removals` (keys it lacks), each key once, in order; then removes
    /// the Maglev tables nothing refers to any more (the caller removes
    /// the backends); `wanted`: the ids `want` gave frontends (new ones
    /// written in bulk take theirs from there).
    fn apply_keys(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        (mut updates, removals): (Vec<FrontendKey>, Vec<FrontendKey>),
        wanted: WantedIds,
        report: &mut Report,
    ) {
        let before = Counts::sum(updates.iter().chain(&removals).map(|k| Counts::of(self.frontends.get(k))));
        // External twins are written first (an entry's slot 0 says
        // TWO_SCOPES only once its twin is there) and removed last (after
        // their entry stopped saying so): keys of scope All sort first.
        updates.sort_by_key(|k| (k.scope != Scope::External, *k));
        let new = updates.iter().filter(|k| !self.frontends.contains_key(k)).count();
        report.new_listed = new <= LIST_NEW_FRONTENDS_UP_TO;
        // Every new frontend of a start is reported.
        if !report.new_listed {
            report.added_unlisted.reserve_exact(new);
        }
        self.apply_updates(maps, desired, &updates, &wanted, report);
        // Its only reader is done: freed before the removals and, in
        // `apply`, the rebuild of the frontends' tree (a start's largest
        // moment).
        drop(wanted);
        for &key in &removals {
            // A twin stays while its entry still sends traffic from outside
            // to it (that entry's write failed; the retry removes both).
            if !self.frontends.contains_key(&key)
                || (key.scope == Scope::External && self.says_two_scopes(key.with_scope(Scope::All)))
            {
                continue;
            }
            if let Err(error) = self.remove_frontend(maps, key, report) {
                let subject = format!("{} {key}", self.frontends[&key].service_port);
                report.failures.push(Failure { subject, error });
            }
        }
        let after = Counts::sum(updates.iter().chain(&removals).map(|k| Counts::of(self.frontends.get(k))));
        self.counts.served = self.counts.served + after.served - before.served;
        self.counts.entries = self.counts.entries + after.entries - before.entries;
        debug_assert_eq!(self.counts, self.recount(), "counts kept as frontends change");
        for (id, error) in self.maglev.remove_unused(maps, &mut report.writes) {
            report.failures.push(Failure { subject: format!("Maglev table {id}"), error });
        }
    }

    /// Writes frontend `key` of `desired`; `new`: it is new though its
    /// writing began (`new_frontends`).
    fn apply_frontend(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        key: FrontendKey,
        new: bool,
        report: &mut Report,
    ) {
        let frontend = &desired[&key];
        let held = self.frontends.get(&key).map_or(&[][..], |f| &f.slots);
        let targets: Option<Vec<(BackendAddr, u32)>> = frontend
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let addr = BackendAddr { addr: b.addr, port: b.port, protocol: key.protocol };
                self.backends.id_at(&addr, held.get(i).copied()).map(|id| (addr, id))
            })
            .collect();
        // A missing backend failed to be written (and is reported).
        let Some(targets) = targets else { return };
        let twin_written = key.scope == Scope::All
            && desired.contains_key(&key.with_scope(Scope::External))
            && self.frontends.get(&key.with_scope(Scope::External)).is_some_and(|f| f.slot_zero.is_some());
        let flags = FrontendFlags::of(key, frontend, twin_written).encode();
        if let Err(error) = self.update_frontend(maps, key, frontend, (flags, new), &targets, report) {
            report.failures.push(Failure { subject: format!("{} {key}", frontend.service_port), error });
        }
    }

    /// Writes those of backends `ids` that are new or changed, in batches
    /// of up to `CHUNK`, the new ones through `add_backends`; a new one
    /// that fails is forgotten (its id freed).
    fn upsert_backends(
        &mut self,
        maps: &mut impl ServiceMaps,
        ids: impl IntoIterator<Item = u32>,
        report: &mut Report,
    ) {
        // A start's backends are written a chunk at a time: lists of the
        // whole table's would be made at the agent's peak.
        const CHUNK: usize = 4096;
        let mut ids = ids.into_iter().peekable();
        let mut new: Vec<(u32, BackendValue)> = Vec::new();
        let mut changed: Vec<(u32, BackendValue)> = Vec::new();
        while ids.peek().is_some() {
            new.clear();
            changed.clear();
            for id in ids.by_ref().take(CHUNK) {
                if let Some((value, is_new)) = self.backends.to_write(id) {
                    if is_new { &mut new } else { &mut changed }.push((id, value));
                }
            }
            report.writes += new.len() + changed.len();
            self.write_backends(maps, true, &new, report);
            self.write_backends(maps, false, &changed, report);
        }
    }

    /// Writes `entries`, all `new` to the map or all not; a new one that
    /// fails is forgotten (its id freed).
    fn write_backends(
        &mut self,
        maps: &mut impl ServiceMaps,
        new: bool,
        entries: &[(u32, BackendValue)],
        report: &mut Report,
    ) {
        let mut start = 0;
        while start < entries.len() {
            let rest = &entries[start..];
            let result = if new { maps.add_backends(rest) } else { maps.set_backends(rest) };
            let (written, failed) = match result {
                Ok(()) => (rest.len(), None),
                Err((i, error)) => (i, Some(error)),
            };
            for (id, value) in &rest[..written] {
                self.backends.written(*id, *value);
                report.backends_added += usize::from(new);
            }
            start += written;
            if let Some(error) = failed {
                let (id, _) = entries[start];
                let addr = self.backends.addr(id).expect("a backend to write has an address");
                if new {
                    self.backends.forget(id);
                }
                report.failures.push(Failure { subject: format!("backend {addr}/{}", addr.protocol), error });
                start += 1;
            }
        }
    }

    /// Writes the difference between what frontend `key` holds and what
    /// `frontend` wants, in the reader-safe order (see the module's doc):
    /// the rev-NAT entry and new source ranges, the slots entries that
    /// change, the Maglev table, slot 0 (the switch-over), then what slot 0
    /// no longer counts.
    fn update_frontend(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        frontend: &Frontend,
        (flags, new): (u16, bool),
        targets: &[(BackendAddr, u32)],
        report: &mut Report,
    ) -> Result<(), MapError> {
        let existed = self.frontends.contains_key(&key) && !new;
        let ranges: BTreeSet<IpNet> = frontend.source_ranges.iter().flatten().copied().collect();
        self.set_wanted(key, frontend);
        // A full sync (a restart's, a relist's, an audit's) passes every
        // frontend here, nearly all as the maps hold them: those are known
        // from their record at once. (Debug builds go on, and check that
        // nothing was written.)
        let unchanged = existed && self.frontends[&key].holds(frontend, &ranges, (flags, targets));
        if unchanged && !cfg!(debug_assertions) {
            return Ok(());
        }
        // (A new frontend begun in bulk may have its slot 0 already.)
        let before: Vec<u32> =
            self.frontends.get(&key).filter(|_| !new).map(|f| f.live_slots().to_vec()).unwrap_or_default();
        let writes_before = report.writes;
        self.write_rev_nat(maps, key, report)?;
        self.add_source_ranges(maps, key, &ranges, report)?;
        let list: Vec<u32> = targets.iter().map(|(_, id)| *id).collect();
        self.write_changed_slots(maps, key, &list, report)?;
        let maglev = self.write_maglev_table(maps, key, frontend, targets, report);
        self.switch_slot_zero(maps, key, frontend, (flags, maglev), targets.len(), report)?;
        self.drop_slots_past_count(maps, key, targets.len(), report)?;
        self.remove_old_source_ranges(maps, key, &ranges, report)?;
        self.frontends.get_mut(&key).expect("inserted above").write_name(maps, key, report);
        debug_assert!(!unchanged || report.writes == writes_before, "{key} held as it is, yet written");
        if report.writes > writes_before {
            self.record_update(key, frontend, existed, &before, targets, report);
        }
        Ok(())
    }

    /// Records what `frontend` wants of frontend `key` (added when new).
    fn set_wanted(&mut self, key: FrontendKey, frontend: &Frontend) {
        let fe = self.frontends.entry(key).or_insert_with(|| AppliedFrontend::new(frontend.service_port.clone()));
        fe.set_service_port(&frontend.service_port);
        fe.set_wanted(key, frontend);
    }

    /// Gives frontend `key` a rev-NAT id if it has none, and writes its
    /// rev-NAT entry if not written yet.
    fn write_rev_nat(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        if fe.rev_nat == 0 {
            fe.rev_nat = self.rev_nat_pool.allocate().ok_or(MapError::Full { map: MapName::RevNat })?;
        }
        if !fe.rev_nat_written {
            report.writes += 1;
            maps.set_rev_nat(fe.rev_nat, &codec::rev_nat_value(key))?;
            fe.rev_nat_written = true;
        }
        Ok(())
    }

    /// Adds the source ranges of `ranges` frontend `key` does not hold yet.
    fn add_source_ranges(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        ranges: &BTreeSet<IpNet>,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        for net in ranges.difference(&fe.ranges.clone()) {
            report.writes += 1;
            maps.set_source_range(fe.rev_nat, *net)?;
            fe.ranges.insert(*net);
        }
        Ok(())
    }

    /// Writes the slots entries of frontend `key` whose backends differ
    /// from `list`, slot 0 untouched: a reader still counts the old slots.
    fn write_changed_slots(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        list: &[u32],
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        // The slots entries that change, in one batch (in order, so the
        // entries before a failed one are the ones written).
        let changed: Vec<usize> = (0..codec::slot_entries(list.len()))
            .filter(|e| entry_slots(*e, list.len()).any(|i| fe.slots.get(i) != Some(&list[i])))
            .collect();
        let entries: Vec<(ServiceKey, ServiceValue)> =
            changed.iter().map(|e| (codec::slots_key(key, *e), entry_before_switch(list, &fe.slots, *e))).collect();
        report.writes += entries.len();
        let (written, failed) = match maps.set_services(&entries) {
            Ok(()) => (changed.len(), None),
            Err((i, error)) => (i, Some(error)),
        };
        // Grown once to the size it takes (pushed one by one, 10 ids took
        // room for 16).
        fe.slots.reserve_exact(list.len().saturating_sub(fe.slots.len()));
        for e in &changed[..written] {
            for i in entry_slots(*e, list.len()) {
                set_slot(&mut fe.slots, &mut self.backends, i, list[i]);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The Maglev table traffic from outside picks a backend of frontend
    /// `key` in (0: none; a table that could not be written is reported).
    fn write_maglev_table(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        frontend: &Frontend,
        targets: &[(BackendAddr, u32)],
        report: &mut Report,
    ) -> u16 {
        // Traffic from outside picks its backend in a Maglev table; without
        // one (it could not be written) it hashes over the slots.
        if !frontend.reach.from_outside() || targets.is_empty() {
            return 0;
        }
        let list: Vec<u32> = targets.iter().map(|(_, id)| *id).collect();
        let addrs: BTreeMap<u32, BackendAddr> = targets.iter().map(|(a, id)| (*id, *a)).collect();
        match self.maglev.get_or_write(maps, &list, &addrs, &mut report.writes) {
            Ok(id) => id,
            Err(error) => {
                report
                    .failures
                    .push(Failure { subject: format!("{} {key} Maglev table", frontend.service_port), error });
                0
            }
        }
    }

    /// Writes slot 0 of frontend `key` with the new count, flags and
    /// Maglev table when it differs: the switch-over a reader sees at once.
    fn switch_slot_zero(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        frontend: &Frontend,
        (flags, maglev): (u16, u16),
        count: usize,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        let slot_zero = codec::slot_zero_value(frontend, count, fe.rev_nat, flags, maglev);
        if fe.slot_zero != Some(slot_zero) {
            report.writes += 1;
            maps.set_service(&codec::service_key(key, 0), &slot_zero)?;
            self.maglev.slot_zero_changed(fe.slot_zero.map_or(0, |m| m.maglev), slot_zero.maglev);
            fe.slot_zero = Some(slot_zero);
        }
        Ok(())
    }

    /// Deletes the slots entries of frontend `key` past `count`, which
    /// slot 0 no longer counts, and clears the last one's slots past it.
    fn drop_slots_past_count(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        count: usize,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        remove_slot_entries(maps, key, &mut fe.slots, &mut self.backends, count, &mut report.writes)?;
        if fe.slots.len() > count {
            let entry = codec::slot_entries(count) - 1;
            report.writes += 1;
            maps.set_service(&codec::slots_key(key, entry), &codec::slots_value(&fe.slots[..count], entry))?;
            truncate_slots(&mut fe.slots, &mut self.backends, count);
        }
        Ok(())
    }

    /// Removes the source ranges frontend `key` holds that `ranges` no
    /// longer lists.
    fn remove_old_source_ranges(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        ranges: &BTreeSet<IpNet>,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        for net in fe.ranges.clone().difference(ranges) {
            report.writes += 1;
            maps.remove_source_range(fe.rev_nat, *net)?;
            fe.ranges.remove(net);
        }
        Ok(())
    }

    /// Reports frontend `key` as added or updated, with its backends
    /// `before` (ids) and now.
    fn record_update(
        &self,
        key: FrontendKey,
        frontend: &Frontend,
        existed: bool,
        before: &[u32],
        targets: &[(BackendAddr, u32)],
        report: &mut Report,
    ) {
        let rev_nat = self.frontends[&key].rev_nat;
        let backends = &self.backends;
        let change = || {
            let before: Vec<BackendAddr> = before.iter().filter_map(|id| backends.addr(*id)).collect();
            let after: Vec<BackendAddr> = targets.iter().map(|(a, _)| *a).collect();
            let kind = if existed { ChangeKind::Updated } else { ChangeKind::Added };
            Change::new(frontend.service_port.clone(), key, rev_nat, kind, before, (after, targets.len()))
        };
        report.record(change, key, !existed);
    }

    fn remove_frontend(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("caller lists applied frontends");
        let before: Vec<BackendAddr> = fe.live_slots().iter().filter_map(|id| self.backends.addr(*id)).collect();
        if let Some(slot_zero) = fe.slot_zero {
            report.writes += 1;
            maps.remove_service(&codec::service_key(key, 0))?;
            self.maglev.slot_zero_changed(slot_zero.maglev, 0);
            fe.slot_zero = None;
        }
        remove_slot_entries(maps, key, &mut fe.slots, &mut self.backends, 0, &mut report.writes)?;
        while let Some(net) = fe.ranges.first().copied() {
            report.writes += 1;
            maps.remove_source_range(fe.rev_nat, net)?;
            fe.ranges.remove(&net);
        }
        if fe.name_written {
            report.writes += 1;
            maps.remove_name(fe.rev_nat)?;
            fe.name_written = false;
        }
        if fe.rev_nat != 0 {
            report.writes += 1;
            maps.remove_rev_nat(fe.rev_nat)?;
            self.rev_nat_pool.release(fe.rev_nat);
        }
        let fe = self.frontends.remove(&key).expect("present");
        report.changes.push(Change {
            service_port: fe.service_port,
            frontend: key,
            rev_nat: fe.rev_nat,
            kind: ChangeKind::Removed,
            backends: 0,
            added: Vec::new(),
            removed: before,
        });
        Ok(())
    }

    /// Deletes those of backends `ids` that no slot and no Maglev table
    /// names and that the desired table does not want at that id.
    fn remove_unused_backends(
        &mut self,
        maps: &mut impl ServiceMaps,
        ids: impl IntoIterator<Item = u32>,
        report: &mut Report,
    ) {
        for id in ids {
            if self.backends.unused(id).is_none() || self.maglev.holds_backend(id) {
                continue;
            }
            // Never written: nothing to delete.
            let Some(held) = self.backends.held(id) else {
                self.backends.forget(id);
                continue;
            };
            report.writes += 1;
            match maps.remove_backend(id, &held) {
                Ok(()) => {
                    self.backends.forget(id);
                    report.backends_removed += 1;
                }
                Err(error) => {
                    let subject = self
                        .backends
                        .addr(id)
                        .map_or_else(|| format!("backend {id}"), |addr| format!("backend {addr}/{}", addr.protocol));
                    report.failures.push(Failure { subject, error });
                }
            }
        }
    }
}

/// Which backends serve which frontends now (the reconciler knows).
pub(crate) trait Liveness {
    /// Whether backend `id` is in a live slot of `frontend`.
    fn serves(&self, frontend: &FrontendKey, id: u32) -> bool;
    /// The backend ids in live slots of the frontends with these rev-NAT
    /// ids (an id missing from the answer serves nothing).
    fn by_rev_nat(&self, rev_nats: &HashSet<RevNatId>) -> HashMap<RevNatId, HashSet<u32>>;
}

impl Liveness for Reconciler {
    fn serves(&self, frontend: &FrontendKey, id: u32) -> bool {
        self.frontends.get(frontend).is_some_and(|f| f.live_slots().contains(&id))
    }

    fn by_rev_nat(&self, rev_nats: &HashSet<RevNatId>) -> HashMap<RevNatId, HashSet<u32>> {
        let mut out: HashMap<RevNatId, HashSet<u32>> = HashMap::new();
        for f in self.frontends.values().filter(|f| rev_nats.contains(&f.rev_nat)) {
            out.entry(f.rev_nat).or_default().extend(f.live_slots().iter().copied());
        }
        out
    }
}
