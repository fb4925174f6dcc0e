//! The services file as a `ChangeSource`: polled for changes, read once it
//! has stopped changing, every read a full snapshot (the pipeline diffs it
//! against what is applied).
//!
//! A file caught mid-write never costs a service: a read during which the
//! file changed is thrown away and read again, a file that is not YAML
//! keeps the last good content, so does a file none of whose objects is
//! usable (garbage that parses as YAML, only other kinds), and a file that
//! holds nothing (`: > F`
//! before the new content is written, as `kubectl get -o yaml > F` does) is
//! applied only when it is still empty after `EMPTY_SETTLE`.
use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::{debug, error, info, warn};

use super::{
    ChangeSource, Delivery, Snapshot,
    change_source::ServiceInputs,
    file::{self, Rejection},
};
use crate::model::ServiceId;

/// How often the file is checked for changes.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A change is read once the file has stayed the same this long, so a file
/// being written is not read half-way.
const SETTLE: Duration = Duration::from_millis(50);
/// A file read empty is applied (every service removed) only if it is still
/// empty this long after: a writer that truncates and then writes has
/// written by then. docs/operations.md says so.
pub(crate) const EMPTY_SETTLE: Duration = Duration::from_secs(1);

/// Told of each rejection (the agent counts them in
/// `ebpf_proxy_services_file_rejections_total{reason}`).
pub(crate) type RejectionSink = Arc<dyn Fn(Rejection) + Send + Sync>;

/// Services and EndpointSlices from a services file, read again when it changes.
pub struct FileSource {
    path: PathBuf,
    read_once: bool,
    stamp: Option<file::Stamp>,
    /// Since when the file has been read empty without that being applied.
    empty_since: Option<Instant>,
    rejected: RejectionSink,
    /// What the last delivery held (shared with it), for `inputs`.
    delivered: Option<Snapshot>,
    /// Services left out by label in the last read, and the label: each is
    /// logged when it first is (or its label changes), not on every read.
    not_proxied: BTreeMap<String, &'static str>,
    /// A digest of the last read's rejections: the same ones read again
    /// (the file rewritten with the same junk) are not summarised again.
    rejections_logged: Option<u64>,
}

