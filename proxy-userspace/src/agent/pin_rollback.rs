//! A start that fails, or ends before its programs are attached, leaves
//! the pin directory as it found it: what was in it before (maps and
//! links of a running datapath) stays, what this start pinned goes.
use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
};

/// The pin directory's entries (two levels: `maps-v*`/`links` and what is
/// in them) at one moment; dropped before `keep`, it removes what came
/// after.
#[derive(Debug)]
pub(crate) struct PinRollback {
    before: HashSet<PathBuf>,
    dir: PathBuf,
    kept: bool,
}

impl PinRollback {
    /// Notes what is in `dir` now.
    #[must_use]
    pub(crate) fn take(dir: &Path) -> Self {
        Self { before: entries(dir).into_iter().collect(), dir: dir.to_owned(), kept: false }
    }

    /// What was pinned since `take` stays (the programs are attached).
    pub(crate) const fn keep(&mut self) {
        self.kept = true;
    }

    /// Removes every entry that was not there when `take` ran (files first,
    /// then the directories made, deepest first); returns how many went.
    /// A failure to remove one is logged: this runs on a failure already.
    fn undo(&self) -> usize {
        let mut new: Vec<PathBuf> = entries(&self.dir).into_iter().filter(|p| !self.before.contains(p)).collect();
        // Deepest first: a directory's entries before the directory.
        new.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        let mut removed = 0;
        for path in new {
            let result = if path.is_dir() { fs::remove_dir(&path) } else { fs::remove_file(&path) };
            match result {
                Ok(()) => removed += 1,
                Err(err) => tracing::warn!(path = %path.display(), %err, "cannot remove a pin this failed start made"),
            }
        }
        removed
    }
}

impl Drop for PinRollback {
    fn drop(&mut self) {
        if !self.kept {
            let removed = self.undo();
            if removed > 0 {
                tracing::info!(removed, pin_dir = %self.dir.display(), "removed what this start pinned before its programs were attached");
            }
        }
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let list = |dir: &Path| -> Vec<PathBuf> {
        fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
    };
    let top = list(dir);
    let mut all = Vec::new();
    for path in top {
        if path.is_dir() {
            all.extend(list(&path));
        }
        all.push(path);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::PinRollback;

    #[test]
    fn only_what_came_after_is_removed_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = |s: &str| dir.path().join(s);
        std::fs::create_dir(p("maps-v1")).unwrap();
        std::fs::write(p("maps-v1/OLD"), "").unwrap();
        let rollback = PinRollback::take(dir.path());
        std::fs::write(p("maps-v1/NEW"), "").unwrap();
        std::fs::create_dir(p("maps-v2")).unwrap();
        std::fs::write(p("maps-v2/SERVICES"), "").unwrap();
        assert_eq!(rollback.undo(), 3);
        assert!(p("maps-v1/OLD").exists() && !p("maps-v1/NEW").exists() && !p("maps-v2").exists());
        // Dropped: the same; kept: nothing goes.
        let rollback = PinRollback::take(dir.path());
        std::fs::write(p("maps-v1/NEW"), "").unwrap();
        drop(rollback);
        assert!(!p("maps-v1/NEW").exists() && p("maps-v1/OLD").exists());
        let mut rollback = PinRollback::take(dir.path());
        std::fs::write(p("maps-v1/NEW"), "").unwrap();
        rollback.keep();
        drop(rollback);
        assert!(p("maps-v1/NEW").exists());
    }
}
