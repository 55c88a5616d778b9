//! Graceful node shutdown (kubelet's `nodeshutdown` manager, Linux): nodelet holds a *delay*
//! inhibitor lock from systemd-logind, and when logind announces the shutdown
//! (`PrepareForShutdown(true)`) it stops the pods group by group, lowest priority first, each
//! group within its share of the grace period, then releases the lock so that the shutdown goes
//! on. Meanwhile the node is not Ready ("node is shutting down") and new pods are refused
//! (`NodeShutdown`).
//!
//! - [`priority_groups`]: the configuration as kubelet reads it (`shutdownGracePeriod` and
//!   `shutdownGracePeriodCriticalPods` become two groups; `shutdownGracePeriodByPodPriority`
//!   is taken as it is).
//! - [`group_by_priority`]: which group each pod is stopped with.
//! - [`logind`]: the D-Bus side (the lock, the signal, `InhibitDelayMaxSec`).
//! - [`run`]: the manager's thread.

pub mod logind;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use crate::status::failed::Failure;

/// The status reason of a pod stopped for the node's shutdown.
pub const REASON: &str = "Terminated";
/// Its status message.
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The admission reason while the node shuts down.
pub const ADMISSION_REASON: &str = "NodeShutdown";
/// The admission message while the node shuts down.
pub const ADMISSION_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The Ready condition's message while the node shuts down (its reason is `KubeletNotReady`).
pub const NOT_READY_MESSAGE: &str = "node is shutting down";
/// The file under the root directory recording the last shutdown's start and end (kubelet's
/// `graceful_node_shutdown_state`).
pub const STATE_FILE: &str = "graceful_node_shutdown_state";

/// One group of `shutdownGracePeriodByPodPriority`: pods of at least `priority` (and below the
/// next group's) get `grace_seconds` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityGroup {
    /// The lowest pod priority of the group.
    pub priority: i32,
    /// How long the group's pods get to stop, seconds.
    #[serde(rename = "shutdownGracePeriodSeconds")]
    pub grace_seconds: i64,
}

/// The groups nodelet stops pods with, lowest priority first (kubelet's `migrateConfig` and
/// ordering): `by_priority` when given; else, when `total` is above zero, priority 0 with
/// `total − critical` and priority 2000000000 (critical pods) with `critical`, in whole seconds.
/// Empty: graceful shutdown is off (the node's shutdown is immediate).
pub fn priority_groups(
    total: Duration,
    critical: Duration,
    by_priority: &[PriorityGroup],
) -> Vec<PriorityGroup> {
    let mut groups = if !by_priority.is_empty() {
        by_priority.to_vec()
    } else if total.is_zero() {
        Vec::new()
    } else {
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        vec![
            PriorityGroup {
                priority: 0,
                grace_seconds: secs(total.saturating_sub(critical)),
            },
            PriorityGroup {
                priority: crate::qos::SYSTEM_CRITICAL_PRIORITY,
                grace_seconds: secs(critical),
            },
        ]
    };
    groups.sort_by_key(|g| g.priority);
    groups
}

/// The time the groups need in all, seconds (what logind's `InhibitDelayMaxSec` must allow).
pub fn total_seconds(groups: &[PriorityGroup]) -> i64 {
    groups
        .iter()
        .map(|g| g.grace_seconds.max(0))
        .fold(0, i64::saturating_add)
}

/// `groups` cut to fit in `delay` seconds when logind grants less than they need: the highest
/// priority groups keep their shares first, the lowest get what is left (0 at worst: their pods
/// are then stopped with the 2 s minimum), so critical pods are stopped last with their time.
pub fn fit_groups(groups: &[PriorityGroup], delay: i64) -> Vec<PriorityGroup> {
    let mut left = delay.max(0);
    let mut out = groups.to_vec();
    for g in out.iter_mut().rev() {
        g.grace_seconds = g.grace_seconds.clamp(0, left);
        left -= g.grace_seconds;
    }
    out
}

/// The index in `groups` (sorted, lowest priority first) of the group a pod of `priority` is
/// stopped with (kubelet's `groupByPriority`): the highest group whose priority is at most the
/// pod's; a pod below every group goes with the lowest.
pub fn group_by_priority(groups: &[PriorityGroup], priority: i32) -> usize {
    groups
        .iter()
        .rposition(|g| g.priority <= priority)
        .unwrap_or(0)
}

/// The grace period of a pod stopped with a group of `group_seconds`: its own
/// `terminationGracePeriodSeconds` when that is shorter, else the group's (kubelet's
/// `killPods`).
pub fn pod_grace_seconds(pod: &Pod, group_seconds: i64) -> i64 {
    let own = crate::kuberuntime::kill::pod_grace(pod);
    own.min(group_seconds).max(0)
}

