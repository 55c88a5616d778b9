//! The pod's status (kubelet's `generateAPIPodStatus` and the status manager's write), the
//! pod cache reads a sync starts from ("newer than" the pod's last sync, kubelet's
//! `GetNewerThan`), and the waiting reasons of containers that failed to start (kubelet's
//! `ReasonCache`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::PodSync;
use crate::container::RuntimePodStatus;
use crate::cri::{CriError, CriRuntime};
use crate::kuberuntime::result::{PodSyncResult, SyncAction};
use crate::kuberuntime::status::read_pod_status;
use crate::pod::pod_uid;
use crate::status::failed::Failure;
use crate::status::generate::generate_pod_status;

/// Longest a pod worker waits for the PLEG to bring the pod cache past its last sync before it
/// reads the pod's status itself.
pub const STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl<R: CriRuntime> PodSync<R> {
    /// Updates the waiting reasons of the containers a runtime sync acted on (kubelet's
    /// `reasonCache.Update`): a failed start or a back-off sets the container's reason and
    /// message, a start clears them.
    pub(super) fn update_reasons(&self, uid: &str, result: &PodSyncResult) {
        let mut m = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        let pod = m.entry(uid.to_owned()).or_default();
        for r in result
            .results
            .iter()
            .filter(|r| r.action == SyncAction::StartContainer)
        {
            match &r.error {
                Some(f) => {
                    pod.insert(r.target.clone(), (f.reason.to_owned(), f.message.clone()));
                }
                None => {
                    pod.remove(&r.target);
                }
            }
        }
    }

    /// A failed pod's sync: nothing is started until the manifest changes.
    pub(super) fn show_failed(&self, pod: &Arc<Pod>, uid: &str, failure: &Failure) {
        // Failed by eviction (its kill is queued behind this sync) or refused at admission:
        // nothing is started until the manifest changes. The status written when it was
        // killed stands; without one (the agent restarted since) it is made from what the
        // runtime still holds.
        let written = self.status.get(uid).is_some_and(|s| {
            s.phase.as_deref() == Some("Failed")
                && s.reason.as_deref() == Some(failure.reason.as_str())
                && s.message.as_deref() == Some(failure.message.as_str())
        });
        if !written {
            // The pod cache's view, without a runtime call (the kill reads the runtime).
            let cached = self.cache.latest(uid);
            let rt = cached.as_deref().cloned().unwrap_or_default();
            self.record_failure(pod, failure, &rt);
        }
    }

    /// Writes the pod's status from the runtime's view of it (kubelet's `generateAPIPodStatus`
    /// and `statusManager.SetPodStatus`; the pod worker's write).
    pub(super) fn record_status(&self, pod: &Arc<Pod>, rt: &RuntimePodStatus) {
        let uid = pod_uid(pod);
        let st = self.generated_status(pod, rt);
        let all_running = st
            .container_statuses
            .iter()
            .flatten()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        // Only pods this agent started: an adopted pod's start was measured by its predecessor.
        let started_here = rt
            .sandboxes
            .first()
            .is_some_and(|s| s.created_at >= self.agent_start_ns);
        if all_running && started_here && st.phase.as_deref() == Some("Running") {
            self.observe_pod_start(pod, uid);
        }
        self.status.set(pod.clone(), st);
        self.refresh_status_metrics();
    }

    /// The pod's status from the runtime's view `rt`, its last start errors and its probe
    /// results ([`generate_pod_status`]).
    pub(super) fn generated_status(&self, pod: &Pod, rt: &RuntimePodStatus) -> PodStatus {
        let errors = self
            .reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(pod_uid(pod))
            .cloned()
            .unwrap_or_default();
        generate_pod_status(
            pod,
            rt,
            &errors,
            self.probes.results(),
            &self.runtime.settings().node_ip,
        )
    }

    /// Writes the status of a pod failed with `failure`: for a pod that ran, its last status
    /// from `rt` ([`Failure::terminal_status`]); for one refused before it ran, the plain
    /// failure ([`Failure::status`]).
    pub(super) fn record_failure(&self, pod: &Arc<Pod>, failure: &Failure, rt: &RuntimePodStatus) {
        let st = if failure.ran || !rt.containers.is_empty() {
            failure.terminal_status(pod, self.generated_status(pod, rt))
        } else {
            failure.status(pod)
        };
        self.status.set(pod.clone(), st);
    }

    /// `kubelet_pod_start_duration_seconds`: from `config.seen` to all containers running, once
    /// per pod.
    fn observe_pod_start(&self, pod: &Pod, uid: &str) {
        if !self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned())
        {
            return;
        }
        let seen = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::pod::CONFIG_SEEN_ANNOTATION));
        if let Some(t) = seen.and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok()) {
            let secs = (self.clock.epoch_ns() as i128 - t.as_nanosecond()) as f64 / 1e9;
            if secs >= 0.0 {
                self.metrics.pod_start_duration.observe(secs);
            }
        }
    }

    /// Running pods and containers by state, from the statuses.
    pub(super) fn refresh_status_metrics(&self) {
        self.metrics
            .running_pods
            .set(self.status.running_pods() as i64);
        for (state, n) in self.status.container_state_counts() {
            self.metrics
                .running_containers
                .get_or_create(&crate::metrics::ContainerStateLabel {
                    container_state: state.into(),
                })
                .set(n);
        }
    }

    /// The pod's runtime status, from the PLEG's cache once it is newer than this pod's last
    /// sync (asking the PLEG for a relist and waiting up to [`STATUS_WAIT`]), else read from
    /// the runtime (kubelet's blocking `GetNewerThan` on the pod cache).
    pub(super) async fn current_status(&self, uid: &str) -> Result<RuntimePodStatus, CriError> {
        let since = self
            .last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .copied();
        let cached = match since {
            Some(t) => self
                .cache
                .wait_newer_than(uid, t, STATUS_WAIT)
                .await
                .map(|st| (st, t)),
            // A pod never synced: what the PLEG knows of it (nothing, for a new pod), as
            // kubelet's first sync reads the cache (no CRI call).
            None => self.cache.get_first(uid),
        };
        if let Some((st, at)) = cached {
            self.last_sync
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.to_owned(), at);
            return Ok((*st).clone());
        }
        self.fresh_status(uid).await
    }

    /// Records that the pod was synced now: its next sync acts on a status read after this.
    pub(super) fn mark_synced(&self, uid: &str) {
        let now = self.clock.now();
        self.last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), now);
    }

    /// Reads the pod's status from the runtime, hands it to the PLEG for the cache, and records
    /// it as this pod's last sync time.
    pub(super) async fn fresh_status(&self, uid: &str) -> Result<RuntimePodStatus, CriError> {
        let at = self.clock.now();
        let previous = self.cache.latest(uid);
        let st = read_pod_status(
            self.runtime.cri(),
            uid,
            previous.as_deref(),
            Some(&self.cache),
        )
        .await?;
        // The PLEG writes the cache: it is handed the read and has applied it on return.
        self.cache_feed.status_read(uid, st.clone(), at).await;
        self.last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), at);
        Ok(st)
    }
}
