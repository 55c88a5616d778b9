//! Status manager (kubelet's `status_manager.go`): the latest status of every pod the agent
//! handles, written by pod workers when a pod's first sync begins and after each sync, and read
//! by the server (`GET /pods`).

pub mod failed;
pub mod generate;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Pods by UID, each with its latest status, and what the agent's gauges count of them, kept
/// as statuses are written and removed (so that writing one costs the same at 300 pods as at
/// one; counting every pod at each write made a burst of starts quadratic).
#[derive(Default)]
struct Store {
    pods: HashMap<String, (Arc<Pod>, PodStatus)>,
    tally: Tally,
}

/// Counts over the statuses held: pods in phase Running, and containers (init containers
/// included) by state, in the order of [`StatusManager::container_state_counts`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    running_pods: i64,
    containers: [i64; 3],
}

impl Tally {
    /// What one pod's status adds to the counts.
    fn of(s: &PodStatus) -> Self {
        let mut t = Self {
            running_pods: i64::from(s.phase.as_deref() == Some("Running")),
            containers: [0; 3],
        };
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
            t.containers[i] += 1;
        }
        t
    }

    /// Adds `other` (`sign` 1) or takes it away (`sign` -1).
    fn apply(&mut self, other: Self, sign: i64) {
        self.running_pods += sign * other.running_pods;
        for (a, b) in self.containers.iter_mut().zip(other.containers) {
            *a += sign * b;
        }
    }
}

