//! The latest result of each probe worker (kubelet's `prober/results.Manager`), keyed by pod,
//! container name and probe kind, and tied to the container instance (ID) it was measured on,
//! so that a restarted container never inherits its predecessor's result.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::ProbeKind;

/// Read access to probe results, for status generation and the runtime manager.
pub trait ProbeView: Send + Sync {
    /// The result of probe `kind` of container `container` (its instance `container_id`) of pod
    /// `uid`: `Some(true)` success, `Some(false)` failure, `None` when there is none yet (or it
    /// belongs to another instance).
    fn result(
        &self,
        uid: &str,
        container: &str,
        container_id: &str,
        kind: ProbeKind,
    ) -> Option<bool>;
}

/// No probes at all: every lookup is `None` (tests, and `nodelet plan`).
pub struct NoProbes;

impl ProbeView for NoProbes {
    fn result(&self, _: &str, _: &str, _: &str, _: ProbeKind) -> Option<bool> {
        None
    }
}

type PodResults = HashMap<(String, ProbeKind), (String, bool)>;

/// The results, shared by the workers (writers) and their readers. Cheap to clone.
#[derive(Clone, Default)]
pub struct ProbeResults(Arc<RwLock<HashMap<String, PodResults>>>);

impl ProbeResults {
    /// Records `success` for the probe of `kind` on `container` (instance `container_id`) of pod
    /// `uid`. Returns true when that changed the result (kubelet sends an update only then).
    pub fn set(
        &self,
        uid: &str,
        container: &str,
        container_id: &str,
        kind: ProbeKind,
        success: bool,
    ) -> bool {
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        let pod = all.entry(uid.to_owned()).or_default();
        let new = (container_id.to_owned(), success);
        pod.insert((container.to_owned(), kind), new.clone()) != Some(new)
    }

    /// Forgets the result of one worker (its container changed and has no result yet).
    pub fn clear(&self, uid: &str, container: &str, kind: ProbeKind) {
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        if let Some(pod) = all.get_mut(uid) {
            pod.remove(&(container.to_owned(), kind));
        }
    }

    /// Forgets every result of pod `uid`.
    pub fn remove_pod(&self, uid: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// Pods with results (for tests and leak checks).
    pub fn pods(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl ProbeView for ProbeResults {
    fn result(
        &self,
        uid: &str,
        container: &str,
        container_id: &str,
        kind: ProbeKind,
    ) -> Option<bool> {
        let all = self.0.read().unwrap_or_else(|e| e.into_inner());
        let (id, v) = all.get(uid)?.get(&(container.to_owned(), kind))?;
        (id == container_id).then_some(*v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_belongs_to_one_container_instance_and_changes_are_reported_once() {
        let r = ProbeResults::default();
        assert!(r.set("u", "c", "id1", ProbeKind::Readiness, true));
        assert!(
            !r.set("u", "c", "id1", ProbeKind::Readiness, true),
            "unchanged"
        );
        assert_eq!(r.result("u", "c", "id1", ProbeKind::Readiness), Some(true));
        assert_eq!(
            r.result("u", "c", "id2", ProbeKind::Readiness),
            None,
            "a new instance"
        );
        assert_eq!(r.result("u", "c", "id1", ProbeKind::Liveness), None);
        assert!(
            r.set("u", "c", "id2", ProbeKind::Readiness, true),
            "new instance"
        );
        r.remove_pod("u");
        assert_eq!(r.pods(), 0);
    }
}
