//! Admission, active deadlines, local storage limits and runtime classes on the real containerd:
//! each row of the admission issue's table gets kubelet's outcome.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

fn status(n: &Nodelet, name: &str) -> serde_json::Value {
    n.pod(name).map(|p| p["status"].clone()).unwrap_or_default()
}

fn manifest(name: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec}")
}

/// One busybox container `c` that sleeps, with `resources` (a flow mapping) and `extra` spec
/// lines before the containers.
fn sleeper(name: &str, extra: &str, resources: &str) -> String {
    manifest(
        name,
        &format!("{extra}  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600'], resources: {resources}}}\n"),
    )
}

/// Waits for the pod to be Failed and returns its (reason, message).
fn failed(n: &Nodelet, name: &str, within: Duration) -> (String, String) {
    wait_until(within, &format!("{name} Failed"), || {
        status(n, name)["phase"] == "Failed"
    });
    let st = status(n, name);
    (
        st["reason"].as_str().unwrap_or_default().to_owned(),
        st["message"].as_str().unwrap_or_default().to_owned(),
    )
}

fn cpus() -> i64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i64)
}

#[test]
fn admission_refuses_what_kubelet_refuses_and_a_full_node_still_runs_what_fits() {
    // kubeReserved leaves exactly one cpu (1000m) allocatable, whatever the machine has.
    let reserved = cpus() * 1000 - 1000;
    let mut n = Nodelet::with_config(
        "admission",
        &format!("kubeReserved: {{cpu: {reserved}m}}\nevictionHard: {{memory.available: 100Mi}}\nallowedUnsafeSysctls: [kernel.msgmax]\n"),
    );
    n.extra_args = vec!["--node-labels".into(), "tier=edge".into()];
    n.start();
    // A pod that fits, and one whose node selector matches the --node-labels label.
    n.write_manifest("fit.yaml", &sleeper("fit", "", "{requests: {cpu: 600m}}"));
    n.write_manifest(
        "edge.yaml",
        &sleeper("edge", "  nodeSelector: {tier: edge}\n", "{}"),
    );
    let fit = n.uid("fit");
    n.wait_running(&fit, &["c"], Duration::from_secs(30));
    let edge = n.uid("edge");
    n.wait_running(&edge, &["c"], Duration::from_secs(30));

    // The node is now 600m full: 600m more does not fit.
    n.write_manifest("over.yaml", &sleeper("over", "", "{requests: {cpu: 600m}}"));
    n.write_manifest(
        "huge.yaml",
        &sleeper("huge", "", "{requests: {cpu: '100'}}"),
    );
    let memory = common::mem_total() * 2;
    n.write_manifest(
        "mem.yaml",
        &sleeper("mem", "", &format!("{{requests: {{memory: '{memory}'}}}}")),
    );
    n.write_manifest(
        "ssd.yaml",
        &sleeper("ssd", "  nodeSelector: {disktype: ssd}\n", "{}"),
    );
    n.write_manifest(
        "windows.yaml",
        &sleeper("windows", "  os: {name: windows}\n", "{}"),
    );
    // An unsafe sysctl not allowed, and one that allowedUnsafeSysctls allows.
    n.write_manifest(
        "sysctl.yaml",
        &sleeper(
            "sysctl",
            "  securityContext: {sysctls: [{name: kernel.msgmnb, value: '65536'}]}\n",
            "{}",
        ),
    );
    n.write_manifest(
        "allowed.yaml",
        &sleeper(
            "allowed",
            "  securityContext: {sysctls: [{name: kernel.msgmax, value: '12345'}]}\n",
            "{}",
        ),
    );

    let within = Duration::from_secs(20);
    assert_eq!(
        failed(&n, "over", within),
        (
            "OutOfcpu".into(),
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 600, used: 600, capacity: 1000".into()
        )
    );
    assert_eq!(
        failed(&n, "huge", within),
        (
            "OutOfcpu".into(),
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 100000, used: 600, capacity: 1000".into()
        )
    );
    let (reason, message) = failed(&n, "mem", within);
    assert_eq!(reason, "OutOfmemory");
    assert!(
        message.starts_with(&format!(
            "Pod was rejected: Node didn't have enough resource: memory, requested: {memory}, used: 0, capacity: "
        )),
        "{message}"
    );
    assert_eq!(
        failed(&n, "ssd", within),
        (
            "NodeAffinity".into(),
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into()
        )
    );
    assert_eq!(
        failed(&n, "windows", within),
        (
            "PodOSNotSupported".into(),
            "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS".into()
        )
    );
    assert_eq!(
        failed(&n, "sysctl", within),
        (
            "SysctlForbidden".into(),
            "Pod was rejected: forbidden sysctl: \"kernel.msgmnb\" not allowlisted".into()
        )
    );
    let allowed = n.uid("allowed");
    let c = n.wait_running(&allowed, &["c"], Duration::from_secs(30));
    let (code, out) = n
        .runtime
        .exec(&c["c"].id, &["cat", "/proc/sys/kernel/msgmax"]);
    assert_eq!((code, out.trim()), (0, "12345"));
    // Refused pods never reached the runtime; the admitted ones still run.
    for name in ["over", "huge", "mem", "ssd", "windows", "sysctl"] {
        let uid = n.uid(name);
        assert!(n.runtime.sandboxes(&uid).is_empty(), "{name} has a sandbox");
    }
    n.wait_running(&fit, &["c"], Duration::from_secs(5));
    n.wait_running(&edge, &["c"], Duration::from_secs(5));
    assert_eq!(status(&n, "fit")["phase"], "Running");

    let events = n.get("/events").unwrap();
    for reason in [
        "OutOfcpu",
        "OutOfmemory",
        "NodeAffinity",
        "PodOSNotSupported",
        "SysctlForbidden",
    ] {
        assert!(
            events.contains(&format!("\"reason\":\"{reason}\"")),
            "no {reason} event: {events}"
        );
    }
    assert_eq!(
        n.metric("kubelet_admission_rejections_total{reason=\"OutOfcpu\"}"),
        2.0
    );
    n.wait_running(&edge, &["c"], Duration::from_secs(5));
    assert_eq!(
        n.metric("kubelet_admission_rejections_total{reason=\"NodeAffinity\"}"),
        1.0
    );

    // An edit goes through admission again: edge asking for 900m beside fit's 600m is refused
    // and stopped, as kubelet refuses an edited static pod (a new pod to it).
    n.write_manifest(
        "edge.yaml",
        &sleeper(
            "edge",
            "  nodeSelector: {tier: edge}\n",
            "{requests: {cpu: 900m}}",
        ),
    );
    let (reason, _) = failed(&n, "edge", within);
    assert_eq!(reason, "OutOfcpu");
    wait_until(Duration::from_secs(20), "edge stopped", || {
        n.runtime.sandboxes(&edge).is_empty()
    });
    n.wait_running(&fit, &["c"], Duration::from_secs(5));

    // When the fitting pod goes, a refused pod whose manifest changes is admitted.
    std::fs::remove_file(n.manifests().join("fit.yaml")).unwrap();
    wait_until(Duration::from_secs(20), "fit removed", || {
        n.runtime.sandboxes(&fit).is_empty()
    });
    n.write_manifest("over.yaml", &sleeper("over", "", "{requests: {cpu: 700m}}"));
    wait_until(Duration::from_secs(30), "changed over runs", || {
        status(&n, "over")["phase"] == "Running"
    });
}

