//! The file source: static pod manifests in `staticPodPath` (kubelet's `config/file.go` and
//! `file_linux.go`).
//!
//! The directory is watched with inotify (through `notify`) and re-listed every
//! `fileCheckFrequency`. A write that ends with close, a rename or a removal of a `.yaml`, `.yml`
//! or `.json` file triggers a re-list at once; other events (create, partial writes, temporary
//! files of editors and `sed -i`) a re-list [`SETTLE`] later, so that a file caught half-written
//! or a temporary copy is not reported as broken. A file still being written (inotify saw writes
//! and no close yet, or, with no event seen, it changed less than [`SETTLE`] ago) is neither
//! read nor reported until it is complete: several manifests copied with one `cp` never show as
//! broken. Dotfiles and directories are ignored. Each re-list sends the full set of pods to the
//! pod configuration's merger ([`crate::source::mux`], then [`crate::source::PodConfig::set`]),
//! publishes the files' ConfigMaps and Secrets ([`crate::objects`]; a file may hold several
//! documents, at most one of them a Pod) and has the pods that use a changed object synced
//! ([`crate::source::PodConfig::reconcile`]). The watching is in [`watch`].
//!
//! Broken manifests are reported (log, event, metric) once per distinct content. A manifest that
//! breaks after it was good keeps its last good pod running until it is fixed or removed: an
//! operator's typo never takes a running pod down. Two files defining the same namespace/name (or
//! the same explicit `metadata.uid`): the file that defined it first keeps it, the other is
//! reported as a duplicate.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use notify::EventKind;

use super::checkpoint::CheckpointStore;
use super::manifest::{decode_manifest, Manifest};
use super::ManifestError;
use crate::events::Recorder;
use crate::metrics::Metrics;

pub mod watch;
pub use watch::{run, ListSchedule, DIR_EVENTS_CAPACITY};

/// Delay after a create or partial-write event before the directory is re-listed.
pub const SETTLE: Duration = Duration::from_millis(200);

/// How often a missing `staticPodPath` is looked for, so that a re-created directory is watched
/// again without waiting for `fileCheckFrequency`.
pub const REWATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Source name used in `PodUpdate.source` and `config.source`.
pub const SOURCE: &str = "file";

/// Largest manifest read, bytes; a larger file is refused (the API server's own request limit
/// is 3 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// What the last listing found in one file.
struct FileEntry {
    /// A hash of the file's content (to tell a change), or why it could not be read. The bytes
    /// themselves are not kept.
    content: Result<u64, String>,
    /// What this file defined the last time it decoded (kept while the file is broken).
    good: Option<Defined>,
    /// The error of the current content, if it is broken.
    error: Option<ManifestError>,
}

/// What one file defines: its ConfigMaps and Secrets, and its pod, shared with the snapshots
/// it is listed in so that listing the directory again copies no pod. The pod is stamped with
/// the time it was first listed ([`super::record_first_seen`]) when it is: a duplicate that
/// becomes its name's owner later is stamped then.
struct Defined {
    pod: Option<Arc<Pod>>,
    objects: Vec<(crate::objects::ObjectRef, crate::objects::Data)>,
}

impl Defined {
    /// `m`, keeping `prev`'s pod (and the time it was first listed) when the new decode is the
    /// same pod: same `config.hash`, namespace and name (an edit of a comment or of a ConfigMap
    /// beside it, or a broken file fixed back).
    fn new(m: Manifest, prev: Option<Defined>) -> Self {
        let same = |a: &Pod, b: &Pod| {
            crate::pod::config_hash(a) == crate::pod::config_hash(b)
                && a.metadata.namespace == b.metadata.namespace
                && a.metadata.name == b.metadata.name
        };
        let pod = match (m.pod, prev.and_then(|p| p.pod)) {
            (Some(new), Some(prev)) if same(&new, &prev) => Some(prev),
            (new, _) => new.map(Arc::new),
        };
        Self {
            pod,
            objects: m.objects,
        }
    }
}

/// A file written for longer than this without being closed is read anyway (its writer may have
/// died holding it open).
pub const MAX_WRITE: Duration = Duration::from_secs(10);

/// Reads the manifest directory into pods; keeps per-file state between listings.
pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    files: BTreeMap<PathBuf, FileEntry>,
    /// namespace/name → file that owns it.
    owners: HashMap<(String, String), PathBuf>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    checkpoints: Option<CheckpointStore>,
    missing_dir_reported: bool,
    /// Files inotify saw being written (true, since when) or finished (false).
    writes: HashMap<PathBuf, (bool, Instant)>,
    /// The last listing skipped a file still being written: list again once it settles.
    unsettled: bool,
    /// A listing has been returned (the next unchanged one may be skipped).
    listed: bool,
    clock: crate::clock::SharedClock,
    /// Where the files' ConfigMaps and Secrets go.
    objects: crate::objects::LocalObjects,
    /// Objects whose data changed since [`FileSource::take_changed_objects`] was last called.
    changed_objects: std::collections::BTreeSet<crate::objects::ObjectRef>,
    /// Entries of the manifest directory that are not manifests (subdirectories, dangling
    /// symlinks, FIFOs, sockets, devices), already reported (once each while they are there).
    skipped: HashSet<PathBuf>,
}

