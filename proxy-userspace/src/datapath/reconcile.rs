//! Keeps the maps equal to the desired table by writing only the difference,
//! in an order that never lets a reader in the kernel see a `count` that
//! points at an unwritten slot or a removed backend (docs/design.md):
//!
//! 1. upsert the backends the table needs;
//! 2. per frontend (scope `External` twins before the entries that point
//!    at them): add its new source ranges, write changed slots `1..=N` and
//!    its Maglev table, then slot 0 with the new count, flags and table
//!    (the switch-over), then delete slots above `N` and ranges no longer
//!    listed;
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
use proxy_common::{Backend as BackendValue, ServiceKey, ServiceName, ServiceValue};

pub use super::codec::BackendAddr;
use super::{
    codec::{self, BackendEntry, FrontendFlags},
    ids::IdPool,
    maglev_tables::MaglevTables,
    maps::{Dump, MapError, ServiceMaps},
};
use crate::model::{BackendState, Frontend, FrontendKey, Scope, ServicePort, ServiceTable};

#[derive(Clone, Debug)]
struct AppliedFrontend {
    service_port: ServicePort,
    /// Whether `SERVICE_NAMES[rev_nat]` holds `service_port`.
    name_written: bool,
    /// Allocated rev-NAT id (0: none yet).
    rev_nat: u16,
    /// Whether `REVNAT[rev_nat]` holds this frontend's address.
    rev_nat_written: bool,
    /// Slot 0 as it is in the map.
    master: Option<ServiceValue>,
    /// `slots[i]` is the backend id in slot `i + 1` (0: unknown id).
    slots: Vec<u32>,
    /// Source ranges in `SOURCE_RANGES` for this frontend's rev-NAT id.
    ranges: BTreeSet<IpNet>,
}

impl AppliedFrontend {
    fn new(service_port: ServicePort) -> Self {
        Self {
            service_port,
            name_written: false,
            rev_nat: 0,
            rev_nat_written: false,
            master: None,
            slots: Vec::new(),
            ranges: BTreeSet::new(),
        }
    }

    /// Takes the service port `name` names (recovery).
    fn recover_name(&mut self, name: Option<&ServiceName>) {
        if let Some(name) = name {
            self.service_port = codec::service_port_of(name);
            self.name_written = true;
        }
    }

    /// Takes `service_port`; its name is written again when it differs.
    fn set_service_port(&mut self, service_port: &ServicePort) {
        if self.service_port != *service_port {
            service_port.clone_into(&mut self.service_port);
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

    /// Backend ids reachable by readers (slots `1..=count`).
    fn live_slots(&self) -> &[u32] {
        let count = self.master.map_or(0, |m| usize::from(m.count));
        &self.slots[..count.min(self.slots.len())]
    }
}

/// What happened to one frontend, for the logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub service_port: ServicePort,
    pub frontend: FrontendKey,
    pub kind: ChangeKind,
    pub backends: usize,
    pub added: Vec<BackendAddr>,
    pub removed: Vec<BackendAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Updated,
    Removed,
}

/// A write that failed; the rest of the table was still applied.
#[derive(Debug)]
pub struct Failure {
    /// The frontend or backend the write was for.
    pub subject: String,
    pub error: MapError,
}

/// The outcome of one `apply`.
#[derive(Debug, Default)]
pub struct Report {
    pub changes: Vec<Change>,
    pub failures: Vec<Failure>,
    /// Map writes and deletes issued.
    pub writes: usize,
    pub backends_added: usize,
    pub backends_removed: usize,
}

/// What `recover` found in the maps and removed as unreachable.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub frontends: usize,
    pub backends: usize,
    pub stale_entries_removed: usize,
}

#[derive(Debug, Default)]
pub struct Reconciler {
    frontends: BTreeMap<FrontendKey, AppliedFrontend>,
    /// Backend id per address (the lowest, should the maps hold two).
    backend_ids: HashMap<BackendAddr, u32>,
    /// Every backend in the map, by id.
    backends: BTreeMap<u32, (BackendAddr, BackendValue)>,
    backend_pool: IdPool<u32>,
    rev_nat_pool: IdPool<u16>,
    maglev: MaglevTables,
    /// How many slots name each backend id (it must stay in `BACKENDS`).
    slot_refs: HashMap<u32, u32>,
    /// The desired table's backends per frontend, and the frontends using
    /// each backend (a backend's value is the best they give it): what
    /// `apply_changes` updates one frontend at a time.
    desired: HashMap<FrontendKey, Vec<(BackendAddr, Wanted)>>,
    /// (Counts, not the users themselves: a list or map per backend would
    /// cost far more memory at 100,000 backends.)
    users: HashMap<BackendAddr, WantCounts>,
    /// Whether `desired` and `users` describe the last table applied (a
    /// full `apply` builds them).
    indexed: bool,
    /// When to try again after failed writes.
    retry: RetryBackoff,
}

