//! Eviction manager (kubelet's `pkg/kubelet/eviction`): reclaims memory, disk and pids by failing
//! pods before the kernel has to.
//!
//! - [`threshold`]: `evictionHard` / `evictionSoft` parsing with kubelet's rules.
//! - [`signals`]: the signals, read from cgroup files, `/proc` and `statvfs`.
//! - [`state`]: thresholds and node conditions over time (grace, transition, minimum reclaim).
//! - [`rank`]: where eviction ranks pods.
//! - [`notifier`]: kernel memory threshold notifications (cgroup v1 eventfd + epoll; PSI on v2).
//! - [`manager`]: the loop that ties them together and kills one pod per pass.
//! - [`admission`]: pods refused while the node is under pressure.
//! - [`provider`]: the agent's side: signals from this node, pods, kills through the pod workers.
//!
//! This module also holds what the rest of the agent shares with the manager: [`EvictedPods`]
//! (pods that stay Failed/Evicted until their manifest changes) and [`NodePressure`] (conditions,
//! signals and recent evictions, served on `/node`).

pub mod admission;
pub mod manager;
pub mod notifier;
pub mod provider;
pub mod rank;
pub mod signals;
pub mod state;
pub mod threshold;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::Serialize;

/// The reason on a pod failed by eviction or refused at admission (kubelet's `Evicted`).
pub const REASON: &str = "Evicted";

/// The node conditions eviction drives, in the order they are reported.
pub const CONDITIONS: [&str; 3] = ["MemoryPressure", "DiskPressure", "PIDPressure"];

/// How many recent evictions [`NodePressure`] keeps.
const RECENT_EVICTIONS: usize = 32;

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Evicted {
    config_hash: Option<String>,
    /// `Evicted`, or an admission reason such as `NodePorts` (records written before reasons
    /// were kept are evictions).
    #[serde(default = "evicted_reason")]
    reason: String,
    message: String,
}

fn evicted_reason() -> String {
    REASON.into()
}

/// Why a pod was failed without running: kubelet's status reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `Evicted`, `OutOfpods`, `NodePorts`, ...
    pub reason: String,
    /// The status message.
    pub message: String,
}

impl Failure {
    /// The pod's status: phase Failed with this reason and message (see [`failed_status`]).
    pub fn status(&self, pod: &Pod) -> PodStatus {
        failed_status(pod, &self.reason, &self.message)
    }
}

#[derive(Default)]
struct EvictedInner {
    pods: HashMap<String, Evicted>,
    /// Where the record is kept across restarts (`<root-dir>/evicted-pods.json`), if anywhere.
    path: Option<PathBuf>,
}

/// Pods failed by eviction or refused at admission, by UID, with the manifest hash
/// (`kubernetes.io/config.hash`) they were failed with. Such a pod is not started again until its
/// manifest changes (a new hash) or is removed. Cheap to clone; shared by the sync loop, the pod
/// workers and the eviction manager. With [`EvictedPods::persistent`] the record survives a
/// restart of the agent, as a Failed pod does in kubelet's API server.
#[derive(Clone, Default)]
pub struct EvictedPods(Arc<Mutex<EvictedInner>>);

fn config_hash(pod: &Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(crate::pod::CONFIG_HASH_ANNOTATION)
        .cloned()
}

