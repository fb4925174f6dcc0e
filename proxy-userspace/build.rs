//! Builds the eBPF object (proxy-ebpf, for the bpf target, with the nightly
//! toolchain and bpf-linker) into OUT_DIR, where `datapath::loader` embeds it.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../proxy-ebpf");
    let package = Package { name: "proxy-ebpf", root_dir, ..Default::default() };
    aya_build::build_ebpf([package], Toolchain::default())
}
