//! Pods failed without running, and kept so until their manifest changes: evicted pods
//! (kubelet's eviction) and pods refused at admission (kubelet's `rejectPod`).
//!
//! [`FailedPods`] records, by UID, why a pod failed and the manifest version
//! (`kubernetes.io/config.hash`) it failed with. Reads never change it. The deciders mark a pod
//! (the sync loop for admission, the eviction manager for evictions) and the pod's worker turns
//! the mark into the pod's status ([`Failure::status`]); the sync loop forgets a pod whose
//! manifest changed or went. With [`FailedPods::persistent`] the record survives a restart of the
//! agent, as a Failed pod does in kubelet's API server: it is written to a JSON file by a thread
//! of its own, so no caller waits on the disk.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::pod::{config_hash, pod_uid};

/// The reason on an evicted pod (kubelet's `Evicted`).
pub const EVICTED: &str = "Evicted";

/// Why a pod failed without running: kubelet's status reason and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// `Evicted`, `OutOfpods`, `NodePorts`, ...
    #[serde(default = "evicted")]
    pub reason: String,
    /// The status message.
    pub message: String,
}

fn evicted() -> String {
    EVICTED.into()
}

impl Failure {
    /// A failure with `reason` and `message`.
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// The pod's status: phase Failed with this reason and message (see [`failed_status`]).
    pub fn status(&self, pod: &Pod) -> PodStatus {
        failed_status(pod, &self.reason, &self.message)
    }
}

/// The status of a pod failed before or instead of running (kubelet's eviction status and
/// `rejectPod`): phase Failed, `reason`, `message`, the QoS class, and a Ready condition that is
/// False with the same reason.
pub fn failed_status(pod: &Pod, reason: &str, message: &str) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(reason.into()),
        message: Some(message.to_owned()),
        qos_class: Some(crate::qos::pod_qos_class(pod).as_str().into()),
        conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some(reason.into()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    config_hash: Option<String>,
    #[serde(flatten)]
    failure: Failure,
}

/// Failed pods by UID. Cheap to clone; shared by the sync loop, the pod workers and the eviction
/// manager.
#[derive(Clone, Default)]
pub struct FailedPods {
    pods: Arc<Mutex<HashMap<String, Entry>>>,
    /// Wakes the writer thread (persistent records only); a full slot already means "write".
    dirty: Option<crossbeam_channel::Sender<()>>,
    /// The file of a persistent record.
    path: Option<Arc<PathBuf>>,
}

fn hash_of(pod: &Pod) -> Option<String> {
    Some(config_hash(pod))
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

impl FailedPods {
    /// A record kept in the JSON file `path` (a map UID → hash, reason and message), loaded now.
    /// A missing or unreadable file starts empty (logged). Each change is written by the thread
    /// `failed-pods-writer`, which replaces the file atomically and exits with the last clone.
    pub fn persistent(path: PathBuf) -> Self {
        let pods: HashMap<String, Entry> = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                warn!(path = %path.display(), error = %e, "cannot parse failed pods record; starting empty");
                HashMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read failed pods record; starting empty");
                HashMap::new()
            }
        };
        let pods = Arc::new(Mutex::new(pods));
        let path = Arc::new(path);
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let (weak, file) = (Arc::downgrade(&pods), path.clone());
        let spawned = std::thread::Builder::new()
            .name("failed-pods-writer".into())
            .spawn(move || {
                for () in rx {
                    let Some(pods) = weak.upgrade() else { return };
                    let snapshot = pods.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    drop(pods);
                    save(&file, &snapshot);
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the failed pods writer; the record is kept in memory only");
        }
        Self {
            pods,
            dirty: Some(tx),
            path: Some(path),
        }
    }

    /// Writes a persistent record now, on the caller's thread (the agent, as it stops).
    pub fn flush(&self) {
        if let Some(path) = &self.path {
            let snapshot = self.pods.lock().unwrap_or_else(|e| e.into_inner()).clone();
            save(path, &snapshot);
        }
    }

    fn changed(&self) {
        if let Some(tx) = &self.dirty {
            let _ = tx.try_send(());
        }
    }

    /// Marks the pod failed with `failure` for its current manifest version.
    pub fn mark(&self, pod: &Pod, failure: Failure) {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).insert(
            pod_uid(pod).to_owned(),
            Entry {
                config_hash: hash_of(pod),
                failure,
            },
        );
        self.changed();
    }

    /// Why the pod failed, when it did with this very manifest version; `None` for a pod never
    /// marked or marked with another version of its manifest.
    pub fn failure(&self, pod: &Pod) -> Option<Failure> {
        let m = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        m.get(pod_uid(pod))
            .filter(|e| e.config_hash == hash_of(pod))
            .map(|e| e.failure.clone())
    }

    /// True when the UID is marked, whatever its manifest.
    pub fn contains(&self, uid: &str) -> bool {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
    }

    /// Forgets every pod for which `keep` is false (housekeeping: pods no source wants).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut m = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let before = m.len();
        m.retain(|uid, _| keep(uid));
        let changed = m.len() != before;
        drop(m);
        if changed {
            self.changed();
        }
    }

    /// Forgets the pod (its manifest changed or was removed).
    pub fn forget(&self, uid: &str) {
        let removed = self
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid)
            .is_some();
        if removed {
            self.changed();
        }
    }
}

