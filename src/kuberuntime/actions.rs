//! What a sync must do to a pod (kubelet's `computePodActions` in `kuberuntime_manager.go`):
//! a pure function of the pod spec and the runtime's view of the pod.
//!
//! - A new sandbox when there is none, the newest is not ready, more than one is ready, or the
//!   pod-level spec that shapes it ([`sandbox_hash`]) or its containers ([`pod_spec_hash`])
//!   changed (`podSandboxChanged`); then every container starts again from the first init
//!   container. A pod whose restart policy says its finished containers stay finished gets no
//!   new sandbox, unless it is a static pod whose spec changed since it ran (kubelet runs an
//!   edited static pod as a new pod).
//! - Init containers run one at a time, in order, each to a zero exit, before any app container.
//!   A failed init container (non-zero exit, or OOM-killed whatever its exit code) is restarted
//!   unless the restart policy is Never (then the pod fails). Once a regular container exists in
//!   the sandbox, the init containers are done.
//! - App containers: missing ones start; exited ones restart by restart policy (Always: always;
//!   OnFailure: non-zero exit; Never: no); running ones whose spec hash changed are killed and
//!   started again; running containers not in the spec are killed.
//! - When nothing is left running and nothing is to start, the sandbox is stopped (`KillPod`).

use k8s_openapi::api::core::v1::{Container, Pod};

use super::labels::container_hash;
use crate::container::{ContainerState, RuntimeContainer, RuntimePodStatus};

/// Why a running container is killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec hash changed.
    SpecChanged,
    /// The spec no longer has a container of this name.
    NotInSpec,
    /// Its liveness or startup probe failed (kubelet: "Container %s failed %s probe, will be
    /// restarted").
    ProbeFailed(crate::prober::ProbeKind),
    /// The runtime reports its state unknown (as containerd may while it reloads its tasks
    /// after a restart): killed before it is started again, so that two instances never run
    /// (kubelet's `computePodActions`).
    UnknownState,
}

/// A container to start: its index in `spec.initContainers` or `spec.containers`, and the
/// restart count (CRI attempt) it will carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToStart {
    /// Index in the list it belongs to.
    pub index: usize,
    /// Restart count / attempt.
    pub restart_count: u32,
}

/// The actions of one sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop everything running in the pod first (sandbox recreation, or nothing left to run).
    pub kill_pod: bool,
    /// Create a new sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    /// The sandbox to use when none is created.
    pub sandbox_id: Option<String>,
    /// The init container to start next, if any.
    pub next_init: Option<ToStart>,
    /// An init container failed under restartPolicy Never: the pod has failed.
    pub init_failed: bool,
    /// App containers to start.
    pub containers_to_start: Vec<ToStart>,
    /// Sidecars (init containers with `restartPolicy: Always`) to start again after the init
    /// phase: they exited or changed while the app containers run. Indices into
    /// `spec.initContainers`.
    pub sidecars_to_start: Vec<ToStart>,
    /// Running containers to kill: (container ID, name, reason).
    pub containers_to_kill: Vec<(String, String, KillReason)>,
    /// Ephemeral containers to start (indices into `spec.ephemeralContainers`): those the
    /// runtime has never held for this pod (kubelet's `EphemeralContainersToStart`). Started
    /// before any init or app container, so that a pod stuck initializing can be debugged;
    /// never restarted; none in a new sandbox or a pod being killed.
    pub ephemeral_to_start: Vec<usize>,
}

/// The pod's restart policy (`Always` when absent).
pub(crate) fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// True when an init container failed (kubelet's `isInitContainerFailed`): it was OOM-killed
/// (whatever its exit code: its shell may exit 0 after the kernel killed a child), exited
/// non-zero, or its state is unknown.
pub fn init_container_failed(rc: &RuntimeContainer) -> bool {
    rc.reason == "OOMKilled"
        || (rc.state() == ContainerState::Exited && rc.exit_code != 0)
        || rc.state() == ContainerState::Unknown
}

/// True when an exited container with `exit_code` should run again under the pod's policy
/// (kubelet's `ShouldContainerBeRestarted` for an exited container).
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

fn next_restart_count(status: &RuntimePodStatus, name: &str) -> u32 {
    status.latest(name).map_or(0, |c| c.attempt + 1)
}

