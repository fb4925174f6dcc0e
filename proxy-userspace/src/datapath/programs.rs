//! The programs of a datapath, loaded into the kernel on a thread of their
//! own while the agent goes on with the maps.
//!
//! The verifier takes a noticeable part of a start for the whole object,
//! and a start would do it once more when it moves to maps sized for the
//! cluster (`crate::agent::resize`). The programs are needed only to attach
//! them, after the first write: so the load runs beside that write (and,
//! after a restart, beside the read of the pinned maps) instead of before
//! it. A failure is logged when it happens and returned where the programs
//! are first needed (`Programs::loaded`). See docs/design.md, "Restarts
//! and upgrades".
//!
//! The socket programs load first and are handed over by their fds
//! (`Programs::sockets`) while the per-packet (TC) programs, most of the
//! verifier's work, go on loading: the pods' connections are served once
//! the maps are written, without waiting for the verification of programs
//! that serve other traffic (`Programs::finished` says when those can be
//! attached).
use std::{
    os::fd::{AsFd as _, OwnedFd},
    sync::mpsc,
    thread::JoinHandle,
};

use aya::{
    Ebpf,
    maps::ProgramArray,
    programs::{CgroupSock, CgroupSockAddr, SchedClassifier, Xdp},
};
use proxy_common::{map_names, tail_call};

use super::{
    acceleration::Acceleration,
    loader::{
        DSR_TO_SNAT_PROGRAM, LoadError, POD_PROGRAMS, SOCK_PROGRAMS, SOCK_RELEASE_PROGRAM, TC_PROGRAMS, XDP_PROGRAM,
        program,
    },
};

/// A socket program, loaded: a duplicate of its fd and where it attaches,
/// which is all a cgroup link needs (`super::links::attach_cgroup`).
pub(crate) struct SocketProgram {
    pub(crate) name: &'static str,
    pub(crate) fd: OwnedFd,
    /// `enum bpf_attach_type`.
    pub(crate) attach_type: u32,
}

/// Where each socket program attaches, as its ELF section
/// (`cgroup/connect4`, ...) says to aya, which keeps it to itself: named
/// by aya-obj's bindings of `enum bpf_attach_type` (linux/bpf.h).
fn attach_type(name: &str) -> Option<u32> {
    use aya_obj::generated::bpf_attach_type::{
        BPF_CGROUP_INET_SOCK_RELEASE, BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_INET4_GETPEERNAME, BPF_CGROUP_INET6_CONNECT,
        BPF_CGROUP_INET6_GETPEERNAME, BPF_CGROUP_UDP4_RECVMSG, BPF_CGROUP_UDP4_SENDMSG, BPF_CGROUP_UDP6_RECVMSG,
        BPF_CGROUP_UDP6_SENDMSG,
    };
    let attach_type = match name {
        "connect4" => BPF_CGROUP_INET4_CONNECT,
        "connect6" => BPF_CGROUP_INET6_CONNECT,
        "sendmsg4" => BPF_CGROUP_UDP4_SENDMSG,
        "sendmsg6" => BPF_CGROUP_UDP6_SENDMSG,
        "recvmsg4" => BPF_CGROUP_UDP4_RECVMSG,
        "recvmsg6" => BPF_CGROUP_UDP6_RECVMSG,
        "getpeername4" => BPF_CGROUP_INET4_GETPEERNAME,
        "getpeername6" => BPF_CGROUP_INET6_GETPEERNAME,
        SOCK_RELEASE_PROGRAM => BPF_CGROUP_INET_SOCK_RELEASE,
        _ => return None,
    };
    Some(attach_type as u32)
}

/// The object's programs, loaded into the kernel.
pub(crate) struct Loaded {
    /// Owns the programs (and the maps not taken out of it).
    pub(crate) ebpf: Ebpf,
    /// The socket programs (`Programs::sockets`), as the load sent them.
    sockets: Vec<SocketProgram>,
    /// Whether the TC programs loaded (traffic from outside can be served).
    pub(crate) tc: bool,
    /// Whether the XDP program loaded (`--nodeport-acceleration`).
    pub(crate) xdp: bool,
    /// Whether the programs `nodeport_ingress` tail-calls were loaded (or
    /// failed to, which was logged): `set_tail_calls`.
    tail_calls_done: bool,
}

