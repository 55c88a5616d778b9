//! The container runtime stopped under a running agent and started again (issue 14): nodelet
//! reports it down (healthz, `nodelet_container_runtime_up`, the node's Ready condition),
//! recovers without being restarted, and loses or duplicates no pod; a pod added meanwhile starts
//! once the runtime is back. Alone in its test binary: it stops the shared containerd, which is
//! started again by `scripts/env/up.sh` (also when the test fails half-way).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;
mod runtime_ctl;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};
use runtime_ctl::{containerd_pid, env_up, Restart};

/// How long the runtime stays down (the harness's full size is 20 s).
const DOWN: Duration = Duration::from_secs(8);

fn manifest(name: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600']}}\n")
}

fn ready_condition(n: &Nodelet) -> (String, String) {
    let node: serde_json::Value =
        serde_json::from_str(&n.get("/node").unwrap_or_default()).unwrap_or_default();
    let c = node["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or_default().to_owned(),
        c["message"].as_str().unwrap_or_default().to_owned(),
    )
}

fn healthz(n: &Nodelet) -> (u16, String) {
    let r = reqwest::blocking::Client::new()
        .get(format!("http://127.0.0.1:{}/healthz", n.port))
        .timeout(Duration::from_secs(5))
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap_or_default())
}

#[test]
fn a_runtime_restart_is_reported_and_survived() {
    let mut n = Nodelet::new("runtimedown");
    n.start();
    for i in 0..3 {
        n.write_manifest(&format!("p{i}.yaml"), &manifest(&format!("p{i}")));
    }
    let uids: Vec<String> = (0..3).map(|i| n.uid(&format!("p{i}"))).collect();
    let before: HashMap<String, String> = uids
        .iter()
        .map(|u| {
            let c = n.wait_running(u, &["c"], Duration::from_secs(60));
            (u.clone(), c["c"].id.clone())
        })
        .collect();
    assert_eq!(ready_condition(&n).0, "True");

    let _restart = Restart;
    let pid = containerd_pid().expect("containerd pid file");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let down_at = Instant::now();
    wait_until(Duration::from_secs(20), "containerd gone", || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    wait_until(Duration::from_secs(15), "runtime reported down", || {
        let (code, body) = healthz(&n);
        code == 500
            && body.contains("container runtime is down")
            && n.metric("nodelet_container_runtime_up") == 0.0
            && ready_condition(&n).0 == "False"
    });
    let reported = down_at.elapsed();
    assert!(ready_condition(&n)
        .1
        .starts_with("container runtime is down"));
    // A pod arrives while the runtime is down.
    n.write_manifest("late.yaml", &manifest("late"));
    let late = n.uid("late");
    let remaining = DOWN.saturating_sub(down_at.elapsed());
    // Nothing to poll for: the runtime stays down for the test's window.
    std::thread::sleep(remaining);
    let up_at = Instant::now();
    env_up();
    wait_until(Duration::from_secs(30), "runtime reported up", || {
        healthz(&n).0 == 200
            && n.metric("nodelet_container_runtime_up") == 1.0
            && ready_condition(&n).0 == "True"
    });
    let recovered = up_at.elapsed();
    // The test's own CRI client fails its first call on the broken connection, then reconnects.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    wait_until(
        Duration::from_secs(10),
        "the test's CRI client answers",
        || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| n.runtime.containers(&late)))
                .is_ok()
        },
    );
    std::panic::set_hook(hook);
    n.wait_running(&late, &["c"], Duration::from_secs(60));
    n.wait_for_housekeeping(2);
    for (uid, id) in &before {
        let cs = n.runtime.containers(uid);
        assert_eq!(cs.len(), 1, "{uid}: {cs:?}");
        assert_eq!(&cs[0].id, id, "{uid}: the container was replaced");
        assert_eq!(n.runtime.sandboxes(uid).len(), 1, "{uid}");
    }
    assert_eq!(n.runtime.sandboxes(&late).len(), 1, "no duplicate sandbox");
    eprintln!("runtime down reported after {reported:?}; up again {recovered:?} after containerd was started");
}
