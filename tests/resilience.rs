//! Resilience on the real containerd (issue 14, trimmed sizes; `cargo bench --bench scale` has
//! the full ones): the agent SIGKILLed with pods running and started again restarts no
//! container and lists every pod Running within seconds; on the quiet node it then trusts
//! containerd's event stream (a relist every 10 s, not every second) and housekeeping and log
//! rotation list nothing of their own.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

const PODS: usize = 20;

fn manifest(i: usize) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: r{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600'], resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}}}\n")
}

fn running_in_pods(n: &Nodelet) -> usize {
    n.pods()
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
        .count()
}

#[test]
fn a_sigkilled_agent_comes_back_without_restarting_a_container() {
    let mut n = Nodelet::new("kill9");
    n.start();
    for i in 0..PODS {
        n.write_manifest(&format!("r{i}.yaml"), &manifest(i));
    }
    wait_until(
        Duration::from_secs(120),
        "all pods Running in /pods",
        || running_in_pods(&n) == PODS,
    );
    let uids: Vec<String> = (0..PODS).map(|i| n.uid(&format!("r{i}"))).collect();
    let before: HashMap<String, String> = uids
        .iter()
        .map(|u| {
            let cs = n.runtime.containers(u);
            assert_eq!(cs.len(), 1, "{u}: {cs:?}");
            (u.clone(), cs[0].id.clone())
        })
        .collect();
    n.kill9();
    let restarted = Instant::now();
    n.start();
    wait_until(
        Duration::from_secs(5),
        "all pods Running in /pods after the restart",
        || running_in_pods(&n) == PODS,
    );
    let took = restarted.elapsed();
    eprintln!("{PODS} pods Running in /pods {took:?} after the agent was started again");
    // A few housekeeping passes later: the same containers, none restarted, no duplicates.
    n.wait_for_housekeeping(2);
    for (uid, id) in &before {
        let cs = n.runtime.containers(uid);
        assert_eq!(cs.len(), 1, "{uid}: {cs:?}");
        assert_eq!(&cs[0].id, id, "{uid}: container replaced");
        assert_eq!(n.runtime.sandboxes(uid).len(), 1, "{uid}: one sandbox");
    }
    for p in n.pods() {
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"], 0,
            "{p}"
        );
    }
    // Quiet now: no container event comes. Six housekeeping passes (12 s) cost at most the
    // periodic relist (every 10 s) and a follow-up, and no listing besides the relists'.
    let relists = || n.metric("kubelet_pleg_relist_duration_seconds_count");
    let listings =
        || n.metric("kubelet_runtime_operations_total{operation_type=\"list_podsandbox\"}");
    let (r0, l0) = (relists(), listings());
    n.wait_for_housekeeping(6);
    let (r, l) = (relists() - r0, listings() - l0);
    eprintln!("quiet node, 6 housekeeping passes: {r} relists, {l} ListPodSandbox calls");
    assert!(r <= 3.0, "{r} relists in 12 s on a quiet node");
    assert!(l <= r, "{l} ListPodSandbox calls besides {r} relists");
}
