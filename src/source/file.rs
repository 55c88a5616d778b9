//! The file source: static pod manifests in `staticPodPath` (kubelet's `config/file.go` and
//! `file_linux.go`).
//!
//! The directory is watched with inotify (through `notify`) and re-listed every
//! `fileCheckFrequency`. A write that ends with close, a rename or a removal of a `.yaml`, `.yml`
//! or `.json` file triggers a re-list at once; other events (create, partial writes, temporary
//! files of editors and `sed -i`) a re-list [`SETTLE`] later, so that a file caught half-written
//! or a temporary copy is not reported as broken. Dotfiles and directories are ignored. Each re-list
//! sends the full set of pods to [`PodConfig::set`].
//!
//! Broken manifests are reported (log, event, metric) once per distinct content. A manifest that
//! breaks after it was good keeps its last good pod running until it is fixed or removed: an
//! operator's typo never takes a running pod down. Two files defining the same namespace/name (or
//! the same explicit `metadata.uid`): the file that defined it first keeps it, the other is
//! reported as a duplicate.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use k8s_openapi::api::core::v1::Pod;
use notify::{EventKind, RecursiveMode, Watcher};

use super::manifest::decode_static_pod;
use super::{ManifestError, PodConfig};
use crate::events::Recorder;
use crate::metrics::Metrics;

/// Delay after a create or partial-write event before the directory is re-listed.
pub const SETTLE: Duration = Duration::from_millis(200);

/// Source name used in `PodUpdate.source` and `config.source`.
pub const SOURCE: &str = "file";

/// What the last listing found in one file.
struct FileEntry {
    bytes: Vec<u8>,
    /// The last pod this file produced successfully (kept while the file is broken).
    good: Option<Pod>,
    /// The error of the current content, if it is broken.
    error: Option<ManifestError>,
}

/// Reads the manifest directory into pods; keeps per-file state between listings.
pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    files: BTreeMap<PathBuf, FileEntry>,
    /// namespace/name → file that owns it.
    owners: HashMap<(String, String), PathBuf>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    missing_dir_reported: bool,
}

impl FileSource {
    /// A source over `dir` for node `node_name`.
    pub fn new(dir: PathBuf, node_name: String, recorder: Recorder, metrics: Arc<Metrics>) -> Self {
        Self {
            dir,
            node_name,
            files: BTreeMap::new(),
            owners: HashMap::new(),
            recorder,
            metrics,
            missing_dir_reported: false,
        }
    }

    fn report(&self, err: &ManifestError, file: &Path) {
        tracing::warn!(file = %file.display(), reason = err.reason(), error = %err, "static pod manifest refused");
        self.recorder.warning(
            format!("file/{}", file.display()),
            err.reason(),
            err.to_string(),
        );
        self.metrics.manifest_error(err.reason());
    }

    /// Lists the directory and returns the pods it defines now, reporting new errors.
    pub fn list(&mut self) -> Vec<Pod> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(rd) => {
                self.missing_dir_reported = false;
                rd
            }
            Err(e) => {
                if !self.missing_dir_reported {
                    tracing::warn!(path = %self.dir.display(), error = %e, "cannot read staticPodPath; will retry");
                    self.missing_dir_reported = true;
                }
                self.files.clear();
                self.owners.clear();
                return Vec::new();
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| {
                e.file_type()
                    .map(|t| t.is_file() || t.is_symlink())
                    .unwrap_or(false)
            })
            .map(|e| e.path())
            .collect();
        paths.sort();
        self.files.retain(|p, _| paths.contains(p));

