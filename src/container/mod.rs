//! The runtime's view of pods (kubelet's `pkg/kubelet/container`): one pod's sandboxes and
//! containers ([`RuntimePodStatus`], kubelet's `kubecontainer.PodStatus`), the one container
//! state type every module uses ([`ContainerState`]), and the pod cache ([`cache::PodCache`]).
//!
//! The runtime manager reads these from CRI ([`crate::kuberuntime::status`]); the PLEG diffs
//! them; the status manager turns them into pod statuses.

pub mod cache;

use crate::cri::api;

/// State of a container in the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited (see exit code).
    Exited,
    /// Unknown to the runtime.
    Unknown,
}

impl From<i32> for ContainerState {
    fn from(v: i32) -> Self {
        match api::ContainerState::try_from(v) {
            Ok(api::ContainerState::ContainerCreated) => Self::Created,
            Ok(api::ContainerState::ContainerRunning) => Self::Running,
            Ok(api::ContainerState::ContainerExited) => Self::Exited,
            _ => Self::Unknown,
        }
    }
}

/// One sandbox of the pod.
#[derive(Debug, Clone, Default)]
pub struct SandboxStatus {
    /// CRI sandbox ID.
    pub id: String,
    /// Sandbox attempt (0 for the first sandbox of a pod).
    pub attempt: u32,
    /// True when the runtime reports SANDBOX_READY.
    pub ready: bool,
    /// Creation time, nanoseconds since the epoch.
    pub created_at: i64,
    /// Pod IPs (primary first); empty for host-network pods.
    pub ips: Vec<String>,
    /// The sandbox hash annotation written at creation.
    pub sandbox_hash: String,
    /// The pod spec hash annotation written at creation
    /// ([`crate::kuberuntime::actions::pod_spec_hash`]); `None` on a sandbox made without it.
    pub pod_spec_hash: Option<String>,
    /// The pod's start time carried from an earlier sandbox (nanoseconds since the epoch), 0
    /// when this is the pod's first.
    pub pod_started_at: i64,
}

/// One container of the pod.
#[derive(Debug, Clone, Default)]
pub struct RuntimeContainer {
    /// CRI container ID.
    pub id: String,
    /// Sandbox it belongs to.
    pub sandbox_id: String,
    /// Container name from the spec.
    pub name: String,
    /// Attempt = restart count of this instance.
    pub attempt: u32,
    /// State.
    pub state: Option<ContainerState>,
    /// Spec hash annotation.
    pub hash: String,
    /// Was started as an init container.
    pub is_init: bool,
    /// Created/started/finished, nanoseconds since the epoch (0 when not yet).
    pub created_at: i64,
    /// See above.
    pub started_at: i64,
    /// See above.
    pub finished_at: i64,
    /// Exit code (exited containers).
    pub exit_code: i32,
    /// Runtime reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Runtime message.
    pub message: String,
    /// Image as requested.
    pub image: String,
    /// Resolved image reference.
    pub image_ref: String,
    /// Absolute path of its CRI log (ContainerStatus `log_path`; empty when not known).
    pub log_path: String,
}

impl RuntimeContainer {
    /// The state, `Unknown` when not known.
    pub fn state(&self) -> ContainerState {
        self.state.unwrap_or(ContainerState::Unknown)
    }
}

/// Sandboxes and containers of one pod, newest first.
#[derive(Debug, Clone, Default)]
pub struct RuntimePodStatus {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<SandboxStatus>,
    /// Containers, newest first (by creation time, then attempt).
    pub containers: Vec<RuntimeContainer>,
}

impl RuntimePodStatus {
    /// The pod's start time (`status.startTime`), nanoseconds since the epoch: the creation of
    /// its first sandbox, carried onto later ones; `None` before it has a sandbox.
    pub fn start_time(&self) -> Option<i64> {
        self.sandboxes
            .iter()
            .map(|s| {
                if s.pod_started_at > 0 {
                    s.pod_started_at.min(s.created_at)
                } else {
                    s.created_at
                }
            })
            .min()
    }

    /// The newest instance of the container `name`.
    pub fn latest(&self, name: &str) -> Option<&RuntimeContainer> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// All instances of the container `name`, newest first.
    pub fn instances<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a RuntimeContainer> + 'a {
        self.containers.iter().filter(move |c| c.name == name)
    }
}
