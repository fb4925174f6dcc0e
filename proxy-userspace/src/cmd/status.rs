//! `ebpf-proxy status`: the datapath left in the kernel, from the pins
//! (the agent need not be running), as text or JSON (`-o json`).
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use serde::Serialize;

use crate::{
    args::{OutputFormat, StatusArgs},
    datapath::{KernelMaps, counters::ExternalStats, handover::HandoverMap, links, links::LinkTarget, socket_lb_pins},
    paths::LINKS_SUBDIR,
    reconcile::{ServiceMaps as _, inspect},
};

/// What `status` shows; the text is made from it, so both say the same.
#[derive(Debug, Serialize)]
pub(crate) struct Status {
    pub(crate) pin_directory: PathBuf,
    /// False: nothing is pinned there (no datapath).
    pub(crate) pinned: bool,
    /// The pinned links, by name; none: translation is off.
    pub(crate) programs: Vec<Program>,
    /// Which path the pods' traffic to services takes; none without
    /// attached programs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) paths: Option<Paths>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) maps: Option<Maps>,
}

/// Where clients' connections to services are translated: at the socket
/// (`--socket-lb`, as the attached programs run it) or per packet on the
/// pod-facing devices.
#[derive(Debug, Serialize)]
pub(crate) struct Paths {
    /// `all` or `host-namespace`; none when it cannot be read (`error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) socket_lb: Option<&'static str>,
    /// `host-namespace`: the cookie of the one network namespace whose
    /// sockets are translated (the node's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) socket_lb_netns_cookie: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) socket_lb_error: Option<String>,
    /// The pod-facing devices, where packets no translated socket sent are
    /// translated.
    pub(crate) pod_devices: Vec<String>,
}

impl Paths {
    fn read(pin_dir: &Path) -> Self {
        let pod_devices = socket_lb_pins::pod_devices(pin_dir);
        let mut paths = Self { socket_lb: None, socket_lb_netns_cookie: None, socket_lb_error: None, pod_devices };
        match socket_lb_pins::read(pin_dir) {
            Ok(seen) => {
                paths.socket_lb = Some(seen.mode().as_str());
                if let socket_lb_pins::Seen::HostNamespace { netns_cookie } = seen {
                    paths.socket_lb_netns_cookie = Some(netns_cookie);
                }
            }
            Err(err) => paths.socket_lb_error = Some(err.to_string()),
        }
        paths
    }

    fn text(&self, out: &mut String) {
        let sockets = match (self.socket_lb, self.socket_lb_netns_cookie) {
            (Some("all"), _) => "every socket in the cgroup (--socket-lb all)".to_owned(),
            (Some(_), Some(cookie)) => format!(
                "only sockets of the node's network namespace (cookie {cookie}, --socket-lb host-namespace); pods' sockets keep the service address"
            ),
            _ => format!("unknown: {}", self.socket_lb_error.as_deref().unwrap_or("?")),
        };
        let _ = writeln!(out, "translated at the socket: {sockets}");
        let devices = if self.pod_devices.is_empty() { "none".to_owned() } else { self.pod_devices.join(" ") };
        let _ = writeln!(out, "translated per packet (pod-facing devices): {devices}");
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Program {
    /// The link's pin name (the program's, or `tc-DEVICE-DIRECTION`).
    pub(crate) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) link_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[allow(clippy::struct_field_names, reason = "the field's name is the JSON field `status` prints")]
    pub(crate) program_id: Option<u32>,
    /// `cgroup id N`, `device DEV ingress|egress` or `link type N`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    /// Why the link could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Maps {
    pub(crate) frontends: usize,
    pub(crate) frontends_without_backends: usize,
    pub(crate) backend_slots: usize,
    /// Entries in the services map (slot 0 of each frontend and its slots
    /// entries, four backend slots to one) and the most it holds now (it
    /// grows with the table).
    pub(crate) services_map_entries: usize,
    pub(crate) services_map_size: u32,
    /// Entries in the backends map and the most it holds now.
    pub(crate) backends_map_entries: usize,
    pub(crate) backends_map_size: u32,
    pub(crate) maglev_tables: usize,
    pub(crate) maglev_table_size: usize,
    pub(crate) source_ranges: usize,
    /// What the TC programs did with traffic from outside, by counter name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) external_traffic: Option<BTreeMap<&'static str, u64>>,
    /// Why the counters could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) external_traffic_error: Option<String>,
    /// How traffic from outside is shared with netfilter (taking over from
    /// kube-proxy, `--outside-handover`): `off`, `defer`, `handover`,
    /// `handover, ends in N s`; why it cannot be read, or `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) outside_handover: Option<String>,
}

/// The name of device `ifindex` in this network namespace, or `#N`.
fn device_name(ifindex: u32) -> String {
    nix::net::if_::if_indextoname(ifindex).map_or_else(|_| format!("#{ifindex}"), |n| n.to_string_lossy().into_owned())
}

/// Runs `ebpf-proxy status`: prints the attached programs and the maps.
pub fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let status = read(&args.pin.bpffs_dir)?;
    match args.output {
        OutputFormat::Table => super::output::print(&text(&status))?,
        OutputFormat::Json => super::output::line(format_args!("{}", serde_json::to_string_pretty(&status)?))?,
    }
    Ok(())
}

