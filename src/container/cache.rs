//! The pod cache (kubelet's `kubecontainer.Cache`): the latest runtime status of each pod with
//! the time it was read, so that a pod worker never acts on a status older than its last sync.
//!
//! Writers: the PLEG (for pods whose containers changed) and the pod workers (each fresh read).
//! [`PodCache::get_newer_than`] answers only with a status read at or after the given time; the
//! PLEG's [`PodCache::update_time`] marks every entry fresh as of a relist that saw no change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::RuntimePodStatus;

#[derive(Default)]
struct Inner {
    pods: HashMap<String, (Arc<RuntimePodStatus>, Instant)>,
    /// Time of the last relist: every pod without a newer entry is unchanged since then.
    global: Option<Instant>,
}

/// Latest runtime status per pod UID. Cheap to clone.
#[derive(Clone, Default)]
pub struct PodCache(Arc<Mutex<Inner>>);

impl PodCache {
    /// Records `status` of `uid` as read at `at`; an older write never replaces a newer one.
    pub fn set(&self, uid: &str, status: RuntimePodStatus, at: Instant) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.pods.get(uid).is_some_and(|(_, t)| *t > at) {
            return;
        }
        g.pods.insert(uid.to_owned(), (Arc::new(status), at));
    }

    /// Marks every entry as current at `at` (a relist found no other change).
    pub fn update_time(&self, at: Instant) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.global.is_none_or(|t| t < at) {
            g.global = Some(at);
        }
    }

    /// The status of `uid` if it is known to be current at or after `t`: read at or after `t`,
    /// or unchanged as of a relist at or after `t`.
    pub fn get_newer_than(&self, uid: &str, t: Instant) -> Option<Arc<RuntimePodStatus>> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (status, at) = g.pods.get(uid)?;
        let fresh = *at >= t || g.global.is_some_and(|gt| gt >= t && gt >= *at);
        fresh.then(|| status.clone())
    }

    /// The latest status of `uid`, however old.
    pub fn latest(&self, uid: &str) -> Option<Arc<RuntimePodStatus>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .get(uid)
            .map(|(s, _)| s.clone())
    }

    /// Forgets a pod.
    pub fn delete(&self, uid: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn answers_only_with_statuses_newer_than_asked() {
        let c = PodCache::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        assert!(c.get_newer_than("a", t0).is_none());
        c.set("a", RuntimePodStatus::default(), t1);
        assert!(c.get_newer_than("a", t0).is_some());
        assert!(c.get_newer_than("a", t2).is_none(), "read before t2");
        c.update_time(t2);
        assert!(
            c.get_newer_than("a", t2).is_some(),
            "a relist at t2 saw no change"
        );
        // An older write does not replace a newer one.
        let mut newer = RuntimePodStatus::default();
        newer.sandboxes.push(Default::default());
        c.set("a", newer, t2);
        c.set("a", RuntimePodStatus::default(), t1);
        assert_eq!(c.get_newer_than("a", t2).unwrap().sandboxes.len(), 1);
        c.delete("a");
        assert!(c.get_newer_than("a", t0).is_none());
    }
}
