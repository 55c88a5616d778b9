//! computePodActions: a pure function of the pod spec and the runtime's view.

use k8s_openapi::api::core::v1::Pod;

use crate::container::{ContainerState, RuntimeContainer, RuntimePodStatus, SandboxStatus};
use crate::kuberuntime::actions::*;
use crate::kuberuntime::labels::container_hash;

fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("{{name: {n}, image: busybox}}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    serde_yaml::from_str(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: u}}\nspec: {{restartPolicy: {policy}, initContainers: [{}], containers: [{}]}}",
        list(inits),
        list(apps)
    ))
    .unwrap()
}

fn sandbox(p: &Pod, ready: bool, attempt: u32) -> SandboxStatus {
    SandboxStatus {
        id: format!("sb{attempt}"),
        attempt,
        ready,
        created_at: attempt as i64,
        ips: vec![],
        sandbox_hash: sandbox_hash(p),
        pod_spec_hash: Some(pod_spec_hash(p)),
        pod_started_at: 0,
    }
}

fn container(
    p: &Pod,
    name: &str,
    state: ContainerState,
    exit: i32,
    attempt: u32,
) -> RuntimeContainer {
    let spec = p.spec.as_ref().unwrap();
    let c = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name);
    RuntimeContainer {
        id: format!("{name}-{attempt}"),
        sandbox_id: "sb0".into(),
        name: name.into(),
        attempt,
        state: Some(state),
        hash: c.map(container_hash).unwrap_or_default(),
        exit_code: exit,
        is_init: spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == name),
        ..Default::default()
    }
}

#[test]
fn new_pod_creates_sandbox_and_starts_all_containers() {
    let p = pod("Always", &[], &["a", "b"]);
    let a = compute_pod_actions(&p, &RuntimePodStatus::default());
    assert_eq!(a.create_sandbox, Some(0));
    assert!(!a.kill_pod);
    assert_eq!(
        a.containers_to_start
            .iter()
            .map(|s| s.index)
            .collect::<Vec<_>>(),
        vec![0, 1]
    );
}

#[test]
fn init_containers_run_one_by_one_before_apps() {
    let p = pod("Always", &["i1", "i2"], &["a"]);
    let a = compute_pod_actions(&p, &RuntimePodStatus::default());
    assert_eq!(
        a.next_init,
        Some(ToStart {
            index: 0,
            restart_count: 0
        })
    );
    assert!(a.containers_to_start.is_empty());

    let mut st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "i1", ContainerState::Running, 0, 0)],
    };
    let a = compute_pod_actions(&p, &st);
    assert_eq!(a.next_init, None);
    assert!(
        a.containers_to_start.is_empty(),
        "wait for the running init container"
    );

    st.containers = vec![container(&p, "i1", ContainerState::Exited, 0, 0)];
    assert_eq!(
        compute_pod_actions(&p, &st).next_init,
        Some(ToStart {
            index: 1,
            restart_count: 0
        })
    );

    st.containers = vec![
        container(&p, "i2", ContainerState::Exited, 0, 0),
        container(&p, "i1", ContainerState::Exited, 0, 0),
    ];
    let a = compute_pod_actions(&p, &st);
    assert_eq!(a.next_init, None);
    assert_eq!(
        a.containers_to_start,
        vec![ToStart {
            index: 0,
            restart_count: 0
        }]
    );
}

#[test]
fn failed_init_container_restarts_unless_never() {
    let p = pod("Always", &["i1"], &["a"]);
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "i1", ContainerState::Exited, 1, 0)],
    };
    assert_eq!(
        compute_pod_actions(&p, &st).next_init,
        Some(ToStart {
            index: 0,
            restart_count: 1
        })
    );
    let p = pod("Never", &["i1"], &["a"]);
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "i1", ContainerState::Exited, 1, 0)],
    };
    let a = compute_pod_actions(&p, &st);
    assert!(a.init_failed && a.next_init.is_none());
}