impl Loaded {
    /// Loads the programs `nodeport_ingress` hands packets to by tail call
    /// and puts them in `TAIL_CALLS`, once: when the TC programs are first
    /// attached to a device (`Datapath::attach_devices`), not with the
    /// others. They serve one rare case (a DSR flow's UDP datagram too long
    /// for the route), and their verification would take CPU from the
    /// start's lists and first write, on which every service waits. Until
    /// then (and if they fail to load) such a datagram is dropped and
    /// counted (`dsr_too_big`); after a restart, the previous agent's
    /// programs stay in the pinned array meanwhile.
    pub(crate) fn set_tail_calls(&mut self) {
        if !self.tc || self.tail_calls_done {
            return;
        }
        self.tail_calls_done = true;
        let started = std::time::Instant::now();
        match load_tail_calls(&mut self.ebpf) {
            Ok(()) => tracing::info!(
                ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "tail-called programs loaded"
            ),
            Err(err) => tracing::warn!(
                %err,
                "a UDP datagram of a DSR flow too long for the route with the DSR option or outer header is dropped (dsr_too_big), not sent by source NAT"
            ),
        }
    }
}

/// A datapath's programs, from the object to the loaded programs.
pub(crate) enum Programs {
    /// The object with its maps taken out, until `start`.
    Waiting(Box<Ebpf>, Acceleration),
    Loading(Loading),
    Loaded(Loaded),
    /// The load failed, and its error was returned once.
    Failed,
}

impl Programs {
    /// The programs of `ebpf` (its maps made), to load when `start` (or
    /// `loaded`) is called.
    pub(crate) fn new(ebpf: Ebpf, acceleration: Acceleration) -> Self {
        Self::Waiting(Box::new(ebpf), acceleration)
    }

    /// Starts loading the programs on a thread (once).
    pub(crate) fn start(&mut self) -> Result<(), LoadError> {
        self.start_with(false)
    }

    /// Starts loading the programs on a thread (once), the TC programs
    /// only when `release_tc` says (or the loaded programs are asked for):
    /// after a restart, whose previous agent's TC programs go on serving
    /// meanwhile, their verification would otherwise take a core from the
    /// lists and the read-back that the first sync waits for.
    pub(crate) fn start_holding_tc(&mut self) -> Result<(), LoadError> {
        self.start_with(true)
    }

    fn start_with(&mut self, hold_tc: bool) -> Result<(), LoadError> {
        if !matches!(self, Self::Waiting(..)) {
            return Ok(());
        }
        let Self::Waiting(ebpf, acceleration) = std::mem::replace(self, Self::Failed) else { unreachable!() };
        let (sockets_tx, sockets) = mpsc::sync_channel(1);
        let (done_tx, done) = tokio::sync::watch::channel(false);
        // A send releases the thread; the sender dropped unsent abandons
        // the TC programs (the datapath went before its first attach).
        let (release, hold) = hold_tc.then(|| mpsc::sync_channel::<()>(1)).unzip();
        let handle = std::thread::Builder::new()
            .name("load-programs".into())
            .spawn(move || {
                let loaded = load(*ebpf, acceleration, &sockets_tx, hold);
                if let Err(err) = &loaded {
                    tracing::error!(%err, "cannot load the programs");
                }
                // Also when nobody waits any more.
                let _ = done_tx.send(true);
                loaded
            })
            .map_err(|source| LoadError::Thread { source })?;
        *self = Self::Loading(Loading { handle: Some(handle), sockets, received: None, done, release });
        Ok(())
    }

    /// Lets a load held by `start_holding_tc` go on with the TC programs.
    pub(crate) fn release_tc(&mut self) {
        if let Self::Loading(loading) = self
            && let Some(release) = loading.release.take()
        {
            // The thread waits for it (or has ended: nothing to do).
            let _ = release.send(());
        }
    }

    /// The socket programs, loaded (starting the load when nothing did):
    /// waits for them alone, not for the TC programs still loading; the
    /// load's error when it failed before them.
    pub(crate) fn sockets(&mut self) -> Result<&[SocketProgram], LoadError> {
        self.start()?;
        if let Self::Loading(loading) = self
            && loading.received.is_none()
            && let Ok(sockets) = loading.sockets.recv()
        {
            loading.received = Some(sockets);
        }
        match self {
            Self::Loading(Loading { received: Some(sockets), .. }) => Ok(sockets),
            // The load ended without them: its error (or they are in
            // the loaded programs).
            _ => Ok(&self.loaded()?.sockets),
        }
    }

