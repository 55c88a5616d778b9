//! SyncPod (kubelet's `kuberuntime_manager.go` `SyncPod`): the runtime's half of one sync of a
//! pod. The pod-sync layer ([`crate::podsync`]) reads the pod's state, makes its cgroup and
//! volumes, and calls [`KubeRuntimeManager::compute_actions`] and then
//! [`KubeRuntimeManager::sync_pod`], which hold back containers in CrashLoopBackOff, kill what
//! must go, create the sandbox if needed, start the next init container or the app containers
//! and clean up dead containers, reporting each action in a [`PodSyncResult`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::actions::{self, compute_pod_actions_with, PodActions, ToStart};
use super::kill::{container_grace_seconds, pod_grace};
use super::result::{PodSyncResult, StartFailure, SyncAction};
use super::{container, hosts_file, image, sandbox, KubeRuntimeManager, SyncError};
use crate::container::{ContainerState, RuntimePodStatus};
use crate::cri::{api, CriRuntime};
use crate::pod::{pod_ref, pod_uid};

/// The waiting reasons of a container whose image is not there: kubelet's `Failed` event for
/// them says `Error: <reason>` (the message is in the image manager's event before it).
const IMAGE_REASONS: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "ImageInspectError",
];

/// The sandbox a sync starts containers in: its ID, config and the pod's IPs.
struct SandboxInfo {
    id: String,
    config: api::PodSandboxConfig,
    ips: Vec<String>,
}

/// What the pod-sync layer made ready for a runtime sync.
pub struct PodInputs<'a> {
    /// The pod cgroup's name (the sandbox's `cgroup_parent`), from
    /// [`crate::cm::ContainerManager::ensure_pod`].
    pub cgroup: String,
    /// Each volume's host directory by name (empty for a pod with nothing to start).
    pub volumes: &'a BTreeMap<String, PathBuf>,
    /// The new sandbox's log directory, made with the pod cgroup and volumes (one hand-off to
    /// the blocking pool): the outcome of `create_dir_all`, or `None` when it was not made
    /// there (the sandbox creation makes it).
    pub log_directory: Option<std::io::Result<()>>,
}

impl PodActions {
    /// The pod has finished: no sandbox to make or use, nothing to start.
    pub fn runs_nothing(&self) -> bool {
        self.create_sandbox.is_none() && self.sandbox_id.is_none()
    }

    /// No sandbox to make and no container to start (a running pod's sync after its start, or
    /// one whose containers wait out a back-off); containers may still be killed.
    pub fn starts_nothing(&self) -> bool {
        self.create_sandbox.is_none()
            && self.next_init.is_none()
            && self.containers_to_start.is_empty()
            && self.sidecars_to_start.is_empty()
            && self.ephemeral_to_start.is_empty()
    }
}

