//! Runtime manager (kubelet's `kuberuntime_manager.go`): turns a pod spec into CRI calls, split as
//! kubelet splits it:
//!
//! - [`sync`] (`SyncPod`): compute the actions ([`actions::compute_pod_actions`], the
//!   crash-loop back-off) and carry them out: stop what must stop, create the sandbox, start the
//!   next init container or the app containers, each outcome in a [`result::PodSyncResult`];
//! - [`kill`] (`KillPod`, `killContainer`): stop every container with the grace period, then the
//!   sandboxes, and remove them;
//! - [`status`] (`GetPodStatus`): the runtime's view of a pod.
//!
//! What a sync does above the runtime (the pod's status, cgroup, volumes, probes, active
//! deadline, clean-up) is the pod-sync layer's, [`crate::podsync`], which calls this manager.
//! The manager drives any [`CriRuntime`] (the socket client in the agent, a recording fake in
//! unit tests) and reads time from an injected [`crate::clock::Clock`].

pub mod actions;
pub mod backoff;
pub mod container;
pub mod container_files;
pub mod hosts_file;
pub mod image;
pub mod kill;
pub mod labels;
pub mod lifecycle;
pub mod logs;
pub mod result;
pub mod sandbox;
pub mod security_context;
pub mod status;
pub mod sync;
pub mod termination_message;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::clock::SharedClock;
use crate::cm::resources::CgroupPolicy;
use crate::container::cache::PodCache;
use crate::cri::{Cri, CriError, CriRuntime};
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::objects::LocalObjects;
use crate::prober::ProbeManager;
use backoff::{Backoff, BackoffPolicy};
use sandbox::ResolvConf;

pub use crate::fieldpath::Allocatable;
pub use kill::MIN_GRACE_PERIOD_SECONDS;

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
    /// Node allocatable (the limits a `resourceFieldRef` falls back to).
    pub allocatable: Allocatable,
    /// The host has AppArmor enabled: containers get their AppArmor profile (RuntimeDefault
    /// when none is set), as kubelet gives it.
    pub apparmor: bool,
    /// Container restart back-off (`crashLoopBackOff`).
    pub crash_backoff: BackoffPolicy,
    /// Image pull back-off (`imagePullBackOff`).
    pub pull_backoff: BackoffPolicy,
}

impl Settings {
    /// Settings with placeholder node facts (node `node1`, IP 10.0.0.10, logs in
    /// `/var/log/pods`, root dir `/var/lib/nodelet`, resolver 10.0.0.1, no cluster DNS) and
    /// kubelet's cgroup and back-off defaults, for `nodelet plan`, benchmarks and unit tests,
    /// where only what derives from the pod matters.
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
            allocatable: Allocatable {
                cpu_milli: 2000,
                memory: 8 << 30,
                ephemeral_storage: 100 << 30,
            },
            apparmor: false,
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
    /// A container could not be started; `reason` is kubelet's waiting reason.
    #[error("{}{reason}: {message}", start_prefix(.container))]
    Start {
        /// Container name.
        container: String,
        /// `ErrImagePull`, `CreateContainerConfigError`, `CreateContainerError`, `RunContainerError`...
        reason: &'static str,
        /// Details.
        message: String,
    },
}

/// `container <name>: ` before a start error's reason, nothing for the pod's own (a sandbox).
fn start_prefix(container: &str) -> String {
    if container.is_empty() {
        String::new()
    } else {
        format!("container {container}: ")
    }
}

