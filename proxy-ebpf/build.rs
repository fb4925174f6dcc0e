//! Rebuild when bpf-linker changes (a new linker can change the object),
//! and keep the programs' global functions global through the link.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
    // bpf-linker makes every function it is not told to export static, and
    // the verifier walks a static function again at every call site; a
    // global one it checks once (`frame::tc_rewrite_port`). Only the BPF
    // link: the host's build of this crate (clippy, tests) links no object.
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("bpf") {
        for function in GLOBAL_FUNCTIONS {
            println!("cargo:rustc-link-arg=--export={function}");
        }
    }
}

/// The eBPF crate's `#[unsafe(no_mangle)] extern "C"` functions that are
/// not programs.
const GLOBAL_FUNCTIONS: &[&str] = &["tc_rewrite_port"];