/// Reads the status of the datapath pinned in `dir`.
pub(crate) fn read(dir: &Path) -> anyhow::Result<Status> {
    let mut status =
        Status { pin_directory: dir.to_owned(), pinned: dir.exists(), programs: Vec::new(), paths: None, maps: None };
    if !status.pinned {
        return Ok(status);
    }
    let mut names: Vec<_> = std::fs::read_dir(dir.join(LINKS_SUBDIR))
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    for name in names {
        let program = match links::pinned_link_info(&dir.join(LINKS_SUBDIR).join(&name)) {
            Ok(i) => Program {
                name,
                link_id: Some(i.link_id),
                program_id: Some(i.program_id),
                target: Some(match i.target {
                    LinkTarget::Cgroup(id) => format!("cgroup id {id}"),
                    LinkTarget::Tc { ifindex, ingress } => {
                        format!("device {} {}", device_name(ifindex), if ingress { "ingress" } else { "egress" })
                    }
                    LinkTarget::Xdp { ifindex } => format!("device {} xdp", device_name(ifindex)),
                    LinkTarget::Other { link_type } => format!("link type {link_type}"),
                }),
                error: None,
            },
            Err(err) => Program { name, link_id: None, program_id: None, target: None, error: Some(err.to_string()) },
        };
        status.programs.push(program);
    }
    if !status.programs.is_empty() {
        status.paths = Some(Paths::read(dir));
    }
    let maps_dir = crate::paths::current_maps_dir(dir).context("no pinned maps")?;
    let maps = KernelMaps::open_pinned(&maps_dir).context("reading the pinned maps")?;
    let dump = maps.dump()?;
    let (services_map_size, backends_map_size) = maps.sizes()?;
    let frontends = inspect::frontends(&dump);
    let (external_traffic, external_traffic_error) =
        match ExternalStats::open_pinned(&maps_dir.join(proxy_common::map_names::EXTERNAL_STATS))
            .map_err(|e| e.to_string())
            .and_then(|s| s.read().map_err(|e| e.to_string()))
        {
            Ok(counters) => (Some(counters.into_iter().collect()), None),
            Err(err) => (None, Some(err)),
        };
    let outside_handover = match HandoverMap::open_pinned(&maps_dir.join(proxy_common::map_names::OUTSIDE_HANDOVER))
        .and_then(|m| m.get())
    {
        Ok(Some(mode)) => mode.to_string(),
        Ok(None) => "unknown".to_owned(),
        Err(err) => format!("unreadable: {err}"),
    };
    status.maps = Some(Maps {
        frontends: frontends.len(),
        frontends_without_backends: frontends.iter().filter(|f| f.backends.is_empty()).count(),
        backend_slots: frontends.iter().map(|f| f.backends.len()).sum(),
        services_map_entries: dump.services.len(),
        services_map_size,
        backends_map_entries: dump.backends.len(),
        backends_map_size,
        maglev_tables: dump.maglev.len(),
        maglev_table_size: maps.maglev_size(),
        source_ranges: dump.source_ranges.len(),
        external_traffic,
        external_traffic_error,
        outside_handover: Some(outside_handover),
    });
    Ok(status)
}

