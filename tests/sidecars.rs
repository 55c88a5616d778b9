//! Sidecars (init containers with `restartPolicy: Always`) on the real containerd: started in
//! their turn and kept running, counted in the pod's cgroup as kubelet counts them, and stopped
//! after the app container.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::time::Duration;

use common::{pod_cgroup_dirs, wait_until, Nodelet};

fn status(n: &Nodelet, name: &str) -> serde_json::Value {
    n.pod(name).map(|p| p["status"].clone()).unwrap_or_default()
}

#[test]
fn a_sidecar_runs_before_the_next_init_container_and_stops_after_the_app() {
    let mut n = Nodelet::new("sidecar");
    n.start();
    n.write_manifest(
        "side.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: side}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 5\n  initContainers:\n  - name: proxy\n    image: busybox:1.36\n    restartPolicy: Always\n    command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 0.2; done']\n    resources: {requests: {cpu: 200m}}\n  - name: setup\n    image: busybox:1.36\n    command: [sleep, '1']\n    resources: {requests: {cpu: 700m}}\n  containers:\n  - name: app\n    image: busybox:1.36\n    command: [sleep, '3']\n    resources: {requests: {cpu: 100m}}\n",
    );
    let uid = n.uid("side");
    // The pod's cpu request is max(100m + 200m, 700m + 200m) = 900m: cpu.shares 921.
    wait_until(Duration::from_secs(20), "pod cgroup", || {
        !pod_cgroup_dirs(&n.cgroup_root, &uid).is_empty()
    });
    let shares: Vec<String> = pod_cgroup_dirs(&n.cgroup_root, &uid)
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cpu.shares")).ok())
        .map(|s| s.trim().to_owned())
        .collect();
    assert_eq!(shares, vec!["921"]);
    // The app runs 3 s and exits 0: the pod is done, and the sidecar is stopped after it.
    wait_until(Duration::from_secs(40), "pod Succeeded", || {
        status(&n, "side")["phase"] == "Succeeded"
    });
    let by_name = |name: &str| {
        let c = n
            .runtime
            .containers(&uid)
            .into_iter()
            .find(|c| c.metadata.as_ref().unwrap().name == name)
            .unwrap_or_else(|| panic!("{name}"));
        n.runtime.container_status(&c.id)
    };
    wait_until(Duration::from_secs(20), "sidecar stopped", || {
        by_name("proxy").finished_at > 0
    });
    let (proxy, setup, app) = (by_name("proxy"), by_name("setup"), by_name("app"));
    assert!(
        proxy.started_at < setup.started_at,
        "the sidecar runs before the next init container starts"
    );
    assert!(
        proxy.finished_at > setup.finished_at && proxy.finished_at > app.started_at,
        "the sidecar kept running beside the app"
    );
    assert!(
        proxy.finished_at >= app.finished_at,
        "the sidecar stops after the app"
    );
    assert_eq!((app.exit_code, proxy.exit_code), (0, 0));
}
