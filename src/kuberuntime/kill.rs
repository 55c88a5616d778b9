//! KillPod (kubelet's `killPodWithSyncResult`, `killContainersWithSyncResult`, `killContainer`):
//! stop a pod's containers with their grace period, then its sandboxes, and remove the sandboxes.
//! What else the pod left on the node (its last status, directories, cgroups) is the pod-sync
//! layer's ([`crate::podsync`], `SyncTerminatingPod`).

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::status::get_pod_status;
use super::KubeRuntimeManager;
use crate::container::{ContainerState, RuntimePodStatus};
use crate::cri::{CriError, CriRuntime};
use crate::pod::{pod_ref, pod_uid};

/// Smallest timeout a container is stopped with, seconds (kubelet's
/// `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_PERIOD_SECONDS: i64 = 2;

// How long a container gets to stop, in the order of kubelet's `killContainer`:
//
// 1. The container's grace period: the pod's deletion grace period while an API pod is being
//    deleted (carried in its `terminationGracePeriodSeconds`, see `source::api::prepare`);
//    else, when a failed liveness or startup probe is why it stops, that probe's
//    `terminationGracePeriodSeconds` if set; else the pod's `terminationGracePeriodSeconds`
//    (30 when absent) ([`container_grace_seconds`]).
// 2. When the whole pod is killed, an override replaces it: the pod worker's effective grace
//    period ([`grace_seconds`]: an eviction's override, or the pod's own, never below 1 s).
// 3. The preStop hook runs for at most that long (only when it is above zero), and the whole
//    seconds it took are taken off.
// 4. A sidecar, stopped after the containers it serves, has the time spent on them taken off.
// 5. What is left is raised to `MIN_GRACE_PERIOD_SECONDS` ([`stop_timeout`]): StopContainer
//    never gets less than 2 s, an eviction's 1 s override included.

/// The grace period of a kill of the whole pod, seconds (kubelet's pod workers,
/// `calculateEffectiveGracePeriod`): the override `over` when given (a hard eviction's 1 s, a
/// soft eviction's `min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds)`), else the
/// pod's `terminationGracePeriodSeconds` (30 when absent); never below 1, so an override of 0
/// or below is 1 s. (kubelet 1.22–1.34 took an override of exactly 0 as no override and gave
/// the pod its own grace period; current kubelet reads it as 0, raised to 1.) The containers
/// are then stopped with [`stop_timeout`].
pub fn grace_seconds(pod: &Pod, over: Option<i64>) -> i64 {
    over.unwrap_or_else(|| pod_grace(pod)).max(1)
}

