//! SyncPod (kubelet's `kuberuntime_manager.go` `SyncPod`): one sync of a pod. Read its state
//! (the pod cache when newer than its last sync), compute the actions, hold back containers in
//! CrashLoopBackOff, kill what must go, make sure the pod cgroup exists, create the sandbox if
//! needed, start the next init container or the app containers, clean up dead containers and
//! record the pod's status.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use super::actions::{self, compute_pod_actions_with, PodActions, ToStart};
use super::kill::{container_grace_seconds, pod_grace};
use super::{container, hosts_file, image, sandbox, KubeRuntimeManager, SyncError};
use crate::active_deadline::{self, Deadline};
use crate::container::{ContainerState, RuntimePodStatus};
use crate::cri::{api, CriRuntime};
use crate::pod::{pod_ref, pod_uid};
use crate::podworkers::{KillPodOptions, Requeue};
use crate::status::failed::Failure;

/// The sandbox a sync starts containers in: its ID, config and the pod's IPs.
struct SandboxInfo {
    id: String,
    config: api::PodSandboxConfig,
    ips: Vec<String>,
}

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// One sync of `pod`; asks to be synced again when a container's back-off ends.
    pub(super) async fn sync(&self, pod: &Arc<Pod>) -> Result<Requeue, SyncError> {
        let uid = pod_uid(pod).to_owned();
        if let Some(failure) = self.failed.failure(pod) {
            self.show_failed(pod, &uid, &failure);
            return Ok(Requeue::Normal);
        }
        let rt = self.current_status(&uid).await?;
        if active_deadline::check(pod, rt.start_time(), self.clock.epoch_ns()) == Deadline::Exceeded
        {
            return self.deadline_exceeded(pod).await;
        }
        let mut actions = compute_pod_actions_with(pod, &rt, self.probes.results());
        let probe_kills =
            actions::probe_kills(pod, &rt, self.probes.results(), &actions.containers_to_kill);
        actions.containers_to_kill.extend(probe_kills);
        let wait = self.apply_crash_backoff(pod, &rt, &mut actions);
        let grace = pod_grace(pod);
        if actions.kill_pod {
            info!(pod = %pod_ref(pod), uid, recreate_sandbox = actions.create_sandbox.is_some(), "stopping pod containers and sandbox");
            self.kill_running(pod, &rt, grace).await?;
        }
        // The pod cgroup exists with kubelet's values before anything runs in it (kubelet's
        // `EnsureExists` on every sync); the QoS cgroups are updated first.
        let cgroup = self
            .cm
            .ensure_pod(pod)
            .map_err(|e| SyncError::Cgroup(e.to_string()))?;
        let sb = if let Some(attempt) = actions.create_sandbox {
            self.create_sandbox(pod, &rt, attempt, cgroup).await?
        } else if let Some(id) = actions.sandbox_id.clone() {
            let sb = rt.sandboxes.first().cloned().unwrap_or_default();
            SandboxInfo {
                id,
                config: sandbox::sandbox_config(&self.settings, pod, sb.attempt, cgroup),
                ips: sb.ips,
            }
        } else {
            // Finished pod: nothing to start.
            self.mark_synced(&uid);
            self.record_status(pod, &rt);
            return Ok(Requeue::Normal);
        };
        // A pod on the host network has the node's addresses (kubelet's podIPs for it).
        let ips = if sandbox::is_host_network(pod) {
            vec![self.settings.node_ip.clone()]
        } else {
            sb.ips.clone()
        };
        // The pod's probe workers run from its first sync; they read its containers from the
        // pod cache.
        self.probes.update_pod(pod, &ips);
        // An API pod's ConfigMaps and Secrets: their watches given a moment to list.
        if crate::pod::is_api_pod(pod) {
            let refs = crate::objects::pod_references(pod);
            if !refs.is_empty() && !self.api_objects.wait_synced(&refs).await {
                debug!(pod = %pod_ref(pod), uid, "objects not read from the apiserver yet");
            }
        }
        let volumes = self.set_up_volumes(pod, &uid, &rt)?;
        let volumes = &volumes;
        let to_kill = self.kills_announced(pod, &actions.containers_to_kill);
        // Stopped before anything starts: a replacement may need the same host port.
        self.stop_containers(pod, &self.hook_ips(pod, &rt), to_kill)
            .await?;

        let first_err = self
            .start_containers(pod, &actions, &sb, &ips, volumes)
            .await;
        // The status written is the one this sync started from, with what failed to start
        // (kubelet's: computed before SyncPod acts). What was started shows at the next sync,
        // which the PLEG's events bring, from the pod cache once it is newer than now.
        self.mark_synced(&uid);
        crate::gc::remove_dead_containers(&self.cri, &rt).await;
        self.record_status(pod, &rt);
        // Counted from the pod's first sandbox, which may have been created just now (after
        // the status this sync started from).
        let now = self.clock.epoch_ns();
        let started = rt
            .start_time()
            .or(actions.create_sandbox.is_some().then_some(now));
        let deadline = match active_deadline::check(pod, started, now) {
            Deadline::In(d) => Some(d),
            // Reached during this sync: the next one (at once) kills the pod.
            Deadline::Exceeded => Some(std::time::Duration::ZERO),
            Deadline::None => None,
        };
        if let Some(e) = first_err {
            return Err(e);
        }
        // PLEG events bring the pod back when its containers change; a container in back-off
        // is started again when its delay is over, and the pod when its deadline comes.
        Ok(match (wait, deadline) {
            (Some(a), Some(b)) => Requeue::After(a.min(b)),
            (Some(d), None) | (None, Some(d)) => Requeue::After(d),
            (None, None) => Requeue::Normal,
        })
    }

    /// A failed pod's sync: nothing is started until the manifest changes.
    fn show_failed(&self, pod: &Arc<Pod>, uid: &str, failure: &crate::status::failed::Failure) {
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

    /// The pod's volumes, before any container (kubelet's `WaitForAttachAndMount`): a failure
    /// holds the pod in ContainerCreating with a `FailedMount` event, and the next sync tries
    /// again. Returns each volume's directory by name.
    fn set_up_volumes(
        &self,
        pod: &Arc<Pod>,
        uid: &str,
        rt: &RuntimePodStatus,
    ) -> Result<std::collections::BTreeMap<String, PathBuf>, SyncError> {
        match crate::volume::set_up_pod(
            pod,
            &hosts_file::pod_dir(&self.settings.root_dir, uid),
            self.objects_for(pod),
            &self.settings.allocatable,
        ) {
            Ok(v) => Ok(v),
            Err(e) => {
                warn!(pod = %pod_ref(pod), uid, error = %e, "volume set-up failed");
                self.recorder.warning(
                    crate::events::Involved::pod(pod),
                    "FailedMount",
                    e.to_string(),
                );
                self.mark_synced(uid);
                self.record_status(pod, rt);
                Err(SyncError::Start {
                    container: String::new(),
                    reason: "FailedMount",
                    message: e.to_string(),
                })
            }
        }
    }

    /// The containers to kill with their grace periods, each announced by a `Killing` event
    /// with kubelet's message for its reason.
    fn kills_announced(
        &self,
        pod: &Pod,
        kills: &[(String, String, actions::KillReason)],
    ) -> Vec<(String, String, i64)> {
        kills
            .iter()
            .map(|(id, name, reason)| {
                let probe = match reason {
                    actions::KillReason::ProbeFailed(kind) => Some(*kind),
                    _ => None,
                };
                let grace = container_grace_seconds(pod, name, probe);
                let why = match reason {
                    actions::KillReason::SpecChanged => {
                        format!("Container {name} definition changed, will be restarted")
                    }
                    actions::KillReason::NotInSpec => {
                        format!("Container {name} is not in the pod spec any more")
                    }
                    actions::KillReason::UnknownState => {
                        format!("Container {name} is in an unknown state, will be restarted")
                    }
                    actions::KillReason::ProbeFailed(kind) => {
                        let restart = if actions::restart_policy(pod) == "Never" {
                            ""
                        } else {
                            ", will be restarted"
                        };
                        format!(
                            "Container {name} failed {} probe{restart}",
                            kind.as_str().to_ascii_lowercase()
                        )
                    }
                };
                self.recorder
                    .normal(crate::events::Involved::pod(pod), "Killing", why);
                (id.clone(), name.clone(), grace)
            })
            .collect()
    }

    /// Starts what `actions` says: the next init container, or the sidecars that exited and
    /// then the app containers, one at a time in spec order. Returns the first failure; a
    /// failure does not hold back the containers after it.
    async fn start_containers(
        &self,
        pod: &Pod,
        actions: &PodActions,
        sb: &SandboxInfo,
        ips: &[String],
        volumes: &std::collections::BTreeMap<String, PathBuf>,
    ) -> Option<SyncError> {
        let mut first_err = None;
        if let Some(init) = &actions.next_init {
            if let Err(e) = self.start_one(pod, init, true, sb, ips, volumes).await {
                first_err = Some(e);
            }
        } else {
            // Sidecars that exited come back first, in order; then the app containers.
            for s in &actions.sidecars_to_start {
                if let Err(e) = self.start_one(pod, s, true, sb, ips, volumes).await {
                    first_err.get_or_insert(e);
                }
            }
            // One at a time, in spec order: each created, started and its postStart hook
            // finished before the next (kubelet's `SyncPod`), so a proxy listed first with a
            // postStart that waits for it is ready before the app starts. A failure does not
            // hold back the containers after it.
            for s in &actions.containers_to_start {
                if let Err(e) = self.start_one(pod, s, false, sb, ips, volumes).await {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err
    }

    /// A pod past its `activeDeadlineSeconds` (kubelet's active deadline handler): marked
    /// Failed with `DeadlineExceeded`, a Normal event, then killed and cleaned up as an evicted
    /// pod is; it stays Failed until its manifest changes.
    async fn deadline_exceeded(&self, pod: &Arc<Pod>) -> Result<Requeue, SyncError> {
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

    /// Creates the pod's sandbox with `attempt` in `cgroup` (RunPodSandbox, then
    /// PodSandboxStatus for its IPs). A failure is kubelet's FailedCreatePodSandBox: the pod
    /// stays Pending, visible, with an event.
    async fn create_sandbox(
        &self,
        pod: &Arc<Pod>,
        rt: &RuntimePodStatus,
        attempt: u32,
        cgroup: String,
    ) -> Result<SandboxInfo, SyncError> {
        let uid = pod_uid(pod);
        let mut config = sandbox::sandbox_config(&self.settings, pod, attempt, cgroup);
        if let Some(started) = rt.start_time() {
            config
                .annotations
                .insert(super::labels::POD_START_TIME.into(), started.to_string());
        }
        // A pod on the pod network waits its turn (CNI is what makes a burst CPU-bound); a
        // host-network pod needs no network set up, and is often the CNI agent itself. The
        // semaphore is never closed, so a permit always comes.
        let permit = if sandbox::is_host_network(pod) {
            None
        } else {
            self.sandbox_starts.acquire().await.ok()
        };
        // A relist that lists the sandbox before its IPs are recorded waits for them.
        let making = self.cache.making(uid);
        let created = match (
            sandbox::kernel_hostname(&self.settings, pod),
            std::fs::create_dir_all(&config.log_directory),
        ) {
            (Err(message), _) => Err(SyncError::Start {
                container: String::new(),
                reason: "CreatePodSandboxError",
                message,
            }),
            (Ok(_), Ok(())) => self
                .cri
                .run_pod_sandbox(config.clone(), &runtime_handler(pod))
                .await
                .map_err(SyncError::from),
            (Ok(_), Err(e)) => Err(SyncError::Start {
                container: String::new(),
                reason: "CreateContainerError",
                message: format!(
                    "cannot create pod log directory {}: {e}",
                    config.log_directory
                ),
            }),
        };
        drop(permit);
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                self.recorder.warning(
                    crate::events::Involved::pod(pod),
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {e}"),
                );
                self.record_status(pod, rt);
                return Err(e);
            }
        };
        self.metrics.started_pods.inc();
        info!(pod = %pod_ref(pod), uid, sandbox = %id, attempt, "created pod sandbox");
        let ips = match self.cri.pod_sandbox_status(&id).await? {
            Some(st) => st
                .network
                .map(|n| {
                    std::iter::once(n.ip)
                        .chain(n.additional_ips.into_iter().map(|i| i.ip))
                        .filter(|i| !i.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            None => Vec::new(),
        };
        // The PLEG takes them from here rather than asking the runtime again.
        self.cache.remember_sandbox_ips(uid, &id, &ips);
        drop(making);
        Ok(SandboxInfo { id, config, ips })
    }

    /// Pulls the image if needed, then creates and starts one container (kubelet's
    /// `startContainer`). A failure is recorded as the container's waiting reason, with an event.
    async fn start_one(
        &self,
        pod: &Pod,
        start: &ToStart,
        is_init: bool,
        sb: &SandboxInfo,
        pod_ips: &[String],
        volumes: &std::collections::BTreeMap<String, PathBuf>,
    ) -> Result<(), SyncError> {
        let spec = pod.spec.as_ref().ok_or_else(|| SyncError::Start {
            container: String::new(),
            reason: "CreateContainerConfigError",
            message: "pod has no spec".into(),
        })?;
        let list = if is_init {
            spec.init_containers.as_deref().unwrap_or(&[])
        } else {
            &spec.containers[..]
        };
        let c = &list[start.index];
        let uid = pod_uid(pod);
        // What a runtime or path error could quote of the pod's Secrets is taken out of every
        // message (a value in the env, a subPathExpr expanded with it).
        let secrets = crate::objects::secret_values(pod, self.objects_for(pod));
        let fail = |reason: &'static str, message: String| {
            let message = crate::objects::redact(&message, &secrets);
            self.set_start_error(uid, &c.name, Some((reason.to_owned(), message.clone())));
            self.recorder.warning(
                crate::events::Involved::pod(pod),
                if reason.starts_with("ErrImage") {
                    "Failed"
                } else {
                    "FailedCreate"
                },
                format!("container {}: {reason}: {message}", c.name),
            );
            warn!(pod = %pod_ref(pod), uid, container = %c.name, reason, error = %message, "container start failed");
            SyncError::Start {
                container: c.name.clone(),
                reason,
                message,
            }
        };
        let image = c.image.clone().unwrap_or_default();
        let pull_key = format!("{uid}/{image}");
        let now = self.clock.epoch_ns();
        if let Some(left) = self.pull_backoff.remaining_since_update(&pull_key, now) {
            return Err(fail(
                "ImagePullBackOff",
                format!(
                    "Back-off pulling image {image:?} ({}s left)",
                    left.as_secs()
                ),
            ));
        }
        let image = match image::ensure_image(&self.cri, c, &sb.config).await {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, image::ImageError::Pull { .. }) {
                    self.pull_backoff.next(&pull_key, self.clock.epoch_ns());
                }
                return Err(fail(e.reason(), e.to_string()));
            }
        };
        if super::security_context::run_as_non_root(pod, c) {
            let image = self.cri.image_status(&image.id).await.ok().flatten();
            let user = c
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .or_else(|| spec.security_context.as_ref().and_then(|s| s.run_as_user));
            super::security_context::verify_run_as_non_root(
                pod,
                c,
                user,
                image.as_ref().and_then(|i| i.uid.as_ref()).map(|u| u.value),
                image.as_ref().map_or("", |i| i.username.as_str()),
            )
            .map_err(|e| fail("CreateContainerConfigError", e))?;
        }
        let config = self
            .container_config_with_mounts(pod, c, start, is_init, &image.id, pod_ips, volumes)
            .map_err(|e| fail("CreateContainerConfigError", e))?;
        let log_dir = PathBuf::from(&sb.config.log_directory).join(&c.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| {
            fail(
                "CreateContainerError",
                format!("cannot create log directory {}: {e}", log_dir.display()),
            )
        })?;
        let log_path = PathBuf::from(&sb.config.log_directory).join(&config.log_path);
        // A relist that lists the container before it is recorded waits for the record.
        let making = self.cache.making(uid);
        let id = self
            .cri
            .create_container(&sb.id, config, sb.config.clone())
            .await
            .map_err(|e| fail("CreateContainerError", e.message))?;
        self.cache.remember_container(
            uid,
            &id,
            crate::container::cache::MadeContainer {
                name: c.name.clone(),
                image_ref: image.status_ref,
                log_path: log_path.to_string_lossy().into_owned(),
            },
        );
        drop(making);
        self.cri
            .start_container(&id)
            .await
            .map_err(|e| fail("RunContainerError", e.message))?;
        if let Err(message) = self.run_post_start(pod, c, &id, pod_ips).await {
            // kubelet kills the container and reports PostStartHookError; it restarts by policy.
            let grace = container_grace_seconds(pod, &c.name, None);
            let _ = self
                .stop_containers(pod, pod_ips, vec![(id.clone(), c.name.clone(), grace)])
                .await;
            self.set_start_error(
                uid,
                &c.name,
                Some(("PostStartHookError".to_owned(), message.clone())),
            );
            return Err(SyncError::Start {
                container: c.name.clone(),
                reason: "PostStartHookError",
                message,
            });
        }
        self.set_start_error(uid, &c.name, None);
        self.metrics.started_containers.inc();
        self.recorder.normal(
            crate::events::Involved::pod(pod),
            "Started",
            format!("Started container {}", c.name),
        );
        info!(pod = %pod_ref(pod), uid, container = %c.name, restart_count = start.restart_count, init = is_init, "started container");
        Ok(())
    }

    /// The CRI config of container `c` with its mounts: volumes (subPathExpr expanded with the
    /// container's env), the termination message file and the pod's hosts file. Errors: the
    /// message of a `CreateContainerConfigError`.
    #[allow(clippy::too_many_arguments)]
    fn container_config_with_mounts(
        &self,
        pod: &Pod,
        c: &k8s_openapi::api::core::v1::Container,
        start: &ToStart,
        is_init: bool,
        image_ref: &str,
        pod_ips: &[String],
        volumes: &std::collections::BTreeMap<String, PathBuf>,
    ) -> Result<api::ContainerConfig, String> {
        let uid = pod_uid(pod);
        let inputs = container::ContainerInputs {
            restart_count: start.restart_count,
            image_ref,
            pod_ips,
            is_init,
            env_sources: container::EnvSources {
                objects: self.objects_for(pod),
            },
        };
        let mut config =
            container::container_config(&self.settings, pod, c, &inputs).map_err(|e| e.message)?;
        // subPathExpr expands with the env the config was just built with.
        let vars: std::collections::HashMap<String, String> = config
            .envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        let read_only = crate::volume::read_only_volumes(pod);
        let mounts = crate::volume::mounts::container_mounts(c, volumes, &read_only, &|s| {
            container::expand(s, &vars)
        })?;
        config.mounts.extend(mounts);
        if let Some(path) = c
            .termination_message_path
            .as_deref()
            .filter(|p| !p.is_empty())
        {
            let pod_dir = hosts_file::pod_dir(&self.settings.root_dir, uid);
            let host = super::termination_message::prepare(&pod_dir, &c.name, start.restart_count)
                .map_err(|e| format!("cannot create the termination message file: {e}"))?;
            config
                .mounts
                .push(super::termination_message::mount(&host, path));
        }
        match hosts_file::ensure_hosts_file(&self.settings, pod, pod_ips) {
            Ok(Some(mount)) => config.mounts.push(mount),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot write the pod's hosts file: {e}")),
        }
        Ok(config)
    }

    /// CrashLoopBackOff (kubelet's `doBackOff`): a container that exited and is due to restart
    /// waits its back-off delay from its finish time. Waiting containers are taken out of
    /// `actions` and shown as waiting with reason CrashLoopBackOff; returns the shortest wait.
    fn apply_crash_backoff(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        actions: &mut PodActions,
    ) -> Option<Duration> {
        let uid = pod_uid(pod);
        let spec = pod.spec.as_ref()?;
        let now = self.clock.epoch_ns();
        let mut wait: Option<Duration> = None;
        let mut held = |name: &str| -> bool {
            let Some(last) = rt
                .latest(name)
                .filter(|c| c.state() == ContainerState::Exited)
            else {
                return false;
            };
            let key = format!("{uid}/{name}");
            match self.crash_backoff.remaining(&key, last.finished_at, now) {
                Some(left) => {
                    let delay = self.crash_backoff.current(&key).unwrap_or_default();
                    // kubelet's wording and pod spelling (`name_namespace(uid)`).
                    let msg = format!(
                        "back-off {}s restarting failed container={name} pod={}_{}({uid})",
                        delay.as_secs(),
                        pod.metadata.name.as_deref().unwrap_or(""),
                        pod.metadata.namespace.as_deref().unwrap_or("")
                    );
                    self.recorder.warning(
                        crate::events::Involved::pod(pod),
                        "BackOff",
                        format!("Back-off restarting failed container {name}: {msg}"),
                    );
                    self.set_start_error(uid, name, Some(("CrashLoopBackOff".into(), msg)));
                    wait = Some(wait.map_or(left, |w| w.min(left)));
                    true
                }
                None => {
                    self.crash_backoff.next(&key, last.finished_at);
                    false
                }
            }
        };
        if let Some(init) = actions.next_init.clone() {
            let name = &spec.init_containers.as_deref().unwrap_or(&[])[init.index].name;
            if held(name) {
                actions.next_init = None;
            }
        }
        actions
            .containers_to_start
            .retain(|s| !held(&spec.containers[s.index].name));
        let inits = spec.init_containers.as_deref().unwrap_or(&[]);
        actions
            .sidecars_to_start
            .retain(|s| !held(&inits[s.index].name));
        wait
    }
}

/// The CRI runtime handler a pod's sandbox runs under: its `runtimeClassName` taken as the
/// handler's name. kubelet resolves the name through a RuntimeClass object of the API server to
/// that object's `handler`; a node without an API server has no such objects, so nodelet uses the
/// name itself (a documented difference). A handler the runtime does not have fails the
/// sandbox with the runtime's message; the pod never runs under the default runtime.
pub fn runtime_handler(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.clone())
        .unwrap_or_default()
}
