//! The resilience cases of the scale benchmark, at full size with a burst's pods running: the
//! agent SIGKILLed and started again, containerd stopped and started, and a staticPodPath of
//! 1,000 hostile entries on a fresh agent.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use nodelet::cri::{Cri, RuntimeService};
use nodelet::kuberuntime::labels;

use super::burst::{manifest, rss_mib, running, sandboxes, wait_for};
use super::{agent, hostile_dir, runtime_ctl};

/// `node`'s pods in the runtime: container IDs and sandbox count by pod UID.
type NodeState = (BTreeMap<String, Vec<String>>, BTreeMap<String, usize>);

async fn node_state(cri: &Cri, node: &str) -> Result<NodeState, nodelet::cri::CriError> {
    let sel: HashMap<String, String> = [(labels::NODE_NAME.to_string(), node.to_string())].into();
    let mut sandboxes: BTreeMap<String, usize> = BTreeMap::new();
    for s in cri.list_pod_sandbox(sel).await? {
        if let Some(u) = s.labels.get(labels::POD_UID) {
            *sandboxes.entry(u.clone()).or_default() += 1;
        }
    }
    let mut containers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in cri.list_containers(HashMap::new()).await? {
        if let Some(u) = c.labels.get(labels::POD_UID) {
            if sandboxes.contains_key(u) {
                containers.entry(u.clone()).or_default().push(c.id);
            }
        }
    }
    for ids in containers.values_mut() {
        ids.sort();
    }
    Ok((containers, sandboxes))
}

/// [`node_state`], retried for up to 30 s (the client's connection breaks when containerd
/// restarts, and its first calls after that fail).
fn node_state_retried(rt: &tokio::runtime::Runtime, cri: &Cri, node: &str) -> NodeState {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rt.block_on(node_state(cri, node)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("CRI after 30 s: {e}"),
        }
    }
}

/// `/pods` of an agent: pods Running with every container running, and the sum of their
/// containers' restart counts.
fn api_running(port: u16) -> (usize, i64) {
    let v: serde_json::Value = reqwest::blocking::get(format!("http://127.0.0.1:{port}/pods"))
        .and_then(|r| r.json())
        .unwrap_or_default();
    let mut running = 0;
    let mut restarts = 0;
    for p in v["items"].as_array().into_iter().flatten() {
        let cs = p["status"]["containerStatuses"].as_array();
        restarts += cs
            .into_iter()
            .flatten()
            .map(|c| c["restartCount"].as_i64().unwrap_or(0))
            .sum::<i64>();
        if p["status"]["phase"] == "Running"
            && cs.is_some_and(|cs| cs.iter().all(|c| c["state"]["running"].is_object()))
        {
            running += 1;
        }
    }
    (running, restarts)
}

/// Differences between two [`NodeState`]s: pods lost, pods whose containers were replaced, and
/// pods with more than one sandbox or container.
fn compare(before: &NodeState, after: &NodeState) -> (usize, usize, usize) {
    let lost = before
        .0
        .keys()
        .filter(|u| !after.0.contains_key(*u))
        .count();
    let replaced = before
        .0
        .iter()
        .filter(|(u, ids)| after.0.get(*u).is_some_and(|a| a != *ids))
        .count();
    let duplicated = after.1.values().filter(|n| **n > 1).count()
        + after.0.values().filter(|ids| ids.len() > 1).count();
    (lost, replaced, duplicated)
}

/// After ten seconds of housekeeping, PLEG relists and pod syncs: pods lost, containers
/// replaced, pods duplicated (see [`compare`]) against `before`, and the sum of the restart
/// counts in `/pods`.
fn settled(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    a: &agent::Agent,
    before: &NodeState,
) -> (usize, usize, usize, i64) {
    std::thread::sleep(Duration::from_secs(10));
    let after = node_state_retried(rt, cri, &a.node);
    let (lost, replaced, duplicated) = compare(before, &after);
    (lost, replaced, duplicated, api_running(a.port).1)
}

/// SIGKILL with the pods running, and the agent started again.
#[derive(Default)]
pub struct Kill9 {
    pub pods: usize,
    pub running_after: f64,
    pub lost: usize,
    pub replaced: usize,
    pub duplicated: usize,
    pub restarts: i64,
}

pub fn kill9_case(rt: &tokio::runtime::Runtime, cri: &Cri, a: &mut agent::Agent) -> Kill9 {
    let before = node_state_retried(rt, cri, &a.node);
    let pods = before.1.len();
    let t0 = Instant::now();
    a.kill9_and_restart();
    wait_for(
        Duration::from_secs(60),
        "kill -9: pods Running again",
        || api_running(a.port).0 >= pods,
    );
    let running_after = t0.elapsed().as_secs_f64();
    let (lost, replaced, duplicated, restarts) = settled(rt, cri, a, &before);
    Kill9 {
        pods,
        running_after,
        lost,
        replaced,
        duplicated,
        restarts,
    }
}

/// containerd stopped with the pods running, and started again.
#[derive(Default)]
pub struct RuntimeDown {
    pub pods: usize,
    pub down_for: f64,
    pub reported_down: f64,
    pub recovered: f64,
    pub all_running: f64,
    pub lost: usize,
    pub replaced: usize,
    pub duplicated: usize,
    pub restarts: i64,
}

