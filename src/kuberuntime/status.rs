//! GetPodStatus (kubelet's `kuberuntime_manager.go` `GetPodStatus`): one pod's sandboxes and
//! containers, newest first, read through CRI by label `io.kubernetes.pod.uid`, and the
//! runtime's pods as housekeeping sees them.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::labels;
use super::KubeRuntimeManager;
use crate::container::cache::PodCache;
use crate::container::{ContainerState, RuntimeContainer, RuntimePodStatus, SandboxStatus};
use crate::cri::{api, CriError, CriResult, CriRuntime, RuntimeService};

/// The runtime's pods as housekeeping sees them.
#[derive(Debug, Clone, Default)]
pub struct RuntimePods {
    /// Pods of this node (`nodelet.io/node-name` is ours).
    pub ours: Vec<RuntimePod>,
    /// UIDs of sandboxes of other agents: never touched.
    pub foreign: std::collections::HashSet<String>,
    /// IDs of the running containers of this node's pods (log rotation's work list).
    pub running_containers: Vec<String>,
}

/// A pod of this node as the runtime's listings tell it (its sandboxes' and containers'
/// labels; kubelet's running `kubecontainer.Pod`): what housekeeping needs to kill it when no
/// source wants it, without holding a whole `Pod` object per pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimePod {
    /// The pod's UID.
    pub uid: String,
    /// Its full name as the sandbox's label gives it (a static pod's `<name>-<node>`).
    pub name: Option<String>,
    /// Its namespace, from the sandbox's label.
    pub namespace: Option<String>,
    /// Its `terminationGracePeriodSeconds`, seconds, from its containers' annotation.
    pub grace_seconds: Option<i64>,
    /// A sandbox of it is ready or a container of it runs (what kubelet's `GetPods(false)`
    /// lists as a running pod).
    pub running: bool,
}

impl RuntimePod {
    /// The minimal pod a pod worker kills it by: UID, name, namespace, grace period.
    pub fn to_pod(&self) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(self.uid.clone());
        p.metadata.name = self.name.clone();
        p.metadata.namespace = self.namespace.clone();
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: self.grace_seconds,
            ..Default::default()
        });
        p
    }
}

/// The runtime's pods as last listed elsewhere (the PLEG's relist), or `None` before the first
/// listing. Housekeeping and log rotation read it instead of listing the runtime themselves.
pub type RuntimePodsView = Box<dyn Fn() -> Option<Arc<RuntimePods>> + Send + Sync>;

/// Reads the pod's status from the runtime: ListPodSandbox and ListContainers filtered by the
/// UID label, PodSandboxStatus for the newest sandbox (for its IPs) and ContainerStatus for every
/// container (exit codes, times). kubelet's `GetPodStatus`.
pub async fn get_pod_status(cri: &impl RuntimeService, uid: &str) -> CriResult<RuntimePodStatus> {
    read_pod_status(cri, uid, None, None).await
}

/// [`get_pod_status`], with the status calls for what `previous` and `made` already know left
/// out (see [`pod_status_from`]).
pub async fn read_pod_status(
    cri: &impl RuntimeService,
    uid: &str,
    previous: Option<&RuntimePodStatus>,
    made: Option<&PodCache>,
) -> CriResult<RuntimePodStatus> {
    let sel: HashMap<String, String> = [(labels::POD_UID.to_string(), uid.to_string())].into();
    let (sandboxes, containers) = tokio::try_join!(
        cri.list_pod_sandbox_brief(sel.clone(), &labels::BRIEF),
        cri.list_containers_brief(sel, &labels::BRIEF)
    )?;
    pod_status_from(cri, uid, sandboxes, containers, previous, made).await
}