/// Delays between retries of failed map writes.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The retry policy after failed writes: 1 s doubling to 30 s while writes
/// keep failing; the sync after a failure compares the whole table, since a
/// failed write may have left any of the frontends it touched behind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    /// The delay before the next retry (`None`: the last sync wrote all).
    delay: Option<Duration>,
}

impl RetryBackoff {
    /// Records the outcome of a sync.
    pub fn record(&mut self, failed: bool) {
        self.delay = failed.then(|| self.delay.map_or(RETRY_MIN, |d| (d * 2).min(RETRY_MAX)));
    }

    /// How long to wait before the next retry; `None`: nothing to retry.
    #[must_use]
    pub const fn delay(&self) -> Option<Duration> {
        self.delay
    }
}

fn backend_value(addr: BackendAddr, wanted: Wanted) -> BackendValue {
    codec::backend_value(BackendEntry { addr, state: wanted.state, local: wanted.local })
}

/// A backend as the table wants it: its best state, and whether it is on
/// this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Wanted {
    state: BackendState,
    local: bool,
}

impl Wanted {
    /// The best of two frontends' views of one backend.
    fn merge(self, other: Self) -> Self {
        Self { state: self.state.min(other.state), local: self.local || other.local }
    }
}

/// How many frontends of the desired table want a backend, by the way
/// they want it (state x local).
#[derive(Clone, Copy, Debug, Default)]
struct WantCounts([u32; 4]);

impl WantCounts {
    const WAYS: [Wanted; 4] = [
        Wanted { state: BackendState::Active, local: false },
        Wanted { state: BackendState::Active, local: true },
        Wanted { state: BackendState::Terminating, local: false },
        Wanted { state: BackendState::Terminating, local: true },
    ];

    fn way(w: Wanted) -> usize {
        Self::WAYS.iter().position(|x| *x == w).expect("every Wanted is one of the four")
    }

    fn add(&mut self, w: Wanted) {
        self.0[Self::way(w)] += 1;
    }

    fn remove(&mut self, w: Wanted) {
        let n = &mut self.0[Self::way(w)];
        *n = n.saturating_sub(1);
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|n| *n == 0)
    }

    /// The best of what the frontends want (`None`: none wants it).
    fn best(&self) -> Option<Wanted> {
        Self::WAYS.iter().zip(self.0).filter(|(_, n)| *n > 0).map(|(w, _)| *w).reduce(Wanted::merge)
    }
}

/// A frontend's backends as the maps know them.
fn wanted_of(key: FrontendKey, frontend: &Frontend) -> Vec<(BackendAddr, Wanted)> {
    frontend
        .backends
        .iter()
        .map(|b| {
            (
                BackendAddr { addr: b.addr, port: b.port, protocol: key.protocol },
                Wanted { state: b.state, local: b.local },
            )
        })
        .collect()
}

/// `slots[i] = id`, keeping `refs` (slots naming each id) right.
fn set_slot(slots: &mut Vec<u32>, refs: &mut HashMap<u32, u32>, i: usize, id: u32) {
    let old = if i < slots.len() {
        std::mem::replace(&mut slots[i], id)
    } else {
        slots.push(id);
        0
    };
    *refs.entry(id).or_default() += 1;
    unref(refs, old);
}

/// Drops the last slot, keeping `refs` right.
fn pop_slot(slots: &mut Vec<u32>, refs: &mut HashMap<u32, u32>) {
    if let Some(old) = slots.pop() {
        unref(refs, old);
    }
}

fn unref(refs: &mut HashMap<u32, u32>, id: u32) {
    if let Some(n) = refs.get_mut(&id) {
        *n -= 1;
        if *n == 0 {
            refs.remove(&id);
        }
    }
}

