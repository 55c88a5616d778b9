//! Runtime manager (kubelet's `kuberuntime_manager.go`): turns a pod spec into CRI calls.
//!
//! `sync_pod` reads the pod's state from the runtime, computes the actions
//! ([`actions::compute_pod_actions`]) and carries them out: stop what must stop, create the
//! sandbox, start the next init container or the app containers; then it records the pod's status.
//! `terminate_pod` stops every container with the grace period and stops and removes the
//! sandboxes, the pod's log directory and its cgroups.

pub mod actions;
pub mod backoff;
pub mod container;
pub mod hosts_file;
pub mod image;
pub mod labels;
pub mod logs;
pub mod runtime_status;
pub mod sandbox;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use crate::cm::resources::CgroupPolicy;
use crate::cm::ContainerManager;
use crate::cri::{api, Cri, CriError};
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::pleg::cache::PodCache;
use crate::pod::pod_ref;
use crate::podworkers::{PodSyncer, Requeue};
use crate::status::generate::{generate_pod_status, StartErrors};
use crate::status::StatusManager;
use actions::{compute_pod_actions, PodActions, ToStart};
use backoff::{Backoff, BackoffPolicy};
use runtime_status::{get_pod_status, ContainerState, RuntimePodStatus};
use sandbox::ResolvConf;
use std::time::Duration;

/// Smallest grace period used to stop a container, seconds (kubelet's
/// `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_PERIOD_SECONDS: i64 = 2;

