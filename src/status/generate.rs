//! Pod status from the runtime's view (kubelet's `generateAPIPodStatus`, `getPhase` and
//! `convertToAPIContainerStatuses` in `kubelet_pods.go`).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::container::{ContainerState, RuntimeContainer, RuntimePodStatus};
use crate::prober::{ProbeKind, ProbeView};
use crate::qos::pod_qos_class;

/// The last error of starting a container: (kubelet waiting reason, message).
pub type StartErrors = HashMap<String, (String, String)>;

fn time(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| {
            k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos))
                .ok()
                .map(Time)
        })
        .flatten()
}

fn terminated(rc: &RuntimeContainer) -> ContainerStateTerminated {
    let reason = if !rc.reason.is_empty() {
        rc.reason.clone()
    } else if rc.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    ContainerStateTerminated {
        exit_code: rc.exit_code,
        signal: (rc.exit_code > 128 && rc.exit_code < 160).then_some(rc.exit_code - 128),
        reason: Some(reason),
        message: (!rc.message.is_empty()).then(|| rc.message.clone()),
        started_at: time(rc.started_at),
        finished_at: time(rc.finished_at),
        container_id: Some(format!("containerd://{}", rc.id)),
    }
}

fn api_state(rc: &RuntimeContainer) -> ApiState {
    match rc.state() {
        ContainerState::Running => ApiState {
            running: Some(ContainerStateRunning {
                started_at: time(rc.started_at),
            }),
            ..Default::default()
        },
        ContainerState::Exited => ApiState {
            terminated: Some(terminated(rc)),
            ..Default::default()
        },
        ContainerState::Created | ContainerState::Unknown => ApiState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..Default::default()
        },
    }
}

/// True when the container will be started again by the next sync (kubelet's
/// `ShouldContainerBeRestarted`): it never ran, was created but not started, or exited and the
/// restart policy says it restarts (Always; OnFailure after a non-zero exit).
fn will_restart(latest: Option<&RuntimeContainer>, policy: &str) -> bool {
    let Some(rc) = latest else {
        return true;
    };
    match rc.state() {
        ContainerState::Running => false,
        ContainerState::Created | ContainerState::Unknown => true,
        ContainerState::Exited => match policy {
            "Never" => false,
            "OnFailure" => rc.exit_code != 0,
            _ => true,
        },
    }
}

/// What a status is generated from besides the spec: the runtime's view, the last start errors
/// and the probe results.
struct Inputs<'a> {
    uid: &'a str,
    rt: &'a RuntimePodStatus,
    errors: &'a StartErrors,
    probes: &'a dyn ProbeView,
    /// The runtime holds some instance of an app container (kubelet's
    /// `HasAnyRegularContainerCreated`: created, running or exited).
    regular_created: bool,
}

/// The message of an init container that the runtime no longer holds in a pod whose app
/// containers were created: it completed (kubelet 1.35's `convertToAPIContainerStatuses`).
pub const INIT_ASSUMED_COMPLETED: &str = "Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally";

