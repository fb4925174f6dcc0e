//! Builds the eBPF object (proxy-ebpf, for the bpf target, with the nightly
//! toolchain and bpf-linker) into OUT_DIR, where `datapath::loader` embeds it.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // aya-build passes every line the inner cargo prints on as a
    // `cargo:warning`, so its "Compiling ..." progress would show as dozens
    // of warnings on each fresh build. Quiet, it prints only what matters:
    // compiler diagnostics and errors still come through.
    // SAFETY: the build script is single-threaded here; nothing else reads
    // the environment concurrently.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../proxy-ebpf");
    let package = Package { name: "proxy-ebpf", root_dir, ..Default::default() };
    aya_build::build_ebpf([package], Toolchain::default())
}
