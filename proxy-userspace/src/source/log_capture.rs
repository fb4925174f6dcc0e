//! Log lines captured by a unit test that checks what the agent logs (how
//! many lines an outage or a file of junk costs), not only what it does.
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

/// The text logged at info and above on this thread while the guard lives.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Starts capturing on this thread (a current-thread runtime's tasks
    /// included), without colours.
    #[must_use]
    pub(crate) fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        let captured = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (captured.clone(), tracing::subscriber::set_default(subscriber))
    }

    #[must_use]
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
    }

    /// Lines so far.
    #[must_use]
    pub(crate) fn lines(&self) -> usize {
        self.text().lines().count()
    }

    /// Lines so far that contain `needle`.
    #[must_use]
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}
