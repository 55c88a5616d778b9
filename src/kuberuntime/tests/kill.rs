//! KillPod, and pods failed without running, against the fake runtime.

use super::*;

#[tokio::test]
async fn kill_stops_containers_with_the_pods_grace_then_the_sandbox_then_removes_everything() {
    let h = harness();
    let p = pod(&format!(
        "{{terminationGracePeriodSeconds: 5, containers: [{}]}}",
        apps(&["a", "b"])
    ));
    h.sync(&p).await.unwrap();
    let dir = h.mgr.runtime().settings().root_dir.join("pods/u1");
    assert!(dir.join("etc-hosts").exists());
    h.rt.clear_calls();
    h.mgr
        .terminate_pod(p.clone(), KillPodOptions::removed())
        .await
        .unwrap();
    let calls = h.rt.calls();
    let pos = |c: &str| calls.iter().position(|x| x == c).unwrap();
    let stop_sb = pos("StopPodSandbox sb1");
    assert!(pos("StopContainer a grace=5") < stop_sb);
    assert!(pos("StopContainer b grace=5") < stop_sb);
    assert!(stop_sb < pos("RemovePodSandbox sb1"));
    assert!(h.rt.sandboxes().is_empty());
    assert!(h.status.get("u1").is_none(), "a removed pod has no status");
    assert!(!dir.exists());
    assert!(!h.cgroups.has("/kubepods/besteffort/podu1"));
    let killing: Vec<(Option<String>, String)> = h
        .recorder
        .list()
        .into_iter()
        .filter(|e| e.reason == "Killing")
        .map(|e| (e.field_path, e.message))
        .collect();
    // kubelet's `killContainer` event for each container, then nodelet's own for the pod.
    assert_eq!(killing.len(), 3, "{killing:?}");
    for c in ["a", "b"] {
        assert!(
            killing[..2].contains(&(
                Some(format!("spec.containers{{{c}}}")),
                format!("Stopping container {c}")
            )),
            "{killing:?}"
        );
    }
    assert_eq!(killing[2].0, None);
    assert!(killing[2].1.starts_with("Pod removed"), "{killing:?}");
}

#[tokio::test]
async fn a_sandbox_removal_that_finds_part_of_it_gone_completes_the_kill() {
    let h = harness();
    let p = pod(&format!("{{containers: [{}]}}", apps(&["a"])));
    h.sync(&p).await.unwrap();
    // Another failure of the removal: the kill fails, and the pod worker tries it again.
    h.rt.fail_next("remove_podsandbox", "transport is closing");
    let err = h.mgr.runtime().kill_pod(&p, 1, false).await.unwrap_err();
    assert_eq!(err.code, tonic::Code::Unknown);
    // containerd's answer when a container of the sandbox was removed behind CRI's back: the
    // pod is stopped, the kill is done.
    h.rt.fail_next_with(
        "remove_podsandbox",
        tonic::Code::NotFound,
        "failed to remove container \"c1\": not found",
    );
    h.rt.clear_calls();
    let killed = h.mgr.runtime().kill_pod(&p, 1, false).await.unwrap();
    assert!(killed.existed);
    assert_eq!(h.rt.calls_of("RemovePodSandbox").len(), 1);
}

#[tokio::test]
async fn an_eviction_kill_uses_its_grace_and_leaves_the_pod_failed() {
    let h = harness();
    let p = pod(&format!("{{containers: [{}]}}", apps(&["c"])));
    h.sync(&p).await.unwrap();
    let f = Failure::new("Evicted", "The node was low on resource: memory.")
        .of_running_pod()
        .with_disruption_target();
    h.mgr
        .terminate_pod(p.clone(), KillPodOptions::failed(f, Some(1)))
        .await
        .unwrap();
    // The 1 s override, raised to kubelet's 2 s minimum for each container.
    assert_eq!(
        h.rt.calls_of("StopContainer"),
        vec!["StopContainer c grace=2"]
    );
    let st = h.status();
    assert_eq!(
        (
            st.phase.as_deref(),
            st.reason.as_deref(),
            st.message.as_deref()
        ),
        (
            Some("Failed"),
            Some("Evicted"),
            Some("The node was low on resource: memory.")
        )
    );
    // The container keeps its last state (the fake's SIGTERM: 143), the pod its conditions.
    let c = &st.container_statuses.as_ref().unwrap()[0];
    let t = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (143, Some("Error")));
    let cond = |ty: &str| {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == ty)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            cond("Ready").status.as_str(),
            cond("Ready").reason.as_deref()
        ),
        ("False", Some("PodFailed"))
    );
    let d = cond("DisruptionTarget");
    assert_eq!(
        (d.status.as_str(), d.reason.as_deref(), d.message.as_deref()),
        (
            "True",
            Some("TerminationByKubelet"),
            Some("The node was low on resource: memory.")
        )
    );
    // Read again after the agent lost it (a restart): what the runtime no longer holds is
    // ContainerStatusUnknown, 137.
    h.status.remove(crate::pod::pod_uid(&p));
    h.failed.mark(
        &p,
        Failure::new("Evicted", "The node was low on resource: memory.").of_running_pod(),
    );
    h.sync(&p).await.unwrap();
    let st = h.status();
    let t = st.container_statuses.as_ref().unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (t.exit_code, t.reason.as_deref(), t.message.as_deref()),
        (
            137,
            Some("ContainerStatusUnknown"),
            Some("The container could not be located when the pod was terminated")
        )
    );
    assert_eq!(st.phase.as_deref(), Some("Failed"));
}