/// The status as text.
#[must_use]
pub(crate) fn text(status: &Status) -> String {
    let mut out = String::new();
    if !status.pinned {
        let _ = writeln!(out, "no datapath: nothing is pinned in {}", status.pin_directory.display());
        return out;
    }
    let _ = writeln!(out, "pin directory: {}", status.pin_directory.display());
    let _ = writeln!(out, "programs (attached through pinned links):");
    if status.programs.is_empty() {
        let _ = writeln!(out, "  none: translation is off");
    }
    for p in &status.programs {
        let _ = match (&p.error, p.link_id, p.program_id, &p.target) {
            (None, Some(link), Some(program), Some(target)) => {
                writeln!(out, "  {:<24} link {link:<6} program {program:<6} {target}", p.name)
            }
            (error, ..) => writeln!(out, "  {:<24} unreadable: {}", p.name, error.as_deref().unwrap_or("?")),
        };
    }
    if let Some(paths) = &status.paths {
        paths.text(&mut out);
    }
    if let Some(m) = &status.maps {
        let _ = writeln!(
            out,
            "frontends: {} ({} without backends), backend slots: {}",
            m.frontends, m.frontends_without_backends, m.backend_slots
        );
        let _ = writeln!(
            out,
            "map SERVICES: {} of {} entries, map BACKENDS: {} of {} entries",
            m.services_map_entries, m.services_map_size, m.backends_map_entries, m.backends_map_size
        );
        let _ = writeln!(
            out,
            "Maglev tables: {} of {} entries, source ranges: {}",
            m.maglev_tables, m.maglev_table_size, m.source_ranges
        );
        match (&m.external_traffic, &m.external_traffic_error) {
            (Some(counters), _) => {
                let text: Vec<String> = proxy_common::external_stat::NAMES
                    .iter()
                    .filter_map(|name| Some(format!("{name}={}", counters.get(name)?)))
                    .collect();
                let _ = writeln!(out, "traffic from outside: {}", text.join(" "));
            }
            (None, error) => {
                let _ = writeln!(out, "traffic from outside: unreadable: {}", error.as_deref().unwrap_or("?"));
            }
        }
        if let Some(mode) = &m.outside_handover {
            let _ = writeln!(out, "outside handover: {mode}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Maps, Paths, Program, Status, text};

    fn status() -> Status {
        Status {
            pin_directory: "/sys/fs/bpf/ebpf-proxy".into(),
            pinned: true,
            programs: vec![
                Program {
                    name: "connect4".into(),
                    link_id: Some(7),
                    program_id: Some(42),
                    target: Some("cgroup id 1".into()),
                    error: None,
                },
                Program { name: "tc-eth0-ingress".into(), error: Some("gone".into()), ..none() },
            ],
            paths: Some(Paths {
                socket_lb: Some("host-namespace"),
                socket_lb_netns_cookie: Some(4096),
                socket_lb_error: None,
                pod_devices: vec!["cni0".into(), "veth1".into()],
            }),
            maps: Some(Maps {
                frontends: 3,
                frontends_without_backends: 1,
                backend_slots: 4,
                services_map_entries: 7,
                services_map_size: 4096,
                backends_map_entries: 3,
                backends_map_size: 8192,
                maglev_tables: 1,
                maglev_table_size: 16_381,
                source_ranges: 0,
                external_traffic: Some([("new_flow", 5), ("no_backend", 1)].into_iter().collect()),
                external_traffic_error: None,
                outside_handover: Some("defer".into()),
            }),
        }
    }

    fn none() -> Program {
        Program { name: String::new(), link_id: None, program_id: None, target: None, error: None }
    }

    #[test]
    fn text_and_json_say_the_same() {
        let s = status();
        assert_eq!(
            text(&s),
            "\
pin directory: /sys/fs/bpf/ebpf-proxy
programs (attached through pinned links):
  connect4                 link 7      program 42     cgroup id 1
  tc-eth0-ingress          unreadable: gone
translated at the socket: only sockets of the node's network namespace (cookie 4096, --socket-lb host-namespace); pods' sockets keep the service address
translated per packet (pod-facing devices): cni0 veth1
frontends: 3 (1 without backends), backend slots: 4
map SERVICES: 7 of 4096 entries, map BACKENDS: 3 of 8192 entries
Maglev tables: 1 of 16381 entries, source ranges: 0
traffic from outside: new_flow=5 no_backend=1
outside handover: defer
"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["programs"][0]["program_id"], 42);
        assert_eq!(json["programs"][1]["error"], "gone");
        assert_eq!(json["maps"]["frontends_without_backends"], 1);
        assert_eq!(json["maps"]["external_traffic"]["new_flow"], 5);
        assert_eq!(json["maps"]["outside_handover"], "defer");
        assert_eq!(json["paths"]["socket_lb"], "host-namespace");
        assert_eq!(json["paths"]["socket_lb_netns_cookie"], 4096);
        assert_eq!(json["paths"]["pod_devices"][1], "veth1");
    }

    #[test]
    fn nothing_pinned_says_so() {
        let s = Status { pin_directory: "/x".into(), pinned: false, programs: Vec::new(), paths: None, maps: None };
        assert_eq!(text(&s), "no datapath: nothing is pinned in /x\n");
        assert_eq!(serde_json::to_value(&s).unwrap()["pinned"], false);
    }
}