impl FileSource {
    /// A source reading the file at `path`.
    #[must_use]
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            read_once: false,
            stamp: None,
            empty_since: None,
            rejected: Arc::new(|_| {}),
            delivered: None,
            not_proxied: BTreeMap::new(),
            rejections_logged: None,
        }
    }

    /// Tells `sink` of every rejection.
    #[must_use]
    pub(crate) fn with_rejections(mut self, sink: RejectionSink) -> Self {
        self.rejected = sink;
        self
    }

    /// Takes the services left out by label in this read: those that were
    /// not in the last one (or with another label), to be logged.
    fn newly_not_proxied(&mut self, now: &[(String, &'static str)]) -> Vec<(String, &'static str)> {
        let now: BTreeMap<String, &'static str> = now.iter().cloned().collect();
        let new = now.iter().filter(|(o, l)| self.not_proxied.get(*o) != Some(*l)).map(|(o, l)| (o.clone(), *l));
        let new = new.collect();
        self.not_proxied = now;
        new
    }

    /// Logs the rejected objects of one read: one line per reason, with
    /// the count and the first few objects (each object at debug), and at
    /// debug only when the last read had the very same rejections. A file
    /// of 100,000 ConfigMaps beside the services is one line, not 100,000
    /// on every change.
    fn log_rejections(&mut self, errors: &[file::ObjectError]) {
        let digest = digest(errors);
        let repeated = self.rejections_logged == Some(digest);
        self.rejections_logged = Some(digest);
        let mut by_reason: BTreeMap<&'static str, Vec<&file::ObjectError>> = BTreeMap::new();
        for err in errors {
            let (document, object, field, reason) = (err.document, &err.object, &err.field, err.rejection.as_str());
            debug!(document, %object, %field, reason, "rejected object: {}", err.message);
            by_reason.entry(reason).or_default().push(err);
        }
        for (reason, errs) in by_reason {
            let objects = errs.len();
            if repeated {
                debug!(reason, objects, "the same objects rejected as in the last read");
                continue;
            }
            let first = errs[0];
            let examples: Vec<String> =
                errs.iter().take(EXAMPLES).map(|e| format!("document {} {}", e.document, e.object)).collect();
            let examples = examples.join(", ");
            let path = self.path.display();
            match first.rejection {
                Rejection::Duplicate => warn!(
                    %path, reason, objects, %examples, %first,
                    "services file objects skipped: a second object of the same kind, namespace and name \
                     (the first one is used; remove or rename the later ones; each at debug)"
                ),
                Rejection::UnknownKind => error!(
                    %path, reason, objects, %examples, %first,
                    "services file objects skipped: only v1/Service, discovery.k8s.io/v1/EndpointSlice \
                     and v1/Node are read (remove the others from the file; each at debug)"
                ),
                _ => error!(
                    %path, reason, objects, %examples, %first,
                    "services file objects skipped: fix the field named in `first` (each at debug)"
                ),
            }
        }
    }

    /// An empty read that has waited `EMPTY_SETTLE` and is due again.
    fn empty_due(&self) -> bool {
        self.empty_since.is_some_and(|since| since.elapsed() >= EMPTY_SETTLE)
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
            if self.read_once && stamp == self.stamp && !self.empty_due() {
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
                error!(%err, reason = err.rejection().as_str(), "services file not applied");
                (self.rejected)(err.rejection());
                return None;
            }
        };
        if file::stamp(&self.path) != self.stamp {
            // Written while it was read: what was read may be half of it.
            // `changed` sees the new stamp and it is read again.
            info!(path = %self.path.display(), "services file changed while it was read; reading it again");
            return None;
        }
        if parsed.is_empty() {
            match self.empty_since {
                Some(_) if self.empty_due() => {
                    self.empty_since = None;
                    warn!(path = %self.path.display(), "services file stayed empty: every service is removed");
                }
                Some(_) => return None,
                None => {
                    self.empty_since = Some(Instant::now());
                    warn!(
                        path = %self.path.display(),
                        settle_ms = EMPTY_SETTLE.as_millis(),
                        reason = Rejection::Empty.as_str(),
                        "services file is empty; the last good content stays in effect unless it is still empty after the settle time (write the file by atomic rename to avoid this)"
                    );
                    (self.rejected)(Rejection::Empty);
                    return None;
                }
            }
        }
        self.empty_since = None;
        for err in &parsed.errors {
            (self.rejected)(err.rejection);
        }
        self.log_rejections(&parsed.errors);
        if parsed.nothing_usable() {
            // Garbage that parses as YAML (a base64 blob is a YAML scalar)
            // or a file of other kinds only: applying it would remove
            // every service, so it is refused like a file that is not YAML.
            error!(
                path = %self.path.display(),
                objects = parsed.errors.len(),
                reason = Rejection::NoUsableObject.as_str(),
                "services file not applied: none of its objects is a usable v1/Service, \
                 discovery.k8s.io/v1/EndpointSlice or v1/Node (see the rejections logged with it); \
                 the last good content stays in effect"
            );
            (self.rejected)(Rejection::NoUsableObject);
            return None;
        }
        log_not_proxied(&self.newly_not_proxied(&parsed.not_proxied));
        let mut delivery = Delivery::new(Snapshot::from(parsed.objects));
        delivery.rejected = parsed.errors.len() as u64;
        self.delivered = Some(delivery.snapshot.clone());
        Some(delivery)
    }

    fn inputs(&self, service: &ServiceId) -> Option<ServiceInputs> {
        let Some(Snapshot::Full { services, slices, .. }) = &self.delivered else { return None };
        let svc = services.iter().find(|s| &s.id == service)?;
        let slices = slices.iter().filter(|s| s.owner() == Some(service)).cloned().collect();
        Some((svc.clone(), slices))
    }

    /// What was last delivered, again (a node address or zone change
    /// translates it anew); a file being written, broken or in its
    /// empty-file grace is not read for it. Before any delivery: a read.
    fn everything(&mut self) -> Option<Delivery> {
        match &self.delivered {
            Some(snapshot) => Some(Delivery::new(snapshot.clone())),
            None => self.snapshot(),
        }
    }
}

/// Objects named in a rejection summary; the rest are at debug.
const EXAMPLES: usize = 5;

/// A digest of `errors`, to tell the same rejections read again.
fn digest(errors: &[file::ObjectError]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for err in errors {
        (err.document, &err.object, &err.field, &err.message, err.rejection.as_str()).hash(&mut hasher);
    }
    hasher.finish()
}

