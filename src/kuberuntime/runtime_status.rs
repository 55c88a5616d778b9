//! The runtime's view of one pod (kubelet's `kubecontainer.PodStatus`): its sandboxes and
//! containers, newest first, read through CRI by label `io.kubernetes.pod.uid`.

use std::collections::HashMap;

use crate::cri::{api, Cri, CriResult};

use super::labels;

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

/// Reads the pod's status from the runtime: ListPodSandbox and ListContainers filtered by the
/// UID label, PodSandboxStatus for the newest sandbox (for its IPs) and ContainerStatus for every
/// container (exit codes, times). kubelet's `GetPodStatus`.
pub async fn get_pod_status(cri: &Cri, uid: &str) -> CriResult<RuntimePodStatus> {
    let sel: HashMap<String, String> = [(labels::POD_UID.to_string(), uid.to_string())].into();
    let (sandboxes, containers) =
        tokio::try_join!(cri.list_pod_sandbox(sel.clone()), cri.list_containers(sel))?;
    let mut out = RuntimePodStatus::default();
    for s in sandboxes {
        out.sandboxes.push(SandboxStatus {
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: s.state == api::PodSandboxState::SandboxReady as i32,
            created_at: s.created_at,
            ips: Vec::new(),
            sandbox_hash: s
                .annotations
                .get(labels::SANDBOX_HASH)
                .cloned()
                .unwrap_or_default(),
            id: s.id,
        });
    }
    out.sandboxes
        .sort_by_key(|s| std::cmp::Reverse(s.created_at));
    if let Some(newest) = out.sandboxes.first_mut().filter(|s| s.ready) {
        if let Some(st) = cri.pod_sandbox_status(&newest.id).await? {
            if let Some(net) = st.network {
                if !net.ip.is_empty() {
                    newest.ips.push(net.ip);
                }
                newest
                    .ips
                    .extend(net.additional_ips.into_iter().map(|i| i.ip));
            }
        }
    }
    // A container removed between the list and its status call is simply gone.
    let statuses =
        futures::future::join_all(containers.iter().map(|c| cri.container_status(&c.id))).await;
    let mut kept = Vec::with_capacity(containers.len());
    for (c, st) in containers.into_iter().zip(statuses) {
        match st {
            Err(e) if e.code == tonic::Code::NotFound => continue,
            Err(e) => return Err(e),
            Ok(st) => kept.push((c, st)),
        }
    }
    for (c, st) in kept {
        let st = st.unwrap_or_default();
        out.containers.push(RuntimeContainer {
            sandbox_id: c.pod_sandbox_id,
            name: c
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))
                .unwrap_or_default(),
            attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
            state: Some(ContainerState::from(st.state)),
            hash: c
                .annotations
                .get(labels::CONTAINER_HASH)
                .cloned()
                .unwrap_or_default(),
            is_init: c.annotations.contains_key(labels::CONTAINER_IS_INIT),
            created_at: c.created_at,
            started_at: st.started_at,
            finished_at: st.finished_at,
            exit_code: st.exit_code,
            reason: st.reason,
            message: st.message,
            image: c.image.map(|i| i.image).unwrap_or_default(),
            image_ref: c.image_ref,
            id: c.id,
        });
    }
    out.containers.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then(b.attempt.cmp(&a.attempt))
    });
    Ok(out)
}