/// Longest a status read waits for a pod worker that is making a sandbox or container of the
/// pod to record what it learned ([`PodCache::making`]); past it, the runtime is asked. The
/// window it covers is short (the CRI call's answer on its way back to the worker), but the
/// read holds one of the relist's [`crate::pleg::STATUS_CONCURRENCY`] slots meanwhile.
pub const MADE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Pod `uid`'s status from listings of its sandboxes and containers (the PLEG's relist has
/// them for every pod): PodSandboxStatus for the newest ready sandbox and ContainerStatus for
/// each container, except what is already known:
/// - the IPs of the same ready sandbox in `previous` (the pod cache) or recorded in `made` by
///   the pod worker that made it (none, for a host-network pod: known as well);
/// - a container in `previous` in the same state as listed (an exited one only with the
///   runtime's reason, which the task-exit fast path does not know);
/// - a container listed in state Created that its pod worker recorded in `made` with its image
///   reference (that and the log path are all ContainerStatus would add).
///
/// When the listing holds a ready sandbox or a Created container that nothing records yet while
/// the pod's worker is making one, the read first waits until they are recorded (at most
/// [`MADE_WAIT`]; at once when the worker is making nothing): the listing can show them before
/// the call that made them has returned to the worker.
pub async fn pod_status_from(
    cri: &impl RuntimeService,
    uid: &str,
    sandboxes: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    previous: Option<&RuntimePodStatus>,
    made: Option<&PodCache>,
) -> CriResult<RuntimePodStatus> {
    // Sized to the listings: a status is kept per pod, and a vector grown by pushes keeps room
    // for four containers.
    let mut out = RuntimePodStatus {
        sandboxes: Vec::with_capacity(sandboxes.len()),
        containers: Vec::with_capacity(containers.len()),
    };
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
            pod_spec_hash: s.annotations.get(labels::POD_SPEC_HASH).cloned(),
            pod_started_at: s
                .annotations
                .get(labels::POD_START_TIME)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0),
            id: s.id,
        });
    }
    out.sandboxes
        .sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let previous_of = |id: &str| previous.and_then(|p| p.containers.iter().find(|k| k.id == id));
    // What the cache holds as listed needs no status call.
    let known_as_listed = |c: &api::Container| {
        let listed = ContainerState::from(c.state);
        previous_of(&c.id).is_some_and(|k| {
            k.state == Some(listed) && (listed != ContainerState::Exited || !k.reason.is_empty())
        })
    };
    let created = |c: &api::Container| ContainerState::from(c.state) == ContainerState::Created;
    // A ready sandbox's IPs, once read, are final (containerd lists a sandbox ready only after
    // its network is set up); none at all is the answer for a host-network pod.
    let previous_ips = |id: &str| {
        previous
            .and_then(|p| p.sandboxes.first())
            .filter(|s| s.id == id && s.ready)
            .map(|s| s.ips.clone())
    };
    let newest_ready = out
        .sandboxes
        .first()
        .filter(|s| s.ready)
        .map(|s| s.id.clone());
    // Listed, and nothing records it yet: what a worker may be about to record.
    let unrecorded = |made: &PodCache| {
        newest_ready
            .as_deref()
            .is_some_and(|id| previous_ips(id).is_none() && made.sandbox_ips(id).is_none())
            || containers
                .iter()
                .any(|c| created(c) && !known_as_listed(c) && made.made_container(&c.id).is_none())
    };
    if let Some(made) = made.filter(|m| unrecorded(m)) {
        made.wait_made(uid, MADE_WAIT, |m| !unrecorded(m)).await;
    }
    let known_ips = |id: &str| previous_ips(id).or_else(|| made.and_then(|m| m.sandbox_ips(id)));
    if let Some(newest) = out.sandboxes.first_mut().filter(|s| s.ready) {
        if let Some(ips) = known_ips(&newest.id) {
            newest.ips = ips;
        } else if let Some(st) = cri.pod_sandbox_status(&newest.id).await? {
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
    let mut to_read = Vec::new();
    for c in containers {
        if known_as_listed(&c) {
            if let Some(k) = previous_of(&c.id) {
                out.containers.push(k.clone());
            }
            continue;
        }
        let recorded = made
            .and_then(|m| m.made_container(&c.id))
            .filter(|_| created(&c))
            .and_then(|m| Some((m.image_ref?, m.log_path)));
        match recorded {
            // What ContainerStatus says of a container not yet started, but for the image
            // reference and log path, which its worker recorded.
            Some((image_ref, log_path)) => {
                let st = api::ContainerStatus {
                    state: c.state,
                    image_ref,
                    log_path,
                    ..Default::default()
                };
                out.containers.push(runtime_container(c, st, None));
            }
            None => to_read.push(c),
        }
    }
    // A container removed between the list and its status call is simply gone.
    let statuses =
        futures::future::join_all(to_read.iter().map(|c| cri.container_status(&c.id))).await;
    let mut kept = Vec::with_capacity(to_read.len());
    for (c, st) in to_read.into_iter().zip(statuses) {
        match st {
            Err(e) if e.code == tonic::Code::NotFound => continue,
            Err(e) => return Err(e),
            Ok(st) => kept.push((c, st)),
        }
    }
    // An exited container's termination message (its file, or its log's tail) is read on the
    // blocking pool: a hung file system under the pod directory or the log directory holds
    // this status read, not the runtime's thread. One hand-off for all of a pod's.
    let needs_message = |st: &Option<api::ContainerStatus>| {
        st.as_ref().is_some_and(|st| {
            st.message.is_empty() && ContainerState::from(st.state) == ContainerState::Exited
        })
    };
    let kept: Vec<(api::Container, api::ContainerStatus, Option<String>)> =
        if kept.iter().any(|(_, st)| needs_message(st)) {
            crate::blocking::run(move || {
                kept.into_iter()
                    .map(|(c, st)| {
                        let message = needs_message(&st).then(|| {
                            st.as_ref()
                                .and_then(super::termination_message::read)
                                .unwrap_or_default()
                        });
                        (c, st.unwrap_or_default(), message)
                    })
                    .collect()
            })
            .await
        } else {
            kept.into_iter()
                .map(|(c, st)| (c, st.unwrap_or_default(), None))
                .collect()
        };
    for (c, st, message) in kept {
        out.containers.push(runtime_container(c, st, message));
    }
    out.containers.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then(b.attempt.cmp(&a.attempt))
    });
    Ok(out)
}

