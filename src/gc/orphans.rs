//! Directories of gone pods (kubelet's `cleanupOrphanedPodDirs` and the pod log directories of
//! `evictPodLogsDirectories`), swept by housekeeping with back-off for what cannot go.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// First wait before a directory that could not be removed is tried again; it doubles up to
/// [`ORPHAN_RETRY_MAX`].
pub const ORPHAN_RETRY_INITIAL: Duration = Duration::from_secs(2);
/// Longest wait between two tries of a directory that cannot be removed.
pub const ORPHAN_RETRY_MAX: Duration = Duration::from_secs(300);

/// A directory that could not be removed: how often it failed and when it is tried again.
#[derive(Debug, Clone)]
struct Stuck {
    failures: u32,
    next: Instant,
}

/// The directories of gone pods (kubelet's `cleanupOrphanedPodDirs` and the pod log
/// directories of `evictPodLogsDirectories`), swept by housekeeping: `<root-dir>/pods/<uid>`
/// (volumes torn down first: a tmpfs emptyDir is unmounted) and `<podLogsDir>/<ns>_<name>_<uid>`
/// of every UID not in use, on their own filesystem only (a symlink removed, never followed; a
/// tree holding a mount left whole). One that cannot be removed (it holds a mount another
/// process made, a read-only file) is reported once, then retried with back-off ([`ORPHAN_RETRY_INITIAL`]
/// doubling to [`ORPHAN_RETRY_MAX`]) without a log line per try; its removal at last is logged.
/// Written by housekeeping alone.
#[derive(Debug, Default)]
pub struct OrphanedDirs {
    stuck: HashMap<PathBuf, Stuck>,
}

impl OrphanedDirs {
    /// Whether a directory that could not be removed is due for another try at `now`.
    pub fn retry_due(&self, now: Instant) -> bool {
        self.stuck.values().any(|s| s.next <= now)
    }

    /// Number of directories that could not be removed yet.
    pub fn stuck(&self) -> usize {
        self.stuck.len()
    }

    /// Removes the pod and log directories of every UID not in `in_use`, at `now`; entries
    /// whose name holds no safe UID are left alone. Returns the directories removed.
    pub fn sweep(
        &mut self,
        root_dir: &Path,
        pod_logs_dir: &Path,
        in_use: &HashSet<String>,
        now: Instant,
    ) -> Vec<PathBuf> {
        let mut candidates = Vec::new();
        for e in read_dir(&root_dir.join("pods")) {
            let uid = e.file_name().to_string_lossy().into_owned();
            candidates.push((uid, e.path(), true));
        }
        for e in read_dir(pod_logs_dir) {
            let name = e.file_name().to_string_lossy().into_owned();
            let parts: Vec<&str> = name.split('_').collect();
            let pod_like = parts.len() == 3
                && parts[..2]
                    .iter()
                    .all(|p| !p.is_empty() && !p.starts_with('.'));
            if pod_like {
                candidates.push((parts[2].to_owned(), e.path(), false));
            }
        }
        let mut removed = Vec::new();
        for (uid, path, is_pod_dir) in candidates {
            if in_use.contains(&uid) || !crate::pod::is_safe_uid(&uid) {
                self.stuck.remove(&path);
                continue;
            }
            if self.stuck.get(&path).is_some_and(|s| s.next > now) {
                continue;
            }
            // A symlink is removed as such (never followed); volumes are torn down in a real
            // pod directory only.
            if is_pod_dir && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                crate::volume::tear_down_pod(&path);
            }
            match crate::volume::removal::remove_all_one_filesystem(&path) {
                Ok(()) => {
                    if let Some(s) = self.stuck.remove(&path) {
                        info!(uid, path = %path.display(), tries = s.failures + 1, "removed orphaned pod directory at last");
                    }
                    removed.push(path);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.stuck.remove(&path);
                }
                Err(e) => {
                    let s = self.stuck.entry(path.clone()).or_insert(Stuck {
                        failures: 0,
                        next: now,
                    });
                    if s.failures == 0 {
                        warn!(uid, path = %path.display(), error = %e, "cannot remove orphaned pod directory; retrying with back-off (reported once)");
                    }
                    s.failures = s.failures.saturating_add(1);
                    let wait = ORPHAN_RETRY_INITIAL
                        .saturating_mul(1u32 << (s.failures - 1).min(16))
                        .min(ORPHAN_RETRY_MAX);
                    s.next = now + wait;
                }
            }
        }
        removed
    }
}

fn read_dir(dir: &Path) -> Vec<std::fs::DirEntry> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphaned_pod_and_log_dirs_go_and_pods_in_use_keep_theirs() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("logs");
        for uid in ["keep", "gone"] {
            std::fs::create_dir_all(tmp.path().join("pods").join(uid)).unwrap();
            std::fs::write(tmp.path().join("pods").join(uid).join("etc-hosts"), "x").unwrap();
            std::fs::create_dir_all(logs.join(format!("default_web_{uid}/c"))).unwrap();
        }
        std::fs::create_dir_all(logs.join("not-a-pod")).unwrap();
        let in_use = ["keep".to_string()].into();
        let mut dirs = OrphanedDirs::default();
        let mut removed = dirs.sweep(tmp.path(), &logs, &in_use, Instant::now());
        removed.sort();
        assert_eq!(
            removed,
            [logs.join("default_web_gone"), tmp.path().join("pods/gone")]
        );
        assert!(tmp.path().join("pods/keep/etc-hosts").exists());
        assert!(logs.join("default_web_keep/c").exists());
        assert!(logs.join("not-a-pod").exists());
    }

    #[test]
    fn a_directory_that_cannot_go_is_retried_with_back_off() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let stuck = tmp.path().join("pods/gone");
        std::fs::create_dir_all(&stuck).unwrap();
        let mut dirs = OrphanedDirs::default();
        let t0 = Instant::now();
        // As after a first failure (a busy mount: tests/garbage_collection.rs makes a real one).
        dirs.stuck.insert(
            stuck.clone(),
            Stuck {
                failures: 1,
                next: t0 + ORPHAN_RETRY_INITIAL,
            },
        );
        assert!(!dirs.retry_due(t0));
        assert!(
            dirs.sweep(tmp.path(), &logs, &HashSet::new(), t0)
                .is_empty(),
            "not yet due"
        );
        assert!(stuck.exists());
        assert!(dirs.retry_due(t0 + ORPHAN_RETRY_INITIAL));
        assert_eq!(
            dirs.sweep(
                tmp.path(),
                &logs,
                &HashSet::new(),
                t0 + ORPHAN_RETRY_INITIAL
            ),
            std::slice::from_ref(&stuck)
        );
        assert_eq!(dirs.stuck(), 0);
    }
}