fn container_statuses(
    is_init: bool,
    specs: &[Container],
    inputs: &Inputs<'_>,
    default_waiting: &str,
    policy: &str,
) -> Vec<ContainerStatus> {
    let Inputs {
        uid,
        rt,
        errors,
        probes,
        regular_created,
    } = *inputs;
    specs
        .iter()
        .map(|c| {
            let mut inst = rt.instances(&c.name);
            let latest = inst.next();
            let previous = inst.next();
            let mut st = ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                ..Default::default()
            };
            match latest {
                Some(rc) => {
                    st.state = Some(api_state(rc));
                    st.restart_count = rc.attempt as i32;
                    st.container_id = Some(format!("containerd://{}", rc.id));
                    st.image_id = rc.image_ref.clone();
                    let running = rc.state() == ContainerState::Running;
                    // A regular init container is ready once it completed, and only then
                    // (kubelet's prober `UpdatePodStatus`: not while it runs).
                    let regular_init = is_init && c.restart_policy.as_deref() != Some("Always");
                    let completed = rc.state() == ContainerState::Exited && rc.exit_code == 0;
                    // kubelet's prober `UpdatePodStatus`: started once the startup probe has
                    // succeeded (or there is none); ready once started and the readiness probe
                    // has succeeded (or there is none).
                    let probed = !is_init || c.restart_policy.as_deref() == Some("Always");
                    let passed = |kind, has: bool| {
                        !probed || !has || probes.result(uid, &c.name, &rc.id, kind) == Some(true)
                    };
                    let started = running && passed(ProbeKind::Startup, c.startup_probe.is_some());
                    let ready =
                        started && passed(ProbeKind::Readiness, c.readiness_probe.is_some());
                    st.ready = if regular_init { completed } else { ready };
                    st.started = Some(started);
                    st.last_state = previous.map(|p| ApiState {
                        terminated: Some(terminated(p)),
                        ..Default::default()
                    });
                }
                // An init container gone from the runtime (removed by clean-up or by hand, seen
                // after an agent restart) in a pod whose app containers were created: it
                // completed, and it is not run again.
                None if is_init
                    && regular_created
                    && c.restart_policy.as_deref() != Some("Always") =>
                {
                    st.state = Some(ApiState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 0,
                            reason: Some("Completed".into()),
                            message: Some(INIT_ASSUMED_COMPLETED.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                    st.ready = true;
                    st.started = Some(false);
                }
                None => {
                    st.state = Some(ApiState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(default_waiting.into()),
                            message: None,
                        }),
                        ..Default::default()
                    });
                    st.started = Some(false);
                }
            }
            // The last start error shows as the waiting reason only of a container that the
            // next sync starts again (kubelet's `convertToAPIContainerStatuses` with its reason
            // cache); one that stays stopped keeps its terminated state. An init container that
            // completed is never started again.
            let init_done = is_init
                && (latest
                    .is_some_and(|rc| rc.state() == ContainerState::Exited && rc.exit_code == 0)
                    || (latest.is_none() && regular_created));
            let restarts = c.restart_policy.as_deref().unwrap_or(policy);
            if let Some((reason, message)) = errors.get(&c.name) {
                if !init_done && will_restart(latest, restarts) {
                    if st.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
                        st.last_state = st.state.take();
                    }
                    st.state = Some(ApiState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.clone()),
                            message: Some(message.clone()),
                        }),
                        ..Default::default()
                    });
                }
            }
            st
        })
        .collect()
}

fn state_of(s: &ContainerStatus) -> (bool, Option<i32>, bool) {
    let st = s.state.as_ref();
    let running = st.and_then(|x| x.running.as_ref()).is_some();
    let terminated = st.and_then(|x| x.terminated.as_ref()).map(|t| t.exit_code);
    let last_terminated = s
        .last_state
        .as_ref()
        .and_then(|x| x.terminated.as_ref())
        .is_some();
    (running, terminated, last_terminated)
}

