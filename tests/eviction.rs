//! Eviction on this machine's cgroup v1 memory hierarchy with a real containerd: a kubepods limit
//! made small with systemReserved, the allocatableMemory.available signal, a BestEffort pod that
//! allocates steadily, a Guaranteed pod beside it. Needs `scripts/env/up.sh`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::time::Duration;

use common::{mem_total, oom_kills, wait_until, Nodelet};

const LOOP: &str = "[sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]";

/// kubepods memory limit the tests give themselves, bytes.
const KUBEPODS_LIMIT: i64 = 256 << 20;

/// A BestEffort pod that grows by 4 MiB every 100 ms (a line with no end, held by `tail`).
fn hog(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: hog\n    image: busybox:1.36\n    command: [sh, -c, \"while true; do head -c 4194304 /dev/zero; sleep 0.1; done | tail\"]\n"
    )
}

fn guaranteed(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: {LOOP}\n    resources: {{limits: {{cpu: 100m, memory: 32Mi}}}}\n"
    )
}

fn kubepods_file(n: &Nodelet, file: &str) -> String {
    let p = format!("/sys/fs/cgroup/memory{}/kubepods/{file}", n.cgroup_root);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .to_string()
}

fn phase_reason_message(n: &Nodelet, name: &str) -> (String, String, String) {
    let p = n.pod(name).unwrap_or_default();
    let s = &p["status"];
    let get = |k: &str| s[k].as_str().unwrap_or("").to_string();
    (get("phase"), get("reason"), get("message"))
}

fn pressure_config(extra: &str) -> String {
    format!(
        "systemReserved: {{memory: \"{}\"}}\nevictionHard: {{allocatableMemory.available: 96Mi}}\n{extra}",
        mem_total() - KUBEPODS_LIMIT
    )
}

#[test]
fn besteffort_hog_is_evicted_before_any_oom_kill_and_guaranteed_keeps_running() {
    let mut n = Nodelet::with_config(
        "evict",
        &pressure_config("evictionPressureTransitionPeriod: 10s\n"),
    );
    n.start();
    let limit: i64 = kubepods_file(&n, "memory.limit_in_bytes").parse().unwrap();
    assert!(
        (KUBEPODS_LIMIT - 4096..=KUBEPODS_LIMIT).contains(&limit),
        "kubepods limit {limit}"
    );
    n.write_manifest("g.yaml", &guaranteed("steady"));
    let g_uid = n.uid("steady");
    let g = n.wait_running(&g_uid, &["c"], Duration::from_secs(30))["c"].clone();

    let ooms_before = oom_kills();
    n.write_manifest("hog.yaml", &hog("hog"));
    let hog_uid = n.uid("hog");
    wait_until(Duration::from_secs(90), "hog evicted", || {
        phase_reason_message(&n, "hog").1 == "Evicted"
    });
    let (phase, _, message) = phase_reason_message(&n, "hog");
    assert_eq!(phase, "Failed");
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );

    // The kernel never had to step in.
    wait_until(Duration::from_secs(20), "hog sandbox removed", || {
        n.runtime.sandboxes(&hog_uid).is_empty()
    });
    assert_eq!(
        oom_kills(),
        ooms_before,
        "an OOM kill happened on this machine"
    );
    assert_eq!(
        kubepods_file(&n, "memory.failcnt"),
        "0",
        "kubepods hit its limit"
    );
    let max_usage: i64 = kubepods_file(&n, "memory.max_usage_in_bytes")
        .parse()
        .unwrap();
    assert!(max_usage < limit, "max usage {max_usage} of {limit}");
    assert!(kubepods_file(&n, "memory.oom_control").contains("oom_kill 0"));

    // The Guaranteed pod kept running, same container.
    let st = n.runtime.container_status(&g.id);
    assert_eq!(st.state, 1, "guaranteed container not running: {st:?}");

    // The kill was started by the kernel notification, and shows on /node and in metrics.
    let node: serde_json::Value = serde_json::from_str(&n.get("/node").unwrap()).unwrap();
    let ev = &node["evictions"][0];
    assert_eq!(ev["uid"], hog_uid.as_str());
    assert_eq!(ev["signal"], "allocatableMemory.available");
    assert_eq!(ev["graceSeconds"], 1);
    assert!(ev["notifiedAtUnixNanos"].is_i64(), "{ev}");
    let metrics = n.get("/metrics").unwrap();
    assert!(
        metrics
            .contains("kubelet_evictions_total{eviction_signal=\"allocatableMemory.available\"} 1"),
        "{metrics}"
    );

    // An evicted pod stays Failed while its manifest is unchanged...
    n.wait_for_housekeeping(2);
    assert!(n.runtime.sandboxes(&hog_uid).is_empty());
    assert_eq!(phase_reason_message(&n, "hog").1, "Evicted");
    // ...a changed manifest is admitted afresh: refused while MemoryPressure holds (BestEffort,
    // within the 10 s transition period)...
    let edited = hog("hog").replace(
        "while true; do head -c 4194304 /dev/zero; sleep 0.1; done | tail",
        "sleep 3600",
    );
    assert!(n
        .get("/node")
        .is_some_and(|b| b.contains("\"KubeletHasInsufficientMemory\"")));
    n.write_manifest("hog.yaml", &edited);
    let refused = "Pod was rejected: The node had condition: [MemoryPressure]. ";
    wait_until(Duration::from_secs(10), "refused at admission", || {
        phase_reason_message(&n, "hog").2 == refused
    });
    assert!(n.runtime.sandboxes(&hog_uid).is_empty());
    // ...and stays so across a restart of the agent (the record is on disk)...
    n.kill9();
    n.start();
    wait_until(
        Duration::from_secs(20),
        "refused status after restart",
        || phase_reason_message(&n, "hog").2 == refused,
    );
    n.wait_for_housekeeping(1);
    assert!(n.runtime.sandboxes(&hog_uid).is_empty());
    assert_eq!(n.runtime.container_status(&g.id).state, 1);
    // ...until the manifest changes again with no pressure left.
    wait_until(Duration::from_secs(30), "MemoryPressure clears", || {
        n.get("/node")
            .is_some_and(|b| b.contains("\"KubeletHasSufficientMemory\""))
    });
    n.write_manifest("hog.yaml", &edited.replace("3600", "3601"));
    n.wait_running(&hog_uid, &["hog"], Duration::from_secs(30));
    assert_eq!(n.runtime.container_status(&g.id).state, 1);
}

