//! Housekeeping (kubelet's `HandlePodCleanups`): every 2 s, once every source has reported, the
//! sync loop hands over the desired pods, and a pass, run off the sync-loop thread, kills the
//! pods the runtime runs that no source wants, removes pod cgroups, pod directories and pod log
//! directories that no desired, running or terminating pod owns ([`crate::gc::OrphanedDirs`]),
//! and tells the garbage collector which pods exist
//! ([`crate::gc::GarbageCollector::set_existing`]).
//!
//! A pass costs no CRI call while the PLEG has listed the runtime: it takes the runtime's pods
//! from the PLEG's last relist ([`Pleg::runtime_pods`](crate::pleg::Pleg::runtime_pods)), which
//! containerd's events keep current (kubelet reads its runtime cache, refreshed by a listing at
//! most every 2 s). The cgroup hierarchies and the pod directories are read only when the pods
//! in use changed since the last read, an orphaned cgroup awaits a retry, or
//! [`ORPHAN_SCAN_PERIOD`] has passed; with nothing changing, a pass touches no file.
//!
//! At most one pass runs at a time; a tick that comes while one runs is skipped. Each pass is
//! timed in `kubelet_housekeeping_duration_seconds`, and one that takes over
//! [`SLOW_PASS`] is logged, as kubelet does.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::cri::CriRuntime;
use crate::gc::{GarbageCollector, OrphanedDirs};
use crate::kuberuntime::status::{RuntimePod, RuntimePods, RuntimePodsView};
use crate::metrics::Metrics;
use crate::podsync::PodSync;
use crate::podworkers::{KillPodOptions, PodWorkers, UpdateType};
use crate::syncloop::Housekeeper;

/// A pass slower than this is logged (kubelet's housekeeping warning threshold).
pub const SLOW_PASS: Duration = Duration::from_secs(1);

/// Longest time between two reads of the cgroup hierarchies and pod directories for orphans
/// while the pods in use stay the same (something else may have left a `pod<UID>` cgroup).
pub const ORPHAN_SCAN_PERIOD: Duration = Duration::from_secs(10);

/// What the last orphan scan saw: the UIDs in use and when.
#[derive(Default)]
pub struct OrphanScan {
    last: Option<(HashSet<String>, Instant)>,
}

impl OrphanScan {
    /// Whether the hierarchies and pod directories must be read now: the UIDs `in_use`
    /// differ from the last scan's, `stuck` (an orphan awaits a retry), or
    /// [`ORPHAN_SCAN_PERIOD`] has passed since it. Records `in_use` and `now` when it says yes.
    pub fn due(&mut self, in_use: &HashSet<String>, stuck: bool, now: Instant) -> bool {
        let due = stuck
            || match &self.last {
                None => true,
                Some((uids, at)) => {
                    uids != in_use || now.saturating_duration_since(*at) >= ORPHAN_SCAN_PERIOD
                }
            };
        if due {
            self.last = Some((in_use.clone(), now));
        }
        due
    }
}