/// What the manager shares with the rest of the agent.
pub struct Shared {
    /// Events (Started, Killing, BackOff, FailedCreatePodSandBox...).
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The pod cache (read; its entries are the PLEG's, what a worker made is its own note).
    pub cache: PodCache,
    /// Time.
    pub clock: SharedClock,
    /// Probe results (liveness and startup failures kill) and the hook handlers' context.
    pub probes: ProbeManager,
    /// Local ConfigMaps and Secrets (env of static pods).
    pub objects: LocalObjects,
    /// The apiserver's ConfigMaps and Secrets (env of API pods).
    pub api_objects: crate::objects::ApiObjects,
}

/// The runtime manager: one per agent, shared by all pod workers (through the pod-sync layer),
/// over the CRI runtime `R`.
pub struct KubeRuntimeManager<R: CriRuntime = Cri> {
    cri: R,
    settings: Settings,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    cache: PodCache,
    crash_backoff: Backoff,
    pull_backoff: Backoff,
    probes: ProbeManager,
    objects: LocalObjects,
    api_objects: crate::objects::ApiObjects,
    /// Permits for RunPodSandbox calls in flight ([`SANDBOX_STARTS_IN_FLIGHT`]).
    sandbox_starts: tokio::sync::Semaphore,
}

/// Most RunPodSandbox calls for pods on the pod network nodelet has in flight at once; a pod
/// worker that would make one more waits for one to return. A host-network pod's sandbox is
/// not counted nor held back (no network to set up; the CNI agent itself is one). kubelet has
/// no bound: a burst of 110 pods asks the runtime for 110 sandboxes at once. On the 2-core test
/// machine, where the runtime is CPU-bound (a busybox pod start costs the machine about 350 ms
/// of CPU there, containerd, runc, CNI and the kernel), a burst of 110 busybox pods ran 12–16 %
/// sooner with the bound than without, and cost nodelet less CPU per pod (benches/README.md,
/// scale); 16 is the concurrency of the harness's raw CRI client. A sandbox whose creation
/// hangs holds its permit until the runtime request timeout.
pub const SANDBOX_STARTS_IN_FLIGHT: usize = 16;

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// A manager over `cri` with `settings`.
    pub fn new(cri: R, settings: Settings, shared: Shared) -> Self {
        Self {
            crash_backoff: Backoff::new(settings.crash_backoff),
            pull_backoff: Backoff::new(settings.pull_backoff),
            cri,
            settings,
            recorder: shared.recorder,
            metrics: shared.metrics,
            clock: shared.clock,
            cache: shared.cache,
            probes: shared.probes,
            objects: shared.objects,
            api_objects: shared.api_objects,
            sandbox_starts: tokio::sync::Semaphore::new(SANDBOX_STARTS_IN_FLIGHT),
        }
    }

    /// Where `pod` reads its ConfigMaps and Secrets: the apiserver's for a pod from the API,
    /// else the local documents.
    fn objects_for(&self, pod: &Pod) -> &LocalObjects {
        if crate::pod::is_api_pod(pod) {
            self.api_objects.store()
        } else {
            &self.objects
        }
    }

    /// The registry credentials for pulling `repository` for `pod` (kubelet's
    /// `getPullSecretsForPod` and `MakeDockerKeyring`, [`crate::credentialprovider`]): those of
    /// the Secrets its `spec.imagePullSecrets` names, read from its objects, then the node's
    /// `<root-dir>/config.json`. A named Secret that is absent is named in a Warning event
    /// `FailedToRetrieveImagePullSecret` with kubelet's message, and the pull goes on without
    /// it. Errors: a pull secret that does not parse, naming it.
    fn pull_credentials(
        &self,
        pod: &Pod,
        repository: &str,
    ) -> Result<Vec<crate::cri::api::AuthConfig>, String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let objects = self.objects_for(pod);
        let names = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.as_str());
        let secrets = crate::credentialprovider::pull_secrets(names, |name| {
            objects.get(crate::objects::ObjectKind::Secret, namespace, name)
        })?;
        if !secrets.missing.is_empty() {
            self.recorder.warning(
                crate::events::Involved::pod(pod),
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    secrets.missing.join(", ")
                ),
            );
        }
        let mut creds = secrets.keyring.lookup(repository);
        creds.extend(
            crate::credentialprovider::node_keyring(&self.settings.root_dir).lookup(repository),
        );
        Ok(creds)
    }

    /// The service variables of `pod`'s containers ([`crate::envvars::pod_env`]). Errors:
    /// [`crate::envvars::NOT_SYNCED`].
    fn service_env(&self, pod: &Pod) -> Result<Vec<(String, String)>, String> {
        crate::envvars::pod_env(self.api_objects.services(), pod).map_err(str::to_owned)
    }

    /// Node facts and paths.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The CRI runtime.
    pub fn cri(&self) -> &R {
        &self.cri
    }
}