#[test]
fn disk_pressure_refuses_new_pods_but_not_critical_or_running_ones_and_never_evicts_those() {
    // First without pressure: a pod runs.
    let mut n = Nodelet::with_config(
        "diskpressure",
        "evictionHard: {nodefs.available: \"0.001%\"}\nevictionMonitoringPeriod: 500ms\n",
    );
    n.start();
    n.write_manifest("early.yaml", &guaranteed("early"));
    let early_uid = n.uid("early");
    let early = n.wait_running(&early_uid, &["c"], Duration::from_secs(30))["c"].clone();
    // Restarted under DiskPressure: the running pod is adopted, not refused.
    let cfg = std::fs::read_to_string(n.config_path()).unwrap();
    std::fs::write(n.config_path(), cfg.replace("0.001%", "99.9%")).unwrap();
    n.kill9();
    n.start();
    wait_until(Duration::from_secs(10), "DiskPressure on /node", || {
        n.get("/node")
            .is_some_and(|b| b.contains("\"KubeletHasDiskPressure\""))
    });
    let metrics = n.get("/metrics").unwrap();
    assert!(
        metrics.contains("nodelet_node_condition{condition=\"DiskPressure\"} 1"),
        "{metrics}"
    );
    n.write_manifest("p.yaml", &guaranteed("plain"));
    n.write_manifest(
        "c.yaml",
        &guaranteed("critical").replace(
            "  containers:",
            "  priorityClassName: system-node-critical\n  containers:",
        ),
    );
    let c_uid = n.uid("critical");
    let c = n.wait_running(&c_uid, &["c"], Duration::from_secs(30))["c"].clone();
    wait_until(Duration::from_secs(10), "plain refused", || {
        phase_reason_message(&n, "plain").1 == "Evicted"
    });
    let (phase, _, message) = phase_reason_message(&n, "plain");
    assert_eq!(phase, "Failed");
    assert_eq!(
        message,
        "Pod was rejected: The node had condition: [DiskPressure]. "
    );
    assert!(n.runtime.sandboxes(&n.uid("plain")).is_empty());
    // Passes under pressure go on: the critical pod is never picked. The early pod, adopted (not
    // refused), is not critical, so it is evicted for ephemeral storage.
    wait_until(Duration::from_secs(20), "early evicted", || {
        phase_reason_message(&n, "early").1 == "Evicted"
    });
    let (_, _, message) = phase_reason_message(&n, "early");
    assert!(
        message.starts_with("The node was low on resource: ephemeral-storage."),
        "{message}"
    );
    assert!(n
        .runtime
        .try_container_status(&early.id)
        .is_none_or(|s| s.state != 1));
    wait_until(Duration::from_secs(10), "no pod may be evicted", || {
        n.log().contains("no pod may be evicted")
    });
    assert_eq!(n.runtime.container_status(&c.id).state, 1);
}