/// The housekeeper the sync loop calls: it starts a pass on `rt` unless one is running, over
/// the runtime's pods `listed` by the PLEG (listed through `manager` before the PLEG's first
/// relist), and reports the pods that exist to `gc`. After a pass that read the node for
/// orphans it calls `release_free_heap`, so that the garbage of a burst of pods (listings,
/// statuses, decoded manifests) leaves the agent's RSS once the burst is over.
pub fn housekeeper<R: CriRuntime + Clone>(
    manager: Arc<PodSync<R>>,
    workers: PodWorkers<PodSync<R>>,
    gc: Arc<GarbageCollector<R>>,
    listed: RuntimePodsView,
    metrics: Arc<Metrics>,
    rt: tokio::runtime::Handle,
    release_free_heap: fn(),
) -> Housekeeper {
    let busy = Arc::new(AtomicBool::new(false));
    let scan = Arc::new(std::sync::Mutex::new(Sweeps::default()));
    let listed = Arc::new(listed);
    Box::new(move |desired: HashSet<String>| {
        if busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut existing = workers.known_uids();
        existing.extend(desired.iter().cloned());
        gc.set_existing(existing);
        let (manager, workers, busy, metrics, scan, listed) = (
            manager.clone(),
            workers.clone(),
            busy.clone(),
            metrics.clone(),
            scan.clone(),
            listed.clone(),
        );
        rt.spawn(async move {
            let start = crate::clock::monotonic_now();
            let runtime_pods = match listed() {
                Some(p) => Ok(p),
                None => manager.runtime().runtime_pods().await.map(Arc::new),
            };
            match runtime_pods {
                Ok(p) => {
                    if pass(&manager, &workers, &desired, &p, &scan).await {
                        release_free_heap();
                    }
                }
                Err(e) => warn!(error = %e, "housekeeping: cannot list runtime pods"),
            }
            let took = start.elapsed();
            metrics.housekeeping_duration.observe(took.as_secs_f64());
            if took > SLOW_PASS {
                warn!(took = ?took, "housekeeping took longer than expected");
            }
            busy.store(false, Ordering::Release);
        });
    })
}

/// What housekeeping keeps between passes: when it last read the node for orphans, and the
/// directories that could not be removed yet.
#[derive(Default)]
pub struct Sweeps {
    scan: OrphanScan,
    dirs: OrphanedDirs,
    idle: IdleKills,
}

/// The runtime pods no source wants that housekeeping had a pod worker kill while nothing of
/// them ran, by UID, kept while the runtime still lists them. Such a kill only removes what is
/// left (sandboxes, directories); when the runtime still lists the pod after it (containerd
/// cannot remove a sandbox one of whose containers was deleted behind CRI's back), asking again
/// every pass would only repeat the kill and its warning. kubelet's housekeeping kills running
/// pods only (`HandlePodCleanups` over `GetPods(false)`) and leaves the rest to its garbage
/// collector; nodelet kills an idle leftover once, so that it goes at once, then leaves it to
/// the collector too. A pod that runs again is killed again.
#[derive(Default)]
struct IdleKills(HashSet<String>);

impl IdleKills {
    /// The pods of `ours` (the runtime's pods of this node) to kill: those `wanted` does not
    /// hold, running, or idle and not killed idle before. Forgets the UIDs `ours` no longer lists.
    fn choose<'a>(
        &mut self,
        ours: &'a [RuntimePod],
        wanted: impl Fn(&str) -> bool,
    ) -> Vec<&'a RuntimePod> {
        self.0.retain(|u| ours.iter().any(|p| p.uid == *u));
        ours.iter()
            .filter(|p| !wanted(&p.uid))
            .filter(|p| p.running || self.0.insert(p.uid.clone()))
            .collect()
    }
}