/// One container to start: its spec, its restart count, whether it is an init container, and
/// for an ephemeral container with a target, the target's container ID (or why there is none).
struct Starting<'a> {
    c: &'a k8s_openapi::api::core::v1::Container,
    start: &'a ToStart,
    is_init: bool,
    target: Option<Result<String, String>>,
}

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// The actions a sync of `pod` takes from its runtime state `rt` (kubelet's
    /// `computePodActions`, with the containers failed probes kill), with the containers in
    /// CrashLoopBackOff taken out and reported in `result` (kubelet's `doBackOff`).
    pub fn compute_actions(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        result: &mut PodSyncResult,
    ) -> PodActions {
        let mut actions = compute_pod_actions_with(pod, rt, self.probes.results());
        let probe_kills =
            actions::probe_kills(pod, rt, self.probes.results(), &actions.containers_to_kill);
        actions.containers_to_kill.extend(probe_kills);
        result.backoff = self.apply_crash_backoff(pod, rt, &mut actions, result);
        actions
    }

    /// Carries `actions` out (kubelet's `SyncPod` steps 2–7): stops the pod when it must be
    /// made again, creates the sandbox in `inputs.cgroup`, stops the containers to kill, starts
    /// the next init container or the sidecars and app containers, and removes dead containers.
    /// Every action's outcome goes into `result`; a failure outside a start (a CRI kill or
    /// status call, the sandbox) stops the sync and is `result.error`.
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        actions: &PodActions,
        inputs: PodInputs<'_>,
        result: &mut PodSyncResult,
    ) {
        if let Err(e) = self.sync_steps(pod, rt, actions, inputs, result).await {
            result.error = Some(e);
        }
    }

    async fn sync_steps(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        actions: &PodActions,
        inputs: PodInputs<'_>,
        result: &mut PodSyncResult,
    ) -> Result<(), SyncError> {
        let uid = pod_uid(pod);
        if actions.kill_pod {
            info!(pod = %pod_ref(pod), uid, recreate_sandbox = actions.create_sandbox.is_some(), "stopping pod containers and sandbox");
            if actions.create_sandbox.is_some() {
                // kubelet's event when a pod's sandbox is made again (SyncPod).
                self.recorder.normal(
                    crate::events::Involved::pod(pod),
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                );
            }
            self.kill_running(pod, rt, pod_grace(pod)).await?;
        }
        let sb = if let Some(attempt) = actions.create_sandbox {
            let sb = self
                .create_sandbox(pod, rt, attempt, inputs.cgroup, inputs.log_directory)
                .await
                .inspect_err(|e| {
                    result.add(
                        SyncAction::CreatePodSandbox,
                        "",
                        Some(StartFailure {
                            reason: "CreatePodSandboxError",
                            message: e.to_string(),
                        }),
                    );
                })?;
            result.add(SyncAction::CreatePodSandbox, "", None);
            result.sandbox_created = true;
            sb
        } else if let Some(id) = actions.sandbox_id.clone() {
            let sb = rt.sandboxes.first().cloned().unwrap_or_default();
            SandboxInfo {
                id,
                config: sandbox::sandbox_config(&self.settings, pod, sb.attempt, inputs.cgroup),
                ips: sb.ips,
            }
        } else {
            // Finished pod: nothing to start.
            return Ok(());
        };
        // A pod on the host network has the node's addresses (kubelet's podIPs for it).
        let ips = if sandbox::is_host_network(pod) {
            vec![self.settings.node_ip.clone()]
        } else {
            sb.ips.clone()
        };
        result.pod_ips = Some(ips.clone());
        let to_kill = self.kills_announced(pod, &actions.containers_to_kill);
        // Stopped before anything starts: a replacement may need the same host port.
        self.stop_containers(pod, &self.hook_ips(pod, rt), to_kill)
            .await?;
        self.start_containers(pod, rt, actions, &sb, &ips, inputs.volumes, result)
            .await;
        Ok(())
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
                self.recorder.normal(
                    crate::events::Involved::container(pod, name),
                    "Killing",
                    why,
                );
                (id.clone(), name.clone(), grace)
            })
            .collect()
    }

    /// Starts what `actions` says: the ephemeral containers never started (each joining its
    /// target's process namespace, found in `rt`), then the next init container, or the sidecars
    /// that exited and then the app containers, one at a time in spec order, each one's outcome
    /// in `result`. A failure does not hold back the containers after it.
    #[allow(clippy::too_many_arguments)]
    async fn start_containers(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        actions: &PodActions,
        sb: &SandboxInfo,
        ips: &[String],
        volumes: &BTreeMap<String, PathBuf>,
        result: &mut PodSyncResult,
    ) {
        // Sidecars that exited come back first, in order; then the app containers. One at a
        // time, in spec order: each created, started and its postStart hook finished before the
        // next (kubelet's `SyncPod`), so a proxy listed first with a postStart that waits for
        // it is ready before the app starts.
        let starts: Vec<(&ToStart, bool)> = match &actions.next_init {
            Some(init) => vec![(init, true)],
            None => actions
                .sidecars_to_start
                .iter()
                .map(|s| (s, true))
                .chain(actions.containers_to_start.iter().map(|s| (s, false)))
                .collect(),
        };
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        // Ephemeral containers first (kubelet's SyncPod step 5), so that a pod whose init
        // containers do not finish can be debugged. One with a target joins the process
        // namespace of the target's latest container.
        let ephemeral = crate::pod::ephemeral_containers(spec);
        for &index in &actions.ephemeral_to_start {
            let Some((c, target)) = ephemeral.get(index) else {
                continue;
            };
            let target = target.as_deref().map(|t| {
                rt.latest(t)
                    .map(|rc| rc.id.clone())
                    .ok_or_else(|| format!("unable to find target container {t}"))
            });
            let one = Starting {
                c,
                start: &ToStart {
                    index,
                    restart_count: 0,
                },
                is_init: false,
                target,
            };
            let outcome = self.start_one(pod, one, sb, ips, volumes).await;
            result.add(SyncAction::StartContainer, &c.name, outcome.err());
        }
        for (s, is_init) in starts {
            let list = if is_init {
                spec.init_containers.as_deref().unwrap_or(&[])
            } else {
                &spec.containers[..]
            };
            let Some(c) = list.get(s.index) else {
                continue;
            };
            let one = Starting {
                c,
                start: s,
                is_init,
                target: None,
            };
            let outcome = self.start_one(pod, one, sb, ips, volumes).await;
            result.add(SyncAction::StartContainer, &c.name, outcome.err());
        }
    }

    /// Creates the pod's sandbox with `attempt` in `cgroup` (RunPodSandbox, then
    /// PodSandboxStatus for its IPs), its log directory made first on the blocking pool unless
    /// `log_directory_made` carries the outcome of making it ([`PodInputs::log_directory`]). A
    /// failure is kubelet's FailedCreatePodSandBox: the pod stays Pending, visible, with an
    /// event.
    async fn create_sandbox(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        attempt: u32,
        cgroup: String,
        log_directory_made: Option<std::io::Result<()>>,
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
        let made_log_directory = match log_directory_made {
            Some(made) => made,
            None => {
                let log_directory = config.log_directory.clone();
                crate::blocking::run(move || std::fs::create_dir_all(log_directory)).await
            }
        };
        let created = match (
            sandbox::kernel_hostname(&self.settings, pod),
            made_log_directory,
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
        one: Starting<'_>,
        sb: &SandboxInfo,
        pod_ips: &[String],
        volumes: &BTreeMap<String, PathBuf>,
    ) -> Result<(), StartFailure> {
        let Starting {
            c,
            start,
            is_init,
            target,
        } = one;
        let spec = pod.spec.as_ref().ok_or_else(|| StartFailure {
            reason: "CreateContainerConfigError",
            message: "pod has no spec".into(),
        })?;
        let uid = pod_uid(pod);
        // What a runtime or path error could quote of the pod's Secrets is taken out of every
        // message (a value in the env, a subPathExpr expanded with it).
        let secrets = crate::objects::secret_values(pod, self.objects_for(pod));
        // kubelet's events are about the container (`GenerateContainerRef`): every failure to
        // pull, create or start ends in a Warning `Failed` `Error: <message>`, where for an
        // image the message is the waiting reason and the image manager's own event came first
        // (`startContainer`, `EnsureImageExists`).
        let about = crate::events::Involved::container(pod, &c.name);
        let fail = |reason: &'static str, message: String| {
            let message = crate::objects::redact(&message, &secrets);
            let error = if IMAGE_REASONS.contains(&reason) {
                reason
            } else {
                &message
            };
            self.recorder
                .warning(about.clone(), "Failed", format!("Error: {error}"));
            warn!(pod = %pod_ref(pod), uid, container = %c.name, reason, error = %message, "container start failed");
            StartFailure { reason, message }
        };
        let image = c.image.clone().unwrap_or_default();
        let pull_key = format!("{uid}/{image}");
        let now = self.clock.epoch_ns();
        if self
            .pull_backoff
            .remaining_since_update(&pull_key, now)
            .is_some()
        {
            let message = format!("Back-off pulling image {image:?}");
            self.recorder
                .normal(about.clone(), "BackOff", message.clone());
            return Err(fail("ImagePullBackOff", message));
        }
        let credentials = |repository: &str| self.pull_credentials(pod, repository);
        let mut pulling = self.clock.now();
        let report = |step| match step {
            image::ImageStep::Present => self.recorder.normal(
                about.clone(),
                "Pulled",
                format!("Container image {image:?} already present on machine"),
            ),
            image::ImageStep::Pulling => {
                pulling = self.clock.now();
                self.recorder
                    .normal(about.clone(), "Pulling", format!("Pulling image {image:?}"));
            }
            image::ImageStep::Pulled => self.recorder.normal(
                about.clone(),
                "Pulled",
                format!(
                    "Successfully pulled image {image:?} in {}",
                    crate::duration::format_go_duration(
                        self.clock.now().saturating_duration_since(pulling)
                    )
                ),
            ),
        };
        let image = match image::ensure_image(&self.cri, c, &sb.config, credentials, report).await {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, image::ImageError::Pull { .. }) {
                    self.pull_backoff.next(&pull_key, self.clock.epoch_ns());
                }
                let (reason, message) = e.event();
                self.recorder.warning(
                    about.clone(),
                    reason,
                    crate::objects::redact(&message, &secrets),
                );
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
        let mut config = self
            .container_config_with_mounts(pod, c, start, is_init, &image.id, pod_ips, volumes)
            .await
            .map_err(|e| fail("CreateContainerConfigError", e))?;
        if let Some(target) = target {
            let target = target.map_err(|e| fail("CreateContainerConfigError", e))?;
            container::join_target_pid_namespace(&mut config, &target);
        }
        let files = super::container_files::ContainerFiles {
            termination_message: c
                .termination_message_path
                .clone()
                .filter(|p| !p.is_empty())
                .map(|path| super::container_files::TerminationMessage {
                    pod_dir: hosts_file::pod_dir(&self.settings.root_dir, uid),
                    container: c.name.clone(),
                    attempt: start.restart_count,
                    container_path: path,
                }),
            hosts: hosts_file::plan(&self.settings, pod, pod_ips),
            log_dir: PathBuf::from(&sb.config.log_directory).join(&c.name),
        };
        let mounts = crate::blocking::run(move || files.make())
            .await
            .map_err(|e| fail(e.reason(), e.to_string()))?;
        config.mounts.extend(mounts);
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
        self.recorder.normal(
            about.clone(),
            "Created",
            format!("Created container {}", c.name),
        );
        self.cri
            .start_container(&id)
            .await
            .map_err(|e| fail("RunContainerError", e.message))?;
        self.metrics.started_containers.inc();
        self.recorder.normal(
            about.clone(),
            "Started",
            format!("Started container {}", c.name),
        );
        if let Err(message) = self.run_post_start(pod, c, &id, pod_ips).await {
            // kubelet kills the container (its `Killing` event says why) and reports
            // PostStartHookError; it restarts by policy.
            self.recorder
                .normal(about, "Killing", "FailedPostStartHook");
            let grace = container_grace_seconds(pod, &c.name, None);
            let _ = self
                .stop_containers(pod, pod_ips, vec![(id.clone(), c.name.clone(), grace)])
                .await;
            return Err(StartFailure {
                reason: "PostStartHookError",
                message,
            });
        }
        info!(pod = %pod_ref(pod), uid, container = %c.name, restart_count = start.restart_count, init = is_init, "started container");
        Ok(())
    }

    /// The CRI config of container `c` with its volumes' mounts (subPathExpr expanded with the
    /// container's env); the termination message file and the pod's hosts file are mounted by
    /// the caller once made ([`super::container_files`]). Errors: the message of a
    /// `CreateContainerConfigError`.
    #[allow(clippy::too_many_arguments)]
    async fn container_config_with_mounts(
        &self,
        pod: &Pod,
        c: &k8s_openapi::api::core::v1::Container,
        start: &ToStart,
        is_init: bool,
        image_ref: &str,
        pod_ips: &[String],
        volumes: &BTreeMap<String, PathBuf>,
    ) -> Result<api::ContainerConfig, String> {
        let services = self.service_env(pod)?;
        let inputs = container::ContainerInputs {
            restart_count: start.restart_count,
            image_ref,
            pod_ips,
            is_init,
            env_sources: container::EnvSources {
                objects: self.objects_for(pod),
                services: &services,
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
        // A subPath reaches the runtime as a bind mount of what was checked (CVE-2017-1002101).
        let pod_dir = super::hosts_file::pod_dir(&self.settings.root_dir, pod_uid(pod));
        // A subPath is made, resolved and bound in its volume: on the blocking pool, as the
        // other file-system steps of a start (a volume on a hung file system holds this pod).
        // Mounts without one touch no file system.
        let mounts = if crate::volume::mounts::has_sub_path(c) {
            let (c, volumes) = (c.clone(), volumes.clone());
            crate::blocking::run(move || volume_mounts(&c, &volumes, &read_only, &vars, &pod_dir))
                .await?
        } else {
            volume_mounts(c, volumes, &read_only, &vars, &pod_dir)?
        };
        config.mounts.extend(mounts);
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
        result: &mut PodSyncResult,
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
                        "back-off {}s restarting failed container={name} pod={}",
                        delay.as_secs(),
                        crate::pod::format_pod(pod)
                    );
                    // The event as kubelet words it since v1.27 (v1.20 left the container and
                    // pod out of it: the event's field path named the container).
                    self.recorder.warning(
                        crate::events::Involved::container(pod, name),
                        "BackOff",
                        format!(
                            "Back-off restarting failed container {name} in pod {}",
                            crate::pod::format_pod(pod)
                        ),
                    );
                    result.add(
                        SyncAction::StartContainer,
                        name,
                        Some(StartFailure {
                            reason: "CrashLoopBackOff",
                            message: msg,
                        }),
                    );
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

/// Container `c`'s CRI mounts of its volumes ([`crate::volume::mounts::container_mounts`]),
/// `subPathExpr` expanded with `vars` (its env), a subPath bound under `pod_dir`
/// ([`crate::volume::subpath::bind`]). Errors: the message of a `CreateContainerConfigError`.
fn volume_mounts(
    c: &k8s_openapi::api::core::v1::Container,
    volumes: &BTreeMap<String, PathBuf>,
    read_only: &std::collections::BTreeSet<String>,
    vars: &std::collections::HashMap<String, String>,
    pod_dir: &std::path::Path,
) -> Result<Vec<api::Mount>, String> {
    let bind = |root: &std::path::Path, rel: &std::path::Path, volume: &str, i: usize| {
        crate::volume::subpath::bind(root, rel, pod_dir, volume, &c.name, i)
    };
    crate::volume::mounts::container_mounts(
        c,
        volumes,
        read_only,
        &|s| container::expand(s, vars),
        &bind,
    )
}
