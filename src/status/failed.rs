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

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
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
    /// The pod also gets a `DisruptionTarget` condition (reason `TerminationByKubelet`, the
    /// message as its message): an eviction for node pressure (kubelet's eviction manager adds
    /// it there, not for local storage limits, a deadline or an admission refusal).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disruption_target: bool,
    /// The pod ran and the node stopped it (an eviction, its active deadline), as opposed to
    /// one refused before it ran: its containers' last states belong in its status
    /// ([`Failure::terminal_status`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ran: bool,
}

/// The condition type kubelet adds to a pod it evicts for node pressure.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason.
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";
/// The state of a container the runtime no longer holds when its pod ends (kubelet's
/// `TerminatePod`): terminated with this reason, [`CONTAINER_STATUS_UNKNOWN_MESSAGE`] and exit
/// code 137.
pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
/// Its message.
pub const CONTAINER_STATUS_UNKNOWN_MESSAGE: &str =
    "The container could not be located when the pod was terminated";

fn evicted() -> String {
    EVICTED.into()
}

impl Failure {
    /// A failure with `reason` and `message`.
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
            disruption_target: false,
            ran: false,
        }
    }

    /// The same failure of a pod that ran (see [`Failure::ran`]).
    pub fn of_running_pod(mut self) -> Self {
        self.ran = true;
        self
    }

    /// The same failure with a `DisruptionTarget` condition (a node-pressure eviction).
    pub fn with_disruption_target(mut self) -> Self {
        self.disruption_target = true;
        self
    }

    /// The status of a pod refused before it ran: phase Failed with this reason and message
    /// (see [`failed_status`]).
    pub fn status(&self, pod: &Pod) -> PodStatus {
        let mut s = failed_status(pod, &self.reason, &self.message);
        self.add_disruption_target(&mut s);
        s
    }

    fn add_disruption_target(&self, s: &mut PodStatus) {
        if self.disruption_target {
            s.conditions
                .get_or_insert_with(Vec::new)
                .push(PodCondition {
                    type_: DISRUPTION_TARGET.into(),
                    status: "True".into(),
                    reason: Some(TERMINATION_BY_KUBELET.into()),
                    message: Some(self.message.clone()),
                    ..Default::default()
                });
        }
    }

    /// The last status of a pod that ran and was failed by the node (evicted, past its active
    /// deadline, over its local storage limits), from `ran`: the status generated from the
    /// runtime's view after its containers were stopped (kubelet's `generateAPIPodStatus` with
    /// the eviction's status function, then the status manager's `TerminatePod`):
    ///
    /// - phase Failed with this reason and message; `ContainersReady` and `Ready` False with
    ///   reason `PodFailed`; the `DisruptionTarget` condition of a node-pressure eviction;
    /// - each container keeps its state (a killed one: terminated, its exit code and reason;
    ///   one still running while its kill is under way: running);
    /// - a container left waiting (the runtime no longer holds it, after an agent restart or a
    ///   removal by hand) becomes terminated `ContainerStatusUnknown`, exit code 137: every app
    ///   container once the pod had initialized, and the init containers up to the last one
    ///   that ever started.
    pub fn terminal_status(&self, pod: &Pod, ran: PodStatus) -> PodStatus {
        let mut s = ran;
        s.phase = Some("Failed".into());
        s.reason = Some(self.reason.clone());
        s.message = Some(self.message.clone());
        for c in s.conditions.iter_mut().flatten() {
            if c.type_ == "Ready" || c.type_ == "ContainersReady" {
                c.status = "False".into();
                c.reason = Some("PodFailed".into());
                c.message = None;
            }
        }
        s.conditions
            .get_or_insert_with(Vec::new)
            .retain(|c| c.type_ != DISRUPTION_TARGET);
        self.add_disruption_target(&mut s);
        let initialized = has_pod_initialized(pod, &s);
        if initialized {
            s.container_statuses
                .iter_mut()
                .flatten()
                .for_each(mark_unknown_if_waiting);
        }
        if let Some(init) = s.init_container_statuses.as_mut() {
            let started = init
                .iter()
                .rposition(|c| waiting(c).is_none() || last_terminated(c).is_some())
                .map_or(1, |i| i + 1);
            init.iter_mut()
                .take(started)
                .for_each(mark_unknown_if_waiting);
        }
        s
    }
}

