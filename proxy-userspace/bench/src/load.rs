//! The client workload, run as its own process inside a client namespace
//! (and, for ebpf-proxy, the agent's cgroup): threads that either open a
//! short connection per request (connect, 32 bytes each way, close) or keep
//! one connection and loop requests on it (32 bytes, or 64 KiB chunks in
//! the bulk mode), against random targets. Prints
//! one JSON line: operations, errors, seconds, latency percentiles.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd as _,
    path::Path,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A new connection per request: connect latency is measured.
    Short,
    /// One kept connection per thread: request latency is measured.
    Keep,
    /// One kept connection per thread, `BULK_CHUNK` bytes sent and echoed
    /// back per operation: throughput (and each chunk's round trip).
    Bulk,
    /// A new connection per request, the whole request timed (connect to
    /// reply): what a client of a slow backend waits (`balance.rs`).
    Request,
}

impl Mode {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Short => "short",
            Self::Keep => "keep",
            Self::Bulk => "bulk",
            Self::Request => "request",
        }
    }
}

/// What one load run did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadResult {
    pub ops: u64,
    pub errors: u64,
    pub seconds: f64,
    /// Connect latency (short) or request latency (keep, bulk),
    /// microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
}

const PAYLOAD: [u8; 32] = [b'x'; 32];
/// The bytes one bulk operation sends (and reads back).
pub const BULK_CHUNK: usize = 64 * 1024;

/// Runs the workload against the addresses listed in `targets` (one
/// `IP:PORT` a line).
pub fn run(targets: &Path, mode: Mode, seconds: f64, threads: usize) -> anyhow::Result<LoadResult> {
    let text = std::fs::read_to_string(targets)?;
    let targets: Vec<SocketAddr> = text.lines().map(str::parse).collect::<Result<_, _>>()?;
    anyhow::ensure!(!targets.is_empty(), "no targets");
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let per_thread: Vec<(u64, u64, Vec<u32>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let targets = &targets;
                scope.spawn(move || match mode {
                    Mode::Short => short(targets, deadline, seed(t), false),
                    Mode::Request => short(targets, deadline, seed(t), true),
                    Mode::Keep => keep(targets, deadline, seed(t), &PAYLOAD),
                    Mode::Bulk => keep(targets, deadline, seed(t), &vec![b'x'; BULK_CHUNK]),
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("load thread")).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut samples: Vec<u32> = per_thread.iter().flat_map(|(_, _, s)| s.iter().copied()).collect();
    samples.sort_unstable();
    let pct = |p: f64| crate::percentile::index(samples.len(), p).map_or(0.0, |i| f64::from(samples[i]));
    Ok(LoadResult {
        ops: per_thread.iter().map(|(ops, _, _)| ops).sum(),
        errors: per_thread.iter().map(|(_, e, _)| e).sum(),
        seconds: elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    })
}

fn seed(thread: usize) -> u64 {
    0x9e37_79b9_7f4a_7c15 ^ (thread as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ u64::from(std::process::id())
}

/// xorshift64*: a cheap per-thread random target.
fn next(state: &mut u64, len: usize) -> usize {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    #[expect(clippy::cast_possible_truncation, reason = "a modulo of the target count")]
    let n = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % len as u64) as usize;
    n
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// One request on `stream`: `payload` out, as many bytes back into
/// `reply` (of its length).
fn request(stream: &mut TcpStream, payload: &[u8], reply: &mut [u8]) -> std::io::Result<()> {
    stream.write_all(payload)?;
    stream.read_exact(reply)
}

/// Closes with a reset (SO_LINGER 0), so a short-connection client leaves
/// no TIME_WAIT behind to run out of ports.
fn close_now(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a socket this function owns, with a valid
    // struct of the size passed.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast(),
            u32::try_from(size_of::<libc::linger>()).expect("small"),
        );
    }
}

/// A new connection per request; `whole`: the sample is the whole request,
/// else the connect alone.
fn short(targets: &[SocketAddr], deadline: Instant, mut rng: u64, whole: bool) -> (u64, u64, Vec<u32>) {
    let (mut ops, mut errors, mut samples) = (0, 0, Vec::with_capacity(1 << 16));
    while Instant::now() < deadline {
        let target = targets[next(&mut rng, targets.len())];
        let t0 = Instant::now();
        let Ok(mut stream) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
            errors += 1;
            continue;
        };
        if !whole {
            samples.push(micros(t0.elapsed()));
        }
        // A queue at a slow backend can hold a request for long.
        let _ = stream.set_read_timeout(Some(Duration::from_secs(if whole { 10 } else { 1 })));
        let _ = stream.set_nodelay(true);
        if request(&mut stream, &PAYLOAD, &mut [0u8; PAYLOAD.len()]).is_ok() {
            if whole {
                samples.push(micros(t0.elapsed()));
            }
            ops += 1;
        } else {
            errors += 1;
        }
        close_now(&stream);
    }
    (ops, errors, samples)
}

/// Requests of `payload` on one kept connection (a new one after an error).
fn keep(targets: &[SocketAddr], deadline: Instant, mut rng: u64, payload: &[u8]) -> (u64, u64, Vec<u32>) {
    let (mut ops, mut errors, mut samples) = (0, 0, Vec::with_capacity(1 << 16));
    let mut stream: Option<TcpStream> = None;
    let mut reply = vec![0u8; payload.len()];
    while Instant::now() < deadline {
        let Some(s) = stream.as_mut() else {
            let target = targets[next(&mut rng, targets.len())];
            match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                Ok(s) => {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    let _ = s.set_nodelay(true);
                    stream = Some(s);
                }
                Err(_) => errors += 1,
            }
            continue;
        };
        let t0 = Instant::now();
        if request(s, payload, &mut reply).is_ok() {
            samples.push(micros(t0.elapsed()));
            ops += 1;
        } else {
            errors += 1;
            stream = None;
        }
    }
    (ops, errors, samples)
}