#[test]
fn changed_spec_restarts_only_that_container() {
    let p = pod("Always", &[], &["a", "b"]);
    let mut st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![
            container(&p, "a", ContainerState::Running, 0, 0),
            container(&p, "b", ContainerState::Running, 0, 0),
        ],
    };
    assert_eq!(
        compute_pod_actions(&p, &st),
        PodActions {
            sandbox_id: Some("sb0".into()),
            ..Default::default()
        }
    );
    st.containers[1].hash = "old".into();
    let a = compute_pod_actions(&p, &st);
    assert_eq!(
        a.containers_to_kill,
        vec![("b-0".to_string(), "b".to_string(), KillReason::SpecChanged)]
    );
    assert_eq!(
        a.containers_to_start,
        vec![ToStart {
            index: 1,
            restart_count: 1
        }]
    );
    assert!(!a.kill_pod && a.create_sandbox.is_none());
}

#[test]
fn exited_containers_follow_the_restart_policy() {
    for (policy, exit, restart) in [
        ("Always", 0, true),
        ("Always", 1, true),
        ("OnFailure", 0, false),
        ("OnFailure", 1, true),
        ("Never", 1, false),
    ] {
        let p = pod(policy, &[], &["a"]);
        let st = RuntimePodStatus {
            sandboxes: vec![sandbox(&p, true, 0)],
            containers: vec![container(&p, "a", ContainerState::Exited, exit, 0)],
        };
        let a = compute_pod_actions(&p, &st);
        assert_eq!(
            !a.containers_to_start.is_empty(),
            restart,
            "{policy} {exit}"
        );
        assert_eq!(
            a.kill_pod, !restart,
            "{policy} {exit}: stop the sandbox of a finished pod"
        );
    }
}

#[test]
fn dead_sandbox_is_recreated_with_next_attempt_unless_finished() {
    let p = pod("Always", &[], &["a"]);
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, false, 0)],
        containers: vec![container(&p, "a", ContainerState::Exited, 137, 0)],
    };
    let a = compute_pod_actions(&p, &st);
    assert_eq!(a.create_sandbox, Some(1));
    assert!(a.kill_pod);
    assert_eq!(
        a.containers_to_start,
        vec![ToStart {
            index: 0,
            restart_count: 1
        }]
    );
    let p = pod("Never", &[], &["a"]);
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, false, 0)],
        containers: vec![container(&p, "a", ContainerState::Exited, 0, 0)],
    };
    assert_eq!(compute_pod_actions(&p, &st).create_sandbox, None);
    let p = pod("Never", &["i1"], &["a"]);
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, false, 0)],
        containers: vec![container(&p, "i1", ContainerState::Exited, 1, 0)],
    };
    assert_eq!(
        compute_pod_actions(&p, &st).create_sandbox,
        None,
        "a failed Never pod is not retried"
    );
}

#[test]
fn an_edited_finished_static_pod_runs_again_from_its_start() {
    let static_pod = |mut p: Pod| {
        p.metadata.annotations = Some(
            [(
                crate::pod::CONFIG_SOURCE_ANNOTATION.to_owned(),
                "file".to_owned(),
            )]
            .into(),
        );
        p
    };
    for policy in ["Never", "OnFailure"] {
        let ran = static_pod(pod(policy, &["i1"], &["a"]));
        // It ran to completion; its sandbox is stopped.
        let st = RuntimePodStatus {
            sandboxes: vec![sandbox(&ran, false, 0)],
            containers: vec![
                container(&ran, "i1", ContainerState::Exited, 0, 0),
                container(&ran, "a", ContainerState::Exited, 0, 0),
            ],
        };
        assert_eq!(
            compute_pod_actions(&ran, &st).create_sandbox,
            None,
            "{policy}"
        );
        // A container's command is edited: the new version runs, init container first.
        let mut cmd = ran.clone();
        cmd.spec.as_mut().unwrap().containers[0].command = Some(vec!["true".into()]);
        let a = compute_pod_actions(&cmd, &st);
        assert_eq!(a.create_sandbox, Some(1), "{policy}");
        assert_eq!(a.next_init.map(|s| s.index), Some(0), "{policy}");
        // A pod-level edit likewise.
        let mut vol = ran.clone();
        vol.spec.as_mut().unwrap().volumes = Some(vec![serde_json::from_str(
            r#"{"name": "v", "emptyDir": {}}"#,
        )
        .unwrap()]);
        assert_eq!(
            compute_pod_actions(&vol, &st).create_sandbox,
            Some(1),
            "{policy}"
        );
        // An API pod is not a new pod when edited: finished stays finished.
        let mut api = cmd.clone();
        api.metadata.annotations = None;
        assert_eq!(
            compute_pod_actions(&api, &st).create_sandbox,
            None,
            "{policy}"
        );
    }
}