/// Hash of the pod-level fields that shape the sandbox (namespaces, hostname, DNS, ports).
pub fn sandbox_hash(pod: &Pod) -> String {
    let Some(s) = pod.spec.as_ref() else {
        return String::new();
    };
    let ports: Vec<_> = s
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .collect();
    let base = crate::hash::object_hash(&(
        s.host_network,
        s.host_pid,
        s.host_ipc,
        s.share_process_namespace,
        &s.hostname,
        &s.subdomain,
        &s.dns_policy,
        &s.dns_config,
        ports,
    ));
    // Sysctls and the runtime class shape the sandbox too; they join the hash only when set,
    // so that the sandboxes of pods without them keep their hash across an upgrade.
    let sysctls = s.security_context.as_ref().and_then(|c| c.sysctls.as_ref());
    if sysctls.is_none() && s.runtime_class_name.is_none() {
        return base;
    }
    crate::hash::object_hash(&(base, sysctls, &s.runtime_class_name))
}

/// Hash of the pod-level fields that shape the containers when they are made, outside both
/// their own hashes ([`container_hash`]) and [`sandbox_hash`]: the volumes, the pod's security
/// context, the pod's `resources` and `overhead`, and every container's resources (by name),
/// which decide the QoS class and so the pod cgroup the sandbox is made in. A change recreates
/// the sandbox and every container, as kubelet does for an edited static pod (whose UID, and so
/// whole pod, is new). An API pod's resources changed in place (a resize) restart it the same
/// way: nodelet does not resize running containers.
pub fn pod_spec_hash(pod: &Pod) -> String {
    let Some(s) = pod.spec.as_ref() else {
        return String::new();
    };
    let resources: Vec<_> = s
        .init_containers
        .iter()
        .flatten()
        .chain(&s.containers)
        .map(|c| (&c.name, &c.resources))
        .collect();
    crate::hash::object_hash(&(
        &s.volumes,
        &s.security_context,
        &s.resources,
        &s.overhead,
        resources,
    ))
}

/// True for a sidecar: an init container with `restartPolicy: Always`.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Computes the actions for `pod` given the runtime's view of it, without probe results.
pub fn compute_pod_actions(pod: &Pod, status: &RuntimePodStatus) -> PodActions {
    compute_pod_actions_with(pod, status, &crate::prober::results::NoProbes)
}

/// The actions when the pod needs a new sandbox (attempt `attempt`): the old one killed if
/// there is one (`had_sandbox`), then the first init container, or the app containers that
/// would run again; nothing when the pod has finished under its restart policy.
fn actions_in_new_sandbox(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    status: &RuntimePodStatus,
    policy: &str,
    had_sandbox: bool,
    attempt: u32,
) -> PodActions {
    let mut a = PodActions::default();
    let inits: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    // Which app containers would run in a new sandbox.
    let to_start: Vec<ToStart> = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(_, c)| match status.latest(&c.name) {
            Some(rc) if rc.state() == ContainerState::Exited => {
                should_restart(policy, rc.exit_code)
            }
            _ => true,
        })
        .map(|(index, c)| ToStart {
            index,
            restart_count: next_restart_count(status, &c.name),
        })
        .collect();
    a.kill_pod = had_sandbox;
    let never_again = policy == "Never" && had_sandbox && !status.containers.is_empty();
    if (to_start.is_empty() || never_again) && had_sandbox {
        // Finished under its restart policy: nothing to run again.
        return a;
    }
    a.create_sandbox = Some(attempt);
    if let Some(first) = inits.first() {
        a.next_init = Some(ToStart {
            index: 0,
            restart_count: next_restart_count(status, &first.name),
        });
    } else {
        a.containers_to_start = to_start;
    }
    a
}