fn save(path: &std::path::Path, pods: &HashMap<String, Entry>) {
    let tmp = path.with_extension("json.tmp");
    let r = serde_json::to_vec(pods)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        warn!(path = %path.display(), error = %e, "cannot save failed pods record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pods::versioned as pod;

    #[test]
    fn a_failed_pod_stays_failed_until_its_manifest_changes_and_reads_change_nothing() {
        let e = FailedPods::default();
        e.mark(
            &pod("u", "h1"),
            Failure::new(EVICTED, "The node was low on resource: memory."),
        );
        assert!(e.failure(&pod("u", "h1")).is_some());
        assert!(e.failure(&pod("other", "h1")).is_none());
        assert!(e.failure(&pod("u", "h2")).is_none(), "a new manifest runs");
        assert!(e.contains("u"), "reading does not forget");
        e.forget("u");
        assert!(!e.contains("u"));
        let s = Failure::new(EVICTED, "m").status(&pod("u", "h1"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref()),
            (Some("Failed"), Some("Evicted"))
        );
    }

    fn wait_for(path: &std::path::Path, want: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !std::fs::read_to_string(path).is_ok_and(|t| want(&t)) {
            assert!(
                std::time::Instant::now() < deadline,
                "record not written: {:?}",
                std::fs::read_to_string(path)
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_record_survives_a_restart_and_is_written_off_the_callers_thread() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("evicted-pods.json");
        let e = FailedPods::persistent(path.clone());
        e.mark(&pod("u", "h1"), Failure::new(EVICTED, "low"));
        e.mark(&pod("v", "h1"), Failure::new("NodePorts", "taken"));
        e.forget("v");
        wait_for(&path, |t| t.contains("\"u\"") && !t.contains("\"v\""));
        e.flush();
        let again = FailedPods::persistent(path.clone());
        assert_eq!(
            again.failure(&pod("u", "h1")),
            Some(Failure::new(EVICTED, "low"))
        );
        assert!(!again.contains("v"));
        // Files of their own: the first record's writer may still be writing its file.
        // A record written before reasons were kept reads as an eviction.
        let older = tmp.path().join("older.json");
        std::fs::write(&older, r#"{"w":{"config_hash":"h1","message":"old"}}"#).unwrap();
        let old = FailedPods::persistent(older);
        assert_eq!(old.failure(&pod("w", "h1")).unwrap().reason, "Evicted");
        let broken = tmp.path().join("broken.json");
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&broken, &whole[..whole.len() - 2]).unwrap();
        assert!(
            !FailedPods::persistent(broken).contains("u"),
            "a truncated file starts empty"
        );
    }
}
