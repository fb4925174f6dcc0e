//! What the subcommands print, on stdout. A reader that closed the pipe
//! (`ebpf-proxy service list | head -1`) has what it wanted: that is no
//! error and no panic, as for any Unix tool.
use std::io::{self, Write as _};

/// Writes `text` to stdout; a closed pipe is not an error.
pub(crate) fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result,
    }
}

/// `print` with a newline after `args`.
pub(crate) fn line(args: std::fmt::Arguments<'_>) -> io::Result<()> {
    print(&format!("{args}\n"))
}
