//! Pod status from the runtime's view (kubelet's `generateAPIPodStatus`, `getPhase` and
//! `convertToAPIContainerStatuses` in `kubelet_pods.go`).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::container::{ContainerState, RuntimeContainer, RuntimePodStatus};
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

fn container_statuses(
    is_init: bool,
    specs: &[Container],
    rt: &RuntimePodStatus,
    errors: &StartErrors,
    default_waiting: &str,
) -> Vec<ContainerStatus> {
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
                    // An init container that completed is ready (kubelet's init status).
                    let completed =
                        is_init && rc.state() == ContainerState::Exited && rc.exit_code == 0;
                    st.ready = running || completed;
                    st.started = Some(running);
                    st.last_state = previous.map(|p| ApiState {
                        terminated: Some(terminated(p)),
                        ..Default::default()
                    });
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
            if let Some((reason, message)) = errors.get(&c.name) {
                if latest.is_none_or(|rc| rc.state() != ContainerState::Running) {
                    st.last_state = st
                        .last_state
                        .take()
                        .or_else(|| st.state.take().filter(|s| s.terminated.is_some()));
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

/// Pod phase (kubelet's `getPhase`): Pending until init containers are done and some app
/// container ran; Running while any app container runs or will be restarted; Succeeded when all
/// app containers exited 0 and will not restart; Failed when some exited non-zero and none will
/// restart, or an init container failed under restartPolicy Never.
pub fn pod_phase(
    pod: &Pod,
    init: &[ContainerStatus],
    apps: &[ContainerStatus],
    init_failed: bool,
) -> &'static str {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    if init_failed {
        return "Failed";
    }
    let init_done = init.iter().all(|s| {
        s.state
            .as_ref()
            .and_then(|x| x.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    });
    if !init_done {
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in apps {
        let st = s.state.as_ref();
        if st.and_then(|x| x.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = st.and_then(|x| x.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s
            .last_state
            .as_ref()
            .and_then(|x| x.terminated.as_ref())
            .is_some()
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if waiting > 0 && running == 0 && stopped == 0 {
        return "Pending";
    }
    if running > 0 || waiting > 0 {
        return "Running";
    }
    match policy {
        "Always" => "Running",
        "OnFailure" if stopped != succeeded => "Running",
        _ if stopped == succeeded => "Succeeded",
        _ => "Failed",
    }
}

fn condition(type_: &str, ok: bool, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: (!ok).then(|| reason.map(str::to_owned)).flatten(),
        ..Default::default()
    }
}

/// The pod's API status from the runtime's view, the last start errors and the node's IP.
pub fn generate_pod_status(
    pod: &Pod,
    rt: &RuntimePodStatus,
    errors: &StartErrors,
    node_ip: &str,
    init_failed: bool,
) -> PodStatus {
    let Some(spec) = pod.spec.as_ref() else {
        return PodStatus::default();
    };
    let inits = spec.init_containers.as_deref().unwrap_or(&[]);
    let init_st = container_statuses(true, inits, rt, errors, "PodInitializing");
    let init_pending = !init_st.iter().all(|s| {
        s.state
            .as_ref()
            .and_then(|x| x.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    });
    let app_st = container_statuses(
        false,
        &spec.containers,
        rt,
        errors,
        if init_pending {
            "PodInitializing"
        } else {
            "ContainerCreating"
        },
    );
    let phase = pod_phase(pod, &init_st, &app_st, init_failed);
    let sandbox = rt.sandboxes.first().filter(|s| s.ready);
    let host_network = spec.host_network.unwrap_or(false);
    let ips: Vec<String> = if host_network {
        vec![node_ip.to_owned()]
    } else {
        sandbox.map(|s| s.ips.clone()).unwrap_or_default()
    };
    let all_ready = !app_st.is_empty() && app_st.iter().all(|s| s.ready);
    let not_ready_reason = if phase == "Succeeded" || phase == "Failed" {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![
            condition("PodScheduled", true, None),
            condition(
                "Initialized",
                !init_pending,
                Some("ContainersNotInitialized"),
            ),
            condition("ContainersReady", all_ready, Some(not_ready_reason)),
            condition("Ready", all_ready, Some(not_ready_reason)),
        ]),
        host_ip: Some(node_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: node_ip.to_owned(),
        }]),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: rt.sandboxes.last().and_then(|s| time(s.created_at)),
        qos_class: Some(pod_qos_class(pod).as_str().into()),
        init_container_statuses: (!init_st.is_empty()).then_some(init_st),
        container_statuses: Some(app_st),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::SandboxStatus;

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
        let s = generate_pod_status(&p, &rt(vec![]), &e, "10.0.0.1", false);
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
            "10.0.0.1",
            false,
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
            "",
            false,
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
            "",
            false,
        );
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(
            generate_pod_status(&p, &rt(vec![]), &e, "", true)
                .phase
                .as_deref(),
            Some("Failed")
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
            "",
            false,
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
            "",
            false,
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