fn condition(n: &Nodelet, name: &str, kind: &str) -> serde_json::Value {
    common::condition(&n.pod(name).unwrap_or_default()["status"], kind)
}

#[test]
fn an_evicted_pod_names_its_containers_keeps_their_states_and_each_gets_two_seconds() {
    // Running first, then a hard nodefs threshold that every node meets: the pod is evicted
    // for ephemeral storage with the hard eviction's 1 s override.
    let mut n = Nodelet::with_config(
        "evictgrace",
        "evictionHard: {nodefs.available: \"0.001%\"}\nevictionMonitoringPeriod: 500ms\n",
    );
    n.start();
    let out = n.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // On SIGTERM the container records the host's uptime, then keeps recording it every 0.1 s
    // until it is SIGKILLed: the last minus the first is how long the stop let it run.
    n.write_manifest(
        "victim.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: victim}}\nspec:\n  terminationGracePeriodSeconds: 30\n  volumes: [{{name: out, hostPath: {{path: {}}}}}]\n  containers:\n  - name: app\n    image: busybox:1.36\n    volumeMounts: [{{name: out, mountPath: /out}}]\n    command: [sh, -c, \"echo started; head -c 65536 /dev/zero > /tmp/layer; trap 'cat /proc/uptime > /out/term; while true; do cat /proc/uptime > /out/last; sleep 0.1; done' TERM; while true; do sleep 1 & wait; done\"]\n",
            out.display()
        ),
    );
    let uid = n.uid("victim");
    n.wait_running(&uid, &["app"], Duration::from_secs(30));
    let cfg = std::fs::read_to_string(n.config_path()).unwrap();
    std::fs::write(n.config_path(), cfg.replace("0.001%", "99.9%")).unwrap();
    n.kill9();
    n.start();
    wait_until(Duration::from_secs(30), "victim evicted", || {
        phase_reason_message(&n, "victim").1 == "Evicted"
    });
    wait_until(Duration::from_secs(20), "victim's sandbox removed", || {
        n.runtime.sandboxes(&uid).is_empty()
    });
    // kubelet's message: the node, the threshold, then each container over its request.
    let (phase, _, message) = phase_reason_message(&n, "victim");
    assert_eq!(phase, "Failed");
    assert!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "{message}"
    );
    assert!(
        message.contains(", request is 0, has larger consumption of ephemeral-storage. ")
            && message.contains("Container app was using "),
        "{message}"
    );
    let d = condition(&n, "victim", "DisruptionTarget");
    assert_eq!(
        (
            d["status"].as_str(),
            d["reason"].as_str(),
            d["message"].as_str()
        ),
        (
            Some("True"),
            Some("TerminationByKubelet"),
            Some(message.as_str())
        ),
        "{d}"
    );
    assert_eq!(condition(&n, "victim", "Ready")["status"], "False");
    // The container's last state: SIGKILLed after ignoring SIGTERM.
    let st = &n.pod("victim").unwrap()["status"];
    let t = &st["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (t["exitCode"].as_i64(), t["reason"].as_str()),
        (Some(137), Some("Error")),
        "{st}"
    );
    // The 1 s override reached the runtime as kubelet's 2 s minimum.
    let uptime = |f: &str| -> f64 {
        std::fs::read_to_string(out.join(f))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let ran = uptime("last") - uptime("term");
    assert!((1.7..4.0).contains(&ran), "ran {ran:.2} s after SIGTERM");
    // The agent restarted: the runtime no longer holds the container, whose state is then
    // kubelet's ContainerStatusUnknown.
    n.kill9();
    n.start();
    wait_until(Duration::from_secs(20), "status after restart", || {
        n.pod("victim").unwrap_or_default()["status"]["containerStatuses"][0]["state"]["terminated"]
            ["reason"]
            == "ContainerStatusUnknown"
    });
    let st = &n.pod("victim").unwrap()["status"];
    let t = &st["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 137, "{st}");
    assert_eq!(
        t["message"],
        "The container could not be located when the pod was terminated"
    );
    assert_eq!(st["phase"], "Failed");
    assert_eq!(st["reason"], "Evicted");
}