/// healthz status code, `nodelet_container_runtime_up`, and the node's Ready condition status.
fn runtime_health(port: u16) -> (u16, f64, String) {
    let code = reqwest::blocking::get(format!("http://127.0.0.1:{port}/healthz"))
        .map(|r| r.status().as_u16())
        .unwrap_or(0);
    let up = agent::metric_samples(port, "/metrics")
        .into_iter()
        .find(|(l, _)| l.starts_with("nodelet_container_runtime_up "))
        .map_or(-1.0, |(_, v)| v);
    let node: serde_json::Value = reqwest::blocking::get(format!("http://127.0.0.1:{port}/node"))
        .and_then(|r| r.json())
        .unwrap_or_default();
    let ready = node["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned();
    (code, up, ready)
}

pub fn runtime_down_case(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    a: &agent::Agent,
    down: Duration,
) -> RuntimeDown {
    let before = node_state_retried(rt, cri, &a.node);
    let pods = before.1.len();
    let pid = runtime_ctl::containerd_pid().expect("containerd pid file");
    let restart = runtime_ctl::Restart;
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    wait_for(Duration::from_secs(30), "runtime reported down", || {
        let (code, up, ready) = runtime_health(a.port);
        code == 500 && up == 0.0 && ready == "False"
    });
    let reported_down = t0.elapsed().as_secs_f64();
    // The scenario: the runtime stays down for `down`.
    std::thread::sleep(down.saturating_sub(t0.elapsed()));
    drop(restart); // up.sh starts containerd again
    let down_for = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    wait_for(Duration::from_secs(60), "runtime reported up", || {
        let (code, up, ready) = runtime_health(a.port);
        code == 200 && up == 1.0 && ready == "True"
    });
    let recovered = t1.elapsed().as_secs_f64();
    wait_for(Duration::from_secs(60), "pods Running again", || {
        api_running(a.port).0 >= pods
    });
    let all_running = t1.elapsed().as_secs_f64();
    let (lost, replaced, duplicated, restarts) = settled(rt, cri, a, &before);
    RuntimeDown {
        pods,
        down_for,
        reported_down,
        recovered,
        all_running,
        lost,
        replaced,
        duplicated,
        restarts,
    }
}

/// A staticPodPath of 1,000 hostile entries and 10 good manifests on a fresh agent.
pub struct Hostile {
    pub to_report: usize,
    pub good_running: f64,
    pub reported: f64,
    pub reported_later: f64,
    pub rss_before: f64,
    pub rss_peak: f64,
    pub rss_after: f64,
    pub healthy: bool,
}

pub fn hostile_case(rt: &tokio::runtime::Runtime, cri: &Cri) -> Hostile {
    let mut a = agent::start(
        &format!("hostile-{}", std::process::id()),
        "",
        std::process::Stdio::null(),
    );
    let pid = a.child.id();
    std::thread::sleep(Duration::from_secs(3));
    let rss_before = rss_mib(pid);
    let other = tempfile::tempdir().unwrap();
    let good = |name: &str| manifest(name);
    let to_report = hostile_dir::write_thousand(&a.manifests, other.path(), &good);
    let t0 = Instant::now();
    for i in 0..10 {
        let stage = a.dir.path().join(format!("good{i}.yaml"));
        std::fs::write(&stage, manifest(&format!("good{i}"))).unwrap();
        std::fs::rename(&stage, a.manifests.join(format!("good{i}.yaml"))).unwrap();
    }
    let mut peak = rss_before;
    wait_for(Duration::from_secs(120), "the 10 good pods", || {
        peak = peak.max(rss_mib(pid));
        rt.block_on(running(cri, &a.node)) >= 10
    });
    let good_running = t0.elapsed().as_secs_f64();
    let reported = || -> f64 {
        agent::metric_samples(a.port, "/metrics")
            .into_iter()
            .filter(|(l, _)| l.starts_with("nodelet_static_pod_manifest_errors_total{"))
            .map(|(_, v)| v)
            .sum()
    };
    wait_for(Duration::from_secs(60), "every bad file reported", || {
        peak = peak.max(rss_mib(pid));
        reported() >= to_report as f64
    });
    let first = reported();
    // Five more listings of the directory (fileCheckFrequency 2 s).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        peak = peak.max(rss_mib(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    let healthy = reqwest::blocking::get(format!("http://127.0.0.1:{}/healthz", a.port))
        .and_then(|r| r.text())
        .is_ok_and(|b| b == "ok");
    let out = Hostile {
        to_report,
        good_running,
        reported: first,
        reported_later: reported(),
        rss_before,
        rss_peak: peak,
        rss_after: rss_mib(pid),
        healthy,
    };
    for e in std::fs::read_dir(&a.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    wait_for(Duration::from_secs(120), "hostile: teardown", || {
        rt.block_on(sandboxes(cri, &a.node)) == 0
    });
    let _ = a.child.kill();
    let _ = a.child.wait();
    let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &a.cgroup_root);
    out
}