/// One line per service newly left out by label; more than
/// `LOG_EACH_UP_TO` (a first read of a big file) log one summary, and
/// each at debug.
fn log_not_proxied(new: &[(String, &'static str)]) {
    const MESSAGE: &str = "service not proxied: labelled for another proxy or headless (kube-proxy's selector)";
    const LOG_EACH_UP_TO: usize = 64;
    for (object, label) in new {
        if new.len() <= LOG_EACH_UP_TO {
            info!(%object, label, "{MESSAGE}");
        } else {
            debug!(%object, label, "{MESSAGE}");
        }
    }
    if new.len() > LOG_EACH_UP_TO {
        info!(services = new.len(), "services not proxied: labelled for another proxy or headless (each at debug)");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn source(dir: &tempfile::TempDir) -> (FileSource, Arc<Mutex<Vec<Rejection>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let source = FileSource::new(dir.path().join("services.yaml"))
            .with_rejections(Arc::new(move |r| sink.lock().unwrap().push(r)));
        (source, seen)
    }

    const ONE_SERVICE: &str =
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";

    fn services(delivery: &Delivery) -> usize {
        match &delivery.snapshot {
            Snapshot::Full { services, .. } => services.len(),
            Snapshot::Changed { .. } => panic!("the file gives full snapshots"),
        }
    }

    /// `: > F` then the new content: the empty read is held back, and the
    /// content that follows within the settle time is applied; an empty
    /// file that stays empty is applied after it.
    #[tokio::test]
    async fn an_empty_read_waits_for_the_settle_time() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, seen) = source(&dir);
        let path = dir.path().join("services.yaml");
        std::fs::write(&path, ONE_SERVICE).unwrap();
        source.changed().await;
        assert_eq!(services(&source.snapshot().unwrap()), 1);

        std::fs::write(&path, "").unwrap();
        source.changed().await;
        assert!(source.snapshot().is_none(), "an empty read is not applied on sight");
        assert_eq!(*seen.lock().unwrap(), vec![Rejection::Empty]);
        std::fs::write(&path, ONE_SERVICE).unwrap();
        source.changed().await;
        assert_eq!(services(&source.snapshot().unwrap()), 1, "the rewritten content is applied");

        std::fs::write(&path, "# nothing\n---\n").unwrap();
        let truncated = Instant::now();
        source.changed().await;
        assert!(source.snapshot().is_none());
        // Nothing changes on disk: `changed` fires again after the settle.
        source.changed().await;
        assert!(truncated.elapsed() >= EMPTY_SETTLE);
        assert_eq!(services(&source.snapshot().unwrap()), 0, "an empty file that stays empty is applied");
    }

    /// `inputs` answers from what was delivered: the Service and the
    /// slices that name it.
    #[tokio::test]
    async fn inputs_are_those_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, _) = source(&dir);
        let id = ServiceId::new("default", "a");
        assert!(source.inputs(&id).is_none(), "nothing delivered yet");
        let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
            metadata: {name: a-1, labels: {kubernetes.io/service-name: a}}\nendpoints: []\n";
        let other = slice.replace("name: a-1", "name: b-1").replace("service-name: a", "service-name: b");
        std::fs::write(dir.path().join("services.yaml"), format!("{ONE_SERVICE}---\n{slice}---\n{other}")).unwrap();
        source.changed().await;
        source.snapshot().unwrap();
        let (service, slices) = source.inputs(&id).unwrap();
        assert_eq!(service.id.name(), "a");
        assert_eq!(slices.iter().map(|s| s.id().name().to_owned()).collect::<Vec<_>>(), ["a-1"]);
        assert!(source.inputs(&ServiceId::new("default", "b")).is_none());
    }

    #[tokio::test]
    async fn a_file_that_is_not_yaml_is_counted_and_keeps_what_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, seen) = source(&dir);
        std::fs::write(dir.path().join("services.yaml"), "kind: [\n").unwrap();
        source.changed().await;
        assert!(source.snapshot().is_none());
        assert_eq!(*seen.lock().unwrap(), vec![Rejection::NotYaml]);
    }

    /// Writes `text` as the services file and reads it as the agent does.
    async fn read(source: &mut FileSource, dir: &tempfile::TempDir, text: &str) -> Option<Delivery> {
        // Atomic replace: a new inode, so the change is seen even when the
        // length and mtime happen to match.
        let tmp = dir.path().join(".services.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.path().join("services.yaml")).unwrap();
        source.changed().await;
        source.snapshot()
    }

    fn config_maps(n: usize) -> String {
        use std::fmt::Write as _;
        (0..n).fold(String::new(), |mut out, i| {
            let _ = write!(out, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{i}}}\n");
            out
        })
    }

    /// 20 KB of base64 is a YAML scalar: one object of no kind. Applied,
    /// it would remove every service; it is refused like a file that is
    /// not YAML, and so is a file of only other kinds. What was delivered
    /// stays (a node change translates it again).
    #[tokio::test]
    async fn a_file_with_no_usable_object_keeps_what_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, seen) = source(&dir);
        assert_eq!(services(&read(&mut source, &dir, ONE_SERVICE).await.unwrap()), 1);
        let garbage: String = (0..20_000).map(|i| char::from(b"QUJD"[i % 4])).collect();
        assert!(read(&mut source, &dir, &garbage).await.is_none(), "garbage is not applied");
        assert_eq!(*seen.lock().unwrap(), vec![Rejection::UnknownKind, Rejection::NoUsableObject]);
        seen.lock().unwrap().clear();
        assert!(read(&mut source, &dir, &config_maps(3)).await.is_none(), "other kinds only are not applied");
        assert_eq!(seen.lock().unwrap().iter().filter(|r| **r == Rejection::NoUsableObject).count(), 1);
        assert_eq!(services(&source.everything().unwrap()), 1, "the last delivery stays");
        // A truncated file (no object at all) keeps its own rule.
        assert!(read(&mut source, &dir, "").await.is_none());
        assert_eq!(seen.lock().unwrap().last(), Some(&Rejection::Empty));
    }

    /// One usable object is enough: the Service is applied, the junk
    /// beside it skipped and counted.
    #[tokio::test]
    async fn one_good_service_among_junk_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, seen) = source(&dir);
        let delivery = read(&mut source, &dir, &(config_maps(50) + "---\n" + ONE_SERVICE)).await.unwrap();
        assert_eq!((services(&delivery), delivery.rejected), (1, 50));
        assert!(seen.lock().unwrap().iter().all(|r| *r == Rejection::UnknownKind));
    }

    /// 10,000 rejected objects log one line per reason, not one each; the
    /// same rejections read again (the file rewritten with the same junk)
    /// log nothing at info; new ones are summarised again.
    #[test]
    fn ten_thousand_rejections_log_a_handful_of_lines() {
        let (log, _guard) = crate::source::log_capture::Captured::start();
        let count = || log.lines();
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (mut source, seen) = source(&dir);
        let broken = "---\napiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {ports: 3}\n";
        let junk = config_maps(10_000) + &broken.repeat(3) + "---\n" + ONE_SERVICE;
        let delivery = runtime.block_on(read(&mut source, &dir, &junk)).unwrap();
        assert_eq!((services(&delivery), delivery.rejected), (1, 10_003));
        assert_eq!(seen.lock().unwrap().len(), 10_003, "each rejection is still counted");
        let first = count();
        assert!(first <= 4, "{first} lines for 10,003 rejections");
        let text = log.text();
        assert!(text.contains("objects=10000") && text.contains("document 1 ConfigMap default/cm-0"), "{text}");
        // The same junk, the Service changed: no new summary.
        let again = junk.replace("name: a", "name: a2");
        runtime.block_on(read(&mut source, &dir, &again)).unwrap();
        assert_eq!(count(), first, "the same rejections were summarised again");
        // Other junk is summarised.
        runtime.block_on(read(&mut source, &dir, &(config_maps(2) + "---\n" + ONE_SERVICE))).unwrap();
        assert_eq!(count(), first + 1);
    }

    /// A labelled Service is named once, not on every read of the file (as
    /// the model names a skipped service once per reason): again only when
    /// its label changes, or when it comes back after a read without it.
    #[test]
    fn a_service_left_out_by_label_is_named_once_per_change() {
        let dir = tempfile::tempdir().unwrap();
        let (mut source, _) = source(&dir);
        let (headless, other) = ("service.kubernetes.io/headless", "service.kubernetes.io/service-proxy-name");
        let read = |list: &[(&str, &'static str)]| -> Vec<(String, &'static str)> {
            list.iter().map(|(o, l)| ((*o).to_owned(), *l)).collect()
        };
        let first = read(&[("Service t/a", headless), ("Service t/b", other)]);
        assert_eq!(source.newly_not_proxied(&first), first);
        assert_eq!(source.newly_not_proxied(&first), Vec::new(), "the same file read again");
        let relabelled = read(&[("Service t/a", other), ("Service t/b", other)]);
        assert_eq!(source.newly_not_proxied(&relabelled), read(&[("Service t/a", other)]));
        assert_eq!(source.newly_not_proxied(&read(&[("Service t/b", other)])), Vec::new(), "t/a is gone");
        assert_eq!(source.newly_not_proxied(&relabelled), read(&[("Service t/a", other)]), "t/a is back");
    }
}
