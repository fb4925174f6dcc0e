//! The services file as a `ChangeSource`: polled for changes, read once it
//! has stopped changing, every read a full snapshot (the pipeline diffs it
//! against what is applied).
use std::{path::PathBuf, time::Duration};

use tracing::error;

use super::{ChangeSource, Delivery, Snapshot, file};

/// How often the file is checked for changes.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A change is read once the file has stayed the same this long, so a file
/// being written is not read half-way.
const SETTLE: Duration = Duration::from_millis(50);

pub struct FileSource {
    path: PathBuf,
    read_once: bool,
    stamp: Option<file::Stamp>,
}

impl FileSource {
    #[must_use]
    pub const fn new(path: PathBuf) -> Self {
        Self { path, read_once: false, stamp: None }
    }
}

impl ChangeSource for FileSource {
    fn name(&self) -> &'static str {
        "file"
    }

    async fn changed(&mut self) {
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            ticker.tick().await;
            let stamp = file::stamp(&self.path);
            if self.read_once && stamp == self.stamp {
                continue;
            }
            tokio::time::sleep(SETTLE).await;
            if file::stamp(&self.path) != stamp {
                continue; // still being written
            }
            self.read_once = true;
            self.stamp = stamp;
            return;
        }
    }

    fn snapshot(&mut self) -> Option<Delivery> {
        let parsed = match file::load(&self.path) {
            Ok(parsed) => parsed,
            Err(err) => {
                error!(%err, "services file not applied");
                return None;
            }
        };
        for err in &parsed.errors {
            error!(document = err.document, object = %err.object, field = %err.field, "rejected object: {}", err.message);
        }
        let mut delivery = Delivery::new(Snapshot::from(parsed.objects));
        delivery.rejected = parsed.errors.len() as u64;
        Some(delivery)
    }

    fn everything(&mut self) -> Option<Delivery> {
        self.snapshot()
    }
}