/// Node facts and paths the runtime manager needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Node name (hostname or `--hostname-override`).
    pub node_name: String,
    /// The machine's hostname: the hostname of host-network pods (which share the host's UTS
    /// namespace), whatever `--hostname-override` names the node.
    pub hostname: String,
    /// The node's IP (`status.hostIP`).
    pub node_ip: String,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// The host's resolver for DNS policy Default / ClusterFirst without cluster DNS.
    pub resolv_conf: ResolvConf,
    /// `clusterDNS`: the cluster DNS servers (empty: none).
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` without a trailing dot (empty: none).
    pub cluster_domain: String,
    /// `--root-dir`: pod directories live in `<root-dir>/pods/<uid>` (kubelet's layout).
    pub root_dir: PathBuf,
    /// Pod and container cgroup knobs (`cpuCFSQuota`, period, `podPidsLimit`).
    pub cgroup_policy: CgroupPolicy,
    /// Node memory capacity, bytes (Burstable oom_score_adj).
    pub memory_capacity: i64,
    /// Container restart back-off (`crashLoopBackOff`).
    pub crash_backoff: BackoffPolicy,
    /// Image pull back-off (`imagePullBackOff`).
    pub pull_backoff: BackoffPolicy,
}

impl Settings {
    /// Settings with placeholder node facts (node `node1`, IP 10.0.0.10, logs in
    /// `/var/log/pods`, root dir `/var/lib/nodelet`, resolver 10.0.0.1, no cluster DNS) and kubelet's cgroup and back-off defaults, for
    /// `nodelet plan`, benchmarks and unit tests, where only what derives from the pod matters.
    pub fn example() -> Self {
        Self {
            node_name: "node1".into(),
            hostname: "node1".into(),
            node_ip: "10.0.0.10".into(),
            pod_logs_dir: "/var/log/pods".into(),
            resolv_conf: ResolvConf {
                servers: vec!["10.0.0.1".into()],
                ..Default::default()
            },
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            root_dir: "/var/lib/nodelet".into(),
            cgroup_policy: CgroupPolicy::default(),
            memory_capacity: 8 << 30,
            crash_backoff: BackoffPolicy::KUBELET,
            pull_backoff: BackoffPolicy::KUBELET,
        }
    }
}

/// A sync that did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SyncError {
    /// A CRI call failed.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The pod cgroup could not be made.
    #[error("pod cgroup: {0}")]
    Cgroup(String),
    /// A container could not be started; `reason` is kubelet's waiting reason.
    #[error("container {container}: {reason}: {message}")]
    Start {
        /// Container name.
        container: String,
        /// `ErrImagePull`, `CreateContainerConfigError`, `CreateContainerError`, `RunContainerError`...
        reason: &'static str,
        /// Details.
        message: String,
    },
}

/// The runtime manager: one per agent, shared by all pod workers.
pub struct KubeRuntimeManager {
    cri: Cri,
    settings: Settings,
    cm: Arc<ContainerManager>,
    status: StatusManager,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    start_errors: Mutex<HashMap<String, StartErrors>>,
    cache: PodCache,
    last_sync: Mutex<HashMap<String, std::time::Instant>>,
    crash_backoff: Backoff,
    pull_backoff: Backoff,
    /// Pods whose start duration has been observed.
    started: Mutex<std::collections::HashSet<String>>,
    /// When this agent started, nanoseconds since the epoch.
    agent_start_ns: i64,
    /// Pods failed by eviction or admission: never started, status Failed/Evicted.
    evicted: crate::eviction::EvictedPods,
}

/// The grace period a pod's containers are stopped with, seconds: an override as given but at
/// least 1 (hard eviction passes 1; kubelet's pod workers never go below 1), else the pod's own
/// raised to [`MIN_GRACE_PERIOD_SECONDS`] (kubelet's `killContainer` applies that minimum before
/// the override).
fn grace_seconds(pod: &Pod, over: Option<i64>) -> i64 {
    if let Some(g) = over {
        return g.max(1);
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(crate::source::manifest::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
        .max(MIN_GRACE_PERIOD_SECONDS)
}

impl KubeRuntimeManager {
    /// A manager over `cri` writing statuses to `status`.
    pub fn new(
        cri: Cri,
        settings: Settings,
        cm: Arc<ContainerManager>,
        status: StatusManager,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        cache: PodCache,
    ) -> Self {
        let (crash, pull) = (settings.crash_backoff, settings.pull_backoff);
        Self {
            cri,
            settings,
            cm,
            status,
            recorder,
            metrics,
            start_errors: Mutex::new(HashMap::new()),
            cache,
            last_sync: Mutex::new(HashMap::new()),
            crash_backoff: Backoff::new(crash),
            pull_backoff: Backoff::new(pull),
            started: Mutex::new(std::collections::HashSet::new()),
            agent_start_ns: backoff::now_ns(),
            evicted: Default::default(),
        }
    }

    /// Shares the registry of evicted pods with the eviction manager and the sync loop.
    pub fn with_evicted(mut self, evicted: crate::eviction::EvictedPods) -> Self {
        self.evicted = evicted;
        self
    }

    /// The container manager.
    pub fn cm(&self) -> &ContainerManager {
        &self.cm
    }

    /// Node facts and paths.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The CRI client.
    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    fn set_start_error(&self, uid: &str, container: &str, err: Option<(String, String)>) {
        let mut m = self.start_errors.lock().unwrap_or_else(|e| e.into_inner());
        let pod = m.entry(uid.to_owned()).or_default();
        match err {
            Some(e) => {
                pod.insert(container.to_owned(), e);
            }
            None => {
                pod.remove(container);
            }
        }
    }

    fn record_status(&self, pod: &Arc<Pod>, rt: &RuntimePodStatus, init_failed: bool) {
        let uid = crate::pod::pod_uid(pod);
        let errors = self
            .start_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
            .unwrap_or_default();
        let st = generate_pod_status(pod, rt, &errors, &self.settings.node_ip, init_failed);
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
            let secs = k8s_openapi::jiff::Timestamp::now()
                .duration_since(t)
                .as_secs_f64();
            if secs >= 0.0 {
                self.metrics.pod_start_duration.observe(secs);
            }
        }
    }

    /// Running pods and containers by state, from the statuses.
    fn refresh_status_metrics(&self) {
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

    async fn stop_containers(
        &self,
        pod: &Pod,
        ids: Vec<(String, String)>,
        grace: i64,
    ) -> Result<(), CriError> {
        let stops = ids.iter().map(|(id, name)| async move {
            info!(pod = %pod_ref(pod), container = %name, grace, "stopping container");
            self.cri.stop_container(id, grace).await
        });
        futures::future::try_join_all(stops).await.map(drop)
    }

    async fn start_one(
        &self,
        pod: &Pod,
        start: &ToStart,
        is_init: bool,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        pod_ips: &[String],
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
        let uid = crate::pod::pod_uid(pod);
        let fail = |reason: &'static str, message: String| {
            self.set_start_error(uid, &c.name, Some((reason.to_owned(), message.clone())));
            self.recorder.warning(
                pod_ref(pod),
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
        if let Some(left) = self
            .pull_backoff
            .remaining_since_update(&pull_key, backoff::now_ns())
        {
            return Err(fail(
                "ImagePullBackOff",
                format!(
                    "Back-off pulling image {image:?} ({}s left)",
                    left.as_secs()
                ),
            ));
        }
        let image_ref = match image::ensure_image(&self.cri, c, sandbox_config).await {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, image::ImageError::Pull { .. }) {
                    self.pull_backoff.next(&pull_key, backoff::now_ns());
                }
                return Err(fail(e.reason(), e.to_string()));
            }
        };
        let inputs = container::ContainerInputs {
            restart_count: start.restart_count,
            image_ref: &image_ref,
            pod_ips,
            is_init,
        };
        let mut config = container::container_config(&self.settings, pod, c, &inputs)
            .map_err(|e| fail("CreateContainerConfigError", e.message))?;
        match hosts_file::ensure_hosts_file(&self.settings, pod, pod_ips) {
            Ok(Some(mount)) => config.mounts.push(mount),
            Ok(None) => {}
            Err(e) => {
                return Err(fail(
                    "CreateContainerConfigError",
                    format!("cannot write the pod's hosts file: {e}"),
                ))
            }
        }
        let log_dir = PathBuf::from(&sandbox_config.log_directory).join(&c.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| {
            fail(
                "CreateContainerError",
                format!("cannot create log directory {}: {e}", log_dir.display()),
            )
        })?;
        let id = self
            .cri
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await
            .map_err(|e| fail("CreateContainerError", e.message))?;
        self.cri
            .start_container(&id)
            .await
            .map_err(|e| fail("RunContainerError", e.message))?;
        self.set_start_error(uid, &c.name, None);
        self.metrics.started_containers.inc();
        self.recorder.normal(
            pod_ref(pod),
            "Started",
            format!("Started container {}", c.name),
        );
        info!(pod = %pod_ref(pod), uid, container = %c.name, restart_count = start.restart_count, init = is_init, "started container");
        Ok(())
    }

    /// Kills everything running in the pod: containers with the grace period, then sandboxes.
    async fn kill_running(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        grace: i64,
    ) -> Result<(), CriError> {
        let running: Vec<(String, String)> = rt
            .containers
            .iter()
            .filter(|c| c.state() == ContainerState::Running)
            .map(|c| (c.id.clone(), c.name.clone()))
            .collect();
        self.stop_containers(pod, running, grace).await?;
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            self.cri.stop_pod_sandbox(&s.id).await?;
        }
        Ok(())
    }

    async fn sync(&self, pod: &Arc<Pod>) -> Result<Requeue, SyncError> {
        let uid = crate::pod::pod_uid(pod).to_owned();
        if let Some(failure) = self.evicted.failure(pod) {
            // Failed by eviction (its kill is queued behind this sync) or refused at admission:
            // nothing is started until the manifest changes.
            self.status.set(pod.clone(), failure.status(pod));
            return Ok(Requeue::Normal);
        }
        let rt = self.current_status(&uid).await?;
        let mut actions = compute_pod_actions(pod, &rt);
        let wait = self.apply_crash_backoff(pod, &rt, &mut actions);
        let grace = grace_seconds(pod, None);
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
        let (sandbox_id, sandbox_config, ips) = if let Some(attempt) = actions.create_sandbox {
            let cfg = sandbox::sandbox_config(&self.settings, pod, attempt, cgroup.clone());
            let created = match std::fs::create_dir_all(&cfg.log_directory) {
                Ok(()) => self
                    .cri
                    .run_pod_sandbox(cfg.clone())
                    .await
                    .map_err(SyncError::from),
                Err(e) => Err(SyncError::Start {
                    container: String::new(),
                    reason: "CreateContainerError",
                    message: format!("cannot create pod log directory {}: {e}", cfg.log_directory),
                }),
            };
            let id = match created {
                Ok(id) => id,
                Err(e) => {
                    // kubelet's FailedCreatePodSandBox: the pod stays Pending, visible, with an event.
                    self.recorder.warning(
                        pod_ref(pod),
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {e}"),
                    );
                    self.record_status(pod, &rt, false);
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
            (id, cfg, ips)
        } else if let Some(id) = actions.sandbox_id.clone() {
            let sb = rt.sandboxes.first().cloned().unwrap_or_default();
            (
                id,
                sandbox::sandbox_config(&self.settings, pod, sb.attempt, cgroup),
                sb.ips,
            )
        } else {
            // Finished pod: nothing to start.
            let rt = get_pod_status(&self.cri, &uid).await?;
            self.record_status(pod, &rt, actions.init_failed);
            return Ok(Requeue::Normal);
        };

        // A pod on the host network has the node's addresses (kubelet's podIPs for it).
        let ips = if sandbox::is_host_network(pod) {
            vec![self.settings.node_ip.clone()]
        } else {
            ips
        };
        let to_kill: Vec<(String, String)> = actions
            .containers_to_kill
            .iter()
            .map(|(id, name, reason)| {
                let why = match reason {
                    actions::KillReason::SpecChanged => {
                        format!("Container {name} definition changed, will be restarted")
                    }
                    actions::KillReason::NotInSpec => {
                        format!("Container {name} is not in the pod spec any more")
                    }
                };
                self.recorder.normal(pod_ref(pod), "Killing", why);
                (id.clone(), name.clone())
            })
            .collect();
        self.stop_containers(pod, to_kill, grace).await?;

        let mut first_err = None;
        if let Some(init) = &actions.next_init {
            if let Err(e) = self
                .start_one(pod, init, true, &sandbox_id, &sandbox_config, &ips)
                .await
            {
                first_err = Some(e);
            }
        } else {
            let starts = actions
                .containers_to_start
                .iter()
                .map(|s| self.start_one(pod, s, false, &sandbox_id, &sandbox_config, &ips));
            first_err = futures::future::join_all(starts)
                .await
                .into_iter()
                .find_map(Result::err);
        }
        let rt = self.fresh_status(&uid).await?;
        crate::gc::remove_dead_containers(&self.cri, &rt).await;
        self.record_status(pod, &rt, actions.init_failed);
        if let Some(e) = first_err {
            return Err(e);
        }
        // PLEG events bring the pod back when its containers change; a container in back-off
        // is started again when its delay is over.
        Ok(wait.map_or(Requeue::Normal, Requeue::After))
    }

    /// The pod's runtime status, from the PLEG's cache when it is newer than this pod's last
    /// sync, else read from the runtime (kubelet's `GetNewerThan` on the pod cache).
    async fn current_status(&self, uid: &str) -> Result<RuntimePodStatus, CriError> {
        let since = self
            .last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .copied();
        if let Some(st) = since.and_then(|t| self.cache.get_newer_than(uid, t)) {
            return Ok((*st).clone());
        }
        self.fresh_status(uid).await
    }

    /// Reads the pod's status from the runtime, records it in the cache and as this pod's
    /// last sync time.
    async fn fresh_status(&self, uid: &str) -> Result<RuntimePodStatus, CriError> {
        let at = std::time::Instant::now();
        let st = get_pod_status(&self.cri, uid).await?;
        self.cache.set(uid, st.clone(), at);
        self.last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), at);
        Ok(st)
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
        let uid = crate::pod::pod_uid(pod);
        let spec = pod.spec.as_ref()?;
        let now = backoff::now_ns();
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
                        pod_ref(pod),
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
        wait
    }

    async fn terminate(&self, pod: &Arc<Pod>, grace: Option<i64>) -> Result<(), SyncError> {
        let uid = crate::pod::pod_uid(pod).to_owned();
        let rt = get_pod_status(&self.cri, &uid).await?;
        let grace = grace_seconds(pod, grace);
        info!(pod = %pod_ref(pod), uid, grace, "killing pod");
        self.kill_running(pod, &rt, grace).await?;
        for s in &rt.sandboxes {
            self.cri.remove_pod_sandbox(&s.id).await?;
        }
        // Names come from validated manifests or from sandbox labels; never remove anything that
        // is not a direct child of podLogsDir, nor a cgroup named by an unsafe UID.
        let logs = sandbox::pod_logs_dir(&self.settings, pod);
        let safe = crate::pod::is_safe_uid(&uid)
            && logs.parent() == Some(self.settings.pod_logs_dir.as_path());
        if !safe {
            warn!(pod = %pod_ref(pod), uid, "pod identity is not safe for paths; leaving its log directory and cgroups alone");
        } else if let Err(e) = std::fs::remove_dir_all(&logs) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(pod = %pod_ref(pod), uid, path = %logs.display(), error = %e, "cannot remove pod log directory");
            }
        }
        if safe {
            self.cm.remove_pod(&uid);
            let dir = hosts_file::pod_dir(&self.settings.root_dir, &uid);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(pod = %pod_ref(pod), uid, path = %dir.display(), error = %e, "cannot remove pod directory");
                }
            }
        }
        self.start_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        // An evicted pod keeps its Failed/Evicted status while its manifest stays.
        let evicted = self.evicted.failure(pod);
        match &evicted {
            Some(f) => self.status.set(pod.clone(), f.status(pod)),
            None => self.status.remove(&uid),
        }
        self.cache.delete(&uid);
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        self.last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        self.crash_backoff.forget_prefix(&format!("{uid}/"));
        self.pull_backoff.forget_prefix(&format!("{uid}/"));
        self.refresh_status_metrics();
        self.recorder.normal(
            pod_ref(pod),
            "Killing",
            match &evicted {
                Some(f) if f.reason == crate::eviction::REASON => {
                    "Pod evicted: containers stopped, sandbox removed"
                }
                Some(_) => "Pod rejected: containers stopped, sandbox removed",
                None => "Pod removed: containers stopped, sandbox removed",
            },
        );
        info!(pod = %pod_ref(pod), uid, "pod terminated and removed");
        Ok(())
    }

    /// Every pod the runtime has a sandbox for on this node, as a minimal pod (name, namespace,
    /// UID, and the grace period its containers were created with); housekeeping compares them
    /// with the desired pods.
    pub async fn runtime_pods(&self) -> Result<Vec<Pod>, CriError> {
        let sel: HashMap<String, String> = [(
            labels::NODE_NAME.to_string(),
            self.settings.node_name.clone(),
        )]
        .into();
        let (sandboxes, containers) = tokio::try_join!(
            self.cri.list_pod_sandbox(sel),
            self.cri.list_containers(HashMap::new())
        )?;
        let grace: HashMap<&str, i64> = containers
            .iter()
            .filter_map(|c| {
                Some((
                    c.labels.get(labels::POD_UID)?.as_str(),
                    c.annotations
                        .get(labels::POD_TERMINATION_GRACE_PERIOD)?
                        .parse()
                        .ok()?,
                ))
            })
            .collect();
        let mut pods: HashMap<String, Pod> = HashMap::new();
        for s in sandboxes {
            let Some(uid) = s.labels.get(labels::POD_UID).cloned() else {
                continue;
            };
            pods.entry(uid.clone()).or_insert_with(|| {
                let mut p = Pod::default();
                p.metadata.name = s.labels.get(labels::POD_NAME).cloned();
                p.metadata.namespace = s.labels.get(labels::POD_NAMESPACE).cloned();
                let g = grace.get(uid.as_str()).copied();
                p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                    termination_grace_period_seconds: g,
                    ..Default::default()
                });
                p.metadata.uid = Some(uid);
                p
            });
        }
        Ok(pods.into_values().collect())
    }
}

impl PodSyncer for KubeRuntimeManager {
    async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Requeue, String> {
        let t = std::time::Instant::now();
        let r = self.sync(&pod).await.map_err(|e| e.to_string());
        Metrics::observe(
            &self.metrics.pod_worker_duration,
            "sync",
            t.elapsed().as_secs_f64(),
        );
        r
    }

    async fn terminate_pod(&self, pod: Arc<Pod>, grace: Option<i64>) -> Result<(), String> {
        let t = std::time::Instant::now();
        let r = self.terminate(&pod, grace).await.map_err(|e| e.to_string());
        Metrics::observe(
            &self.metrics.pod_worker_duration,
            "kill",
            t.elapsed().as_secs_f64(),
        );
        r
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