fn waiting(c: &ContainerStatus) -> Option<&ContainerStateWaiting> {
    c.state.as_ref()?.waiting.as_ref()
}

fn last_terminated(c: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    c.last_state.as_ref()?.terminated.as_ref()
}

fn mark_unknown_if_waiting(c: &mut ContainerStatus) {
    if c.state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some() || s.running.is_some())
    {
        return;
    }
    c.state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(CONTAINER_STATUS_UNKNOWN.into()),
            message: Some(CONTAINER_STATUS_UNKNOWN_MESSAGE.into()),
            exit_code: 137,
            ..Default::default()
        }),
        ..Default::default()
    });
    c.ready = false;
    c.started = Some(false);
}

/// kubelet's `hasPodInitialized` (status manager): a pod without init containers; or one whose
/// app container ever left waiting; or whose last init container completed with exit code 0
/// (a sidecar: runs and has started).
fn has_pod_initialized(pod: &Pod, s: &PodStatus) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let inits = spec.init_containers.as_deref().unwrap_or(&[]);
    if inits.is_empty() {
        return true;
    }
    if s.container_statuses
        .iter()
        .flatten()
        .any(|c| last_terminated(c).is_some() || waiting(c).is_none())
    {
        return true;
    }
    let Some(last) = s.init_container_statuses.as_ref().and_then(|l| l.last()) else {
        return false;
    };
    let Some(spec) = inits.iter().find(|c| c.name == last.name) else {
        return false;
    };
    if spec.restart_policy.as_deref() == Some("Always") {
        return last.state.as_ref().is_some_and(|s| s.running.is_some())
            && last.started == Some(true);
    }
    let zero = |t: Option<&ContainerStateTerminated>| t.is_some_and(|t| t.exit_code == 0);
    zero(last_terminated(last)) || zero(last.state.as_ref().and_then(|s| s.terminated.as_ref()))
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
        conditions: Some(vec![PodCondition {
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
    /// Kept in memory only: the record of a persistent [`FailedPods`] leaves it out, so the
    /// pod runs again after the agent restarts (a pod stopped for the node's shutdown).
    #[serde(skip)]
    until_restart: bool,
}

/// Bound of the channel of [`FailPod`] requests (eviction manager and node shutdown → sync loop).
/// Both senders are threads of their own that send one pod at a time and then wait for it to
/// stop, so the bound is never reached in practice; a full channel makes the sender wait (never
/// a tokio thread).
pub const FAIL_REQUESTS_CAPACITY: usize = 64;

/// A request to fail a running pod, sent to the sync loop, the one writer of [`FailedPods`]: the
/// loop marks the pod and hands its worker the kill (kubelet's eviction manager and node shutdown
/// manager call `killPodFunc`, which goes through the pod workers the same way).
#[derive(Debug, Clone)]
pub struct FailPod {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Why it fails: its Failed status's reason and message.
    pub failure: Failure,
    /// Grace period override, seconds; `None`: the pod's own.
    pub grace: Option<i64>,
    /// Marked only until the agent restarts ([`FailedPods::mark_until_restart`]: node shutdown).
    pub until_restart: bool,
}

/// Failed pods by UID. Cheap to clone. Written by the sync loop alone (admission refusals,
/// [`FailPod`] requests, forgetting pods no source wants); read by the pod workers, admission and
/// the eviction manager.
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
        self.insert(pod, failure, false);
    }

    /// [`FailedPods::mark`] until the agent restarts: the record on disk leaves it out (a pod
    /// stopped for the node's shutdown runs again when the node is back).
    pub fn mark_until_restart(&self, pod: &Pod, failure: Failure) {
        self.insert(pod, failure, true);
    }

    fn insert(&self, pod: &Pod, failure: Failure, until_restart: bool) {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).insert(
            pod_uid(pod).to_owned(),
            Entry {
                config_hash: hash_of(pod),
                failure,
                until_restart,
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
    let kept: HashMap<&String, &Entry> = pods.iter().filter(|(_, e)| !e.until_restart).collect();
    let r = serde_json::to_vec(&kept)
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

    #[test]
    fn a_terminated_pod_keeps_its_states_and_what_is_gone_is_container_status_unknown() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {initContainers: [{name: i1, image: x}, {name: i2, image: x}], containers: [{name: a, image: x}, {name: b, image: x}]}",
        )
        .unwrap();
        let st = |name: &str, state: &str| -> ContainerStatus {
            serde_json::from_value(serde_json::json!({"name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": serde_json::from_str::<serde_json::Value>(state).unwrap()})).unwrap()
        };
        let waiting = r#"{"waiting": {"reason": "PodInitializing"}}"#;
        let f = Failure::new(EVICTED, "low").of_running_pod();
        // Initialized (i2 completed): a's kill state stays, b (gone) is unknown; i1 and i2 keep
        // their states.
        let ran = PodStatus {
            init_container_statuses: Some(vec![
                st(
                    "i1",
                    r#"{"terminated": {"exitCode": 0, "reason": "Completed"}}"#,
                ),
                st(
                    "i2",
                    r#"{"terminated": {"exitCode": 0, "reason": "Completed"}}"#,
                ),
            ]),
            container_statuses: Some(vec![
                st(
                    "a",
                    r#"{"terminated": {"exitCode": 143, "reason": "Error"}}"#,
                ),
                st("b", r#"{"waiting": {"reason": "ContainerCreating"}}"#),
            ]),
            ..Default::default()
        };
        let s = f.terminal_status(&p, ran);
        let term = |l: &Option<Vec<ContainerStatus>>, i: usize| {
            let t = l.as_ref().unwrap()[i]
                .state
                .clone()
                .unwrap()
                .terminated
                .unwrap();
            (t.exit_code, t.reason.unwrap())
        };
        assert_eq!(term(&s.container_statuses, 0), (143, "Error".into()));
        assert_eq!(
            term(&s.container_statuses, 1),
            (137, CONTAINER_STATUS_UNKNOWN.into())
        );
        assert_eq!(term(&s.init_container_statuses, 1), (0, "Completed".into()));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        // Not initialized (everything waiting): the app containers stay waiting, and only the
        // first init container is taken as started.
        let ran = PodStatus {
            init_container_statuses: Some(vec![st("i1", waiting), st("i2", waiting)]),
            container_statuses: Some(vec![st("a", waiting), st("b", waiting)]),
            ..Default::default()
        };
        let s = f.terminal_status(&p, ran);
        assert_eq!(
            term(&s.init_container_statuses, 0),
            (137, CONTAINER_STATUS_UNKNOWN.into())
        );
        for (l, i) in [(&s.init_container_statuses, 1), (&s.container_statuses, 0)] {
            assert!(l.as_ref().unwrap()[i]
                .state
                .as_ref()
                .unwrap()
                .waiting
                .is_some());
        }
        // No DisruptionTarget unless asked; a pressure eviction has one.
        assert!(!s
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == DISRUPTION_TARGET));
        let s = f
            .clone()
            .with_disruption_target()
            .terminal_status(&p, PodStatus::default());
        assert!(s
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == DISRUPTION_TARGET
                && c.reason.as_deref() == Some(TERMINATION_BY_KUBELET)));
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
        e.mark_until_restart(&pod("s", "h1"), Failure::new("Terminated", "shutdown"));
        assert!(e.contains("s"));
        e.forget("v");
        wait_for(&path, |t| t.contains("\"u\"") && !t.contains("\"v\""));
        e.flush();
        let again = FailedPods::persistent(path.clone());
        assert_eq!(
            again.failure(&pod("u", "h1")),
            Some(Failure::new(EVICTED, "low"))
        );
        assert!(!again.contains("v"));
        assert!(!again.contains("s"), "a mark until restart is not on disk");
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