fn slot_number(i: usize) -> u16 {
    u16::try_from(i + 1).expect("the model caps backends at u16::MAX")
}

impl Reconciler {
    /// A reconciler for empty maps.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds the applied state from the maps (after a restart), and
    /// deletes entries no reader can reach: slots without a slot 0, rev-NAT
    /// entries of no frontend, entries of unknown protocols.
    pub fn recover(maps: &mut impl ServiceMaps) -> Result<(Self, Recovery), MapError> {
        let Dump { services, backends, rev_nat, maglev, source_ranges, names } = maps.dump()?;
        let mut this = Self::default();
        let mut recovery = Recovery::default();
        let mut stale_services = Vec::new();
        let mut stale_backends = Vec::new();

        for (id, value) in &backends {
            let Some(addr) = codec::backend_addr(value).ok().filter(|_| *id != 0) else {
                stale_backends.push(*id);
                continue;
            };
            this.backend_ids.entry(addr).or_insert(*id);
            this.backends.insert(*id, (addr, *value));
        }
        for (key, value) in &services {
            let Ok((fk, slot)) = codec::frontend_of(key) else {
                stale_services.push(*key);
                continue;
            };
            let fe = this.frontends.entry(fk).or_insert_with(|| AppliedFrontend::new(ServicePort::default()));
            if slot == 0 {
                fe.master = Some(*value);
                fe.rev_nat = value.rev_nat;
                fe.rev_nat_written = rev_nat.get(&value.rev_nat).is_some_and(|r| *r == codec::rev_nat_value(fk));
                fe.recover_name(names.get(&value.rev_nat));
            } else {
                let i = usize::from(slot) - 1;
                if fe.slots.len() <= i {
                    fe.slots.resize(i + 1, 0);
                }
                fe.slots[i] = value.backend_id;
                *this.slot_refs.entry(value.backend_id).or_default() += 1;
            }
        }
        // Slots of a frontend without slot 0 are unreachable: delete them.
        let orphans: Vec<FrontendKey> =
            this.frontends.iter().filter(|(_, f)| f.master.is_none()).map(|(k, _)| *k).collect();
        for fk in orphans {
            let fe = this.frontends.remove(&fk).expect("listed above");
            for id in &fe.slots {
                unref(&mut this.slot_refs, *id);
            }
            let keys = (0..fe.slots.len()).map(|i| codec::service_key(fk, slot_number(i)));
            stale_services.extend(keys.filter(|k| services.contains_key(k)));
        }
        let used_rev_nat: BTreeSet<u16> = this.frontends.values().map(|f| f.rev_nat).filter(|id| *id != 0).collect();
        let stale_rev_nat: Vec<u16> = rev_nat.keys().filter(|id| !used_rev_nat.contains(id)).copied().collect();
        let stale_names: Vec<u16> = names.keys().filter(|id| !used_rev_nat.contains(id)).copied().collect();
        let by_rev_nat: HashMap<u16, FrontendKey> =
            this.frontends.iter().filter(|(_, f)| f.rev_nat != 0).map(|(k, f)| (f.rev_nat, *k)).collect();
        let mut stale_ranges = Vec::new();
        for (id, net) in &source_ranges {
            match by_rev_nat.get(id) {
                Some(fk) => {
                    this.frontends.get_mut(fk).expect("listed above").ranges.insert(*net);
                }
                None => stale_ranges.push((*id, *net)),
            }
        }
        // A table a frontend's slot 0 names was built from that frontend's
        // slots (checked when recovering it).
        let lists: BTreeMap<u16, Vec<u32>> = this
            .frontends
            .values()
            .filter_map(|f| Some((f.master?.maglev, f.live_slots().to_vec())))
            .filter(|(id, _)| *id != 0)
            .collect();
        let addrs: BTreeMap<u32, BackendAddr> = this.backends.iter().map(|(id, (a, _))| (*id, *a)).collect();
        this.maglev = MaglevTables::recover(&maglev, &lists, &addrs, maps.maglev_size());
        for fe in this.frontends.values() {
            this.maglev.master_changed(0, fe.master.map_or(0, |m| m.maglev));
        }

        for key in &stale_services {
            maps.remove_service(key)?;
        }
        for id in &stale_rev_nat {
            maps.remove_rev_nat(*id)?;
        }
        for (id, net) in &stale_ranges {
            maps.remove_source_range(*id, *net)?;
        }
        for id in &stale_names {
            maps.remove_name(*id)?;
        }
        for id in &stale_backends {
            maps.remove_backend(*id)?;
        }
        this.backend_pool = IdPool::with_used(this.backends.keys().copied());
        this.rev_nat_pool = IdPool::with_used(used_rev_nat.iter().copied());
        recovery.frontends = this.frontends.len();
        recovery.backends = this.backends.len();
        recovery.stale_entries_removed =
            stale_services.len() + stale_rev_nat.len() + stale_backends.len() + stale_ranges.len() + stale_names.len();
        Ok((this, recovery))
    }