/// The reason a subdirectory of `staticPodPath` is counted under in
/// `nodelet_static_pod_manifest_errors_total`.
pub const SUBDIRECTORY: &str = "Subdirectory";
/// The reason (event and `nodelet_static_pod_manifest_errors_total`) for a symlink in
/// `staticPodPath` whose target does not exist.
pub const DANGLING_SYMLINK: &str = "DanglingSymlink";
/// The reason (event and `nodelet_static_pod_manifest_errors_total`) for a FIFO, socket or
/// device in `staticPodPath` (or a symlink to one).
pub const NOT_A_REGULAR_FILE: &str = "NotARegularFile";

/// Reads one manifest: `Ok(None)` when it is gone or not a regular file (directories, FIFOs,
/// devices are skipped, never opened), `Err` with a message when it cannot be read or exceeds
/// [`MAX_MANIFEST_BYTES`].
pub(crate) fn read_manifest(path: &Path) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(format!(
            "file is {} bytes, more than the {MAX_MANIFEST_BYTES} allowed",
            meta.len()
        ));
    }
    let mut buf = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    match std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut buf))
    {
        Ok(n) if n as u64 > MAX_MANIFEST_BYTES => Err(format!(
            "file is more than the {MAX_MANIFEST_BYTES} bytes allowed"
        )),
        Ok(_) => Ok(Some(buf)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl FileSource {
    /// A source over `dir` (a directory, or a single manifest file) for node `node_name`.
    /// With `checkpoints`, the last good version of each manifest survives agent restarts.
    pub fn new(
        dir: PathBuf,
        node_name: String,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        checkpoints: Option<CheckpointStore>,
    ) -> Self {
        let mut files = BTreeMap::new();
        for (path, bytes) in checkpoints.iter().flat_map(CheckpointStore::load) {
            if let Ok(m) = decode_manifest(&path, &bytes, &node_name) {
                let restored = Err("restored from checkpoint".to_owned());
                files.insert(
                    path,
                    FileEntry {
                        content: restored,
                        good: Some(Defined::new(m, None)),
                        error: None,
                    },
                );
            }
        }
        Self {
            dir,
            node_name,
            files,
            owners: HashMap::new(),
            recorder,
            metrics,
            checkpoints,
            missing_dir_reported: false,
            writes: HashMap::new(),
            unsettled: false,
            listed: false,
            clock: crate::clock::system(),
            objects: Default::default(),
            changed_objects: Default::default(),
            skipped: HashSet::new(),
        }
    }

    /// Reports a subdirectory of the manifest directory, once while it is there: kubelet does
    /// not read manifests in subdirectories ("Provided manifest path is a directory, not
    /// recursing into manifest path"), and neither does nodelet. A warning and a count in
    /// `nodelet_static_pod_manifest_errors_total{reason="Subdirectory"}`; no event (it is not
    /// a broken manifest).
    fn report_subdirectory(&mut self, path: &Path) {
        if self.skipped.insert(path.to_owned()) {
            tracing::warn!(path = %path.display(), "Provided manifest path is a directory, not recursing into manifest path");
            self.metrics.manifest_error(SUBDIRECTORY);
        }
    }

    /// Reports an entry of the manifest directory that is neither a manifest nor a
    /// subdirectory, once while it is there: a symlink whose target is gone (a pod it defined is
    /// removed, as kubelet removes it when its `stat` fails) or a FIFO, socket or device (never
    /// opened). A warning naming the entry, a Warning event on the file with reason
    /// [`DANGLING_SYMLINK`] or [`NOT_A_REGULAR_FILE`], and the count (kubelet logs these at
    /// every listing: "Could not get metadata", "Manifest path is not a directory or file").
    fn report_not_a_manifest(&mut self, path: &Path) {
        let Ok(link) = std::fs::symlink_metadata(path) else {
            return; // Removed since the listing.
        };
        let (reason, what) = match std::fs::metadata(path) {
            Err(e) if link.file_type().is_symlink() && e.kind() == std::io::ErrorKind::NotFound => {
                (
                    DANGLING_SYMLINK,
                    format!(
                        "is a symlink to {}, which does not exist; it defines no pod",
                        std::fs::read_link(path).unwrap_or_default().display()
                    ),
                )
            }
            Err(e) => (NOT_A_REGULAR_FILE, format!("cannot be read: {e}")),
            Ok(m) => {
                use std::os::unix::fs::FileTypeExt;
                let t = m.file_type();
                let kind = if t.is_fifo() {
                    "a FIFO"
                } else if t.is_socket() {
                    "a socket"
                } else if t.is_block_device() || t.is_char_device() {
                    "a device"
                } else {
                    return; // A regular file or a directory after all: the next listing reads it.
                };
                (
                    NOT_A_REGULAR_FILE,
                    format!("is {kind}, not a regular file; it is not read"),
                )
            }
        };
        if !self.skipped.insert(path.to_owned()) {
            return;
        }
        let message = format!("manifest {} {what}", path.display());
        tracing::warn!(file = %path.display(), reason, "{message}");
        self.recorder
            .warning(format!("file:{}", path.display()), reason, message);
        self.metrics.manifest_error(reason);
    }

    /// Publishes the files' ConfigMaps and Secrets into `objects`.
    pub fn with_objects(mut self, objects: crate::objects::LocalObjects) -> Self {
        self.objects = objects;
        self
    }

    /// The objects whose data changed (added, edited, removed) since the last call; the pods
    /// that reference them need a sync.
    pub fn take_changed_objects(
        &mut self,
    ) -> std::collections::BTreeSet<crate::objects::ObjectRef> {
        std::mem::take(&mut self.changed_objects)
    }

    /// Reads time (what "recently written" means) from `clock`.
    pub fn with_clock(mut self, clock: crate::clock::SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Notes what an inotify event says about writes: a create or a data write starts one, a
    /// close after writing, a rename or a removal ends it.
    pub fn observe(&mut self, ev: &notify::Event) {
        use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
        let writing = match ev.kind {
            // A directory made is not a file being written (and is never read).
            EventKind::Create(CreateKind::Folder) => return,
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Data(_)) => true,
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Remove(_) => false,
            _ => return,
        };
        let now = self.clock.now();
        for p in &ev.paths {
            // A symlink is made whole by one call: it is never being written (it would
            // otherwise wait for a close that never comes, up to MAX_WRITE).
            let writing =
                writing && !std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
            self.writes.insert(p.clone(), (writing, now));
        }
    }

    /// True (once) when the last listing left out a file that was still being written; the
    /// caller lists again after [`SETTLE`].
    pub fn take_unsettled(&mut self) -> bool {
        std::mem::take(&mut self.unsettled)
    }

    /// True while `path` is being written: inotify saw a write and no close since (for at most
    /// [`MAX_WRITE`]); or, with no event seen for it, it was modified less than [`SETTLE`] ago.
    fn being_written(&self, path: &Path) -> bool {
        match self.writes.get(path) {
            Some((writing, since)) => {
                *writing && self.clock.now().saturating_duration_since(*since) < MAX_WRITE
            }
            None => std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .is_some_and(|mtime| {
                    let now = Duration::from_nanos(self.clock.epoch_ns().max(0) as u64);
                    now.saturating_sub(mtime) < SETTLE
                }),
        }
    }

    fn report(&self, err: &ManifestError, file: &Path) {
        tracing::warn!(file = %file.display(), reason = err.reason(), error = %err, "static pod manifest refused");
        self.recorder.warning(
            format!("file:{}", file.display()),
            err.reason(),
            err.to_string(),
        );
        self.metrics.manifest_error(err.reason());
    }

    /// Warns (log and a Warning event `UnknownField` on the file) of the pod's fields that the
    /// v1 Pod API does not have: the pod runs without them, as kubelet's non-strict decoding
    /// runs it, but a misspelled field (`imagePullPolicyy`) is named rather than dropped
    /// silently. Called once per content of the file.
    fn report_unknown_fields(&self, fields: &[String], file: &Path) {
        if fields.is_empty() {
            return;
        }
        let list = fields.join(", ");
        tracing::warn!(file = %file.display(), fields = %list, "static pod manifest has fields the v1 Pod API does not have; they are ignored");
        self.recorder.warning(
            format!("file:{}", file.display()),
            "UnknownField",
            format!(
                "manifest {}: unknown field(s), ignored (misspelled?): {list}",
                file.display()
            ),
        );
    }

    /// True when the last listing could not read `staticPodPath`.
    pub fn dir_missing(&self) -> bool {
        self.missing_dir_reported
    }

    /// The candidate manifest paths: the file itself when `staticPodPath` is a file, else the
    /// directory's entries without dotfiles, sorted; none when the path does not exist (kubelet
    /// then sets no pods: removing the directory removes its pods). `None` when the path exists
    /// but cannot be read now (out of descriptors, a permission): nothing can be told of the
    /// files, so nothing changes (kubelet's file source keeps its pods on such an error too).
    fn candidates(&mut self) -> Option<Vec<PathBuf>> {
        if std::fs::metadata(&self.dir).is_ok_and(|m| m.is_file()) {
            self.missing_dir_reported = false;
            return Some(vec![self.dir.clone()]);
        }
        match std::fs::read_dir(&self.dir) {
            Ok(rd) => {
                self.missing_dir_reported = false;
                let mut paths: Vec<PathBuf> = rd
                    .filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .map(|e| e.path())
                    .collect();
                paths.sort();
                Some(paths)
            }
            Err(e) => {
                if !self.missing_dir_reported {
                    tracing::warn!(path = %self.dir.display(), error = %e, "cannot read staticPodPath; will retry");
                    self.missing_dir_reported = true;
                }
                (e.kind() == std::io::ErrorKind::NotFound).then(Vec::new)
            }
        }
    }

    /// Lists the directory and returns the pods it defines now, reporting new errors. A file
    /// still being written is neither read nor reported: its last state stands until it is
    /// complete (see [`FileSource::take_unsettled`]).
    pub fn list(&mut self) -> Vec<Arc<Pod>> {
        self.relist(true).unwrap_or_else(|| self.collect_pods())
    }

    /// [`FileSource::list`], or `None` when no file was added, removed or changed since the
    /// last listing: the periodic listing of an unchanged directory then costs a read of each
    /// file and no decoding, merging or comparing of pods.
    pub fn list_if_changed(&mut self) -> Option<Vec<Arc<Pod>>> {
        self.relist(false)
    }

    /// `None` also when the directory cannot be read now: the pods stand as they were.
    fn relist(&mut self, always: bool) -> Option<Vec<Arc<Pod>>> {
        let mut present: Vec<(PathBuf, Result<Vec<u8>, String>)> = Vec::new();
        let mut unread: Vec<PathBuf> = Vec::new();
        let candidates = self.candidates()?;
        // Sets, not scans: with a thousand files a scan per file would cost a million path
        // comparisons per listing.
        let listed: HashSet<&Path> = candidates.iter().map(PathBuf::as_path).collect();
        self.writes.retain(|p, _| listed.contains(p.as_path()));
        // An entry removed is reported again if it comes back; one that is a manifest again
        // (a symlink's target back) is reported again if it turns bad again.
        self.skipped.retain(|p| listed.contains(p.as_path()));
        drop(listed);
        for path in candidates {
            if self.being_written(&path) {
                // Its last state stands.
                self.unsettled = true;
                unread.push(path);
                continue;
            }
            match read_manifest(&path) {
                Ok(None) if path.is_dir() => self.report_subdirectory(&path),
                Ok(None) => self.report_not_a_manifest(&path),
                Ok(Some(bytes)) => {
                    self.skipped.remove(&path);
                    present.push((path, Ok(bytes)));
                }
                Err(msg) => present.push((path, Err(msg))),
            }
        }
        let kept: HashSet<&Path> = present
            .iter()
            .map(|(p, _)| p.as_path())
            .chain(unread.iter().map(PathBuf::as_path))
            .collect();
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !kept.contains(p.as_path()))
            .cloned()
            .collect();
        drop(kept);
        let mut changed = !gone.is_empty() || !self.listed;
        for p in gone {
            self.files.remove(&p);
            if let Some(cp) = &self.checkpoints {
                cp.remove(&p);
            }
        }
        for (path, content) in present {
            let digest = content
                .as_ref()
                .map(|b| crate::hash::fnv1a64(b))
                .map_err(Clone::clone);
            if self.files.get(&path).is_some_and(|f| f.content == digest) {
                continue;
            }
            changed = true;
            let result = match &content {
                Ok(bytes) => decode_manifest(&path, bytes, &self.node_name),
                Err(message) => Err(ManifestError::Read {
                    file: path.display().to_string(),
                    message: message.clone(),
                }),
            };
            let prev_good = self.files.remove(&path).and_then(|f| f.good);
            let entry = match result {
                Ok(m) => {
                    self.report_unknown_fields(&m.unknown_fields, &path);
                    if let (Some(cp), Ok(bytes)) = (&self.checkpoints, &content) {
                        if let Err(e) = cp.save(&path, bytes) {
                            tracing::warn!(file = %path.display(), error = %e, "cannot checkpoint manifest");
                        }
                    }
                    FileEntry {
                        content: digest,
                        good: Some(Defined::new(m, prev_good)),
                        error: None,
                    }
                }
                Err(err) => {
                    self.report(&err, &path);
                    if prev_good.is_some() {
                        tracing::warn!(file = %path.display(), "keeping the last good version of this pod until the manifest is fixed");
                    }
                    FileEntry {
                        content: digest,
                        good: prev_good,
                        error: Some(err),
                    }
                }
            };
            self.files.insert(path, entry);
        }
        if !changed && !always {
            return None;
        }
        self.listed = true;
        self.collect_objects();
        Some(self.collect_pods())
    }

    /// Publishes the objects of the current files, the first file (in name order) defining each
    /// winning; a later duplicate is reported.
    fn collect_objects(&mut self) {
        let mut objects = HashMap::new();
        let mut first: HashMap<crate::objects::ObjectRef, PathBuf> = HashMap::new();
        let mut duplicates = Vec::new();
        for (path, entry) in &self.files {
            for (r, data) in entry.good.iter().flat_map(|m| m.objects.iter()) {
                match first.get(r) {
                    Some(owner) => {
                        if entry.error.is_none() {
                            duplicates.push((
                                path.clone(),
                                ManifestError::DuplicateObject {
                                    file: path.display().to_string(),
                                    kind: r.kind.as_str(),
                                    namespace: r.namespace.clone(),
                                    name: r.name.clone(),
                                    first: owner.display().to_string(),
                                },
                            ));
                        }
                    }
                    None => {
                        first.insert(r.clone(), path.clone());
                        objects.insert(r.clone(), data.clone());
                    }
                }
            }
        }
        for (path, err) in duplicates {
            self.report(&err, &path);
            if let Some(e) = self.files.get_mut(&path) {
                e.error = Some(err);
            }
        }
        let changed = self.objects.replace(objects);
        self.changed_objects.extend(changed);
    }

    /// Pods from the current files, the first owner of each namespace/name winning.
    fn collect_pods(&mut self) -> Vec<Arc<Pod>> {
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
                .and_then(|m| m.pod.as_ref())
                .is_some_and(|p| key(p) == *k)
        });
        // Existing owners first, then new files in name order.
        let mut order: Vec<&PathBuf> = self.owners.values().collect();
        order.sort();
        let owning: HashSet<&PathBuf> = order.iter().copied().collect();
        let mut rest: Vec<&PathBuf> = self.files.keys().filter(|p| !owning.contains(p)).collect();
        order.append(&mut rest);
        let order: Vec<PathBuf> = order.into_iter().cloned().collect();

        let mut pods = Vec::new();
        let mut duplicates = Vec::new();
        let mut uids: HashMap<String, PathBuf> = HashMap::new();
        let mut seen = None;
        for path in order {
            let Some(entry) = self.files.get(&path) else {
                continue;
            };
            let Some(pod) = entry.good.as_ref().and_then(|m| m.pod.as_ref()) else {
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
                    let listed = self
                        .files
                        .get_mut(&path)
                        .and_then(|e| e.good.as_mut())
                        .and_then(|m| m.pod.as_mut());
                    if let Some(pod) = listed {
                        // Listed for the first time: only this source holds it yet, so the
                        // stamp copies nothing.
                        if super::first_seen(pod).is_none() {
                            let at = seen.get_or_insert_with(crate::pod::now_rfc3339);
                            super::record_first_seen(Arc::make_mut(pod), at);
                        }
                        pods.push(pod.clone());
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn source(dir: &Path) -> FileSource {
        FileSource::new(
            dir.to_owned(),
            "n1".into(),
            Recorder::default(),
            Metrics::new(),
            None,
        )
        .with_clock(an_hour_later())
    }

    /// A clock an hour ahead of the files' times: every file written by a test is settled.
    fn an_hour_later() -> crate::clock::SharedClock {
        use crate::clock::Clock;
        let c = crate::clock::FakeClock::new(crate::clock::SystemClock.epoch_ns());
        c.advance(Duration::from_secs(3600));
        c.shared()
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec: {containers: [{name: c, image: busybox}]}\n";

    /// A directory that cannot be read for a while (here a symlink loop stands in for running
    /// out of descriptors) changes nothing: the pods stay. A directory that is gone removes
    /// them, as kubelet's file source does.
    #[test]
    fn an_unreadable_directory_keeps_its_pods_and_a_missing_one_removes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("manifests");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        let mut s = source(&dir);
        assert_eq!(s.list().len(), 1);
        std::fs::rename(&dir, tmp.path().join("aside")).unwrap();
        std::os::unix::fs::symlink(&dir, &dir).unwrap();
        assert!(std::fs::read_dir(&dir).is_err());
        assert_eq!(s.list().len(), 1, "an unreadable directory removes nothing");
        assert_eq!(s.list_if_changed(), None, "nor changes anything");
        assert!(s.dir_missing(), "and is reported");
        std::fs::remove_file(&dir).unwrap();
        assert!(s.list().is_empty(), "a directory that is gone has no pods");
    }

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
    fn a_subdirectory_is_not_read_and_is_reported_once_while_it_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("nested");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("x.yaml"), POD.replace("NAME", "x")).unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        let mut s = source(dir.path());
        let count = |s: &FileSource| {
            s.metrics
                .encode()
                .lines()
                .find(|l| {
                    l.starts_with(
                        "nodelet_static_pod_manifest_errors_total{reason=\"Subdirectory\"}",
                    )
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let pods = s.list();
        assert_eq!(
            pods.len(),
            1,
            "only a.yaml: nothing below the directory is read"
        );
        for _ in 0..3 {
            s.list();
        }
        assert_eq!(count(&s), 1.0, "once per directory, not per listing");
        assert!(s.recorder.list().is_empty(), "not a broken manifest");
        std::fs::remove_dir_all(&sub).unwrap();
        s.list();
        std::fs::create_dir(&sub).unwrap();
        s.list();
        assert_eq!(count(&s), 2.0, "reported again when it comes back");
    }

    /// The manifest of pod `name` in a directory of its own (kept while the guard lives), for a
    /// symlink in the manifest directory to point at.
    fn manifest_elsewhere(name: &str) -> (tempfile::TempDir, PathBuf) {
        let target = tempfile::tempdir().unwrap();
        let real = target.path().join(format!("{name}.yaml"));
        std::fs::write(&real, POD.replace("NAME", name)).unwrap();
        (target, real)
    }

    #[test]
    fn dangling_symlinks_and_special_files_are_reported_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let (_target, real) = manifest_elsewhere("web");
        std::os::unix::fs::symlink(&real, dir.path().join("web.yaml")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/x.yaml", dir.path().join("gone.yaml")).unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("fifo.yaml"),
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        let mut s = source(dir.path());
        assert_eq!(s.list().len(), 1, "the symlinked manifest defines its pod");
        s.list();
        let events = s.recorder.list();
        let reasons: Vec<_> = events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [NOT_A_REGULAR_FILE, DANGLING_SYMLINK],
            "once each, in name order: {events:?}"
        );
        assert!(
            events[0].message.contains("fifo.yaml is a FIFO"),
            "{events:?}"
        );
        assert!(
            events[1]
                .message
                .contains("gone.yaml is a symlink to /nonexistent/x.yaml"),
            "{events:?}"
        );
        // The target of a running pod's symlink is deleted: the pod goes, and that is said.
        std::fs::remove_file(&real).unwrap();
        assert!(s.list().is_empty());
        let events = s.recorder.list();
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(
            events[2].message.contains("web.yaml is a symlink to"),
            "{events:?}"
        );
        // Back: the pod again, and reported again should it break again.
        std::fs::write(&real, POD.replace("NAME", "web")).unwrap();
        assert_eq!(s.list().len(), 1);
        std::fs::remove_file(&real).unwrap();
        s.list();
        assert_eq!(s.recorder.list().len(), 4);
    }

    #[test]
    fn a_symlink_made_in_the_directory_is_never_taken_for_a_file_being_written() {
        let dir = tempfile::tempdir().unwrap();
        let (_target, real) = manifest_elsewhere("web");
        let mut s = source(dir.path());
        let link = dir.path().join("web.yaml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let create = notify::Event::new(EventKind::Create(notify::event::CreateKind::File))
            .add_path(link.clone());
        s.observe(&create);
        assert_eq!(s.list().len(), 1, "read at once, not after MAX_WRITE");
        assert!(!s.take_unsettled());
        // A regular file created and not yet closed still waits.
        let file = dir.path().join("new.yaml");
        std::fs::write(&file, POD.replace("NAME", "new")).unwrap();
        s.observe(
            &notify::Event::new(EventKind::Create(notify::event::CreateKind::File)).add_path(file),
        );
        assert_eq!(s.list().len(), 1);
        assert!(s.take_unsettled());
    }

    #[test]
    fn an_unchanged_directory_is_not_merged_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = source(dir.path());
        assert_eq!(
            s.list_if_changed().map(|p| p.len()),
            Some(0),
            "the first listing"
        );
        assert!(s.list_if_changed().is_none(), "nothing changed");
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        assert_eq!(s.list_if_changed().map(|p| p.len()), Some(1), "a file came");
        assert!(s.list_if_changed().is_none());
        let (first, again) = (s.list(), s.list());
        assert_eq!(again.len(), 1, "list() always answers");
        assert!(
            Arc::ptr_eq(&first[0], &again[0]),
            "a listing shares the decoded pod, it does not copy it"
        );
        assert!(super::super::first_seen(&again[0]).is_some_and(|t| t.ends_with('Z')));
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        assert_eq!(s.list_if_changed().map(|p| p.len()), Some(0), "a file went");
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
    fn an_unknown_field_is_warned_of_once_and_the_pod_runs() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        let typo = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: busybox, imagee: x}]}\n";
        std::fs::write(&f, typo).unwrap();
        let mut s = source(dir.path());
        assert_eq!(s.list().len(), 1, "the pod runs");
        assert_eq!(s.list().len(), 1);
        let ev = s.recorder.list();
        assert_eq!(ev.len(), 1, "once per content: {ev:?}");
        assert_eq!(ev[0].reason, "UnknownField");
        assert!(
            ev[0].message.contains("a.yaml") && ev[0].message.contains("spec.containers[0].imagee"),
            "{}",
            ev[0].message
        );
        std::fs::write(&f, POD.replace("NAME", "a")).unwrap();
        assert_eq!(s.list().len(), 1);
        assert_eq!(s.recorder.list().len(), 1, "a fixed file draws no warning");
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
        // The duplicate is stamped as first seen only once it is listed, when b.yaml goes.
        let stored = |s: &FileSource, f: &str| {
            s.files[&dir.path().join(f)]
                .good
                .as_ref()
                .and_then(|m| m.pod.clone())
                .unwrap()
        };
        assert!(super::super::first_seen(&stored(&s, "a.yaml")).is_none());
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        let pods = s.list();
        assert!(Arc::ptr_eq(&pods[0], &stored(&s, "a.yaml")));
        assert!(super::super::first_seen(&pods[0]).is_some());
    }

    #[test]
    fn an_edit_that_leaves_the_pod_as_it_was_keeps_the_listed_pod() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, POD.replace("NAME", "a")).unwrap();
        let mut s = source(dir.path());
        let first = s.list();
        std::fs::write(&file, format!("# a comment\n{}", POD.replace("NAME", "a"))).unwrap();
        let again = s.list();
        assert!(Arc::ptr_eq(&first[0], &again[0]), "the same pod, held once");
        std::fs::write(&file, POD.replace("NAME", "a").replace("busybox", "nginx")).unwrap();
        let edited = s.list();
        assert!(!Arc::ptr_eq(&first[0], &edited[0]), "a new spec, a new pod");
    }

    #[test]
    fn files_hold_config_maps_and_secrets_beside_a_pod() {
        use crate::objects::{LocalObjects, ObjectKind};
        let dir = tempfile::tempdir().unwrap();
        let cm = |v: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg}}\ndata: {{k: {v}}}\n")
        };
        std::fs::write(
            dir.path().join("a.yaml"),
            format!("{}---\n{}", cm("one"), POD.replace("NAME", "a")),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("s.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata: {name: db, namespace: ns}\ndata: {password: czNjcmV0}\nstringData: {user: admin}\n",
        )
        .unwrap();
        let objects = LocalObjects::default();
        let mut s = source(dir.path()).with_objects(objects.clone());
        assert_eq!(s.list().len(), 1, "the pod of a.yaml");
        assert_eq!(objects.len(), 2);
        let secret = objects.get(ObjectKind::Secret, "ns", "db").unwrap();
        assert_eq!(secret["password"], b"s3cret", "data is base64-decoded");
        assert_eq!(secret["user"], b"admin", "stringData merged");
        assert_eq!(s.take_changed_objects().len(), 2);
        // An edit of the ConfigMap alone changes that object, not the pod.
        std::fs::write(
            dir.path().join("a.yaml"),
            format!("{}---\n{}", cm("two"), POD.replace("NAME", "a")),
        )
        .unwrap();
        let uid = s.list()[0].metadata.uid.clone();
        let changed: Vec<String> = s
            .take_changed_objects()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(changed, ["cfg"]);
        assert_eq!(
            objects
                .get(ObjectKind::ConfigMap, "default", "cfg")
                .unwrap()["k"],
            b"two"
        );
        // A second definition of the same ConfigMap in a later file is reported; the first stays.
        std::fs::write(dir.path().join("b.yaml"), cm("three")).unwrap();
        assert_eq!(s.list()[0].metadata.uid, uid);
        assert_eq!(
            objects
                .get(ObjectKind::ConfigMap, "default", "cfg")
                .unwrap()["k"],
            b"two"
        );
        assert!(s.take_changed_objects().is_empty());
        let ev = s.recorder.list();
        assert_eq!(ev.last().unwrap().reason, "DuplicateObject");
        // A Secret that is not base64 is refused naming the key, never the value.
        std::fs::write(
            dir.path().join("s.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata: {name: db, namespace: ns}\ndata: {password: 'not base64!'}\n",
        )
        .unwrap();
        s.list();
        let ev = s.recorder.list();
        let last = ev.last().unwrap();
        assert!(last.message.contains("data.password"), "{}", last.message);
        assert!(!last.message.contains("not base64!"), "{}", last.message);
        assert!(
            objects.get(ObjectKind::Secret, "ns", "db").is_some(),
            "the last good one stays"
        );
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
    fn unreadable_and_special_files_are_handled() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("big.yaml"),
            vec![b'#'; MAX_MANIFEST_BYTES as usize + 1],
        )
        .unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.path().join("dangling.yaml")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut s = source(dir.path());
        assert!(s.list().is_empty());
        let ev = s.recorder.list();
        let reasons: Vec<_> = ev.iter().map(|e| e.reason.as_str()).collect();
        // Each named (the subdirectory only logged and counted); the device never opened.
        assert_eq!(
            reasons,
            [DANGLING_SYMLINK, NOT_A_REGULAR_FILE, "ReadError"],
            "{:?}",
            ev.iter().map(|e| &e.message).collect::<Vec<_>>()
        );
        assert!(ev[1].message.contains("zero.yaml is a device"));
        assert!(ev[2].message.contains("big.yaml") && ev[2].message.contains("bytes"));
    }

    #[test]
    fn a_single_file_can_be_the_static_pod_path() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("only.yaml");
        std::fs::write(&f, POD.replace("NAME", "solo")).unwrap();
        let mut s = source(&f);
        assert_eq!(s.list()[0].metadata.name.as_deref(), Some("solo-n1"));
    }

    #[test]
    fn the_last_good_pod_survives_a_restart_through_its_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let cp = dir.path().join("cp");
        let m = dir.path().join("m");
        std::fs::create_dir(&m).unwrap();
        std::fs::write(m.join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        let new = |m: &Path| {
            FileSource::new(
                m.to_owned(),
                "n1".into(),
                Recorder::default(),
                Metrics::new(),
                Some(CheckpointStore::new(cp.clone())),
            )
            .with_clock(an_hour_later())
        };
        let uid = new(&m).list()[0].metadata.uid.clone();
        std::fs::write(m.join("a.yaml"), "broken: [").unwrap();
        // A new agent: the file is broken, the checkpoint keeps the pod.
        let mut s = new(&m);
        let pods = s.list();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].metadata.uid, uid);
        assert_eq!(s.recorder.list()[0].reason, "DecodeError");
        // Removing the file removes the pod and its checkpoint.
        std::fs::remove_file(m.join("a.yaml")).unwrap();
        assert!(s.list().is_empty());
        assert!(new(&m).list().is_empty());
    }

    #[test]
    fn a_missing_directory_yields_no_pods() {
        let mut s = source(Path::new("/nonexistent/nodelet-test"));
        assert!(s.list().is_empty());
    }

    /// A file still being written is neither read nor reported: not while inotify saw no close
    /// after its writes, nor (with no event seen) while it changed less than SETTLE ago.
    #[test]
    fn a_file_still_being_written_is_not_read_nor_reported() {
        use crate::clock::Clock;
        let tmp = tempfile::tempdir().unwrap();
        let clock = crate::clock::FakeClock::new(crate::clock::SystemClock.epoch_ns());
        let mut s = source(tmp.path()).with_clock(clock.shared());
        let half = tmp.path().join("half.yaml");
        std::fs::write(&half, "").unwrap();
        let ev = |kind, p: &Path| notify::Event::new(kind).add_path(p.to_owned());
        s.observe(&ev(
            EventKind::Create(notify::event::CreateKind::File),
            &half,
        ));
        assert!(s.list().is_empty());
        assert!(s.recorder.list().is_empty(), "not reported while written");
        assert!(s.take_unsettled() && !s.take_unsettled());
        std::fs::write(&half, POD.replace("NAME", "half")).unwrap();
        s.observe(&ev(
            EventKind::Access(notify::event::AccessKind::Close(
                notify::event::AccessMode::Write,
            )),
            &half,
        ));
        assert_eq!(s.list().len(), 1, "read once closed");
        // No event at all (the copy's events not read yet): a file changed less than SETTLE
        // ago waits; then a broken one is reported.
        let fresh = tmp.path().join("fresh.yaml");
        std::fs::write(&fresh, "").unwrap();
        assert_eq!(s.list().len(), 1);
        assert!(s.recorder.list().is_empty());
        assert!(s.take_unsettled());
        // The file's mtime is real time, a little after the fake clock's start: past SETTLE
        // with a margin.
        clock.advance(SETTLE * 5);
        assert_eq!(s.list().len(), 1);
        assert_eq!(s.recorder.list()[0].reason, "EmptyManifest");
        // A writer that never closes is read after MAX_WRITE.
        let stuck = tmp.path().join("stuck.yaml");
        std::fs::write(&stuck, POD.replace("NAME", "stuck")).unwrap();
        s.observe(&ev(
            EventKind::Modify(notify::event::ModifyKind::Data(
                notify::event::DataChange::Any,
            )),
            &stuck,
        ));
        assert_eq!(s.list().len(), 1);
        clock.advance(MAX_WRITE);
        assert_eq!(s.list().len(), 2);
    }
}
