//! One sync of a pod (kubelet's `Kubelet.SyncPod`): a failed pod shows its failure and starts
//! nothing; a pod past its active deadline is failed and killed; otherwise the pod cgroup, the
//! API objects and volumes are made ready (for a pod with something to run), the runtime
//! manager carries out the pod's actions, and the pod's status is written from the state the
//! sync started from with what failed to start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use super::{PodSync, PodSyncError};
use crate::active_deadline::{self, Deadline};
use crate::cri::CriRuntime;
use crate::kuberuntime::result::PodSyncResult;
use crate::kuberuntime::sync::PodInputs;
use crate::pod::{pod_ref, pod_uid};
use crate::podworkers::{KillPodOptions, Requeue};
use crate::status::failed::Failure;
use crate::volume::VolumeError;

impl<R: CriRuntime> PodSync<R> {
    /// One sync of `pod`; asks to be synced again when a container's back-off ends or the
    /// pod's active deadline comes.
    ///
    /// Errors: the runtime's ([`PodSyncError::Runtime`]: a CRI call, a container or sandbox
    /// that did not start), the pod cgroup's, a volume's ([`PodSyncError::Mount`]).
    pub(super) async fn sync(&self, pod: &Arc<Pod>) -> Result<Requeue, PodSyncError> {
        let uid = pod_uid(pod).to_owned();
        if let Some(failure) = self.failed.failure(pod) {
            self.show_failed(pod, &uid, &failure);
            return Ok(Requeue::Normal);
        }
        // In use from the first sync, before any image is looked up or pulled.
        self.pod_images
            .need(&uid, crate::gc::images::images_of(pod))
            .await;
        let rt = self.current_status(&uid).await?;
        self.dead_containers.report(
            &uid,
            &rt,
            crate::gc::containers::ContainerGcPolicy::KUBELET.max_per_pod_container,
        );
        if active_deadline::check(pod, rt.start_time(), self.clock.epoch_ns()) == Deadline::Exceeded
        {
            return self.deadline_exceeded(pod).await;
        }
        // kubelet's syncPod writes the pod's status before it acts (`SetPodStatus`): a pod is
        // listed (`/pods`, Pending) from its first sync, not only once its sandbox and
        // containers are made (tens of seconds on a slow runtime).
        if !self.status.has(&uid) {
            self.record_status(pod, &rt);
        }
        let mut result = PodSyncResult::default();
        let actions = self.runtime.compute_actions(pod, &rt, &mut result);
        // An API pod's objects and service account tokens are had first (both wait on the API
        // server); then the pod cgroup exists with kubelet's values before anything runs in it
        // (kubelet's `EnsureExists` on every sync; the QoS cgroups are updated first) and the
        // volumes are set up, together off the runtime's thread ([`crate::blocking`]).
        // A pod that starts nothing new, has no volume whose content follows updates and
        // whose cgroup is as made (most syncs after a start: the PLEG's events of its sandbox
        // and containers starting) needs neither: no hand-off. Its volumes are set up again
        // before a container of it starts.
        let current = (actions.runs_nothing()
            || (actions.starts_nothing() && !crate::volume::follows_updates(pod)))
        .then(|| self.cm.pod_cgroup_if_current(pod))
        .flatten();
        let (cgroup, volumes, log_directory) = if let Some(cgroup) = current {
            (Ok(cgroup), Ok(BTreeMap::new()), None)
        } else {
            let tokens = if actions.runs_nothing() {
                None
            } else {
                self.wait_for_api_objects(pod).await;
                Some(self.pod_tokens(pod).await)
            };
            // A sync that makes a sandbox makes its log directory in the same hand-off.
            let log_directory = actions
                .create_sandbox
                .map(|_| crate::kuberuntime::sandbox::pod_logs_dir(self.runtime.settings(), pod));
            self.make_pod_files(pod, &uid, tokens, log_directory).await
        };
        let cgroup = cgroup.map_err(|e| PodSyncError::Cgroup(e.to_string()))?;
        let volumes = match volumes {
            Ok(v) => v,
            Err(e) => {
                warn!(pod = %pod_ref(pod), uid, error = %e, missing_object = e.cause.is_missing_object(), "volume set-up failed");
                self.recorder.warning(
                    crate::events::Involved::pod(pod),
                    "FailedMount",
                    e.to_string(),
                );
                self.update_reasons(&uid, &result);
                self.mark_synced(&uid);
                self.record_status(pod, &rt);
                return Err(e.into());
            }
        };
        let inputs = PodInputs {
            cgroup,
            volumes: &volumes,
            log_directory,
        };
        self.runtime
            .sync_pod(pod, &rt, &actions, inputs, &mut result)
            .await;
        self.update_reasons(&uid, &result);
        if result.sandbox_failed() {
            // The pod stays Pending, visible, with the runtime's event.
            self.record_status(pod, &rt);
        }
        if let Some(e) = result.error.take() {
            return Err(e.into());
        }
        // The pod's probe workers run from its first sync with a sandbox; they read its
        // containers from the pod cache.
        if let Some(ips) = &result.pod_ips {
            self.probes.update_pod(pod, ips);
        }
        // The status written is the one this sync started from, with what failed to start
        // (kubelet's: computed before SyncPod acts). What was started shows at the next sync,
        // which the PLEG's events bring, from the pod cache once it is newer than now.
        self.mark_synced(&uid);
        self.record_status(pod, &rt);
        if actions.runs_nothing() {
            return Ok(Requeue::Normal);
        }
        // Counted from the pod's first sandbox, which may have been created just now (after
        // the status this sync started from).
        let now = self.clock.epoch_ns();
        let started = rt.start_time().or(result.sandbox_created.then_some(now));
        let deadline = match active_deadline::check(pod, started, now) {
            Deadline::In(d) => Some(d),
            // Reached during this sync: the next one (at once) kills the pod.
            Deadline::Exceeded => Some(Duration::ZERO),
            Deadline::None => None,
        };
        if let Some(e) = result.first_error() {
            return Err(e.into());
        }
        // PLEG events bring the pod back when its containers change; a container in back-off
        // is started again when its delay is over, and the pod when its deadline comes.
        Ok(match (result.backoff, deadline) {
            (Some(a), Some(b)) => Requeue::After(a.min(b)),
            (Some(d), None) | (None, Some(d)) => Requeue::After(d),
            (None, None) => Requeue::Normal,
        })
    }