        for path in &paths {
            let bytes = match std::fs::read(path) {
                Ok(b) => b,
                Err(e) => {
                    if path.is_dir() {
                        continue;
                    }
                    Vec::from(format!("\0unreadable: {e}"))
                }
            };
            if self.files.get(path).is_some_and(|f| f.bytes == bytes) {
                continue;
            }
            let result = if bytes.starts_with(b"\0unreadable: ") {
                Err(ManifestError::Read {
                    file: path.display().to_string(),
                    message: String::from_utf8_lossy(&bytes[13..]).into_owned(),
                })
            } else {
                decode_static_pod(path, &bytes, &self.node_name)
            };
            let prev_good = self.files.remove(path).and_then(|f| f.good);
            let entry = match result {
                Ok(pod) => FileEntry {
                    bytes,
                    good: Some(pod),
                    error: None,
                },
                Err(err) => {
                    self.report(&err, path);
                    if prev_good.is_some() {
                        tracing::warn!(file = %path.display(), "keeping the last good version of this pod until the manifest is fixed");
                    }
                    FileEntry {
                        bytes,
                        good: prev_good,
                        error: Some(err),
                    }
                }
            };
            self.files.insert(path.clone(), entry);
        }
        self.collect_pods()
    }

    /// Pods from the current files, the first owner of each namespace/name winning.
    fn collect_pods(&mut self) -> Vec<Pod> {
        let key = |p: &Pod| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        // Drop owners whose file no longer defines that pod.
        self.owners.retain(|k, file| {
            self.files
                .get(file)
                .and_then(|f| f.good.as_ref())
                .is_some_and(|p| key(p) == *k)
        });
        // Existing owners first, then new files in name order.
        let mut order: Vec<&PathBuf> = self.owners.values().collect();
        order.sort();
        let mut rest: Vec<&PathBuf> = self.files.keys().filter(|p| !order.contains(p)).collect();
        order.append(&mut rest);
        let order: Vec<PathBuf> = order.into_iter().cloned().collect();

        let mut pods = Vec::new();
        let mut duplicates = Vec::new();
        let mut uids: HashMap<String, PathBuf> = HashMap::new();
        for path in order {
            let Some(entry) = self.files.get(&path) else {
                continue;
            };
            let Some(pod) = entry.good.as_ref() else {
                continue;
            };
            let k = key(pod);
            let uid = super::pod_uid(pod).to_owned();
            let first = match (self.owners.get(&k), uids.get(&uid)) {
                (Some(owner), _) if *owner != path => Some(owner.clone()),
                (_, Some(owner)) => Some(owner.clone()),
                _ => None,
            };
            match first {
                Some(first) => {
                    if entry.error.is_none() {
                        let err = ManifestError::Duplicate {
                            file: path.display().to_string(),
                            namespace: k.0,
                            name: k.1,
                            uid,
                            first: first.display().to_string(),
                        };
                        duplicates.push((path.clone(), err));
                    }
                }
                None => {
                    self.owners.insert(k, path.clone());
                    uids.insert(uid, path.clone());
                    pods.push(pod.clone());
                }
            }
        }
        for (path, err) in duplicates {
            self.report(&err, &path);
            // Report once per content: mark the entry as errored.
            if let Some(e) = self.files.get_mut(&path) {
                e.error = Some(err);
            }
        }
        pods
    }
}

