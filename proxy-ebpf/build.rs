//! Rebuild when bpf-linker changes (a new linker can change the object).
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
}
