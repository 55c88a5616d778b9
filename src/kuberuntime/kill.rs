//! KillPod (kubelet's `killPodWithSyncResult`, `killContainersWithSyncResult`, `killContainer`):
//! stop a pod's containers with their grace period, then its sandboxes, and remove what the pod
//! left on the node (sandboxes, log directory, pod directory, cgroups). The pod's last status is
//! written here: Failed for a pod killed for a failure, none for a removed pod.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::hosts_file::pod_dir;
use super::sandbox::pod_logs_dir;
use super::status::get_pod_status;
use super::{KubeRuntimeManager, SyncError};
use crate::container::{ContainerState, RuntimePodStatus};
use crate::cri::{CriError, CriRuntime};
use crate::pod::{is_safe_uid, pod_ref, pod_uid};
use crate::podworkers::KillPodOptions;
use crate::status::failed::EVICTED;

/// Smallest grace period used to stop a container, seconds (kubelet's
/// `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_PERIOD_SECONDS: i64 = 2;

/// The grace period a pod's containers are stopped with, seconds: an override as given but at
/// least 1 (hard eviction passes 1; kubelet's pod workers never go below 1), else the pod's own
/// raised to [`MIN_GRACE_PERIOD_SECONDS`] (kubelet's `killContainer` applies that minimum before
/// the override).
pub fn grace_seconds(pod: &Pod, over: Option<i64>) -> i64 {
    if let Some(g) = over {
        return g.max(1);
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(crate::pod::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
        .max(MIN_GRACE_PERIOD_SECONDS)
}

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// Stops the containers `ids` ((ID, name, grace seconds)) in parallel: each one's preStop
    /// hook first, its time taken out of the grace period, then StopContainer with the rest.
    pub(super) async fn stop_containers(
        &self,
        pod: &Pod,
        ids: Vec<(String, String, i64)>,
    ) -> Result<(), CriError> {
        let ips = self.hook_ips(pod);
        let ips = &ips;
        let stops = ids.iter().map(|(id, name, grace)| async move {
            let grace = match crate::pod::container_spec(pod, name) {
                Some(c) => self.run_pre_stop(pod, c, id, ips, *grace).await,
                None => *grace,
            };
            info!(pod = %pod_ref(pod), container = %name, grace, "stopping container");
            self.cri.stop_container(id, grace).await
        });
        futures::future::try_join_all(stops).await.map(drop)
    }

    /// The addresses a hook's httpGet may use: the node's for a host-network pod, else the
    /// pod's IPs as last seen by the runtime.
    fn hook_ips(&self, pod: &Pod) -> Vec<String> {
        if super::sandbox::is_host_network(pod) {
            return vec![self.settings.node_ip.clone()];
        }
        self.cache
            .latest(pod_uid(pod))
            .and_then(|rt| rt.sandboxes.first().map(|s| s.ips.clone()))
            .unwrap_or_default()
    }

    /// Kills everything running in the pod: the containers with the grace period, then the
    /// sidecars one by one in reverse order with what is left of it (at least
    /// [`MIN_GRACE_PERIOD_SECONDS`]), as kubelet stops sidecars after the containers they
    /// serve; then the ready sandboxes.
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
        let started = std::time::Instant::now();
        self.stop_containers(
            pod,
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
            let left = grace.saturating_sub(spent).max(MIN_GRACE_PERIOD_SECONDS);
            self.stop_containers(pod, vec![(c.id.clone(), c.name.clone(), left)])
                .await?;
        }
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            self.cri.stop_pod_sandbox(&s.id).await?;
        }
        Ok(())
    }

    /// Kills the pod and removes everything of it; then writes its last status: Failed with
    /// `opts.failure` (or the failure it is recorded with), or none.
    pub(super) async fn terminate(
        &self,
        pod: &Arc<Pod>,
        opts: KillPodOptions,
    ) -> Result<(), SyncError> {
        let uid = pod_uid(pod).to_owned();
        let rt = get_pod_status(&self.cri, &uid).await?;
        let existed = !rt.sandboxes.is_empty() || !rt.containers.is_empty();
        let grace = grace_seconds(pod, opts.grace);
        if existed {
            info!(pod = %pod_ref(pod), uid, grace, "killing pod");
        }
        self.kill_running(pod, &rt, grace).await?;
        for s in &rt.sandboxes {
            self.cri.remove_pod_sandbox(&s.id).await?;
        }
        self.probes.remove_pod(&uid);
        self.remove_pod_leftovers(pod, &uid).await;
        let failure = opts.failure.or_else(|| self.failed.failure(pod));
        match &failure {
            Some(f) => self.status.set(pod.clone(), f.status(pod)),
            None => self.status.remove(&uid),
        }
        self.forget_pod(&uid);
        if existed {
            let what = match &failure {
                Some(f) if f.reason == EVICTED => "Pod evicted",
                Some(f) if f.reason == crate::active_deadline::REASON => {
                    "Pod past its active deadline"
                }
                Some(_) => "Pod rejected",
                None => "Pod removed",
            };
            self.recorder.normal(
                crate::events::Involved::pod(pod),
                "Killing",
                format!("{what}: containers stopped, sandbox removed"),
            );
            info!(pod = %pod_ref(pod), uid, "pod terminated and removed");
        }
        Ok(())
    }

    /// Removes the pod's log directory, pod directory and cgroups. Names come from validated
    /// manifests or from sandbox labels; nothing is removed that is not a direct child of
    /// podLogsDir, nor anything named by an unsafe UID.
    ///
    /// On a blocking thread: removing the pod cgroup first has the kernel reclaim its page
    /// cache, which waits for dirty pages to be written back
    /// ([`crate::cm::cgroupfs::CgroupManager::destroy`]).
    async fn remove_pod_leftovers(&self, pod: &Pod, uid: &str) {
        let logs = pod_logs_dir(&self.settings, pod);
        let safe = is_safe_uid(uid) && logs.parent() == Some(self.settings.pod_logs_dir.as_path());
        if !safe {
            warn!(pod = %pod_ref(pod), uid, "pod identity is not safe for paths; leaving its directories and cgroups alone");
            return;
        }
        let (dir, cm, uid, pod) = (
            pod_dir(&self.settings.root_dir, uid),
            self.cm.clone(),
            uid.to_owned(),
            pod_ref(pod),
        );
        let removed = tokio::task::spawn_blocking(move || {
            // The pod's containers are gone: its volumes can go (tmpfs unmounted) before its
            // directory.
            crate::volume::tear_down_pod(&dir);
            for dir in [logs, dir] {
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        warn!(pod = %pod, uid = %uid, path = %dir.display(), error = %e, "cannot remove pod directory");
                    }
                }
            }
            cm.remove_pod(&uid);
        })
        .await;
        if let Err(e) = removed {
            warn!(error = %e, "removing a pod's directories and cgroup failed");
        }
    }

    /// Forgets what the manager kept about a pod that is gone.
    fn forget_pod(&self, uid: &str) {
        self.start_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.cache.delete(uid);
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.crash_backoff.forget_prefix(&format!("{uid}/"));
        self.pull_backoff.forget_prefix(&format!("{uid}/"));
        self.refresh_status_metrics();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_period_overrides_go_down_to_one_second_the_pods_own_to_two() {
        let mut pod = Pod::default();
        assert_eq!(grace_seconds(&pod, None), 30);
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        });
        assert_eq!(grace_seconds(&pod, None), MIN_GRACE_PERIOD_SECONDS);
        assert_eq!(grace_seconds(&pod, Some(1)), 1, "hard eviction");
        assert_eq!(grace_seconds(&pod, Some(0)), 1);
        assert_eq!(grace_seconds(&pod, Some(45)), 45);
    }
}