/// Sidecars beside running app containers (in sandbox `sandbox`): started again when they
/// exited, killed and started again when their spec changed or their state is unknown.
fn sidecar_actions(
    a: &mut PodActions,
    inits: &[Container],
    status: &RuntimePodStatus,
    sandbox: &str,
) {
    let in_sandbox = |name: &str| {
        status
            .instances(name)
            .find(|c| c.sandbox_id == sandbox)
            .cloned()
    };
    for (index, c) in inits.iter().enumerate().filter(|(_, c)| is_sidecar(c)) {
        let start = ToStart {
            index,
            restart_count: next_restart_count(status, &c.name),
        };
        match in_sandbox(&c.name) {
            Some(rc) if rc.state() == ContainerState::Running => {
                if rc.hash != container_hash(c) {
                    a.containers_to_kill.push((
                        rc.id.clone(),
                        c.name.clone(),
                        KillReason::SpecChanged,
                    ));
                    a.sidecars_to_start.push(start);
                }
            }
            Some(rc) if rc.state() == ContainerState::Unknown => {
                a.containers_to_kill.push((
                    rc.id.clone(),
                    c.name.clone(),
                    KillReason::UnknownState,
                ));
                a.sidecars_to_start.push(start);
            }
            _ => a.sidecars_to_start.push(start),
        }
    }
}

/// Computes the actions for `pod` given the runtime's view of it and the probe results (a
/// sidecar with a startup probe holds the next container back until the probe succeeds).
///
/// Sidecars (kubelet's `computeInitContainerActions` with sidecar containers): each starts in
/// its turn among the init containers, and the next container starts once it runs (and, with
/// a startup probe, has started); it is restarted whenever it exits, whatever the pod's restart
/// policy, and while the app containers run.
pub fn compute_pod_actions_with(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &dyn crate::prober::ProbeView,
) -> PodActions {
    let mut a = container_actions(pod, status, probes);
    if a.kill_pod || a.create_sandbox.is_some() {
        a.ephemeral_to_start.clear();
    }
    a
}