#[test]
fn host_network_change_recreates_the_sandbox() {
    let p = pod("Always", &[], &["a"]);
    let mut st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "a", ContainerState::Running, 0, 0)],
    };
    st.sandboxes[0].sandbox_hash = "different".into();
    let a = compute_pod_actions(&p, &st);
    assert_eq!(a.create_sandbox, Some(1));
    assert!(a.kill_pod);
}

#[test]
fn a_pod_level_edit_recreates_the_sandbox_a_container_edit_does_not() {
    let p = pod("Always", &[], &["a"]);
    let running = |sb: &Pod, c: &Pod| RuntimePodStatus {
        sandboxes: vec![sandbox(sb, true, 0)],
        containers: vec![container(c, "a", ContainerState::Running, 0, 0)],
    };
    let edit = |f: &dyn Fn(&mut k8s_openapi::api::core::v1::PodSpec)| {
        let mut e = p.clone();
        f(e.spec.as_mut().unwrap());
        e
    };
    let volume = edit(&|s| {
        s.volumes = Some(vec![serde_json::from_str(
            r#"{"name": "v", "hostPath": {"path": "/srv/new"}}"#,
        )
        .unwrap()]);
    });
    let run_as = edit(&|s| {
        s.security_context = Some(serde_json::from_str(r#"{"runAsUser": 1000}"#).unwrap());
    });
    // BestEffort → Burstable (and a limit lowered on a Burstable pod alike).
    let qos = edit(&|s| {
        s.containers[0].resources =
            Some(serde_json::from_str(r#"{"requests": {"memory": "64Mi"}}"#).unwrap());
    });
    for (what, edited) in [
        ("volume", &volume),
        ("runAsUser", &run_as),
        ("resources", &qos),
    ] {
        // The running sandbox was made for `p`; the spec is now `edited`. Its containers keep
        // their own hash: only the pod-level hash tells the difference.
        let a = compute_pod_actions(edited, &running(&p, edited));
        assert_eq!(a.create_sandbox, Some(1), "{what}");
        assert!(a.kill_pod, "{what}");
        assert_eq!(a.containers_to_start.len(), 1, "{what}");
        // Unchanged: nothing to do.
        let a = compute_pod_actions(edited, &running(edited, edited));
        assert_eq!(a.create_sandbox, None, "{what}");
        assert!(!a.kill_pod, "{what}");
    }
    // A sandbox made before the hash was written is not recreated for it.
    let mut old = running(&p, &volume);
    old.sandboxes[0].pod_spec_hash = None;
    assert_eq!(compute_pod_actions(&volume, &old).create_sandbox, None);
    // A container-only edit restarts that container in the same sandbox.
    let image = edit(&|s| s.containers[0].image = Some("busybox:1.35".into()));
    let a = compute_pod_actions(&image, &running(&p, &p));
    assert_eq!(a.create_sandbox, None);
    assert_eq!(a.containers_to_kill.len(), 1);
}

#[test]
fn containers_removed_from_spec_are_killed() {
    let p = pod("Always", &[], &["a"]);
    let mut gone = container(&p, "a", ContainerState::Running, 0, 0);
    gone.name = "old".into();
    gone.id = "old-0".into();
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "a", ContainerState::Running, 0, 0), gone],
    };
    let a = compute_pod_actions(&p, &st);
    assert_eq!(
        a.containers_to_kill,
        vec![(
            "old-0".to_string(),
            "old".to_string(),
            KillReason::NotInSpec
        )]
    );
}

#[test]
fn an_oom_killed_init_container_failed_whatever_its_exit_code() {
    for (policy, restarts) in [("Always", true), ("OnFailure", true), ("Never", false)] {
        let p = pod(policy, &["i1"], &["a"]);
        let mut oom = container(&p, "i1", ContainerState::Exited, 0, 0);
        oom.reason = "OOMKilled".into();
        let st = RuntimePodStatus {
            sandboxes: vec![sandbox(&p, true, 0)],
            containers: vec![oom],
        };
        let a = compute_pod_actions(&p, &st);
        assert!(a.containers_to_start.is_empty(), "{policy}: the app waits");
        assert_eq!(a.next_init.is_some(), restarts, "{policy}");
        assert_eq!(a.init_failed, !restarts, "{policy}");
    }
}

#[test]
fn init_containers_are_done_once_a_regular_container_exists() {
    let p = pod("Always", &["i1"], &["a"]);
    // The init container was removed since; the app container runs.
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "a", ContainerState::Running, 0, 0)],
    };
    let a = compute_pod_actions(&p, &st);
    assert_eq!(a.next_init, None);
    assert!(a.containers_to_start.is_empty() && !a.kill_pod);
}

