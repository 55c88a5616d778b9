//! Status manager (kubelet's `status_manager.go`): the latest status of every pod the agent
//! handles, written by pod workers after each sync and read by the server (`GET /pods`).

pub mod failed;
pub mod generate;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// Pods by UID, each with its latest status.
type Store = HashMap<String, (Arc<Pod>, PodStatus)>;

/// Latest known pods with their statuses, by UID.
#[derive(Clone, Default)]
pub struct StatusManager {
    inner: Arc<RwLock<Store>>,
}

impl StatusManager {
    /// Records `status` as the pod's latest status.
    pub fn set(&self, pod: Arc<Pod>, status: PodStatus) {
        let uid = crate::pod::pod_uid(&pod).to_owned();
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid, (pod, status));
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// UIDs of every pod with a status.
    pub fn uids(&self) -> Vec<String> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// The pod's status, if known.
    pub fn get(&self, uid: &str) -> Option<PodStatus> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .map(|(_, s)| s.clone())
    }

    /// The pod's phase, if known (without copying its status).
    pub fn phase(&self, uid: &str) -> Option<String> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .and_then(|(_, s)| s.phase.clone())
    }

    /// All pods with `status` filled in, sorted by namespace and name.
    pub fn pods(&self) -> Vec<Pod> {
        self.pods_where(|_| true)
    }

    /// The pods `keep` accepts, with `status` filled in, sorted by namespace and name; the
    /// others are not copied.
    pub fn pods_where(&self, keep: impl Fn(&Pod) -> bool) -> Vec<Pod> {
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut pods: Vec<Pod> = map
            .values()
            .filter(|(p, _)| keep(p))
            .map(|(p, s)| {
                let mut p = (**p).clone();
                p.status = Some(s.clone());
                p
            })
            .collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods
    }

    /// Containers (init containers included) by state: `running`, `exited`, and `created` (a
    /// container exists but has not run), without copying the pods.
    pub fn container_state_counts(&self) -> [(&'static str, i64); 3] {
        let mut counts = [("running", 0), ("exited", 0), ("created", 0)];
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        for (_, s) in map.values() {
            for c in s
                .container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
            {
                let state = c.state.as_ref();
                let i = if state.is_some_and(|s| s.running.is_some()) {
                    0
                } else if state.is_some_and(|s| s.terminated.is_some()) {
                    1
                } else if c.container_id.is_some() {
                    2
                } else {
                    continue;
                };
                counts[i].1 += 1;
            }
        }
        counts
    }

    /// Pods whose phase is not terminal (Failed, Succeeded): the pods eviction may pick.
    pub fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|(_, s)| !matches!(s.phase.as_deref(), Some("Failed" | "Succeeded")))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Number of pods whose phase is Running.
    pub fn running_pods(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|(_, s)| s.phase.as_deref() == Some("Running"))
            .count()
    }
}
