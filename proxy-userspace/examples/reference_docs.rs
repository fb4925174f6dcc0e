//! Writes docs/reference/ from the code (`cargo xtask docs` runs it).
fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate is in the workspace");
    let changed = ebpf_proxy::reference::write_all(root)?;
    if changed.is_empty() {
        println!("docs/reference/ is current");
    }
    for path in changed {
        println!("wrote {path}");
    }
    Ok(())
}