#[tokio::test]
async fn a_pod_rejected_before_it_ran_costs_two_list_calls_and_no_kill_event() {
    let h = harness();
    let p = pod(&format!("{{containers: [{}]}}", apps(&["c"])));
    let f = Failure::new("NodePorts", "Pod was rejected: Predicate NodePorts failed");
    h.mgr
        .terminate_pod(p.clone(), KillPodOptions::failed(f, None))
        .await
        .unwrap();
    assert_eq!(h.rt.calls(), vec!["ListPodSandbox", "ListContainers"]);
    assert_eq!(h.status().reason.as_deref(), Some("NodePorts"));
    assert!(h.recorder.list().is_empty());
}

#[tokio::test]
async fn a_failed_pod_is_not_started_until_its_manifest_changes() {
    let h = harness();
    let p = pod(&format!("{{containers: [{}]}}", apps(&["c"])));
    h.failed.mark(&p, Failure::new("Evicted", "low on memory"));
    h.sync(&p).await.unwrap();
    assert!(h.rt.calls().is_empty(), "no runtime call at all");
    assert_eq!(h.status().reason.as_deref(), Some("Evicted"));
    let edited = versioned("h2", &format!("{{containers: [{}]}}", apps(&["c"])));
    h.sync(&edited).await.unwrap();
    assert_eq!(h.rt.running(), vec!["c"]);
}

/// Housekeeping kills a pod no source wants from what the listings tell of it: its name,
/// namespace, the grace period its containers were created with, and whether anything of it
/// runs.
#[test]
fn a_runtime_pod_carries_what_killing_it_takes() {
    use crate::cri::api;
    use crate::kuberuntime::labels;
    use crate::kuberuntime::status::{RuntimePod, RuntimePods};
    let labelled = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ours = api::PodSandbox {
        id: "sb1".into(),
        labels: labelled(&[
            (labels::POD_UID, "u1"),
            (labels::NODE_NAME, "n"),
            (labels::POD_NAME, "web"),
            (labels::POD_NAMESPACE, "ns"),
        ]),
        ..Default::default()
    };
    let foreign = api::PodSandbox {
        id: "sb2".into(),
        labels: labelled(&[(labels::POD_UID, "u2"), (labels::NODE_NAME, "m")]),
        ..Default::default()
    };
    let c = api::Container {
        id: "c1".into(),
        pod_sandbox_id: "sb1".into(),
        state: api::ContainerState::ContainerRunning as i32,
        labels: labelled(&[(labels::POD_UID, "u1")]),
        annotations: labelled(&[(labels::POD_TERMINATION_GRACE_PERIOD, "7")]),
        ..Default::default()
    };
    // A pod whose sandbox is stopped and whose container exited: nothing of it runs.
    let stopped = api::PodSandbox {
        id: "sb3".into(),
        state: api::PodSandboxState::SandboxNotready as i32,
        labels: labelled(&[(labels::POD_UID, "u3"), (labels::NODE_NAME, "n")]),
        ..Default::default()
    };
    let exited = api::Container {
        id: "c3".into(),
        pod_sandbox_id: "sb3".into(),
        state: api::ContainerState::ContainerExited as i32,
        labels: labelled(&[(labels::POD_UID, "u3")]),
        ..Default::default()
    };
    let mut pods = RuntimePods::from_listings(&[ours, foreign, stopped], &[c, exited], "n");
    let idle = pods.ours.iter().position(|p| p.uid == "u3").unwrap();
    assert!(!pods.ours.remove(idle).running);
    let web = RuntimePod {
        uid: "u1".into(),
        name: Some("web".into()),
        namespace: Some("ns".into()),
        grace_seconds: Some(7),
        running: true,
    };
    assert_eq!(pods.ours, [web]);
    assert!(pods.foreign.contains("u2") && pods.foreign.len() == 1);
    assert_eq!(pods.running_containers, ["c1"]);
    let p = pods.ours[0].to_pod();
    assert_eq!(crate::pod::pod_uid(&p), "u1");
    assert_eq!(
        (p.metadata.name.as_deref(), p.metadata.namespace.as_deref()),
        (Some("web"), Some("ns"))
    );
    assert_eq!(p.spec.unwrap().termination_grace_period_seconds, Some(7));
}