/// Pod phase (kubelet's `getPhase`):
///
/// - Failed when a regular init container failed (terminated non-zero, or waiting after a
///   non-zero exit) under restartPolicy Never;
/// - Pending while initialization is pending and no regular container has started, or while
///   any container waits without ever having run;
/// - Running when every container has started and at least one runs;
/// - when none runs and all have stopped: Running under Always (they restart), Succeeded when
///   all exited 0, Failed under Never, Running under OnFailure (they restart);
/// - else Pending.
///
/// Init containers with `restartPolicy: Always` (sidecars) count as running containers, and
/// initialization is pending until each has started.
pub fn pod_phase(pod: &Pod, init: &[ContainerStatus], apps: &[ContainerStatus]) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else {
        return "Pending";
    };
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let (mut pending_init, mut failed_init) = (0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in spec.init_containers.iter().flatten() {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        let Some(s) = find(init, &c.name) else {
            if sidecar {
                unknown += 1;
            } else {
                pending_init += 1;
            }
            continue;
        };
        let (is_running, term, last_term) = state_of(s);
        let is_waiting = s.state.as_ref().and_then(|x| x.waiting.as_ref()).is_some();
        if sidecar {
            if is_running {
                if s.started != Some(true) {
                    pending_init += 1;
                }
                running += 1;
            } else if term.is_some() {
                // A stopped sidecar counts for nothing.
            } else if is_waiting {
                // Waiting in back-off after it ran: counts for nothing, so a crashed sidecar
                // does not turn a running pod Pending (kubelet's `getPhase`).
                if !last_term {
                    pending_init += 1;
                    waiting += 1;
                }
            } else {
                pending_init += 1;
                unknown += 1;
            }
            continue;
        }
        if is_running {
            pending_init += 1;
        } else if let Some(code) = term {
            if code != 0 {
                failed_init += 1;
            }
        } else if is_waiting && last_term {
            let last_code = s
                .last_state
                .as_ref()
                .and_then(|x| x.terminated.as_ref())
                .map_or(0, |t| t.exit_code);
            if last_code != 0 {
                failed_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }
    let mut regular_started = false;
    for c in &spec.containers {
        let Some(s) = find(apps, &c.name) else {
            unknown += 1;
            continue;
        };
        let (is_running, term, last_term) = state_of(s);
        regular_started |= is_running || term.is_some() || last_term;
        if is_running {
            running += 1;
        } else if let Some(code) = term {
            stopped += 1;
            if code == 0 {
                succeeded += 1;
            }
        } else if s.state.as_ref().and_then(|x| x.waiting.as_ref()).is_some() {
            if last_term {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if (pending_init > 0 && !regular_started) || waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

fn condition(type_: &str, ok: bool, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: (!ok).then(|| reason.map(str::to_owned)).flatten(),
        ..Default::default()
    }
}

/// A condition that does not hold, with `reason` and `message`.
fn not_met(type_: &str, reason: &str, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: "False".into(),
        reason: Some(reason.into()),
        message,
        ..Default::default()
    }
}

/// kubelet's list of unknown and incomplete (or unready) containers as a message:
/// "containers with unknown status: [a b]", "containers with <what> status: [c]", joined by
/// ", "; `None` when both are empty.
fn containers_message(unknown: &[&str], other: &[&str], what: &str) -> Option<String> {
    let mut parts = Vec::new();
    if !unknown.is_empty() {
        parts.push(format!(
            "containers with unknown status: [{}]",
            unknown.join(" ")
        ));
    }
    if !other.is_empty() {
        parts.push(format!(
            "containers with {what} status: [{}]",
            other.join(" ")
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn find<'a>(list: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    list.iter().find(|s| s.name == name)
}

/// The `Initialized` condition (kubelet's `GeneratePodInitializedCondition`): True without init
/// containers; True once the pod succeeded (reason `PodCompleted`) or any app container has
/// started; else True only when every init container is done: a sidecar once it has started,
/// any other once it completed (is ready). Otherwise False, reason `ContainersNotInitialized`,
/// naming the unknown and incomplete ones.
pub fn initialized_condition(
    pod: &Pod,
    init: &[ContainerStatus],
    apps: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    if inits.is_empty() {
        return condition("Initialized", true, None);
    }
    let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
    for c in inits {
        let Some(s) = find(init, &c.name) else {
            unknown.push(c.name.as_str());
            continue;
        };
        let done = if c.restart_policy.as_deref() == Some("Always") {
            s.started == Some(true)
        } else {
            s.ready
        };
        if !done {
            incomplete.push(c.name.as_str());
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        let mut c = condition("Initialized", true, None);
        c.reason = Some("PodCompleted".into());
        return c;
    }
    let regular_started = apps.iter().any(|s| {
        let (running, terminated, last) = state_of(s);
        running || terminated.is_some() || last
    });
    if regular_started {
        return condition("Initialized", true, None);
    }
    match containers_message(&unknown, &incomplete, "incomplete") {
        Some(m) => not_met("Initialized", "ContainersNotInitialized", Some(m)),
        None => condition("Initialized", true, None),
    }
}

/// The `ContainersReady` condition (kubelet's `GenerateContainersReadyCondition`): every
/// sidecar and app container ready. A Succeeded pod is False with reason `PodCompleted`, a
/// Failed one `PodFailed`; otherwise False with `ContainersNotReady`, naming the unknown and
/// unready ones.
pub fn containers_ready_condition(
    pod: &Pod,
    init: &[ContainerStatus],
    apps: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let Some(spec) = pod.spec.as_ref() else {
        return condition("ContainersReady", false, Some("ContainersNotReady"));
    };
    let (mut unknown, mut unready) = (Vec::new(), Vec::new());
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| (c, init));
    for (c, list) in sidecars.chain(spec.containers.iter().map(|c| (c, apps))) {
        match find(list, &c.name) {
            None => unknown.push(c.name.as_str()),
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return not_met("ContainersReady", "PodCompleted", None);
    }
    if phase == "Failed" {
        return not_met("ContainersReady", "PodFailed", None);
    }
    match containers_message(&unknown, &unready, "unready") {
        Some(m) => not_met("ContainersReady", "ContainersNotReady", Some(m)),
        None => condition("ContainersReady", true, None),
    }
}

/// The `Ready` condition (kubelet's `GeneratePodReadyCondition`): `ContainersReady`'s when that
/// does not hold; else False with `ReadinessGatesNotReady` for a readiness gate whose condition
/// the pod lacks or does not hold True (nodelet sets no such conditions itself, so a static
/// pod with a gate is never ready, as with kubelet); else True. The gates of a pod from the
/// apiserver are not evaluated: their conditions are written to the API object by controllers
/// and nodelet does not read them back yet (README, cluster mode).
pub fn ready_condition(
    pod: &Pod,
    containers_ready: &PodCondition,
    conditions: &[PodCondition],
) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers_ready.clone()
        };
    }
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .filter(|_| !crate::pod::is_api_pod(pod))
        .unwrap_or(&[]);
    let mut unready = Vec::new();
    for g in gates {
        match conditions.iter().find(|c| c.type_ == g.condition_type) {
            None => unready.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                g.condition_type
            )),
            Some(c) if c.status != "True" => unready.push(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                g.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if unready.is_empty() {
        condition("Ready", true, None)
    } else {
        not_met("Ready", "ReadinessGatesNotReady", Some(unready.join(", ")))
    }
}

/// The pod's API status from the runtime's view, the last start errors, the probe results and
/// the node's IP.
pub fn generate_pod_status(
    pod: &Pod,
    rt: &RuntimePodStatus,
    errors: &StartErrors,
    probes: &dyn ProbeView,
    node_ip: &str,
) -> PodStatus {
    let Some(spec) = pod.spec.as_ref() else {
        return PodStatus::default();
    };
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let inits = spec.init_containers.as_deref().unwrap_or(&[]);
    let inputs = Inputs {
        uid: crate::pod::pod_uid(pod),
        rt,
        errors,
        probes,
        regular_created: spec.containers.iter().any(|c| rt.latest(&c.name).is_some()),
    };
    let init_st = container_statuses(true, inits, &inputs, "PodInitializing", policy);
    let init_pending = !init_st.iter().all(|s| {
        s.state
            .as_ref()
            .and_then(|x| x.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    });
    let app_st = container_statuses(
        false,
        &spec.containers,
        &inputs,
        if init_pending {
            "PodInitializing"
        } else {
            "ContainerCreating"
        },
        policy,
    );
    // Ephemeral containers are never restarted; the default waiting reason is the one kubelet
    // gives them (its init containers', by whether the pod has any); never ready.
    let ephemeral: Vec<Container> = crate::pod::ephemeral_containers(spec)
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let mut ephemeral_st = container_statuses(
        false,
        &ephemeral,
        &inputs,
        if inits.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        },
        "Never",
    );
    for st in &mut ephemeral_st {
        st.ready = false;
    }
    let phase = pod_phase(pod, &init_st, &app_st);
    let sandbox = rt.sandboxes.first().filter(|s| s.ready);
    let host_network = spec.host_network.unwrap_or(false);
    let ips: Vec<String> = if host_network {
        vec![node_ip.to_owned()]
    } else {
        sandbox.map(|s| s.ips.clone()).unwrap_or_default()
    };
    let initialized = initialized_condition(pod, &init_st, &app_st, phase);
    let containers_ready = containers_ready_condition(pod, &init_st, &app_st, phase);
    let ready = ready_condition(pod, &containers_ready, &[]);
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![
            condition("PodScheduled", true, None),
            initialized,
            containers_ready,
            ready,
        ]),
        host_ip: Some(node_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: node_ip.to_owned(),
        }]),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: rt.start_time().and_then(time),
        qos_class: Some(pod_qos_class(pod).as_str().into()),
        init_container_statuses: (!init_st.is_empty()).then_some(init_st),
        container_statuses: Some(app_st),
        ephemeral_container_statuses: (!ephemeral_st.is_empty()).then_some(ephemeral_st),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::SandboxStatus;
    use crate::prober::results::NoProbes;

    fn pod(policy: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: u}}\nspec: {{restartPolicy: {policy}, initContainers: [{{name: i, image: b}}], containers: [{{name: a, image: b}}]}}"
        ))
        .unwrap()
    }

    fn rc(name: &str, state: ContainerState, exit: i32, attempt: u32) -> RuntimeContainer {
        RuntimeContainer {
            id: format!("{name}{attempt}"),
            name: name.into(),
            state: Some(state),
            exit_code: exit,
            attempt,
            started_at: 1_700_000_000_000_000_000,
            ..Default::default()
        }
    }

    fn rt(containers: Vec<RuntimeContainer>) -> RuntimePodStatus {
        RuntimePodStatus {
            sandboxes: vec![SandboxStatus {
                id: "s".into(),
                ready: true,
                ips: vec!["10.88.0.2".into()],
                ..Default::default()
            }],
            containers,
        }
    }

    #[test]
    fn phases_follow_kubelet() {
        let e = StartErrors::new();
        let p = pod("Always");
        let s = generate_pod_status(&p, &rt(vec![]), &e, &NoProbes, "10.0.0.1");
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let w = s.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("PodInitializing"));

        let s = generate_pod_status(
            &p,
            &rt(vec![
                rc("a", ContainerState::Running, 0, 0),
                rc("i", ContainerState::Exited, 0, 0),
            ]),
            &e,
            &NoProbes,
            "10.0.0.1",
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.2"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        let ready = s
            .conditions
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .status
            .clone();
        assert_eq!(ready, "True");

        let p = pod("Never");
        let s = generate_pod_status(
            &p,
            &rt(vec![
                rc("a", ContainerState::Exited, 1, 0),
                rc("i", ContainerState::Exited, 0, 0),
            ]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        let t = s.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (1, Some("Error")));

        let p = pod("OnFailure");
        let s = generate_pod_status(
            &p,
            &rt(vec![
                rc("a", ContainerState::Exited, 0, 0),
                rc("i", ContainerState::Exited, 0, 0),
            ]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    }

    fn cond(s: &PodStatus, kind: &str) -> (String, Option<String>, Option<String>) {
        let c = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// A regular init container that is still running is not ready, and the pod not
    /// initialized (kubelet's prober marks an init container ready only once it exited 0), so
    /// that `kubectl get pods` reads `Init:0/1`.
    #[test]
    fn a_running_init_container_is_not_ready_and_the_pod_not_initialized() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {initContainers: [{name: setup, image: b}], containers: [{name: a, image: b}]}",
        )
        .unwrap();
        let s = generate_pod_status(
            &p,
            &rt(vec![rc("setup", ContainerState::Running, 0, 0)]),
            &StartErrors::new(),
            &NoProbes,
            "",
        );
        let init = &s.init_container_statuses.as_ref().unwrap()[0];
        assert!(!init.ready, "{init:?}");
        assert_eq!(init.started, Some(true));
        assert_eq!(
            cond(&s, "Initialized").1.as_deref(),
            Some("ContainersNotInitialized")
        );
    }

    /// kubelet's condition and phase rules for sidecars (restartable init containers).
    #[test]
    fn sidecars_count_once_started_for_initialized_and_their_readiness_for_ready() {
        let e = StartErrors::new();
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {initContainers: [{name: side, image: b, restartPolicy: Always}, {name: setup, image: b}], containers: [{name: a, image: b}]}",
        )
        .unwrap();
        // The sidecar runs, setup is done, the app runs: initialized and ready.
        let s = generate_pod_status(
            &p,
            &rt(vec![
                rc("side", ContainerState::Running, 0, 0),
                rc("setup", ContainerState::Exited, 0, 0),
                rc("a", ContainerState::Running, 0, 0),
            ]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized").0, "True");
        assert_eq!(cond(&s, "Ready").0, "True");
        // Before setup ran: the sidecar started, setup is incomplete.
        let s = generate_pod_status(
            &p,
            &rt(vec![rc("side", ContainerState::Running, 0, 0)]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(
            cond(&s, "Initialized"),
            (
                "False".into(),
                Some("ContainersNotInitialized".into()),
                Some("containers with incomplete status: [setup]".into())
            )
        );
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        // The sidecar crashed and waits in back-off while the app runs: still Running,
        // initialized, and not ready because the sidecar is not.
        let mut crashed = rc("side", ContainerState::Exited, 1, 0);
        crashed.finished_at = 1_700_000_001_000_000_000;
        let mut errors = StartErrors::new();
        errors.insert(
            "side".into(),
            ("CrashLoopBackOff".into(), "back-off 10s".into()),
        );
        let s = generate_pod_status(
            &p,
            &rt(vec![
                crashed,
                rc("setup", ContainerState::Exited, 0, 0),
                rc("a", ContainerState::Running, 0, 0),
            ]),
            &errors,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Running"), "{s:?}");
        assert_eq!(cond(&s, "Initialized").0, "True");
        assert_eq!(
            cond(&s, "ContainersReady"),
            (
                "False".into(),
                Some("ContainersNotReady".into()),
                Some("containers with unready status: [side]".into())
            )
        );
        assert_eq!(cond(&s, "Ready"), cond(&s, "ContainersReady"));
        // Succeeded: initialized with PodCompleted; not ready with PodCompleted.
        let never: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {restartPolicy: Never, initContainers: [{name: side, image: b, restartPolicy: Always}], containers: [{name: a, image: b}]}",
        )
        .unwrap();
        let s = generate_pod_status(
            &never,
            &rt(vec![
                rc("side", ContainerState::Exited, 143, 0),
                rc("a", ContainerState::Exited, 0, 0),
            ]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(
            cond(&s, "Initialized"),
            ("True".into(), Some("PodCompleted".into()), None)
        );
        assert_eq!(
            cond(&s, "Ready"),
            ("False".into(), Some("PodCompleted".into()), None)
        );
    }

    #[test]
    fn an_init_container_gone_from_the_runtime_after_the_app_started_completed() {
        let e = StartErrors::new();
        let s = generate_pod_status(
            &pod("Always"),
            &rt(vec![rc("a", ContainerState::Running, 0, 0)]),
            &e,
            &NoProbes,
            "",
        );
        let i = &s.init_container_statuses.as_ref().unwrap()[0];
        let t = i.state.clone().unwrap().terminated.unwrap();
        assert_eq!(
            (t.exit_code, t.reason.as_deref(), t.message.as_deref()),
            (0, Some("Completed"), Some(INIT_ASSUMED_COMPLETED))
        );
        assert!(i.ready);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized").0, "True");
        // Before any app container exists, a missing init container is waiting.
        let s = generate_pod_status(&pod("Always"), &rt(vec![]), &e, &NoProbes, "");
        assert!(s.init_container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .is_some());
    }

    #[test]
    fn a_readiness_gate_without_its_condition_keeps_the_pod_not_ready() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {readinessGates: [{conditionType: example.com/lb}], containers: [{name: a, image: b}]}",
        )
        .unwrap();
        let s = generate_pod_status(
            &p,
            &rt(vec![rc("a", ContainerState::Running, 0, 0)]),
            &StartErrors::new(),
            &NoProbes,
            "",
        );
        assert_eq!(cond(&s, "ContainersReady").0, "True");
        assert_eq!(
            cond(&s, "Ready"),
            (
                "False".into(),
                Some("ReadinessGatesNotReady".into()),
                Some(
                    "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
                        .into()
                )
            )
        );
    }

    /// The inputs of the fidelity issue, with kubelet's answers.
    #[test]
    fn phases_of_failed_init_containers_waiting_containers_and_start_errors() {
        let e = StartErrors::new();
        // restartPolicy Never, init container exited 1 (its sandbox already stopped): Failed.
        let s = generate_pod_status(
            &pod("Never"),
            &rt(vec![rc("i", ContainerState::Exited, 1, 0)]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        // The same under OnFailure: restarted, Pending.
        let s = generate_pod_status(
            &pod("OnFailure"),
            &rt(vec![rc("i", ContainerState::Exited, 1, 0)]),
            &e,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        // One container runs, the other waits on its image and never ran: Pending.
        let two: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: u}\nspec: {containers: [{name: a, image: b}, {name: b, image: 'b:nope'}]}").unwrap();
        let pulls: StartErrors = [(
            "b".to_string(),
            ("ErrImagePull".to_string(), "not found".to_string()),
        )]
        .into();
        let s = generate_pod_status(
            &two,
            &rt(vec![rc("a", ContainerState::Running, 0, 0)]),
            &pulls,
            &NoProbes,
            "",
        );
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        // restartPolicy Never, the start failed (the runtime: exited 128, StartError): the
        // container stays terminated, and the pod Failed.
        let never: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: u}\nspec: {restartPolicy: Never, containers: [{name: a, image: b}]}").unwrap();
        let mut start_error = rc("a", ContainerState::Exited, 128, 0);
        start_error.reason = "StartError".into();
        let run_error: StartErrors = [(
            "a".to_string(),
            ("RunContainerError".to_string(), "no such file".to_string()),
        )]
        .into();
        let s = generate_pod_status(
            &never,
            &rt(vec![start_error.clone()]),
            &run_error,
            &NoProbes,
            "",
        );
        let st = s.container_statuses.unwrap()[0].state.clone().unwrap();
        let t = st.terminated.expect("terminated, not waiting");
        assert_eq!(
            (t.exit_code, t.reason.as_deref()),
            (128, Some("StartError"))
        );
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        // Under Always the same container is started again: waiting RunContainerError, with the
        // failed start as its last state.
        let always: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: u}\nspec: {containers: [{name: a, image: b}]}").unwrap();
        let s = generate_pod_status(&always, &rt(vec![start_error]), &run_error, &NoProbes, "");
        let cs = &s.container_statuses.unwrap()[0];
        assert_eq!(
            cs.state.clone().unwrap().waiting.unwrap().reason.as_deref(),
            Some("RunContainerError")
        );
        assert_eq!(
            cs.last_state
                .clone()
                .unwrap()
                .terminated
                .unwrap()
                .reason
                .as_deref(),
            Some("StartError")
        );
    }

    #[test]
    fn restarts_show_last_state_and_count() {
        let p = pod("Always");
        let s = generate_pod_status(
            &p,
            &rt(vec![
                rc("a", ContainerState::Running, 0, 1),
                rc("a", ContainerState::Exited, 137, 0),
                rc("i", ContainerState::Exited, 0, 0),
            ]),
            &StartErrors::new(),
            &NoProbes,
            "",
        );
        let cs = &s.container_statuses.unwrap()[0];
        assert_eq!(cs.restart_count, 1);
        let last = cs.last_state.clone().unwrap().terminated.unwrap();
        assert_eq!((last.exit_code, last.signal), (137, Some(9)));
    }

    #[test]
    fn start_errors_become_waiting_reasons() {
        let p = pod("Always");
        let errors: StartErrors = [(
            "a".to_string(),
            ("ErrImagePull".to_string(), "no such image".to_string()),
        )]
        .into();
        let s = generate_pod_status(
            &p,
            &rt(vec![rc("i", ContainerState::Exited, 0, 0)]),
            &errors,
            &NoProbes,
            "",
        );
        let w = s.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("ErrImagePull"));
    }
}