/// The pod's `terminationGracePeriodSeconds`, 30 when absent: the grace period of the
/// containers a sync stops without an override (kubelet's `killPodWithSyncResult` from
/// `SyncPod`, before a sandbox is made again).
pub fn pod_grace(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(crate::pod::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
}

/// The grace period of one container stopped while its pod goes on (a restart), seconds:
/// kubelet's `setTerminationGracePeriod`. While an API pod is being deleted, its deletion
/// grace period; else, for a container killed because its liveness or startup probe
/// (`probe`) failed, that probe's `terminationGracePeriodSeconds` when set; else the pod's.
/// Not raised to any minimum: see [`stop_timeout`].
pub fn container_grace_seconds(
    pod: &Pod,
    container: &str,
    probe: Option<crate::prober::ProbeKind>,
) -> i64 {
    if pod.metadata.deletion_grace_period_seconds.is_some() {
        return pod_grace(pod);
    }
    probe
        .and_then(|kind| {
            let c = crate::pod::container_spec(pod, container)?;
            crate::prober::spec::probe_of(c, kind)?.termination_grace_seconds
        })
        .unwrap_or_else(|| pod_grace(pod))
}

/// The timeout StopContainer gets, seconds: `grace` less the whole seconds `spent` (on the
/// preStop hook, on the containers stopped before a sidecar), at least
/// [`MIN_GRACE_PERIOD_SECONDS`] (the last rule of kubelet's `killContainer`).
pub fn stop_timeout(grace: i64, spent: i64) -> i64 {
    grace.saturating_sub(spent).max(MIN_GRACE_PERIOD_SECONDS)
}

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// Stops the containers `ids` ((ID, name, grace seconds)) in parallel: each one's preStop
    /// hook first (when its grace period is above zero), its time taken out of the grace
    /// period, then StopContainer with the rest, at least [`MIN_GRACE_PERIOD_SECONDS`]
    /// ([`stop_timeout`]).
    /// `ips` are the addresses its hooks' httpGet may use ([`Self::hook_ips`]).
    pub(super) async fn stop_containers(
        &self,
        pod: &Pod,
        ips: &[String],
        ids: Vec<(String, String, i64)>,
    ) -> Result<(), CriError> {
        let stops = ids.iter().map(|(id, name, grace)| async move {
            let spent = match crate::pod::container_spec(pod, name) {
                Some(c) if *grace > 0 => self.run_pre_stop(pod, c, id, ips, *grace).await,
                _ => 0,
            };
            let timeout = stop_timeout(*grace, spent);
            info!(pod = %pod_ref(pod), container = %name, grace, timeout, "stopping container");
            self.cri.stop_container(id, timeout).await
        });
        futures::future::try_join_all(stops).await.map(drop)
    }

    /// The addresses a hook's httpGet may use: the node's for a host-network pod, else the
    /// IPs of the pod's ready sandbox in `rt` (the view the kill acts on), else those the pod
    /// cache last saw.
    pub(super) fn hook_ips(&self, pod: &Pod, rt: &RuntimePodStatus) -> Vec<String> {
        if super::sandbox::is_host_network(pod) {
            return vec![self.settings.node_ip.clone()];
        }
        let ready = |rt: &RuntimePodStatus| {
            rt.sandboxes
                .iter()
                .find(|s| s.ready && !s.ips.is_empty())
                .map(|s| s.ips.clone())
        };
        ready(rt)
            .or_else(|| self.cache.latest(pod_uid(pod)).and_then(|c| ready(&c)))
            .unwrap_or_default()
    }

    /// Kills everything running in the pod: the containers with the grace period, then the
    /// sidecars one by one in reverse order with what is left of it, as kubelet stops sidecars
    /// after the containers they serve; then the ready sandboxes. Each container stopped is
    /// announced by a `Killing` event `Stopping container <name>`.
    pub(super) async fn kill_running(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        grace: i64,
    ) -> Result<(), CriError> {
        let sidecars: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .filter(|c| super::actions::is_sidecar(c))
            .map(|c| c.name.as_str())
            .collect();
        let running = rt
            .containers
            .iter()
            .filter(|c| c.state() == ContainerState::Running);
        let (side, main): (Vec<_>, Vec<_>) =
            running.partition(|c| c.is_init && sidecars.contains(&c.name.as_str()));
        // kubelet's `killContainer` without a reason: a `Killing` event for each container.
        for c in main.iter().chain(&side) {
            self.recorder.normal(
                crate::events::Involved::container(pod, &c.name),
                "Killing",
                format!("Stopping container {}", c.name),
            );
        }
        let started = crate::clock::monotonic_now();
        let ips = self.hook_ips(pod, rt);
        self.stop_containers(
            pod,
            &ips,
            main.iter()
                .map(|c| (c.id.clone(), c.name.clone(), grace))
                .collect(),
        )
        .await?;
        for name in sidecars.iter().rev() {
            let Some(c) = side.iter().find(|c| c.name == *name) else {
                continue;
            };
            let spent = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
            let left = grace.saturating_sub(spent);
            self.stop_containers(pod, &ips, vec![(c.id.clone(), c.name.clone(), left)])
                .await?;
        }
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            self.cri.stop_pod_sandbox(&s.id).await?;
        }
        Ok(())
    }

    /// Kills the pod (kubelet's `KillPod`): reads its containers and sandboxes from the
    /// runtime, stops them with `grace` seconds (the containers, then the sidecars, then the sandboxes), reads them again once
    /// stopped when `last_states` (so a failed pod's status keeps its containers' last states),
    /// then removes the sandboxes (and their containers).
    ///
    /// Errors: a CRI call that failed; the pod worker tries the kill again. A removal that
    /// fails with `NotFound` (the sandbox or one of its containers gone from the runtime behind
    /// CRI's back) is not one: the pod is stopped, which is all kubelet's `KillPod` asks, and
    /// the garbage collector retries the removal.
    pub async fn kill_pod(
        &self,
        pod: &Pod,
        grace: i64,
        last_states: bool,
    ) -> Result<KilledPod, CriError> {
        let uid = pod_uid(pod);
        let rt = get_pod_status(&self.cri, uid).await?;
        let existed = !rt.sandboxes.is_empty() || !rt.containers.is_empty();
        if existed {
            info!(pod = %pod_ref(pod), uid, grace, "killing pod");
        }
        self.kill_running(pod, &rt, grace).await?;
        // Read once they stopped, before the sandboxes (and their containers) are removed.
        let stopped = if existed && last_states {
            get_pod_status(&self.cri, uid).await.unwrap_or(rt.clone())
        } else {
            rt.clone()
        };
        for s in &rt.sandboxes {
            match self.cri.remove_pod_sandbox(&s.id).await {
                Ok(()) => {}
                // The sandbox, or one of its containers, is no longer in the runtime (removed
                // behind CRI's back, as with `ctr`): everything is stopped, so the kill is done.
                // What containerd still lists is the garbage collector's to retry, as kubelet
                // leaves every sandbox removal to it.
                Err(e) if e.code == tonic::Code::NotFound => {
                    warn!(pod = %pod_ref(pod), uid, sandbox = %s.id, error = %e,
                        "sandbox removal found part of it gone; the pod is stopped, the garbage collector retries the removal");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(KilledPod { existed, stopped })
    }

    /// Forgets the back-offs of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.crash_backoff.forget_prefix(&format!("{uid}/"));
        self.pull_backoff.forget_prefix(&format!("{uid}/"));
    }
}

/// What [`KubeRuntimeManager::kill_pod`] found and did.
#[derive(Debug)]
pub struct KilledPod {
    /// The pod had sandboxes or containers.
    pub existed: bool,
    /// Its containers as they were once stopped (before removal).
    pub stopped: RuntimePodStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_kill_takes_the_override_or_the_pods_own_never_below_one_second() {
        let mut pod = Pod::default();
        assert_eq!(grace_seconds(&pod, None), 30);
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        });
        assert_eq!(grace_seconds(&pod, None), 1);
        assert_eq!(grace_seconds(&pod, Some(1)), 1, "hard eviction");
        assert_eq!(grace_seconds(&pod, Some(0)), 1);
        assert_eq!(
            grace_seconds(&pod, Some(-5)),
            1,
            "evictionMaxPodGracePeriod < 0"
        );
        assert_eq!(grace_seconds(&pod, Some(45)), 45);
    }

    #[test]
    fn the_stop_timeout_is_what_is_left_but_never_below_two_seconds() {
        assert_eq!(stop_timeout(30, 0), 30);
        assert_eq!(stop_timeout(30, 5), 25);
        assert_eq!(stop_timeout(30, 29), MIN_GRACE_PERIOD_SECONDS);
        assert_eq!(stop_timeout(30, 60), MIN_GRACE_PERIOD_SECONDS);
        assert_eq!(
            stop_timeout(1, 0),
            MIN_GRACE_PERIOD_SECONDS,
            "an eviction's 1 s"
        );
        assert_eq!(stop_timeout(0, 0), MIN_GRACE_PERIOD_SECONDS);
    }

    #[test]
    fn a_restarted_containers_grace_is_the_deletions_then_the_probes_then_the_pods() {
        use crate::prober::ProbeKind;
        let mut pod: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {terminationGracePeriodSeconds: 20, containers: [{name: c, image: x, livenessProbe: {exec: {command: [x]}, terminationGracePeriodSeconds: 3}}]}",
        )
        .unwrap();
        assert_eq!(container_grace_seconds(&pod, "c", None), 20);
        assert_eq!(
            container_grace_seconds(&pod, "c", Some(ProbeKind::Liveness)),
            3
        );
        assert_eq!(
            container_grace_seconds(&pod, "c", Some(ProbeKind::Startup)),
            20,
            "no startup probe"
        );
        pod.metadata.deletion_grace_period_seconds = Some(20);
        assert_eq!(
            container_grace_seconds(&pod, "c", Some(ProbeKind::Liveness)),
            20,
            "a pod being deleted: the deletion grace period wins"
        );
    }
}