#[test]
fn a_container_in_unknown_state_is_killed_before_it_starts_again() {
    // containerd may report a container unknown while it reloads its tasks after a restart;
    // starting a second instance beside the first would run the container twice.
    let p = pod("Always", &[], &["a"]);
    let mut unknown = container(&p, "a", ContainerState::Unknown, 0, 0);
    unknown.id = "a-0".into();
    let st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![unknown],
    };
    let a = compute_pod_actions(&p, &st);
    assert_eq!(
        a.containers_to_kill,
        vec![("a-0".to_string(), "a".to_string(), KillReason::UnknownState)]
    );
    assert_eq!(
        a.containers_to_start,
        vec![ToStart {
            index: 0,
            restart_count: 1
        }]
    );
    assert!(!a.kill_pod);
}

/// kubelet's `EphemeralContainersToStart`: an ephemeral container the runtime never held is
/// started, even while an init container runs; once it exists it is never started again, nor
/// killed as unknown; none in a new sandbox.
#[test]
fn ephemeral_containers_start_once_and_are_not_killed_as_unknown() {
    let mut p = pod("Always", &["i1"], &["a"]);
    p.spec.as_mut().unwrap().ephemeral_containers = Some(
        serde_yaml::from_str("[{name: debug, image: busybox, targetContainerName: a}]").unwrap(),
    );
    assert!(
        compute_pod_actions(&p, &RuntimePodStatus::default())
            .ephemeral_to_start
            .is_empty(),
        "not in a new sandbox"
    );
    let mut st = RuntimePodStatus {
        sandboxes: vec![sandbox(&p, true, 0)],
        containers: vec![container(&p, "i1", ContainerState::Running, 0, 0)],
    };
    assert_eq!(compute_pod_actions(&p, &st).ephemeral_to_start, [0]);
    st.containers = vec![
        container(&p, "i1", ContainerState::Exited, 0, 0),
        container(&p, "a", ContainerState::Running, 0, 0),
        container(&p, "debug", ContainerState::Running, 0, 0),
    ];
    let a = compute_pod_actions(&p, &st);
    assert!(a.ephemeral_to_start.is_empty());
    assert!(
        a.containers_to_kill.is_empty(),
        "{:?}",
        a.containers_to_kill
    );
    st.containers[2].state = Some(ContainerState::Exited);
    st.containers[2].exit_code = 1;
    let a = compute_pod_actions(&p, &st);
    assert!(a.ephemeral_to_start.is_empty(), "never restarted");
    assert!(!a.kill_pod);
}