impl EvictedPods {
    /// A record kept in the JSON file `path` (a map UID → hash and message), loaded now. A
    /// missing or unreadable file starts empty (logged); writes replace it atomically.
    pub fn persistent(path: PathBuf) -> Self {
        let pods = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "cannot parse evicted pods record; starting empty");
                HashMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read evicted pods record; starting empty");
                HashMap::new()
            }
        };
        Self(Arc::new(Mutex::new(EvictedInner {
            pods,
            path: Some(path),
        })))
    }

    fn save(inner: &EvictedInner) {
        let Some(path) = &inner.path else { return };
        let tmp = path.with_extension("json.tmp");
        let r = serde_json::to_vec(&inner.pods)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = r {
            tracing::warn!(path = %path.display(), error = %e, "cannot save evicted pods record");
        }
    }

    /// Marks the pod failed with `message` (its status becomes Failed/Evicted).
    pub fn mark(&self, pod: &Pod, message: String) {
        self.mark_failed(pod, REASON, message);
    }

    /// Marks the pod failed with `reason` and `message` (an admission refusal: `NodePorts`, ...).
    pub fn mark_failed(&self, pod: &Pod, reason: &str, message: String) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.pods.insert(
            crate::pod::pod_uid(pod).to_owned(),
            Evicted {
                config_hash: config_hash(pod),
                reason: reason.to_owned(),
                message,
            },
        );
        Self::save(&m);
    }

    /// The message the pod was failed with, when it was and its manifest is unchanged. A pod
    /// whose manifest changed is forgotten here (it may run again) and gets `None`.
    pub fn message(&self, pod: &Pod) -> Option<String> {
        self.failure(pod).map(|f| f.message)
    }

    /// Why the pod was failed, when it was and its manifest is unchanged; as
    /// [`EvictedPods::message`].
    pub fn failure(&self, pod: &Pod) -> Option<Failure> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let uid = crate::pod::pod_uid(pod);
        let e = m.pods.get(uid)?;
        if e.config_hash == config_hash(pod) {
            return Some(Failure {
                reason: e.reason.clone(),
                message: e.message.clone(),
            });
        }
        m.pods.remove(uid);
        Self::save(&m);
        None
    }

    /// True when the UID is marked, whatever its manifest.
    pub fn contains(&self, uid: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .contains_key(uid)
    }

    /// Forgets every pod for which `keep` is false (housekeeping: pods no source wants).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let before = m.pods.len();
        m.pods.retain(|uid, _| keep(uid));
        if m.pods.len() != before {
            Self::save(&m);
        }
    }

    /// Forgets the pod (its manifest was removed).
    pub fn forget(&self, uid: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.pods.remove(uid).is_some() {
            Self::save(&m);
        }
    }
}

/// The status of a pod failed by eviction or refused at admission (kubelet's eviction
/// `PodStatus`): phase Failed, reason Evicted, the message, the QoS class, and a Ready condition
/// that is False.
pub fn evicted_status(pod: &Pod, message: &str) -> PodStatus {
    failed_status(pod, REASON, message)
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

/// One signal as last observed, for `/node`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SignalView {
    /// Available, bytes (memory, disk), inodes or pids.
    pub available: i64,
    /// Capacity the percentages refer to, same unit.
    pub capacity: i64,
}

/// One eviction, for `/node` and the benchmarks.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRecord {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// The signal whose threshold was met.
    pub signal: String,
    /// The status message.
    pub message: String,
    /// Grace period of the kill, seconds.
    pub grace_seconds: i64,
    /// When the kernel notification that started this pass arrived (Unix time, nanoseconds);
    /// absent when the pass was the periodic check.
    pub notified_at_unix_nanos: Option<i64>,
    /// When the kill was handed to the pod worker (Unix time, nanoseconds).
    pub kill_issued_at_unix_nanos: i64,
}

/// What `/node` shows: node conditions, the latest signals and recent evictions.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PressureView {
    /// `MemoryPressure`, `DiskPressure`, `PIDPressure` → true while in force.
    pub conditions: BTreeMap<String, bool>,
    /// Signal name → latest observation.
    pub signals: BTreeMap<String, SignalView>,
    /// Thresholds configured, `signal<value` (hard) or `signal<value for grace` (soft).
    pub thresholds: Vec<String>,
    /// The latest evictions, oldest first.
    pub evictions: VecDeque<EvictionRecord>,
}

/// Node pressure as the eviction manager last saw it. Cheap to clone; read by admission and the
/// server, written by the manager.
#[derive(Clone, Default)]
pub struct NodePressure(Arc<RwLock<PressureView>>);