/// The failure a pod stopped for the shutdown is recorded with: phase Failed, reason
/// `Terminated`, kubelet's message, and a `DisruptionTarget` condition.
pub fn failure() -> Failure {
    Failure::new(REASON, MESSAGE)
        .of_running_pod()
        .with_disruption_target()
}

/// Whether the node is shutting down, shared by the manager (the writer), the Ready condition
/// and admission. Cheap to clone.
#[derive(Clone, Default)]
pub struct ShutdownState(Arc<AtomicBool>);

impl ShutdownState {
    /// True between `PrepareForShutdown(true)` and a cancellation.
    pub fn is_shutting_down(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the flag (the manager, on logind's signal).
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// What the manager does to pods (the agent's pod workers; a fake in tests).
pub trait ShutdownNode: Send {
    /// The pods to stop: every pod that is not terminal.
    fn active_pods(&self) -> Vec<Arc<Pod>>;
    /// Stops `pod` with `grace` seconds, recording `failure` as its status.
    fn kill(&mut self, pod: Arc<Pod>, grace: i64, failure: Failure);
    /// True once the pod's worker has finished with it.
    fn is_gone(&self, uid: &str) -> bool;
    /// A Normal event on the node (`reason`, `message`).
    fn node_event(&self, reason: &str, message: &str);
}

/// Stops every active pod, group by group, lowest priority first: each group's pods in
/// parallel, then a wait until they are gone or the group's grace period has passed (unused
/// time is not carried over; a kill still under way when the time is up goes on in the
/// background). `sleep` waits in steps (the clock: the manager's thread sleeps, tests advance
/// time). Returns the number of pods stopped.
pub fn stop_pods(
    node: &mut dyn ShutdownNode,
    groups: &[PriorityGroup],
    mut sleep: impl FnMut(Duration),
    now: impl Fn() -> std::time::Instant,
) -> usize {
    let pods = node.active_pods();
    let mut by_group: Vec<Vec<Arc<Pod>>> = vec![Vec::new(); groups.len()];
    for p in pods {
        let g = group_by_priority(groups, crate::qos::pod_priority(&p));
        if let Some(v) = by_group.get_mut(g) {
            v.push(p);
        }
    }
    let mut stopped = 0;
    for (group, pods) in groups.iter().zip(by_group) {
        if pods.is_empty() {
            continue;
        }
        info!(
            priority = group.priority,
            grace = group.grace_seconds,
            pods = pods.len(),
            "shutdown: stopping a group of pods"
        );
        for p in &pods {
            let grace = pod_grace_seconds(p, group.grace_seconds);
            node.kill(p.clone(), grace, failure());
        }
        stopped += pods.len();
        let share = Duration::from_secs(u64::try_from(group.grace_seconds).unwrap_or(0));
        let start = now();
        let deadline = start.checked_add(share).unwrap_or(start);
        loop {
            if pods.iter().all(|p| node.is_gone(crate::pod::pod_uid(p))) {
                info!(
                    priority = group.priority,
                    "shutdown: the group's pods are stopped"
                );
                break;
            }
            if now() >= deadline {
                warn!(
                    priority = group.priority,
                    "shutdown: the group's grace period is over; going on"
                );
                break;
            }
            sleep(Duration::from_millis(100));
        }
    }
    stopped
}

/// The agent's [`ShutdownNode`]: pods from the status manager, kills through the pod workers
/// of syncer `S`. A stopped pod is marked failed until the agent restarts
/// ([`crate::status::failed::FailedPods::mark_until_restart`]), so nothing starts it again
/// while the node goes down, and it runs again when the node is back.
pub struct AgentShutdownNode<S: crate::podworkers::PodSyncer> {
    /// Active pods come from here.
    pub status: crate::status::StatusManager,
    /// Stops go here, to the sync loop, which marks the pod until the agent restarts and
    /// hands its worker the kill.
    pub fail: crossbeam_channel::Sender<crate::status::failed::FailPod>,
    /// Whether a stopped pod's worker is gone.
    pub workers: crate::podworkers::PodWorkers<S>,
    /// Events.
    pub recorder: crate::events::Recorder,
}

impl<S: crate::podworkers::PodSyncer> ShutdownNode for AgentShutdownNode<S> {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.status.active_pods()
    }

    fn kill(&mut self, pod: Arc<Pod>, grace: i64, failure: Failure) {
        let request = crate::status::failed::FailPod {
            pod,
            failure,
            grace: Some(grace),
            until_restart: true,
        };
        if self.fail.send(request).is_err() {
            tracing::warn!("the sync loop has stopped; pod not stopped for the shutdown");
        }
    }

    fn is_gone(&self, uid: &str) -> bool {
        !self.workers.is_known(uid)
    }

    fn node_event(&self, reason: &str, message: &str) {
        self.recorder.normal("node", reason, message);
    }
}

/// The manager's settings.
pub struct Settings {
    /// The groups ([`priority_groups`]); the manager is not started when empty.
    pub groups: Vec<PriorityGroup>,
    /// `--root-dir`, where [`STATE_FILE`] is written.
    pub root_dir: PathBuf,
}

/// Writes the shutdown's start (and end, once known) to `<root-dir>/`[`STATE_FILE`], replacing
/// the file atomically (kubelet's JSON: `{"startTime", "endTime"}`).
fn write_state(root: &std::path::Path, start: &str, end: Option<&str>) {
    let body =
        serde_json::json!({ "startTime": start, "endTime": end.unwrap_or("0001-01-01T00:00:00Z") });
    let path = root.join(STATE_FILE);
    let tmp = root.join(format!(".tmp-{STATE_FILE}"));
    let r = std::fs::write(&tmp, body.to_string()).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = r {
        warn!(path = %path.display(), error = %e, "cannot record the shutdown state");
    }
}

/// Runs the manager on the calling thread until `stop` fires: takes the inhibitor lock (making
/// sure logind's `InhibitDelayMaxSec` covers the groups, as kubelet does), waits for
/// `PrepareForShutdown`, stops the pods and releases the lock. A failure to reach logind is
/// reported and retried every second; pods are not touched then.
pub fn run(
    settings: Settings,
    mut node: Box<dyn ShutdownNode>,
    state: ShutdownState,
    stop: crossbeam_channel::Receiver<()>,
) {
    let needed = Duration::from_secs(u64::try_from(total_seconds(&settings.groups)).unwrap_or(0));
    let mut reported = false;
    loop {
        match logind::Logind::connect() {
            Ok(mut l) => {
                reported = false;
                // The groups as logind's delay allows them.
                let groups = match l.ensure_delay(needed) {
                    Ok(delay) => {
                        info!(
                            ?delay,
                            ?needed,
                            "shutdown: logind's InhibitDelayMaxSec covers the grace period"
                        );
                        settings.groups.clone()
                    }
                    Err(e) => {
                        warn!(error = %e, "shutdown: pods will be stopped with what time there is, critical pods last");
                        let delay = l
                            .delay()
                            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                        fit_groups(&settings.groups, delay)
                    }
                };
                if let Err(e) = l.inhibit() {
                    warn!(error = %e, "shutdown: cannot take logind's inhibitor lock; retrying");
                } else {
                    info!("shutdown: holding logind's delay inhibitor lock for graceful node shutdown");
                    match l.watch(&stop, |shutting_down, l| {
                        state.set(shutting_down);
                        if shutting_down {
                            let start = crate::pod::api_time(crate::clock::wall_now()).0.to_string();
                            info!("shutdown: logind announced the node's shutdown; stopping pods by priority");
                            node.node_event("Shutdown", "Shutdown manager detected shutdown event");
                            write_state(&settings.root_dir, &start, None);
                            let n = stop_pods(node.as_mut(), &groups, crate::clock::sleep_blocking, crate::clock::monotonic_now);
                            let end = crate::pod::api_time(crate::clock::wall_now()).0.to_string();
                            write_state(&settings.root_dir, &start, Some(&end));
                            info!(pods = n, "shutdown: pods stopped; releasing the inhibitor lock");
                            l.release();
                        } else {
                            info!("shutdown: logind cancelled the shutdown; taking the inhibitor lock again");
                            node.node_event("Shutdown", "Shutdown manager detected shutdown cancellation");
                            if let Err(e) = l.inhibit() {
                                warn!(error = %e, "shutdown: cannot take logind's inhibitor lock again");
                            }
                        }
                    }) {
                        logind::Watched::Stopped => return,
                        logind::Watched::Lost(e) => warn!(error = %e, "shutdown: lost logind's signals; connecting again"),
                    }
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut reported, true) {
                    warn!(error = %e, "shutdown: cannot reach systemd-logind; graceful node shutdown waits for it (retried every second)");
                }
            }
        }
        if stop.recv_timeout(Duration::from_secs(1)).is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::time::Instant;

    #[test]
    fn the_plain_fields_become_two_groups_and_the_list_is_taken_as_it_is() {
        assert!(priority_groups(Duration::ZERO, Duration::ZERO, &[]).is_empty());
        let g = priority_groups(Duration::from_secs(30), Duration::from_secs(10), &[]);
        assert_eq!(
            g,
            vec![
                PriorityGroup {
                    priority: 0,
                    grace_seconds: 20
                },
                PriorityGroup {
                    priority: 2_000_000_000,
                    grace_seconds: 10
                }
            ]
        );
        assert_eq!(total_seconds(&g), 30);
        let list = [
            PriorityGroup {
                priority: 100000,
                grace_seconds: 5,
            },
            PriorityGroup {
                priority: 10,
                grace_seconds: 7,
            },
        ];
        let g = priority_groups(Duration::ZERO, Duration::ZERO, &list);
        assert_eq!(g[0].priority, 10, "sorted, lowest first");
        // A pod below every group goes with the lowest, above every group with the highest.
        assert_eq!(group_by_priority(&g, 0), 0);
        assert_eq!(group_by_priority(&g, 50_000), 0);
        assert_eq!(group_by_priority(&g, 100_000), 1);
        assert_eq!(group_by_priority(&g, i32::MAX), 1);
    }

    #[test]
    fn a_short_delay_goes_to_the_critical_pods_first() {
        let g = priority_groups(Duration::from_secs(30), Duration::from_secs(10), &[]);
        let fit = fit_groups(&g, 12);
        assert_eq!((fit[0].grace_seconds, fit[1].grace_seconds), (2, 10));
        let fit = fit_groups(&g, 5);
        assert_eq!((fit[0].grace_seconds, fit[1].grace_seconds), (0, 5));
        assert_eq!(fit_groups(&g, 60), g, "enough: unchanged");
    }

    struct Fake {
        pods: Vec<Arc<Pod>>,
        killed: Vec<(String, i64)>,
        gone: HashSet<String>,
        /// Pods that never stop.
        stuck: HashSet<String>,
    }

    impl ShutdownNode for Fake {
        fn active_pods(&self) -> Vec<Arc<Pod>> {
            self.pods.clone()
        }
        fn kill(&mut self, pod: Arc<Pod>, grace: i64, f: Failure) {
            assert_eq!(f.reason, REASON);
            let uid = crate::pod::pod_uid(&pod).to_owned();
            self.killed.push((uid.clone(), grace));
            if !self.stuck.contains(&uid) {
                self.gone.insert(uid);
            }
        }
        fn is_gone(&self, uid: &str) -> bool {
            self.gone.contains(uid)
        }
        fn node_event(&self, _: &str, _: &str) {}
    }

    fn pod(uid: &str, priority: i32, grace: i64) -> Arc<Pod> {
        Arc::new(
            serde_yaml::from_str(&format!(
                "metadata: {{name: {uid}, uid: {uid}}}\nspec: {{priority: {priority}, terminationGracePeriodSeconds: {grace}, containers: [{{name: c, image: x}}]}}"
            ))
            .unwrap(),
        )
    }

    #[test]
    fn groups_are_stopped_lowest_priority_first_each_within_its_share() {
        let groups = priority_groups(Duration::from_secs(30), Duration::from_secs(10), &[]);
        let mut node = Fake {
            pods: vec![
                pod("critical", 2_000_001_000, 60),
                pod("low", 0, 60),
                pod("short", 5, 3),
            ],
            killed: Vec::new(),
            gone: HashSet::new(),
            stuck: HashSet::new(),
        };
        let t0 = Instant::now();
        let clock = std::cell::Cell::new(t0);
        let n = stop_pods(
            &mut node,
            &groups,
            |d| clock.set(clock.get() + d),
            || clock.get(),
        );
        assert_eq!(n, 3);
        let order: Vec<&str> = node.killed.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(order, vec!["low", "short", "critical"]);
        let grace: HashMap<&str, i64> = node.killed.iter().map(|(u, g)| (u.as_str(), *g)).collect();
        assert_eq!(grace["low"], 20, "the group's share");
        assert_eq!(grace["short"], 3, "its own, shorter");
        assert_eq!(grace["critical"], 10);
        assert_eq!(clock.get(), t0, "no wait once the pods are gone");
        // A pod that does not stop holds its group for the group's share, no longer.
        let mut node = Fake {
            pods: vec![pod("stuck", 0, 60), pod("critical", 2_000_001_000, 60)],
            killed: Vec::new(),
            gone: HashSet::new(),
            stuck: ["stuck".to_owned()].into(),
        };
        let clock = std::cell::Cell::new(t0);
        stop_pods(
            &mut node,
            &groups,
            |d| clock.set(clock.get() + d),
            || clock.get(),
        );
        assert_eq!(node.killed.len(), 2, "the critical group still goes");
        let waited = clock.get() - t0;
        assert!(
            waited >= Duration::from_secs(20) && waited < Duration::from_secs(21),
            "{waited:?}"
        );
    }
}