/// [`compute_pod_actions_with`] before ephemeral containers are held back from a pod that is
/// killed or made again.
fn container_actions(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &dyn crate::prober::ProbeView,
) -> PodActions {
    let mut a = PodActions::default();
    let Some(spec) = pod.spec.as_ref() else {
        return a;
    };
    let policy = restart_policy(pod);
    let inits: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);

    // Sandbox.
    let ready: Vec<_> = status.sandboxes.iter().filter(|s| s.ready).collect();
    let newest = status.sandboxes.first();
    let pod_changed = |s: &crate::container::SandboxStatus| {
        s.sandbox_hash != sandbox_hash(pod)
            || s.pod_spec_hash
                .as_deref()
                .is_some_and(|h| h != pod_spec_hash(pod))
    };
    let recreate = match newest {
        None => Some(0),
        Some(s) if !s.ready || ready.len() > 1 || pod_changed(s) => Some(s.attempt + 1),
        Some(_) => None,
    };
    if let Some(attempt) = recreate {
        // kubelet gives an edited static pod a new UID: the new version runs from its start,
        // whatever became of the old one under its restart policy. nodelet keeps the UID, so a
        // static pod whose pod-level spec, or the spec of a container's last run, differs from
        // what its newest sandbox ran is run again in full.
        let edited = crate::pod::is_static_pod(pod)
            && newest.is_some_and(|s| {
                pod_changed(s)
                    || inits.iter().chain(&spec.containers).any(|c| {
                        status
                            .latest(&c.name)
                            .is_some_and(|rc| rc.hash != container_hash(c))
                    })
            });
        let policy = if edited { "Always" } else { policy };
        return actions_in_new_sandbox(spec, status, policy, newest.is_some(), attempt);
    }
    let sandbox = newest.map(|s| s.id.clone()).unwrap_or_default();
    a.sandbox_id = Some(sandbox.clone());
    let in_sandbox = |name: &str| {
        status
            .instances(name)
            .find(|c| c.sandbox_id == sandbox)
            .cloned()
    };
    let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or(&[]);
    a.ephemeral_to_start = ephemeral
        .iter()
        .enumerate()
        .filter(|(_, e)| status.latest(&e.name).is_none())
        .map(|(i, _)| i)
        .collect();

    // Init containers, one at a time, unless a regular container already exists in this
    // sandbox: then they all ran (they may have been removed since), as kubelet's
    // `findNextInitContainerToRun` assumes.
    let regular_created = spec
        .containers
        .iter()
        .any(|c| in_sandbox(&c.name).is_some());
    for (index, c) in inits.iter().enumerate().filter(|_| !regular_created) {
        let restart = ToStart {
            index,
            restart_count: next_restart_count(status, &c.name),
        };
        let Some(rc) = in_sandbox(&c.name) else {
            a.next_init = Some(restart);
            return a;
        };
        if is_sidecar(c) {
            if rc.state() != ContainerState::Running {
                a.next_init = Some(restart);
                return a;
            }
            if rc.hash != container_hash(c) {
                a.containers_to_kill
                    .push((rc.id.clone(), c.name.clone(), KillReason::SpecChanged));
                a.next_init = Some(restart);
                return a;
            }
            let uid = crate::pod::pod_uid(pod);
            let started = c.startup_probe.is_none()
                || probes.result(uid, &c.name, &rc.id, crate::prober::ProbeKind::Startup)
                    == Some(true);
            if !started {
                return a;
            }
            continue;
        }
        if init_container_failed(&rc) {
            if policy == "Never" {
                a.init_failed = true;
                a.kill_pod = true;
            } else {
                a.next_init = Some(restart);
            }
            return a;
        }
        match rc.state() {
            ContainerState::Exited => continue,
            ContainerState::Running => return a,
            _ => {
                a.next_init = Some(restart);
                return a;
            }
        }
    }

    // Sidecars keep running beside the app containers: restarted when they exit or change.
    if regular_created {
        sidecar_actions(&mut a, inits, status, &sandbox);
    }

    // App containers.
    let mut keep = 0;
    for (index, c) in spec.containers.iter().enumerate() {
        let start = ToStart {
            index,
            restart_count: next_restart_count(status, &c.name),
        };
        match in_sandbox(&c.name) {
            None => a.containers_to_start.push(start),
            Some(rc) => match rc.state() {
                ContainerState::Running if rc.hash != container_hash(c) => {
                    a.containers_to_kill.push((
                        rc.id.clone(),
                        c.name.clone(),
                        KillReason::SpecChanged,
                    ));
                    a.containers_to_start.push(start);
                }
                ContainerState::Running => keep += 1,
                ContainerState::Exited if !should_restart(policy, rc.exit_code) => {}
                ContainerState::Unknown => {
                    a.containers_to_kill.push((
                        rc.id.clone(),
                        c.name.clone(),
                        KillReason::UnknownState,
                    ));
                    a.containers_to_start.push(start);
                }
                _ => a.containers_to_start.push(start),
            },
        }
    }
    for rc in status
        .containers
        .iter()
        .filter(|rc| rc.sandbox_id == sandbox && rc.state() == ContainerState::Running)
    {
        let known = spec.containers.iter().any(|c| c.name == rc.name)
            || (rc.is_init && inits.iter().any(|c| c.name == rc.name))
            || ephemeral.iter().any(|e| e.name == rc.name);
        if !known {
            a.containers_to_kill
                .push((rc.id.clone(), rc.name.clone(), KillReason::NotInSpec));
        }
    }
    if keep == 0 && a.containers_to_start.is_empty() {
        // The app containers are done: the sidecars go with the pod.
        a.kill_pod = true;
        a.sidecars_to_start.clear();
    }
    a
}

/// Running containers whose liveness or startup probe has failed (kubelet's `computePodActions`
/// checks `livenessManager` then `startupManager` for each running container), as kills with
/// [`KillReason::ProbeFailed`]; containers already being killed are left out. After the kill,
/// the container restarts by restart policy, with back-off, like any exit.
pub fn probe_kills(
    pod: &Pod,
    rt: &RuntimePodStatus,
    probes: &dyn crate::prober::ProbeView,
    already: &[(String, String, KillReason)],
) -> Vec<(String, String, KillReason)> {
    use crate::prober::ProbeKind;
    let uid = crate::pod::pod_uid(pod);
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    crate::pod::long_running_containers(spec)
        .filter_map(|c| {
            let rc = rt.latest(&c.name)?;
            if rc.state() != ContainerState::Running || already.iter().any(|k| k.0 == rc.id) {
                return None;
            }
            [ProbeKind::Liveness, ProbeKind::Startup]
                .into_iter()
                .find(|k| probes.result(uid, &c.name, &rc.id, *k) == Some(false))
                .map(|k| (rc.id.clone(), c.name.clone(), KillReason::ProbeFailed(k)))
        })
        .collect()
}
