//! A pod's kill and clean-up (kubelet's `SyncTerminatingPod` and `SyncTerminatedPod`): the
//! runtime manager stops and removes its containers and sandboxes; then its last status is
//! written (Failed for a pod killed for a failure, none for a removed pod), its probe workers
//! stop, its log directory, pod directory (volumes unmounted first) and cgroups are removed, and
//! everything kept about it is forgotten (waiting reasons, last sync, back-offs, the PLEG's cache
//! entry).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::{PodSync, PodSyncError};
use crate::cri::CriRuntime;
use crate::kuberuntime::hosts_file::pod_dir;
use crate::kuberuntime::kill::grace_seconds;
use crate::kuberuntime::sandbox::pod_logs_dir;
use crate::pod::{is_safe_uid, pod_ref, pod_uid};
use crate::podworkers::KillPodOptions;
use crate::status::failed::EVICTED;

impl<R: CriRuntime> PodSync<R> {
    /// Kills the pod and removes everything of it; writes its last status: Failed with
    /// `opts.failure` (or the failure it is recorded with), or none.
    ///
    /// Errors: a CRI call of the kill ([`PodSyncError::Runtime`]); the worker tries again.
    pub(super) async fn terminate(
        &self,
        pod: &Arc<Pod>,
        opts: KillPodOptions,
    ) -> Result<(), PodSyncError> {
        let uid = pod_uid(pod).to_owned();
        let grace = grace_seconds(pod, opts.grace);
        let failure = opts.failure.or_else(|| self.failed.failure(pod));
        if failure.is_none() {
            // Removed: listed Terminating while its containers stop (a failed pod is listed
            // Failed instead).
            self.status.mark_terminating(&uid, grace);
        }
        let killed = self.runtime.kill_pod(pod, grace, failure.is_some()).await?;
        if let Some(f) = &failure {
            // A failed pod's last status keeps its containers' last states.
            self.record_failure(pod, f, &killed.stopped);
        }
        self.probes.remove_pod(&uid);
        self.remove_pod_leftovers(pod, &uid).await;
        if failure.is_none() {
            self.status.remove(&uid);
        }
        self.forget_pod(&uid).await;
        if killed.existed {
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
        let settings = self.runtime.settings();
        let logs = pod_logs_dir(settings, pod);
        let safe = is_safe_uid(uid) && logs.parent() == Some(settings.pod_logs_dir.as_path());
        if !safe {
            warn!(pod = %pod_ref(pod), uid, "pod identity is not safe for paths; leaving its directories and cgroups alone");
            return;
        }
        let (dir, cm, uid, pod) = (
            pod_dir(&settings.root_dir, uid),
            self.cm.clone(),
            uid.to_owned(),
            pod_ref(pod),
        );
        let removed = tokio::task::spawn_blocking(move || {
            // The pod's containers are gone: its volumes can go (tmpfs unmounted) before its
            // directory.
            crate::volume::tear_down_pod(&dir);
            // On their own filesystem only: a mount left inside stays, with its source's files
            // (housekeeping retries the directory with back-off).
            for dir in [logs, dir] {
                if let Err(e) = crate::volume::removal::remove_all_one_filesystem(&dir) {
                    warn!(pod = %pod, uid = %uid, path = %dir.display(), error = %e, "cannot remove pod directory");
                }
            }
            cm.remove_pod(&uid);
        })
        .await;
        if let Err(e) = removed {
            warn!(error = %e, "removing a pod's directories and cgroup failed");
        }
    }

    /// Forgets what was kept about a pod that is gone: its waiting reasons, last sync and start
    /// observation here, its back-offs in the runtime manager, its images' registration for
    /// image garbage collection, its pod cache entry (handed to the PLEG), its service account
    /// tokens.
    async fn forget_pod(&self, uid: &str) {
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.runtime.forget_pod(uid);
        self.api_objects.tokens().forget_pod(uid);
        self.pod_images.forget(uid).await;
        self.cache_feed.forget(uid).await;
        self.refresh_status_metrics();
    }
}