/// One pass for the `desired` pod UIDs over the runtime's pods `listed`; `sweeps` decides
/// whether the cgroup hierarchies and pod and log directories are read. Returns whether they
/// were.
pub async fn pass<R: CriRuntime>(
    manager: &PodSync<R>,
    workers: &PodWorkers<PodSync<R>>,
    desired: &HashSet<String>,
    listed: &RuntimePods,
    sweeps: &Arc<std::sync::Mutex<Sweeps>>,
) -> bool {
    // Pod cgroups and directories that no desired, running or terminating pod owns, nor a
    // sandbox of another agent.
    let mut in_use: HashSet<String> = workers.known_uids();
    in_use.extend(listed.ours.iter().map(|p| p.uid.clone()));
    in_use.extend(listed.foreign.iter().cloned());
    in_use.extend(desired.iter().cloned());
    let now = crate::clock::monotonic_now();
    let due = {
        let mut s = sweeps.lock().unwrap_or_else(|e| e.into_inner());
        let stuck = manager.cm().has_stuck_orphans() || s.dirs.retry_due(now);
        s.scan.due(&in_use, stuck, now)
    };
    if due {
        // On a blocking thread: removing a pod cgroup has the kernel reclaim its page cache
        // first, which waits for dirty pages to be written back.
        let settings = manager.runtime().settings();
        let (cm, root, logs, desired, in_use, sweeps) = (
            manager.cm().clone(),
            settings.root_dir.clone(),
            settings.pod_logs_dir.clone(),
            desired.clone(),
            in_use.clone(),
            sweeps.clone(),
        );
        let swept = tokio::task::spawn_blocking(move || {
            cm.cleanup_orphans(&desired, &in_use);
            let mut s = sweeps.lock().unwrap_or_else(|e| e.into_inner());
            s.dirs.sweep(&root, &logs, &in_use, now)
        })
        .await;
        match swept {
            Ok(dirs) => {
                for dir in dirs {
                    info!(path = %dir.display(), "removed orphaned pod directory");
                }
            }
            Err(e) => warn!(error = %e, "removing orphaned pod cgroups and directories failed"),
        }
    }
    let kill = sweeps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .idle
        .choose(&listed.ours, |uid| {
            desired.contains(uid) || workers.is_known(uid)
        });
    for pod in kill {
        info!(
            pod = pod.name.as_deref().unwrap_or(""),
            namespace = pod.namespace.as_deref().unwrap_or(""),
            uid = pod.uid,
            running = pod.running,
            "killing pod that no source wants"
        );
        workers.update_pod(
            Arc::new(pod.to_pod()),
            UpdateType::Kill(KillPodOptions::removed()),
        );
    }
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_runtime_pod_no_source_wants_is_killed_once_a_running_one_every_pass() {
        let pod = |uid: &str, running: bool| RuntimePod {
            uid: uid.into(),
            name: None,
            namespace: None,
            grace_seconds: None,
            running,
        };
        let uids =
            |v: Vec<&RuntimePod>| -> Vec<String> { v.iter().map(|p| p.uid.clone()).collect() };
        let mut idle = IdleKills::default();
        let listed = [pod("run", true), pod("idle", false), pod("wanted", false)];
        let wanted = |u: &str| u == "wanted";
        assert_eq!(uids(idle.choose(&listed, wanted)), ["run", "idle"]);
        // Its kill could not remove it: not asked again; the running one is.
        assert_eq!(uids(idle.choose(&listed, wanted)), ["run"]);
        // Running again: killed again.
        let again = [pod("idle", true)];
        assert_eq!(uids(idle.choose(&again, wanted)), ["idle"]);
        // Gone from the listing, then back idle (a new leftover of the same UID): killed once.
        assert!(idle.choose(&[], wanted).is_empty());
        assert_eq!(uids(idle.choose(&[pod("idle", false)], wanted)), ["idle"]);
        assert!(idle.choose(&[pod("idle", false)], wanted).is_empty());
    }

    #[test]
    fn orphans_are_scanned_on_change_when_stuck_and_every_period() {
        let t0 = Instant::now();
        let a: HashSet<String> = ["a".to_string()].into();
        let ab: HashSet<String> = ["a".to_string(), "b".to_string()].into();
        let mut s = OrphanScan::default();
        assert!(s.due(&a, false, t0), "the first pass scans");
        assert!(
            !s.due(&a, false, t0 + Duration::from_secs(2)),
            "nothing changed"
        );
        assert!(s.due(&ab, false, t0 + Duration::from_secs(4)), "a pod came");
        assert!(s.due(&a, false, t0 + Duration::from_secs(6)), "a pod went");
        assert!(
            s.due(&a, true, t0 + Duration::from_secs(8)),
            "an orphan awaits a retry"
        );
        assert!(!s.due(&a, false, t0 + Duration::from_secs(10)));
        assert!(
            s.due(&a, false, t0 + Duration::from_secs(8) + ORPHAN_SCAN_PERIOD),
            "the period passed"
        );
    }
}