    /// Number of frontends in the maps: those whose slot 0 is written (a
    /// frontend whose writes failed is tracked but not served).
    #[must_use]
    pub fn frontend_count(&self) -> usize {
        self.frontends.values().filter(|f| f.master.is_some()).count()
    }

    /// Entries of the services map in use: slot 0 and the slots of each
    /// frontend.
    #[must_use]
    pub fn service_entries(&self) -> usize {
        self.frontends.values().map(|f| usize::from(f.master.is_some()) + f.slots.len()).sum()
    }

    /// Number of backends in the maps.
    #[must_use]
    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// Every frontend's rev-NAT id, with its key and service port.
    #[must_use]
    pub fn frontend_ids(&self) -> Vec<(u16, FrontendKey, ServicePort)> {
        self.frontends
            .iter()
            .filter(|(_, f)| f.rev_nat != 0)
            .map(|(k, f)| (f.rev_nat, *k, f.service_port.clone()))
            .collect()
    }

    /// The rev-NAT id of frontend `key`, once it has one.
    #[must_use]
    pub fn frontend_id(&self, key: &FrontendKey) -> Option<u16> {
        self.frontends.get(key).map(|f| f.rev_nat).filter(|id| *id != 0)
    }

    /// Whether the applied slot 0 of `key` sends traffic from outside to
    /// its external twin.
    fn says_two_scopes(&self, key: FrontendKey) -> bool {
        self.frontends.get(&key).and_then(|f| f.master).is_some_and(|m| codec::says_two_scopes(m.flags))
    }

    /// Number of Maglev tables in the maps.
    #[must_use]
    pub fn maglev_tables(&self) -> usize {
        self.maglev.count()
    }