    /// Ends when the load does (at once when it is not running), for an
    /// event loop to wait on without polling.
    pub(crate) fn done(&self) -> impl std::future::Future<Output = ()> + use<> {
        let done = match self {
            Self::Loading(loading) => Some(loading.done.clone()),
            _ => None,
        };
        async move {
            if let Some(mut done) = done {
                // An error: the thread ended without a word (a panic, which
                // `loaded` passes on).
                let _ = done.wait_for(|done| *done).await;
            }
        }
    }

    /// Whether the load is over (loaded or failed), without waiting: the
    /// TC programs can then be attached at once (`loaded`).
    pub(crate) fn finished(&self) -> bool {
        match self {
            Self::Waiting(..) => false,
            Self::Loading(loading) => loading.handle.as_ref().is_none_or(JoinHandle::is_finished),
            Self::Loaded(_) | Self::Failed => true,
        }
    }

    /// The loaded programs, waiting for the load to finish; its error the
    /// first time (`LoadError::ProgramsFailed` after that).
    pub(crate) fn loaded(&mut self) -> Result<&mut Loaded, LoadError> {
        self.start()?;
        self.release_tc();
        if matches!(self, Self::Loading(_)) {
            let Self::Loading(loading) = std::mem::replace(self, Self::Failed) else { unreachable!() };
            *self = Self::Loaded(loading.join()?);
        }
        match self {
            Self::Loaded(loaded) => Ok(loaded),
            _ => Err(LoadError::ProgramsFailed),
        }
    }

    /// The programs when their load has been waited for (`loaded`).
    pub(crate) const fn get(&self) -> Option<&Loaded> {
        match self {
            Self::Loaded(loaded) => Some(loaded),
            _ => None,
        }
    }
}

/// A load running on its thread. Dropped before it is joined (a datapath
/// dropped while its programs load: a start that moves to bigger maps
/// before its first write), it waits for the load, so that no program
/// outlives it unseen (a test's cleanup, `cleanup` after a stop).
pub(crate) struct Loading {
    handle: Option<JoinHandle<Result<Loaded, LoadError>>>,
    /// The socket programs, sent as soon as they are loaded.
    sockets: mpsc::Receiver<Vec<SocketProgram>>,
    received: Option<Vec<SocketProgram>>,
    /// Set when the load ends (`Programs::done`).
    done: tokio::sync::watch::Receiver<bool>,
    /// Holds the TC programs' load until a send (`Programs::release_tc`);
    /// dropped unsent, they are not loaded.
    release: Option<mpsc::SyncSender<()>>,
}

