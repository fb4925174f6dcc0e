//! The standard `process_*` metrics (as the Prometheus Go client's process
//! collector exports them for kube-proxy), read from /proc at each scrape.
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

/// This process's numbers from /proc.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    pub(crate) cpu_seconds: f64,
    pub(crate) resident_bytes: f64,
    pub(crate) virtual_bytes: f64,
    pub(crate) start_time_seconds: f64,
    pub(crate) open_fds: f64,
    pub(crate) max_fds: f64,
}

/// The fields of `/proc/PID/stat` this needs, in clock ticks and pages:
/// (utime + stime, starttime, vsize in bytes, rss in pages).
fn parse_stat(stat: &str) -> Option<(u64, u64, u64, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // `rest` starts at field 3 (state): field N is fields[N - 3].
    let field = |n: usize| fields.get(n - 3).copied();
    Some((field(14)? + field(15)?, field(22)?, field(23)?, field(24)?))
}

fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

#[expect(clippy::cast_precision_loss, reason = "ticks, pages and fds stay far below 2^52")]
fn as_f64(n: u64) -> f64 {
    n as f64
}

/// Reads this process's numbers (`None`: /proc is not readable).
#[must_use]
pub(crate) fn read() -> Option<ProcessStats> {
    let (cpu_ticks, start_ticks, vsize, rss_pages) = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let boot = boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
    // SAFETY: sysconf only reads a configuration value.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let ticks = as_f64(u64::try_from(ticks).ok().filter(|t| *t > 0)?);
    let page = u64::try_from(page).ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
    Some(ProcessStats {
        cpu_seconds: as_f64(cpu_ticks) / ticks,
        resident_bytes: as_f64(rss_pages * page),
        virtual_bytes: as_f64(vsize),
        start_time_seconds: as_f64(boot) + as_f64(start_ticks) / ticks,
        open_fds: as_f64(open_fds as u64),
        max_fds: as_f64(soft),
    })
}

/// Encodes `read()` at each scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(&self, mut out: DescriptorEncoder) -> std::fmt::Result {
        let Some(p) = read() else { return Ok(()) };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(out.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            MetricType::Counter,
        )?)?;
        for (name, help, value) in [
            ("process_resident_memory_bytes", "Resident memory size in bytes", p.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", p.virtual_bytes),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                p.start_time_seconds,
            ),
            ("process_open_fds", "Number of open file descriptors", p.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors", p.max_fds),
        ] {
            ConstGauge::new(value).encode(out.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_with_a_command_name_holding_spaces() {
        // Fields 1-24 of a real /proc/PID/stat line, the command renamed.
        let stat = "1234 (ebpf proxy) S 1 1234 1234 0 -1 4194560 2000 0 0 0 150 50 0 0 20 0 9 0 4242 123456789 3000 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((200, 4242, 123_456_789, 3000)));
    }

    #[test]
    fn boot_time_line() {
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"), Some(1_700_000_000));
    }

    #[test]
    fn this_process_reads_sensibly() {
        let p = read().expect("/proc is readable");
        assert!(p.open_fds >= 3.0 && p.open_fds <= p.max_fds, "{p:?}");
        assert!(p.resident_bytes > 0.0 && p.virtual_bytes >= p.resident_bytes, "{p:?}");
        assert!(p.start_time_seconds > 1.6e9, "{p:?}");
    }
}