/// True for names editors and tools give finished manifests (`.yaml`, `.yml`, `.json`): a write
/// to one is acted on at once; other names (temporary files of `sed -i`, editors' swap files) are
/// given [`SETTLE`] to be renamed or removed first.
fn has_manifest_extension(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Runs the file source on the calling thread until `stop` fires: watches `dir`, re-lists on
/// changes and every `period`, and feeds `config`.
pub fn run(
    mut source: FileSource,
    period: Duration,
    config: Arc<std::sync::Mutex<PodConfig>>,
    stop: Receiver<()>,
) {
    let (ev_tx, ev_rx) = crossbeam_channel::unbounded::<notify::Result<notify::Event>>();
    let mut watcher = match notify::recommended_watcher(move |e| {
        let _ = ev_tx.send(e);
    }) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, "inotify unavailable; relying on periodic listing");
            None
        }
    };
    let mut watching = false;
    let ticker = crossbeam_channel::tick(period);
    let mut settle_at: Option<Instant> = None;
    let mut relist = true;
    loop {
        if !watching {
            if let Some(w) = watcher.as_mut() {
                watching = w.watch(&source.dir, RecursiveMode::NonRecursive).is_ok();
            }
        }
        if relist {
            let pods = source.list();
            config
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set(SOURCE, pods);
            relist = false;
            settle_at = None;
        }
        let wait = settle_at.map_or(period, |t| t.saturating_duration_since(Instant::now()));
        select! {
            recv(stop) -> _ => return,
            recv(ticker) -> _ => relist = true,
            recv(ev_rx) -> ev => match ev {
                Ok(Ok(ev)) => {
                    // For a rename the destination (last path) is what will be listed.
                    let manifests_only = match ev.kind {
                        EventKind::Modify(notify::event::ModifyKind::Name(_)) => ev.paths.last().is_some_and(|p| has_manifest_extension(p)),
                        _ => ev.paths.iter().all(|p| has_manifest_extension(p)),
                    };
                    match ev.kind {
                        EventKind::Access(notify::event::AccessKind::Close(notify::event::AccessMode::Write))
                        | EventKind::Modify(notify::event::ModifyKind::Name(_))
                        | EventKind::Remove(_)
                            if manifests_only => relist = true,
                        EventKind::Access(notify::event::AccessKind::Close(notify::event::AccessMode::Write)) | EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => {
                            let due = Instant::now() + SETTLE;
                            settle_at = Some(settle_at.map_or(due, |t| t.min(due)));
                        }
                        _ => {}
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "inotify error; re-watching");
                    watching = false;
                    relist = true;
                }
                Err(_) => return,
            },
            default(wait) => relist = settle_at.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(dir: &Path) -> FileSource {
        FileSource::new(
            dir.to_owned(),
            "n1".into(),
            Recorder::default(),
            Metrics::new(),
        )
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec: {containers: [{name: c, image: busybox}]}\n";

    #[test]
    fn lists_good_pods_and_reports_broken_ones_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), "not: [valid").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "garbage").unwrap();
        let mut s = source(dir.path());
        let pods = s.list();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].metadata.name.as_deref(), Some("a-n1"));
        assert_eq!(s.recorder.list().len(), 1);
        assert!(s.recorder.list()[0].message.contains("b.yaml"));
        s.list();
        assert_eq!(
            s.recorder.list().len(),
            1,
            "same broken content is reported once"
        );
    }

    #[test]
    fn a_broken_edit_keeps_the_last_good_pod() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        std::fs::write(&f, POD.replace("NAME", "a")).unwrap();
        let mut s = source(dir.path());
        assert_eq!(s.list().len(), 1);
        std::fs::write(
            &f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n",
        )
        .unwrap();
        assert_eq!(s.list().len(), 1);
        assert_eq!(s.recorder.list()[0].reason, "InvalidManifest");
        std::fs::remove_file(&f).unwrap();
        assert!(s.list().is_empty());
    }

    #[test]
    fn first_file_wins_a_duplicate_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.yaml"), POD.replace("NAME", "same")).unwrap();
        let mut s = source(dir.path());
        let first_uid = s.list()[0].metadata.uid.clone();
        // a.yaml sorts first but arrives later: b.yaml keeps the name.
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "same")).unwrap();
        let pods = s.list();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].metadata.uid, first_uid);
        let ev = s.recorder.list();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, "DuplicatePod");
        assert!(ev[0].message.contains("a.yaml") && ev[0].message.contains("b.yaml"));
    }

    #[test]
    fn same_explicit_uid_in_two_files_is_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let with_uid = |n: &str| POD.replace("{name: NAME}", &format!("{{name: {n}, uid: same}}"));
        std::fs::write(dir.path().join("a.yaml"), with_uid("one")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), with_uid("two")).unwrap();
        let mut s = source(dir.path());
        let pods = s.list();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].metadata.name.as_deref(), Some("one-n1"));
        assert_eq!(s.recorder.list()[0].reason, "DuplicatePod");
    }

    #[test]
    fn a_missing_directory_yields_no_pods() {
        let mut s = source(Path::new("/nonexistent/nodelet-test"));
        assert!(s.list().is_empty());
    }
}