impl Loading {
    /// The loaded programs, with the socket programs the load sent.
    fn join(mut self) -> Result<Loaded, LoadError> {
        let handle = self.handle.take().expect("joined once");
        let mut loaded = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        loaded.sockets = self.received.take().or_else(|| self.sockets.try_recv().ok()).unwrap_or_default();
        Ok(loaded)
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        // A load still held stops before the TC programs: nothing would
        // attach them (a stop, or a move to other maps, before the first
        // attach), and the verifier's seconds would only delay the end.
        self.release.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Loads the socket programs (a failure is an error) and sends them on
/// `sockets`, then (once `hold`, if any, is released; not at all when it
/// is abandoned) the TC programs (a failure leaves traffic from outside
/// unserved, with an error logged) and the XDP program when
/// `acceleration` wants it.
fn load(
    mut ebpf: Ebpf,
    acceleration: Acceleration,
    sockets_tx: &mpsc::SyncSender<Vec<SocketProgram>>,
    hold: Option<mpsc::Receiver<()>>,
) -> Result<Loaded, LoadError> {
    let started = std::time::Instant::now();
    for name in SOCK_PROGRAMS {
        let program: &mut CgroupSockAddr = program(&mut ebpf, name)?;
        program.load().map_err(|source| LoadError::Program { name, source })?;
    }
    let release: &mut CgroupSock = program(&mut ebpf, SOCK_RELEASE_PROGRAM)?;
    release.load().map_err(|source| LoadError::Program { name: SOCK_RELEASE_PROGRAM, source })?;
    // The receiver may be gone (a datapath dropped while it loads); they
    // reach `Loaded` through it (`Loading::join`).
    let _ = sockets_tx.send(socket_programs(&ebpf)?);
    let mut waited = std::time::Duration::ZERO;
    if let Some(hold) = hold {
        let at = std::time::Instant::now();
        if hold.recv().is_err() {
            tracing::debug!("the TC programs' load was abandoned before the first attach");
            return Ok(Loaded { ebpf, sockets: Vec::new(), tc: false, xdp: false, tail_calls_done: false });
        }
        waited = at.elapsed();
    }
    // Without the TC programs (an old kernel, a verifier that rejects
    // them) clients on the node are still served: say so and go on.
    let mut tc_loaded = true;
    for (name, _) in TC_PROGRAMS.iter().chain(POD_PROGRAMS) {
        let loaded = program::<SchedClassifier>(&mut ebpf, name)
            .and_then(|p| p.load().map_err(|source| LoadError::Program { name, source }));
        if let Err(err) = loaded {
            tracing::error!(%err, "traffic from outside the node (NodePorts, LoadBalancer IPs, externalIPs) and the pods' traffic on pod-facing devices are not served: the TC programs cannot be loaded; sockets the socket programs translate are still served");
            tc_loaded = false;
            break;
        }
    }
    let xdp_loaded = tc_loaded && acceleration.wants_xdp() && load_xdp(&mut ebpf, acceleration)?;
    // Most of it is the verifier's (docs/performance.md, "The verifier's
    // work at each start").
    tracing::info!(
        tc = tc_loaded,
        xdp = xdp_loaded,
        ms = u64::try_from(started.elapsed().saturating_sub(waited).as_millis()).unwrap_or(u64::MAX),
        held_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        "programs loaded"
    );
    Ok(Loaded { ebpf, sockets: Vec::new(), tc: tc_loaded, xdp: xdp_loaded, tail_calls_done: false })
}

/// The loaded socket programs of `ebpf`, by duplicates of their fds.
fn socket_programs(ebpf: &Ebpf) -> Result<Vec<SocketProgram>, LoadError> {
    let mut out = Vec::new();
    for &name in SOCK_PROGRAMS.iter().chain(&[SOCK_RELEASE_PROGRAM]) {
        let program = ebpf.program(name).ok_or(LoadError::MissingProgram { name })?;
        let fd = program
            .fd()
            .map_err(|source| LoadError::Program { name, source })?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| LoadError::ProgramFd { name, source })?;
        let attach_type = attach_type(name).ok_or(LoadError::MissingProgram { name })?;
        out.push(SocketProgram { name, fd, attach_type });
    }
    Ok(out)
}

/// Loads the programs `nodeport_ingress` hands packets to by tail call and
/// puts them in `TAIL_CALLS` (pinned: on a restart the new programs take
/// the old ones' places, which the attached programs call meanwhile).
fn load_tail_calls(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let (name, map) = (DSR_TO_SNAT_PROGRAM, map_names::TAIL_CALLS);
    // Taken out: the program below borrows the object. Its pin keeps it.
    let tail_calls = ebpf.take_map(map).ok_or(LoadError::MissingMap { name: map })?;
    let mut tail_calls =
        ProgramArray::try_from(tail_calls).map_err(|source| LoadError::TailCall { name, map, source })?;
    let program: &mut SchedClassifier = program(ebpf, name)?;
    program.load().map_err(|source| LoadError::Program { name, source })?;
    let fd = program.fd().map_err(|source| LoadError::Program { name, source })?;
    tail_calls.set(tail_call::DSR_TO_SNAT, fd, 0).map_err(|source| LoadError::TailCall { name, map, source })
}

/// Loads the XDP program; whether it loaded. A failure is an error for
/// `native`, a warning (the TC programs alone) for `best-effort`.
fn load_xdp(ebpf: &mut Ebpf, acceleration: Acceleration) -> Result<bool, LoadError> {
    let program: &mut Xdp = program(ebpf, XDP_PROGRAM)?;
    match program.load() {
        Ok(()) => Ok(true),
        Err(source) if acceleration == Acceleration::Native => Err(LoadError::XdpLoad { source }),
        Err(err) => {
            tracing::warn!(%err, "--nodeport-acceleration=best-effort: the XDP program cannot be loaded; the TC programs alone serve traffic from outside");
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SOCK_PROGRAMS, SOCK_RELEASE_PROGRAM, attach_type};

    /// Every socket program has its attach type, each its own.
    #[test]
    fn every_socket_program_has_an_attach_type() {
        let types: Vec<u32> =
            SOCK_PROGRAMS.iter().chain(&[SOCK_RELEASE_PROGRAM]).map(|n| attach_type(n).expect("attach type")).collect();
        let mut distinct = types.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), types.len());
    }
}