/// What a new status keeps of the one before it, as kubelet's status manager
/// (`updateStatusInternal`): each condition's `lastTransitionTime` while its status is unchanged,
/// `now` (seconds) when it changes or is new; the pod's `startTime` once set; and, for the same
/// spec (`same_spec`: the pod was not edited since), a terminal phase (Succeeded, Failed) is
/// never left for a non-terminal one.
pub fn carry_over(old: Option<&PodStatus>, new: &mut PodStatus, now: Time, same_spec: bool) {
    for c in new.conditions.iter_mut().flatten() {
        let before = old
            .and_then(|o| o.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match before {
            Some(b) if b.status == c.status => b.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
    }
    let Some(old) = old else { return };
    let terminal = |p: Option<&str>| matches!(p, Some("Succeeded" | "Failed"));
    if same_spec && terminal(old.phase.as_deref()) && !terminal(new.phase.as_deref()) {
        new.phase = old.phase.clone();
    }
    if new.start_time.is_none() {
        new.start_time = old.start_time.clone();
    }
}

/// Latest known pods with their statuses, by UID.
#[derive(Clone, Default)]
pub struct StatusManager {
    inner: Arc<RwLock<Store>>,
}

impl StatusManager {
    /// Records `status` as the pod's latest status, with kubelet's rules against the one held
    /// before ([`carry_over`]).
    pub fn set(&self, pod: Arc<Pod>, mut status: PodStatus) {
        let uid = crate::pod::pod_uid(&pod).to_owned();
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let now = crate::pod::api_time(crate::clock::wall_now());
        let old = map.pods.get(&uid);
        // A pod edited since (its UID is kept across edits) is admitted and run anew: its old
        // terminal phase (refused at admission, say) is not its fate.
        let same_spec =
            old.is_some_and(|(p, _)| crate::pod::config_hash(p) == crate::pod::config_hash(&pod));
        carry_over(old.map(|(_, s)| s), &mut status, now, same_spec);
        let added = Tally::of(&status);
        if let Some((_, before)) = map.pods.insert(uid, (pod, status)) {
            map.tally.apply(Tally::of(&before), -1);
        }
        map.tally.apply(added, 1);
    }

    /// Marks the pod as being deleted with `grace` seconds (its `metadata.deletionTimestamp`,
    /// now, and `deletionGracePeriodSeconds`), as the API shows a pod whose deletion is under
    /// way, so that `/pods` and `nodelet get` show it `Terminating` until it is gone. A pod
    /// without a status, or one already marked, is left as it is.
    pub fn mark_terminating(&self, uid: &str, grace: i64) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let Some((pod, _)) = map.pods.get_mut(uid) else {
            return;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let mut marked = (**pod).clone();
        marked.metadata.deletion_timestamp = Some(crate::pod::api_time(crate::clock::wall_now()));
        marked.metadata.deletion_grace_period_seconds = Some(grace);
        *pod = Arc::new(marked);
    }

    /// True when the pod has a status (its first sync has begun).
    pub fn has(&self, uid: &str) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .contains_key(uid)
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, before)) = map.pods.remove(uid) {
            map.tally.apply(Tally::of(&before), -1);
        }
    }

    /// UIDs of every pod with a status.
    pub fn uids(&self) -> Vec<String> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .keys()
            .cloned()
            .collect()
    }

    /// The pod's status, if known.
    pub fn get(&self, uid: &str) -> Option<PodStatus> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .get(uid)
            .map(|(_, s)| s.clone())
    }

    /// The pod's phase, if known (without copying its status).
    pub fn phase(&self, uid: &str) -> Option<String> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
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
            .pods
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
        let t = self.inner.read().unwrap_or_else(|e| e.into_inner()).tally;
        [
            ("running", t.containers[0]),
            ("exited", t.containers[1]),
            ("created", t.containers[2]),
        ]
    }

    /// Pods whose phase is not terminal (Failed, Succeeded): the pods eviction may pick.
    pub fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .values()
            .filter(|(_, s)| !matches!(s.phase.as_deref(), Some("Failed" | "Succeeded")))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Number of pods whose phase is Running.
    pub fn running_pods(&self) -> usize {
        let t = self.inner.read().unwrap_or_else(|e| e.into_inner()).tally;
        usize::try_from(t.running_pods).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn status(phase: &str, ready: bool) -> PodStatus {
        let cond = |type_: &str, ok: bool| PodCondition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            ..Default::default()
        };
        PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![cond("PodScheduled", true), cond("Ready", ready)]),
            ..Default::default()
        }
    }

    fn transition(s: &PodStatus, type_: &str) -> Option<Time> {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .and_then(|c| c.last_transition_time.clone())
    }

    #[test]
    fn a_pod_marked_terminating_carries_its_deletion_until_it_is_gone() {
        let m = StatusManager::default();
        let mut p = Pod::default();
        p.metadata.uid = Some("u".into());
        m.mark_terminating("u", 30);
        assert!(m.pods().is_empty(), "a pod without a status is not made up");
        m.set(Arc::new(p), status("Running", true));
        m.mark_terminating("u", 30);
        let listed = &m.pods()[0];
        let first = listed.metadata.deletion_timestamp.clone();
        assert!(first.is_some());
        assert_eq!(listed.metadata.deletion_grace_period_seconds, Some(30));
        assert_eq!(
            m.phase("u").as_deref(),
            Some("Running"),
            "its status stands"
        );
        m.mark_terminating("u", 5);
        assert_eq!(
            m.pods()[0].metadata.deletion_grace_period_seconds,
            Some(30),
            "marked once"
        );
        m.remove("u");
        assert!(m.pods().is_empty());
    }

    #[test]
    fn the_counts_follow_each_status_written_and_removed() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
        };
        let pod = |uid: &str| {
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.into());
            Arc::new(p)
        };
        let container = |state: Option<ContainerState>, id: Option<&str>| ContainerStatus {
            state,
            container_id: id.map(Into::into),
            ..Default::default()
        };
        let running = || ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let exited = || ContainerState {
            terminated: Some(ContainerStateTerminated::default()),
            ..Default::default()
        };
        let with = |phase: &str, cs: Vec<ContainerStatus>, init: Vec<ContainerStatus>| {
            let mut s = status(phase, false);
            s.container_statuses = Some(cs);
            s.init_container_statuses = Some(init);
            s
        };
        let m = StatusManager::default();
        let counts =
            |m: &StatusManager| (m.running_pods(), m.container_state_counts().map(|c| c.1));
        assert_eq!(counts(&m), (0, [0, 0, 0]));
        m.set(
            pod("a"),
            with(
                "Pending",
                vec![container(None, Some("c1")), container(None, None)],
                vec![],
            ),
        );
        assert_eq!(
            counts(&m),
            (0, [0, 0, 1]),
            "created; no ID yet is not counted"
        );
        m.set(
            pod("a"),
            with(
                "Running",
                vec![container(Some(running()), Some("c1"))],
                vec![container(Some(exited()), Some("i1"))],
            ),
        );
        m.set(
            pod("b"),
            with(
                "Running",
                vec![container(Some(running()), Some("c2"))],
                vec![],
            ),
        );
        assert_eq!(counts(&m), (2, [2, 1, 0]), "the first status of a replaced");
        m.remove("a");
        m.remove("a");
        assert_eq!(counts(&m), (1, [1, 0, 0]), "removed once");
        m.remove("b");
        assert_eq!(counts(&m), (0, [0, 0, 0]));
    }

    #[test]
    fn transition_times_change_only_with_the_condition() {
        let mut first = status("Pending", false);
        carry_over(None, &mut first, t(100), true);
        assert_eq!(transition(&first, "Ready"), Some(t(100)));
        let mut same = status("Running", false);
        carry_over(Some(&first), &mut same, t(105), true);
        assert_eq!(transition(&same, "Ready"), Some(t(100)), "unchanged");
        let mut ready = status("Running", true);
        carry_over(Some(&same), &mut ready, t(110), true);
        assert_eq!(transition(&ready, "Ready"), Some(t(110)), "became True");
        assert_eq!(transition(&ready, "PodScheduled"), Some(t(100)));
    }

    #[test]
    fn a_terminal_phase_is_kept_and_the_start_time_too() {
        let mut done = status("Succeeded", false);
        done.start_time = Some(t(50));
        let mut later = status("Pending", false);
        carry_over(Some(&done), &mut later, t(60), true);
        assert_eq!(later.phase.as_deref(), Some("Succeeded"));
        assert_eq!(later.start_time, Some(t(50)));
        let mut edited = status("Running", true);
        carry_over(Some(&done), &mut edited, t(65), false);
        assert_eq!(
            edited.phase.as_deref(),
            Some("Running"),
            "an edited pod (refused, then fixed) runs anew"
        );
        let mut failed = status("Failed", false);
        carry_over(Some(&status("Running", true)), &mut failed, t(70), true);
        assert_eq!(
            failed.phase.as_deref(),
            Some("Failed"),
            "a pod may become terminal"
        );
    }
}