#[test]
fn a_pod_past_its_active_deadline_fails_and_an_agent_restart_does_not_reset_the_clock() {
    let mut n = Nodelet::new("deadline");
    n.start();
    n.write_manifest(
        "five.yaml",
        &sleeper("five", "  activeDeadlineSeconds: 5\n", "{}"),
    );
    n.write_manifest(
        "eight.yaml",
        &sleeper("eight", "  activeDeadlineSeconds: 8\n", "{}"),
    );
    let five = n.uid("five");
    let eight = n.uid("eight");
    n.wait_running(&five, &["c"], Duration::from_secs(30));
    n.wait_running(&eight, &["c"], Duration::from_secs(30));
    let started = Instant::now();

    // The agent is killed and started again while both pods run.
    n.kill9();
    n.start();

    assert_eq!(
        failed(&n, "five", Duration::from_secs(20)),
        (
            "DeadlineExceeded".into(),
            "Pod was active on the node longer than the specified deadline".into()
        )
    );
    let (reason, _) = failed(&n, "eight", Duration::from_secs(20));
    let took = started.elapsed();
    assert_eq!(reason, "DeadlineExceeded");
    // Counted from the pod's start, not from the agent's restart (which came later).
    assert!(
        took < Duration::from_secs(11),
        "eight failed after {took:?}"
    );
    for uid in [&five, &eight] {
        wait_until(Duration::from_secs(10), "containers gone", || {
            n.runtime.containers(uid).is_empty() && n.runtime.sandboxes(uid).is_empty()
        });
    }
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("\"reason\":\"DeadlineExceeded\""),
        "{events}"
    );
    // It stays Failed.
    n.wait_for_housekeeping(1);
    assert_eq!(status(&n, "five")["phase"], "Failed");
    assert!(n.runtime.sandboxes(&five).is_empty());
}