    /// An API pod's ConfigMaps and Secrets: their watches given a moment to list.
    async fn wait_for_api_objects(&self, pod: &Pod) {
        if crate::pod::is_api_pod(pod) {
            let refs = crate::objects::pod_references(pod);
            if !refs.is_empty() && !self.api_objects.wait_synced(&refs).await {
                debug!(pod = %pod_ref(pod), uid = pod_uid(pod), "objects not read from the apiserver yet");
            }
        }
    }

    /// The service account tokens of the pod's projected volumes ([`crate::token`]); a token
    /// that cannot be had fails the first volume that asks for one.
    async fn pod_tokens(&self, pod: &Pod) -> Result<crate::token::PodTokens, VolumeError> {
        let now = self.clock.epoch_ns() / 1_000_000_000;
        self.api_objects
            .tokens()
            .pod_tokens(pod, now)
            .await
            .map_err(|message| VolumeError {
                volume: crate::token::first_token_volume(pod).unwrap_or_default(),
                cause: crate::volume::SetUpError::Token(message),
            })
    }

    /// The pod's cgroup ([`crate::cm::ContainerManager::ensure_pod`]: the cgroup parent for
    /// RunPodSandbox) and, given its `tokens` (`None`: a pod with nothing to run has no volumes
    /// set up), its volumes before any container (kubelet's `WaitForAttachAndMount`: each
    /// volume's directory by name; a failure holds the pod in ContainerCreating with a
    /// `FailedMount` event, and the next sync tries again); then, given the sandbox's
    /// `log_directory` and both made, that directory (kubelet makes it in `createPodSandbox`;
    /// `None` when not made). All in one call on tokio's blocking pool: each hand-off costs the
    /// agent about 80 µs (benches/README.md, "CPU per pod start").
    async fn make_pod_files(
        &self,
        pod: &Arc<Pod>,
        uid: &str,
        tokens: Option<Result<crate::token::PodTokens, VolumeError>>,
        log_directory: Option<PathBuf>,
    ) -> (
        Result<String, crate::cm::CmError>,
        Result<BTreeMap<String, PathBuf>, VolumeError>,
        Option<std::io::Result<()>>,
    ) {
        let cm = self.cm.clone();
        let pod = pod.clone();
        let settings = self.runtime.settings();
        let pod_dir = crate::kuberuntime::hosts_file::pod_dir(&settings.root_dir, uid);
        let allocatable = settings.allocatable;
        let objects = self.objects_for(&pod).clone();
        crate::blocking::run(move || {
            let cgroup = cm.ensure_pod(&pod);
            let volumes = match tokens {
                // Nothing runs in a pod without its cgroup: its volumes wait for the next sync.
                _ if cgroup.is_err() => Ok(BTreeMap::new()),
                None => Ok(BTreeMap::new()),
                Some(tokens) => tokens.and_then(|tokens| {
                    crate::volume::set_up_pod(&pod, &pod_dir, &objects, &allocatable, &tokens)
                }),
            };
            let log_directory = log_directory
                .filter(|_| cgroup.is_ok() && volumes.is_ok())
                .map(std::fs::create_dir_all);
            (cgroup, volumes, log_directory)
        })
        .await
    }

    /// A pod past its `activeDeadlineSeconds` (kubelet's active deadline handler): marked
    /// Failed with `DeadlineExceeded`, a Normal event, then killed and cleaned up as an evicted
    /// pod is; it stays Failed until its manifest changes.
    async fn deadline_exceeded(&self, pod: &Arc<Pod>) -> Result<Requeue, PodSyncError> {
        let failure =
            Failure::new(active_deadline::REASON, active_deadline::MESSAGE).of_running_pod();
        info!(pod = %pod_ref(pod), uid = pod_uid(pod), "pod is past its active deadline; killing it");
        self.failed.mark(pod, failure.clone());
        self.recorder.normal(
            crate::events::Involved::pod(pod),
            active_deadline::REASON,
            active_deadline::MESSAGE,
        );
        self.terminate(pod, KillPodOptions::failed(failure, None))
            .await?;
        Ok(Requeue::Normal)
    }
}