    /// Makes the maps hold `desired`: only the frontends at `changed` are
    /// compared when given, unless the last sync failed a write (then, as
    /// with `None`, the whole table is). Owns the retry policy: after a
    /// failed write `retry_delay` says when to call again.
    pub fn sync(
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
    pub const fn retry_delay(&self) -> Option<Duration> {
        self.retry.delay()
    }

    /// Makes the maps hold `desired`, writing only what differs; the whole
    /// table is compared (see `apply_changes` for a few frontends).
    pub fn apply(&mut self, maps: &mut impl ServiceMaps, desired: &ServiceTable) -> Report {
        self.desired.clear();
        self.users.clear();
        for (key, frontend) in desired {
            self.index(*key, Some(frontend));
        }
        self.indexed = true;
        let keys: Vec<FrontendKey> = desired.keys().chain(self.frontends.keys()).copied().collect();
        let backends: Vec<BackendAddr> = self.users.keys().chain(self.backend_ids.keys()).copied().collect();
        let mut report = self.apply_keys(maps, desired, keys, &backends);
        // Every id, also a second id of one address (left by a crash).
        let ids: Vec<u32> = self.backends.keys().copied().collect();
        self.remove_unused_backends(maps, ids, &mut report);
        report
    }

    /// Makes the maps hold `desired` when it differs from the table last
    /// applied only at `changed`: the work is proportional to those
    /// frontends, not to the table. (Before any full `apply`, it is one.)
    pub fn apply_changes(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        changed: &BTreeSet<FrontendKey>,
    ) -> Report {
        if !self.indexed {
            return self.apply(maps, desired);
        }
        let mut keys: BTreeSet<FrontendKey> = changed.clone();
        // An entry's TWO_SCOPES flag follows its twin.
        keys.extend(changed.iter().filter(|k| k.scope == Scope::External).map(|k| k.with_scope(Scope::All)));
        let mut backends: BTreeSet<BackendAddr> = BTreeSet::new();
        for key in &keys {
            backends.extend(self.desired.get(key).into_iter().flatten().map(|(a, _)| *a));
            self.index(*key, desired.get(key));
            backends.extend(self.desired.get(key).into_iter().flatten().map(|(a, _)| *a));
        }
        let backends: Vec<BackendAddr> = backends.into_iter().collect();
        self.apply_keys(maps, desired, keys.into_iter().collect(), &backends)
    }

    /// Records that the desired table gives `key` `frontend` (`None`: gone).
    fn index(&mut self, key: FrontendKey, frontend: Option<&Frontend>) {
        for (addr, want) in self.desired.remove(&key).unwrap_or_default() {
            if let Some(users) = self.users.get_mut(&addr) {
                users.remove(want);
                if users.is_empty() {
                    self.users.remove(&addr);
                }
            }
        }
        if let Some(frontend) = frontend {
            let wanted = wanted_of(key, frontend);
            for (addr, want) in &wanted {
                self.users.entry(*addr).or_default().add(*want);
            }
            self.desired.insert(key, wanted);
        }
    }

    /// The value the desired table wants for backend `addr`, if any.
    fn wanted(&self, addr: &BackendAddr) -> Option<Wanted> {
        self.users.get(addr)?.best()
    }

    /// Brings frontends `keys` (and, first, backends `backends`) to what
    /// `desired` says, then removes what nothing refers to any more.
    fn apply_keys(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        mut keys: Vec<FrontendKey>,
        backends: &[BackendAddr],
    ) -> Report {
        let mut report = Report::default();
        let upserts: Vec<(BackendAddr, Wanted)> = backends.iter().filter_map(|a| Some((*a, self.wanted(a)?))).collect();
        self.upsert_backends(maps, &upserts, &mut report);
        keys.sort();
        keys.dedup();
        let (mut updates, removals): (Vec<FrontendKey>, Vec<FrontendKey>) =
            keys.into_iter().partition(|k| desired.contains_key(k));
        // External twins are written first (an entry's slot 0 says
        // TWO_SCOPES only once its twin is there) and removed last (after
        // their entry stopped saying so): keys of scope All sort first.
        updates.sort_by_key(|k| (k.scope != Scope::External, *k));
        for key in updates {
            self.apply_frontend(maps, desired, key, &desired[&key], &mut report);
        }
        for key in removals {
            // A twin stays while its entry still sends traffic from outside
            // to it (that entry's write failed; the retry removes both).
            if !self.frontends.contains_key(&key)
                || (key.scope == Scope::External && self.says_two_scopes(key.with_scope(Scope::All)))
            {
                continue;
            }
            if let Err(error) = self.remove_frontend(maps, key, &mut report) {
                let subject = format!("{} {key}", self.frontends[&key].service_port);
                report.failures.push(Failure { subject, error });
            }
        }
        for (id, error) in self.maglev.remove_unused(maps, &mut report.writes) {
            report.failures.push(Failure { subject: format!("Maglev table {id}"), error });
        }
        let ids: Vec<u32> = backends.iter().filter_map(|a| self.backend_ids.get(a).copied()).collect();
        self.remove_unused_backends(maps, ids, &mut report);
        report
    }

    fn apply_frontend(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        key: FrontendKey,
        frontend: &Frontend,
        report: &mut Report,
    ) {
        let targets: Option<Vec<(BackendAddr, u32)>> = frontend
            .backends
            .iter()
            .map(|b| {
                let addr = BackendAddr { addr: b.addr, port: b.port, protocol: key.protocol };
                self.backend_ids.get(&addr).map(|id| (addr, *id))
            })
            .collect();
        // A missing backend failed to be written (and is reported).
        let Some(targets) = targets else { return };
        let twin_written = key.scope == Scope::All
            && desired.contains_key(&key.with_scope(Scope::External))
            && self.frontends.get(&key.with_scope(Scope::External)).is_some_and(|f| f.master.is_some());
        let flags = FrontendFlags::of(key, frontend, twin_written).encode();
        if let Err(error) = self.update_frontend(maps, key, frontend, flags, &targets, report) {
            report.failures.push(Failure { subject: format!("{} {key}", frontend.service_port), error });
        }
    }

    /// Writes the backends that are new or changed, all in one batch.
    fn upsert_backends(&mut self, maps: &mut impl ServiceMaps, wanted: &[(BackendAddr, Wanted)], report: &mut Report) {
        // (address, id, whether the id is newly allocated)
        let mut writes: Vec<(BackendAddr, u32, bool)> = Vec::new();
        let mut entries: Vec<(u32, BackendValue)> = Vec::new();
        for (addr, want) in wanted {
            let value = backend_value(*addr, *want);
            let (id, new) = match self.backend_ids.get(addr) {
                Some(id) if self.backends[id].1 == value => continue,
                Some(id) => (*id, false),
                None => {
                    let Some(id) = self.backend_pool.allocate() else {
                        let error = MapError::Full { map: super::maps::MapName::Backends };
                        report.failures.push(Failure { subject: format!("backend {addr}/{}", addr.protocol), error });
                        continue;
                    };
                    (id, true)
                }
            };
            writes.push((*addr, id, new));
            entries.push((id, value));
        }
        report.writes += entries.len();
        let mut start = 0;
        while start < entries.len() {
            let (written, failed) = match maps.set_backends(&entries[start..]) {
                Ok(()) => (entries.len() - start, None),
                Err((i, error)) => (i, Some(error)),
            };
            for n in start..start + written {
                let ((addr, id, _), (_, value)) = (writes[n], entries[n]);
                if self.backend_ids.insert(addr, id).is_none() {
                    report.backends_added += 1;
                }
                self.backends.insert(id, (addr, value));
            }
            start += written;
            if let Some(error) = failed {
                let (addr, id, new) = writes[start];
                if new {
                    self.backend_pool.release(id);
                }
                report.failures.push(Failure { subject: format!("backend {addr}/{}", addr.protocol), error });
                start += 1;
            }
        }
    }

    fn update_frontend(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        frontend: &Frontend,
        flags: u16,
        targets: &[(BackendAddr, u32)],
        report: &mut Report,
    ) -> Result<(), MapError> {
        let existed = self.frontends.contains_key(&key);
        let before: Vec<u32> = self.frontends.get(&key).map(|f| f.live_slots().to_vec()).unwrap_or_default();
        let fe = self.frontends.entry(key).or_insert_with(|| AppliedFrontend::new(frontend.service_port.clone()));
        fe.set_service_port(&frontend.service_port);
        let writes_before = report.writes;

        if fe.rev_nat == 0 {
            fe.rev_nat = self.rev_nat_pool.allocate().ok_or(MapError::Full { map: super::maps::MapName::RevNat })?;
        }
        if !fe.rev_nat_written {
            report.writes += 1;
            maps.set_rev_nat(fe.rev_nat, &codec::rev_nat_value(key))?;
            fe.rev_nat_written = true;
        }
        let ranges: BTreeSet<IpNet> = frontend.source_ranges.iter().flatten().copied().collect();
        for net in ranges.difference(&fe.ranges.clone()) {
            report.writes += 1;
            maps.set_source_range(fe.rev_nat, *net)?;
            fe.ranges.insert(*net);
        }
        // The slots that change, in one batch (in slot order, so the
        // slots before a failed one are the ones written).
        let slots: Vec<(usize, u32)> = targets
            .iter()
            .enumerate()
            .filter(|(i, (_, id))| fe.slots.get(*i) != Some(id))
            .map(|(i, (_, id))| (i, *id))
            .collect();
        let entries: Vec<(ServiceKey, ServiceValue)> = slots
            .iter()
            .map(|(i, id)| {
                (codec::service_key(key, slot_number(*i)), ServiceValue { backend_id: *id, ..ServiceValue::default() })
            })
            .collect();
        report.writes += entries.len();
        let (written, failed) = match maps.set_services(&entries) {
            Ok(()) => (slots.len(), None),
            Err((i, error)) => (i, Some(error)),
        };
        for (i, id) in &slots[..written] {
            set_slot(&mut fe.slots, &mut self.slot_refs, *i, *id);
        }
        if let Some(error) = failed {
            return Err(error);
        }
        // Traffic from outside picks its backend in a Maglev table; without
        // one (it could not be written) it hashes over the slots.
        let list: Vec<u32> = targets.iter().map(|(_, id)| *id).collect();
        let maglev = if frontend.reach.from_outside() && !list.is_empty() {
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
        } else {
            0
        };
        let fe = self.frontends.get_mut(&key).expect("inserted above");
        let master = ServiceValue {
            backend_id: 0,
            count: u16::try_from(targets.len()).expect("the model caps backends at u16::MAX"),
            rev_nat: fe.rev_nat,
            flags,
            maglev,
            affinity_timeout: frontend.affinity_timeout.unwrap_or(0),
        };
        if fe.master != Some(master) {
            report.writes += 1;
            maps.set_service(&codec::service_key(key, 0), &master)?;
            self.maglev.master_changed(fe.master.map_or(0, |m| m.maglev), master.maglev);
            fe.master = Some(master);
        }
        while fe.slots.len() > targets.len() {
            report.writes += 1;
            maps.remove_service(&codec::service_key(key, slot_number(fe.slots.len() - 1)))?;
            pop_slot(&mut fe.slots, &mut self.slot_refs);
        }
        for net in fe.ranges.clone().difference(&ranges) {
            report.writes += 1;
            maps.remove_source_range(fe.rev_nat, *net)?;
            fe.ranges.remove(net);
        }
        fe.write_name(maps, key, report);
        if report.writes > writes_before {
            let after: Vec<BackendAddr> = targets.iter().map(|(a, _)| *a).collect();
            let before: Vec<BackendAddr> =
                before.iter().filter_map(|id| self.backends.get(id).map(|(a, _)| *a)).collect();
            report.changes.push(Change {
                service_port: frontend.service_port.clone(),
                frontend: key,
                kind: if existed { ChangeKind::Updated } else { ChangeKind::Added },
                backends: after.len(),
                added: after.iter().filter(|a| !before.contains(a)).copied().collect(),
                removed: before.iter().filter(|a| !after.contains(a)).copied().collect(),
            });
        }
        Ok(())
    }

    fn remove_frontend(
        &mut self,
        maps: &mut impl ServiceMaps,
        key: FrontendKey,
        report: &mut Report,
    ) -> Result<(), MapError> {
        let fe = self.frontends.get_mut(&key).expect("caller lists applied frontends");
        let before: Vec<BackendAddr> =
            fe.live_slots().iter().filter_map(|id| self.backends.get(id).map(|(a, _)| *a)).collect();
        if let Some(master) = fe.master {
            report.writes += 1;
            maps.remove_service(&codec::service_key(key, 0))?;
            self.maglev.master_changed(master.maglev, 0);
            fe.master = None;
        }
        while !fe.slots.is_empty() {
            report.writes += 1;
            maps.remove_service(&codec::service_key(key, slot_number(fe.slots.len() - 1)))?;
            pop_slot(&mut fe.slots, &mut self.slot_refs);
        }
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
            kind: ChangeKind::Removed,
            backends: 0,
            added: Vec::new(),
            removed: before,
        });
        Ok(())
    }

    /// Deletes those of backends `ids` that no slot and no Maglev table
    /// names and that the desired table does not want at that id.
    fn remove_unused_backends(&mut self, maps: &mut impl ServiceMaps, ids: Vec<u32>, report: &mut Report) {
        for id in ids {
            let Some((addr, _)) = self.backends.get(&id).copied() else { continue };
            let wanted_here = self.users.contains_key(&addr) && self.backend_ids.get(&addr) == Some(&id);
            if wanted_here || self.slot_refs.contains_key(&id) || self.maglev.holds_backend(id) {
                continue;
            }
            report.writes += 1;
            match maps.remove_backend(id) {
                Ok(()) => {
                    self.backends.remove(&id);
                    if self.backend_ids.get(&addr) == Some(&id) {
                        self.backend_ids.remove(&addr);
                    }
                    self.backend_pool.release(id);
                    report.backends_removed += 1;
                }
                Err(error) => {
                    report.failures.push(Failure { subject: format!("backend {addr}/{}", addr.protocol), error });
                }
            }
        }
    }
}

impl super::sessions::Liveness for Reconciler {
    fn serves(&self, frontend: &FrontendKey, id: u32) -> bool {
        self.frontends.get(frontend).is_some_and(|f| f.live_slots().contains(&id))
    }

    fn by_rev_nat(&self, rev_nats: &HashSet<u16>) -> HashMap<u16, HashSet<u32>> {
        let mut out: HashMap<u16, HashSet<u32>> = HashMap::new();
        for f in self.frontends.values().filter(|f| rev_nats.contains(&f.rev_nat)) {
            out.entry(f.rev_nat).or_default().extend(f.live_slots().iter().copied());
        }
        out
    }
}
