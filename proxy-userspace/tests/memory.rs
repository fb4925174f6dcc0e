//! Where the agent's heap goes, without a kernel: the bench's cluster
//! (N services of 10 endpoints, as `ebpf-proxy-bench --control-only`
//! serves it) through the store, the pipeline and in-memory maps, with an
//! allocator that counts the bytes jemalloc hands out (its size classes).
//! Each part is measured by what its drop gives back; the peaks are those
//! of a start, a relist and a restart on the maps, less what the maps
//! themselves hold (the kernel's, not the agent's). Room a large
//! allocation reserves and never touches counts here, not in the RSS.
//!
//! `cargo test --release --test memory -- --ignored --nocapture` prints
//! the accounting at 100,000 services (`MEMORY_SERVICES=N` for another
//! size, `MEMORY_DETAIL=1` for each step's peak and the resident size);
//! docs/design.md ("What the agent holds") gives it per byte. The test
//! that runs by default checks at 1,500 services that a relist and a
//! restart hold no second copy of what the agent holds.
use std::{
    alloc::{GlobalAlloc, Layout},
    sync::atomic::{AtomicUsize, Ordering},
};

use ebpf_proxy::{
    agent::resize::before_first_write_sizes,
    pipeline::{NodeSettings, Pipeline, Wake},
    reconcile::{Dump, Entry, MapError, MapName, Reconciler, ServiceMaps, sizing::DEFAULT_BOUNDS},
    source::{ChangeSource, Delivery, store::ObjectStore},
};
use ipnet::IpNet;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::runtime::watcher::Event;
use proxy_common::{Backend as BackendValue, RevNat, RevNatId, ServiceKey, ServiceName, ServiceValue};
use serde_json::json;

/// jemalloc, counting the bytes of each allocation's size class.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is jemalloc's; the counters only read the size of
// what jemalloc returned or is about to free.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's.
        let ptr = unsafe { tikv_jemallocator::Jemalloc.alloc(layout) };
        if !ptr.is_null() {
            // SAFETY: jemalloc's allocation.
            add(unsafe { tikv_jemallocator::usable_size(ptr) });
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's.
        let ptr = unsafe { tikv_jemallocator::Jemalloc.alloc_zeroed(layout) };
        if !ptr.is_null() {
            // SAFETY: jemalloc's allocation.
            add(unsafe { tikv_jemallocator::usable_size(ptr) });
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: jemalloc's allocation, not freed yet.
        LIVE.fetch_sub(unsafe { tikv_jemallocator::usable_size(ptr) }, Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { tikv_jemallocator::Jemalloc.dealloc(ptr, layout) };
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: jemalloc's allocation, not freed yet.
        let old = unsafe { tikv_jemallocator::usable_size(ptr) };
        // SAFETY: as the caller's.
        let new = unsafe { tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(old, Ordering::Relaxed);
            // SAFETY: jemalloc's allocation.
            add(unsafe { tikv_jemallocator::usable_size(new) });
        }
        new
    }
}

fn add(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The agent's jemalloc settings (`observe::memory::JEMALLOC_CONF`) as
/// they are once its lists are in: freed pages returned at once.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; 92] =
    b"narenas:1,background_thread:true,max_background_threads:1,dirty_decay_ms:0,muzzy_decay_ms:0\0";

/// This process's resident size, MiB, once freed pages are returned.
fn rss() -> String {
    std::thread::sleep(std::time::Duration::from_millis(300));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
    format!("{:.1} MiB", kib.unwrap_or(0.0) / 1024.0)
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Starts a new peak at what is live now.
fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

const ENDPOINTS: u32 = 10;

fn vip(s: u32) -> String {
    let [_, top, hi, lo] = s.to_be_bytes();
    format!("10.{}.{hi}.{lo}", 96 + top)
}

fn endpoint(s: u32, i: u32) -> String {
    let [_, top, hi, lo] = s.to_be_bytes();
    format!("10.{}.{hi}.{lo}", 128 + 4 * i + u32::from(top))
}

/// Service `s` of the bench, with what the lean decoding keeps of it.
fn service(s: u32) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc{s}"), "namespace": "bench", "resourceVersion": "1"},
        "spec": {"clusterIP": vip(s), "clusterIPs": [vip(s)], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    }))
    .expect("a Service")
}