#[test]
fn a_container_over_its_ephemeral_storage_limit_is_evicted_without_node_pressure() {
    let mut n = Nodelet::with_config("storage", "evictionMonitoringPeriod: 2s\n");
    n.start();
    n.write_manifest(
        "writer.yaml",
        &manifest(
            "writer",
            "  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'dd if=/dev/zero of=/fill bs=1M count=40 && sleep 3600']\n    resources: {limits: {ephemeral-storage: 10Mi}}\n",
        ),
    );
    // A neighbour within its own limit keeps running.
    n.write_manifest(
        "calm.yaml",
        &manifest(
            "calm",
            "  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'dd if=/dev/zero of=/fill bs=1M count=2 && sleep 3600']\n    resources: {limits: {ephemeral-storage: 10Mi}}\n",
        ),
    );
    let calm = n.uid("calm");
    n.wait_running(&calm, &["c"], Duration::from_secs(30));
    assert_eq!(
        failed(&n, "writer", Duration::from_secs(30)),
        (
            "Evicted".into(),
            "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. ".into()
        )
    );
    let writer = n.uid("writer");
    wait_until(Duration::from_secs(10), "writer's containers gone", || {
        n.runtime.containers(&writer).is_empty()
    });
    let node = n.get("/node").unwrap();
    assert!(!node.contains("\"DiskPressure\":true"), "{node}");
    assert_eq!(
        n.metric("kubelet_evictions_total{eviction_signal=\"ephemeralpodfs.limit\"}"),
        1.0
    );
    n.wait_for_housekeeping(1);
    n.wait_running(&calm, &["c"], Duration::from_secs(5));
    assert_eq!(status(&n, "calm")["phase"], "Running");
}

#[test]
fn the_runtime_class_name_picks_the_runtime_handler_and_a_missing_one_never_runs() {
    let mut n = Nodelet::new("runtimeclass");
    n.start();
    n.write_manifest(
        "missing.yaml",
        &sleeper("missing", "  runtimeClassName: gvisor-missing\n", "{}"),
    );
    // runc is the handler the environment's containerd configures.
    n.write_manifest(
        "runc.yaml",
        &sleeper("runc", "  runtimeClassName: runc\n", "{}"),
    );
    let runc = n.uid("runc");
    n.wait_running(&runc, &["c"], Duration::from_secs(30));
    assert_eq!(
        n.runtime.sandboxes(&runc)[0].runtime_handler,
        "runc",
        "the sandbox runs under the handler named"
    );
    wait_until(Duration::from_secs(20), "FailedCreatePodSandBox", || {
        n.get("/events")
            .is_some_and(|e| e.contains("FailedCreatePodSandBox") && e.contains("gvisor-missing"))
    });
    let missing = n.uid("missing");
    n.wait_for_housekeeping(1);
    assert!(
        n.runtime.containers(&missing).is_empty(),
        "nothing of it runs under the default runtime"
    );
    assert!(n
        .runtime
        .sandboxes(&missing)
        .iter()
        .all(|s| s.state != nodelet::cri::api::PodSandboxState::SandboxReady as i32));
    assert_eq!(status(&n, "missing")["phase"], "Pending");
}

#[test]
fn apparmor_profiles_are_admitted_as_kubelet_admits_them() {
    let mut n = Nodelet::new("apparmor");
    n.start();
    n.write_manifest(
        "confined.yaml",
        &sleeper("confined", "", "{}").replace(
            "resources: {}}",
            "resources: {}, securityContext: {appArmorProfile: {type: RuntimeDefault}}}",
        ),
    );
    n.write_manifest(
        "open.yaml",
        &sleeper("open", "", "{}").replace(
            "metadata: {name: open}",
            "metadata: {name: open, annotations: {container.apparmor.security.beta.kubernetes.io/c: unconfined}}",
        ),
    );
    let open = n.uid("open");
    n.wait_running(&open, &["c"], Duration::from_secs(30));
    if nodelet::admission::apparmor::host_enabled() {
        // With AppArmor, the confining profile goes to the runtime.
        let uid = n.uid("confined");
        let c = n.wait_running(&uid, &["c"], Duration::from_secs(30));
        let (_, label) = n
            .runtime
            .exec(&c["c"].id, &["cat", "/proc/self/attr/current"]);
        assert!(!label.contains("unconfined"), "{label}");
    } else {
        // This machine: no AppArmor, so kubelet's refusal.
        let (reason, message) = failed(&n, "confined", Duration::from_secs(20));
        assert_eq!(reason, "AppArmor");
        assert_eq!(
            message,
            "Pod was rejected: Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        assert!(n.runtime.containers(&n.uid("confined")).is_empty());
    }
}