/// One container's entry from its listing and its status (ContainerStatus, or what stands for
/// it), with the termination message read for it when the status has none (an exited
/// container's: [`super::termination_message::read`]).
fn runtime_container(
    c: api::Container,
    st: api::ContainerStatus,
    termination_message: Option<String>,
) -> RuntimeContainer {
    RuntimeContainer {
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
        message: termination_message.unwrap_or_else(|| st.message.clone()),
        reason: st.reason,
        image: c.image.map(|i| i.image).unwrap_or_default(),
        // The status call's image reference: for containerd the repository digest
        // (`docker.io/library/busybox@sha256:…`), what kubelet shows as `imageID`; the
        // listing's image ID when the status has none.
        image_ref: if st.image_ref.is_empty() {
            c.image_ref
        } else {
            st.image_ref
        },
        log_path: st.log_path,
        id: c.id,
    }
}

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// Every pod the runtime has a sandbox for on this node, and the UIDs of other agents'
    /// sandboxes ([`list_runtime_pods`]).
    ///
    /// Errors: a failed list call.
    pub async fn runtime_pods(&self) -> Result<RuntimePods, CriError> {
        list_runtime_pods(&self.cri, &self.settings.node_name).await
    }
}

/// Every pod `cri` has a sandbox for on node `node_name`, and the UIDs of other agents'
/// sandboxes (see [`RuntimePods::from_listings`]): one ListPodSandbox and one ListContainers,
/// unfiltered.
///
/// Errors: a failed list call.
pub async fn list_runtime_pods(
    cri: &impl RuntimeService,
    node_name: &str,
) -> Result<RuntimePods, CriError> {
    let (sandboxes, containers) = tokio::try_join!(
        cri.list_pod_sandbox_brief(HashMap::new(), &labels::BRIEF),
        cri.list_containers_brief(HashMap::new(), &labels::BRIEF)
    )?;
    Ok(RuntimePods::from_listings(
        &sandboxes,
        &containers,
        node_name,
    ))
}

impl RuntimePods {
    /// From unfiltered listings: every pod with a sandbox of `node_name` (label
    /// `nodelet.io/node-name`) as a [`RuntimePod`] (name, namespace, UID, the grace period
    /// its containers were created with, and whether anything of it runs), and the UIDs of sandboxes that belong to other agents
    /// (another node name, or none); housekeeping compares the first with the desired pods and
    /// leaves the second alone. A UID of this node is ours even if another agent also has a
    /// sandbox for it.
    pub fn from_listings(
        sandboxes: &[api::PodSandbox],
        containers: &[api::Container],
        node_name: &str,
    ) -> RuntimePods {
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
        let mut pods: HashMap<String, RuntimePod> = HashMap::new();
        let mut foreign = std::collections::HashSet::new();
        let mut ours: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for s in sandboxes {
            let Some(uid) = s.labels.get(labels::POD_UID) else {
                continue;
            };
            if s.labels.get(labels::NODE_NAME).map(String::as_str) != Some(node_name) {
                foreign.insert(uid.clone());
                continue;
            }
            ours.insert(s.id.as_str());
            let pod = pods.entry(uid.clone()).or_insert_with(|| RuntimePod {
                uid: uid.clone(),
                name: s.labels.get(labels::POD_NAME).cloned(),
                namespace: s.labels.get(labels::POD_NAMESPACE).cloned(),
                grace_seconds: grace.get(uid.as_str()).copied(),
                running: false,
            });
            pod.running |= s.state == api::PodSandboxState::SandboxReady as i32;
        }
        foreign.retain(|u| !pods.contains_key(u));
        let running_containers: Vec<String> = containers
            .iter()
            .filter(|c| {
                c.state == api::ContainerState::ContainerRunning as i32
                    && ours.contains(c.pod_sandbox_id.as_str())
            })
            .map(|c| {
                if let Some(p) = c.labels.get(labels::POD_UID).and_then(|u| pods.get_mut(u)) {
                    p.running = true;
                }
                c.id.clone()
            })
            .collect();
        RuntimePods {
            ours: pods.into_values().collect(),
            foreign,
            running_containers,
        }
    }
}