/// Service `s`'s EndpointSlice, as the bench's (endpoint `moved` on
/// another address, at another version).
fn slice(s: u32, moved: Option<u32>) -> EndpointSlice {
    let endpoints: Vec<serde_json::Value> = (0..ENDPOINTS)
        .map(|i| {
            let addr = if moved == Some(i) { format!("10.250.{}.{}", s / 256 % 256, s % 256) } else { endpoint(s, i) };
            json!({"addresses": [addr], "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": format!("node-{i}"), "zone": format!("zone-{}", i % 3)})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc{s}-1"), "namespace": "bench",
                     "resourceVersion": if moved.is_some() { "2" } else { "1" },
                     "labels": {"kubernetes.io/service-name": format!("svc{s}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .expect("an EndpointSlice")
}

/// The store, fed list events one object at a time (as the watch tasks
/// feed it: no list of objects is held beside it).
#[derive(Default)]
struct Source {
    store: ObjectStore,
}

impl Source {
    /// A list (or relist) of `n` services and their slices (service
    /// `moved`'s slice with one endpoint elsewhere).
    fn list(&mut self, n: u32, moved: Option<u32>) {
        let s = &mut self.store;
        s.service_event(Event::Init);
        (0..n).for_each(|i| s.service_event(Event::InitApply(service(i))));
        s.service_event(Event::InitDone);
        s.slice_event(Event::Init);
        (0..n).for_each(|i| s.slice_event(Event::InitApply(slice(i, moved.filter(|m| *m == i).map(|_| 0)))));
        s.slice_event(Event::InitDone);
        s.node_event(Event::Init);
        s.node_event(Event::InitDone);
    }
}

impl ChangeSource for Source {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn changed(&mut self) {}

    fn snapshot(&mut self) -> Option<Delivery> {
        Some(self.store.take())
    }

    fn everything(&mut self) -> Option<Delivery> {
        Some(self.store.everything())
    }
}

/// Maps in memory that check nothing (the reconciler's fake maps check a
/// reader's view after every write, which is quadratic in the table).
#[derive(Default)]
struct Maps(Dump, Option<usize>);

impl ServiceMaps for Maps {
    fn set_backend(&mut self, id: u32, value: &BackendValue) -> Result<(), MapError> {
        self.0.backends.insert(id, *value);
        Ok(())
    }
    fn remove_backend(&mut self, id: u32, _: &BackendValue) -> Result<(), MapError> {
        self.0.backends.remove(&id);
        Ok(())
    }
    fn set_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.0.services.insert(*key, *value);
        Ok(())
    }
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        self.0.services.remove(key);
        Ok(())
    }
    fn set_rev_nat(&mut self, id: RevNatId, value: &RevNat) -> Result<(), MapError> {
        self.0.rev_nat.insert(id, *value);
        Ok(())
    }
    fn remove_rev_nat(&mut self, id: RevNatId) -> Result<(), MapError> {
        self.0.rev_nat.remove(&id);
        Ok(())
    }
    fn maglev_size(&self) -> usize {
        251
    }
    fn set_maglev(&mut self, id: u16, table: &[u32]) -> Result<(), MapError> {
        self.0.maglev.insert(id, table.to_vec());
        Ok(())
    }
    fn remove_maglev(&mut self, id: u16) -> Result<(), MapError> {
        self.0.maglev.remove(&id);
        Ok(())
    }
    fn set_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError> {
        self.0.source_ranges.insert((rev_nat, net));
        Ok(())
    }
    fn remove_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError> {
        self.0.source_ranges.remove(&(rev_nat, net));
        Ok(())
    }
    fn set_name(&mut self, rev_nat: RevNatId, name: &ServiceName) -> Result<(), MapError> {
        self.0.names.insert(rev_nat, *name);
        Ok(())
    }
    fn remove_name(&mut self, rev_nat: RevNatId) -> Result<(), MapError> {
        self.0.names.remove(&rev_nat);
        Ok(())
    }
    fn read(&self, map: MapName, each: &mut dyn FnMut(Entry<'_>)) -> Result<(), MapError> {
        self.0.read(map, each);
        Ok(())
    }
    /// `BACKENDS`: the kernel's, sized for the table.
    fn capacity(&self, map: MapName) -> Option<usize> {
        self.1.filter(|_| map == MapName::Backends)
    }
}

/// What each part holds and each moment's peak, bytes.
#[derive(Debug, Default)]
struct Accounting {
    store: usize,
    model: usize,
    reconciler: usize,
    start_peak: usize,
    steady: usize,
    relist_peak: usize,
    /// A restart's, by the end of the read-back of the maps.
    read_back_peak: usize,
    restart_peak: usize,
}

fn settings() -> NodeSettings {
    NodeSettings { node_name: "node-0".into(), ..NodeSettings::default() }
}

fn detail() -> bool {
    std::env::var_os("MEMORY_DETAIL").is_some()
}

/// The bench's cluster of `n` services through a start, a relist (one
/// slice changed) and a restart on the maps.
fn account(n: u32) -> Accounting {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let mut maps = Maps::default();
    let base = live();
    reset_peak();
    // A start: the lists, then the first sync.
    let mut source = Source::default();
    source.list(n, None);
    let mut pipeline = Pipeline::new(settings(), Reconciler::default());
    first_sync("start", &runtime, &mut pipeline, &mut source, &mut maps);
    let (start_peak, steady) = (peak(), live());
    if detail() {
        println!("start: resident {} (the maps {} of it)", rss(), mib(held_by(&mut maps)));
    }
    let maps_held = held_by(&mut maps);
    let (start_peak, steady) = (start_peak - base - maps_held, steady - base - maps_held);

    // A relist after 410 Gone: everything again, one slice changed.
    reset_peak();
    source.list(n, Some(n / 2));
    if detail() {
        println!("relist: the lists' peak {}", mib(peak() - base - maps_held));
    }
    let synced = runtime.block_on(pipeline.step(Wake::Changed, &mut source, &mut maps)).expect("a sync");
    assert!(synced.report.failures.is_empty() && synced.report.writes > 0);
    drop(synced);
    let relist_peak = peak() - base - maps_held;

    // What each part holds: given back by its drop.
    let before = live();
    pipeline.write_through(Reconciler::default());
    let reconciler = before - live();
    let before = live();
    drop(pipeline);
    let model = before - live();
    let before = live();
    drop(source);
    let store = before - live();

    // A restart: the maps read back (beside the lists, in the agent), the
    // lists, the sync of what differs.
    let base = live();
    reset_peak();
    let (reconciler_back, _) = Reconciler::recover(&mut maps).expect("read back");
    let read_back_peak = peak() - base;
    if detail() {
        println!("restart: read back {}", mib(live() - base));
    }
    let mut source = Source::default();
    source.list(n, None);
    let mut pipeline = Pipeline::new(settings(), reconciler_back);
    first_sync("restart", &runtime, &mut pipeline, &mut source, &mut maps);
    let restart_peak = peak() - base;
    Accounting { store, model, reconciler, start_peak, steady, relist_peak, read_back_peak, restart_peak }
}

/// A first sync as the agent makes it: the lists translated, the maps
/// sized for the table (`resize::before_first_write`, the reconciler
/// making room for its backends), the write.
fn first_sync(
    what: &str,
    runtime: &tokio::runtime::Runtime,
    pipeline: &mut Pipeline,
    source: &mut Source,
    maps: &mut Maps,
) {
    let before = live();
    let started = std::time::Instant::now();
    let translated = runtime.block_on(pipeline.translate(Wake::Changed, source, maps)).expect("a sync");
    let translation = started.elapsed();
    let (translation_peak, translated_live) = (peak(), live());
    let (_, demand) = before_first_write_sizes(pipeline, DEFAULT_BOUNDS, DEFAULT_BOUNDS);
    pipeline.reserve_backends(demand.backends);
    // The kernel's array is larger (`sizing`): room for ids past those
    // read back is made but never touched, not resident; here it is
    // counted, so only what `reserve_backends` asks for is offered.
    maps.1 = Some(demand.backends + demand.backends / 8 + 2);
    let sizing_peak = peak();
    let started = std::time::Instant::now();
    let synced = pipeline.write(translated, maps);
    let write = started.elapsed();
    assert!(synced.report.failures.is_empty());
    drop(synced);
    if detail() {
        println!(
            "{what}: before {}, translation's peak {} ({translation:.2?}), translated {}, sizing's peak {}, sync's peak {} ({write:.2?}), after it {}",
            mib(before),
            mib(translation_peak),
            mib(translated_live),
            mib(sizing_peak),
            mib(peak()),
            mib(live())
        );
    }
}

/// Bytes `maps` hold (given back by a drop of their entries, put back).
fn held_by(maps: &mut Maps) -> usize {
    let copy = maps.0.clone();
    let before = live();
    drop(std::mem::take(&mut maps.0));
    let held = before - live();
    maps.0 = copy;
    held
}

fn mib(bytes: usize) -> String {
    #[expect(clippy::cast_precision_loss, reason = "a report")]
    let mib = bytes as f64 / f64::from(1 << 20);
    format!("{mib:.1} MiB")
}

fn report(n: u32, a: &Accounting) {
    let endpoints = usize::try_from(n * ENDPOINTS).expect("fits");
    let per = |bytes: usize| bytes / endpoints;
    println!("{n} services x {ENDPOINTS} endpoints (bytes per endpoint in brackets):");
    for (what, bytes) in [
        ("store", a.store),
        ("model", a.model),
        ("reconciler", a.reconciler),
        ("steady", a.steady),
        ("start peak", a.start_peak),
        ("relist peak", a.relist_peak),
        ("read-back peak", a.read_back_peak),
        ("restart peak", a.restart_peak),
    ] {
        println!("  {what:<15} {:>10} [{}]", mib(bytes), per(bytes));
    }
}

#[test]
#[ignore = "100,000 services: run in release, --ignored --nocapture"]
fn accounting_at_the_bench_size() {
    let n = std::env::var("MEMORY_SERVICES").map_or(100_000, |v| v.parse().expect("MEMORY_SERVICES: a number"));
    report(n, &account(n));
}

/// (Below the count from which a start translates on two threads: the
/// peaks are the same from one run to the next.)
#[test]
fn a_relist_and_a_restart_hold_no_second_copy() {
    let n = 1_500;
    let a = account(n);
    report(n, &a);
    let within = |bytes: usize, of: usize, percent: usize| bytes * 100 <= of * percent;
    // The read-back takes the maps into the reconciler's records, without
    // the maps' entries beside them (three times the records, held whole).
    assert!(within(a.read_back_peak, a.reconciler, 125), "{a:?}");
    // A relist updates the store in place and translates what changed.
    assert!(within(a.relist_peak, a.steady, 103), "{a:?}");
    // A restart: the reconciler read back, the lists and their translation
    // beside it, the first sync: about what the agent holds steadily.
    assert!(within(a.restart_peak, a.steady, 108), "{a:?}");
}
