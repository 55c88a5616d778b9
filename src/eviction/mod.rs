//! Eviction manager (kubelet's `pkg/kubelet/eviction`): reclaims memory, disk and pids by failing
//! pods before the kernel has to.
//!
//! - [`threshold`]: `evictionHard` / `evictionSoft` parsing with kubelet's rules.
//! - [`signals`]: the signals, read from cgroup files, `/proc` and `statvfs`.
//! - [`state`]: thresholds and node conditions over time (grace, transition, minimum reclaim).
//! - [`rank`]: where eviction ranks pods.
//! - [`notifier`]: kernel memory threshold notifications (cgroup v1 eventfd + epoll; PSI on v2).
//! - [`local_storage`]: pods over their `ephemeral-storage` limits.
//! - [`manager`]: the loop that ties them together and kills one pod per pass.
//! - [`admission`]: pods refused while the node is under pressure.
//! - [`provider`]: the agent's side: signals from this node, pods, kills through the pod workers.
//!
//! This module also holds what the rest of the agent shares with the manager: [`NodePressure`]
//! (conditions, signals and recent evictions, served on `/node`). Evicted pods are recorded in
//! [`crate::status::failed::FailedPods`], and stay Failed/Evicted until their manifest changes.

pub mod admission;
pub mod local_storage;
pub mod manager;
pub mod notifier;
pub mod provider;
pub mod rank;
pub mod signals;
pub mod state;
pub mod threshold;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

/// The reason on a pod failed by eviction or refused under pressure (kubelet's `Evicted`).
pub const REASON: &str = crate::status::failed::EVICTED;

/// The node conditions eviction drives, in the order they are reported.
pub const CONDITIONS: [&str; 3] = ["MemoryPressure", "DiskPressure", "PIDPressure"];

/// How many recent evictions [`NodePressure`] keeps.
const RECENT_EVICTIONS: usize = 32;

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
    /// The latest reclaims of node-level resources under disk pressure, oldest first.
    pub reclaims: VecDeque<ReclaimRecord>,
}

/// A reclaim of node-level resources before eviction (kubelet's `reclaimNodeLevelResources`),
/// as `/node` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimRecord {
    /// The disk signal whose threshold was met.
    pub signal: String,
    /// What was freed (dead containers, images, bytes).
    pub reclaimed: String,
    /// Whether the threshold was resolved by it (no pod evicted for it in that pass).
    pub resolved: bool,
    /// Available amount of the signal after the reclaim (bytes or inodes).
    pub available_after: i64,
    /// When (Unix time, nanoseconds).
    pub at_unix_nanos: i64,
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

    /// Records a reclaim of node-level resources, keeping the latest few.
    pub fn record_reclaim(&self, r: ReclaimRecord) {
        let mut v = self.0.write().unwrap_or_else(|e| e.into_inner());
        if v.reclaims.len() == RECENT_EVICTIONS {
            v.reclaims.pop_front();
        }
        v.reclaims.push_back(r);
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
        || (static_pods_are_critical && crate::pod::is_static_pod(pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pods::versioned as pod;

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