impl NodePressure {
    /// True while `condition` (`MemoryPressure`...) is in force.
    pub fn has(&self, condition: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .conditions
            .get(condition)
            .copied()
            .unwrap_or(false)
    }

    /// A copy of the whole view.
    pub fn view(&self) -> PressureView {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the conditions and signals (the manager, after each pass).
    pub fn update(
        &self,
        conditions: BTreeMap<String, bool>,
        signals: BTreeMap<String, SignalView>,
    ) {
        let mut v = self.0.write().unwrap_or_else(|e| e.into_inner());
        v.conditions = conditions;
        v.signals = signals;
    }

    /// Sets the configured thresholds shown.
    pub fn set_thresholds(&self, thresholds: Vec<String>) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).thresholds = thresholds;
    }

    /// Records an eviction, keeping the latest few.
    pub fn record(&self, r: EvictionRecord) {
        let mut v = self.0.write().unwrap_or_else(|e| e.into_inner());
        if v.evictions.len() == RECENT_EVICTIONS {
            v.evictions.pop_front();
        }
        v.evictions.push_back(r);
    }
}

/// True for a pod eviction never picks: priority ≥ 2000000000 (priorityClassName
/// `system-node-critical` or `system-cluster-critical`, or `spec.priority`), a mirror pod, or —
/// with `static_pods_are_critical` (kubelet's rule, `IsCriticalPod`) — any static pod.
pub fn is_critical(pod: &Pod, static_pods_are_critical: bool) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let has = |k: &str| annotations.is_some_and(|a| a.contains_key(k));
    crate::qos::pod_priority(pod) >= crate::qos::SYSTEM_CRITICAL_PRIORITY
        || has(crate::pod::CONFIG_MIRROR_ANNOTATION)
        || (static_pods_are_critical
            && annotations
                .and_then(|a| a.get(crate::pod::CONFIG_SOURCE_ANNOTATION))
                .is_some_and(|s| s != "api"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, hash: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.annotations = Some(
            [(
                crate::pod::CONFIG_HASH_ANNOTATION.to_string(),
                hash.to_string(),
            )]
            .into(),
        );
        p
    }

    #[test]
    fn an_evicted_pod_stays_evicted_until_its_manifest_changes() {
        let e = EvictedPods::default();
        e.mark(
            &pod("u", "h1"),
            "The node was low on resource: memory.".into(),
        );
        assert!(e.message(&pod("u", "h1")).is_some());
        assert!(e.message(&pod("other", "h1")).is_none());
        assert!(e.message(&pod("u", "h2")).is_none(), "a new manifest runs");
        assert!(!e.contains("u"));
        let s = evicted_status(&pod("u", "h1"), "m");
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref()),
            (Some("Failed"), Some("Evicted"))
        );
    }

    #[test]
    fn the_record_survives_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("evicted-pods.json");
        let e = EvictedPods::persistent(path.clone());
        e.mark(&pod("u", "h1"), "low".into());
        e.mark(&pod("v", "h1"), "low".into());
        e.forget("v");
        let again = EvictedPods::persistent(path.clone());
        assert_eq!(again.message(&pod("u", "h1")).as_deref(), Some("low"));
        assert!(!again.contains("v"));
        std::fs::write(&path, "not json").unwrap();
        assert!(
            !EvictedPods::persistent(path).contains("u"),
            "a broken file starts empty"
        );
    }

    #[test]
    fn critical_pods_by_priority_mirror_or_the_static_rule() {
        let mut p = pod("u", "h");
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(crate::pod::CONFIG_SOURCE_ANNOTATION.into(), "file".into());
        assert!(!is_critical(&p, false));
        assert!(is_critical(&p, true), "kubelet's rule: every static pod");
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            priority_class_name: Some("system-cluster-critical".into()),
            ..Default::default()
        });
        assert!(is_critical(&p, false));
        let mut m = pod("m", "h");
        m.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(crate::pod::CONFIG_MIRROR_ANNOTATION.into(), "h".into());
        assert!(is_critical(&m, false));
    }
}
