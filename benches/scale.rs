//! Scale (issue 14), one harness for every measurement, each against a baseline in the same
//! run:
//!
//! 1. **Burst**, `REPS` interleaved repetitions (default 5): `PODS` one-container busybox pods
//!    (default 110; requests cpu 10m / memory 16Mi so that 110 of them fit a 2-core node's
//!    allocatable, limits cpu 500m / memory 64Mi, grace 1 s), manifests renamed into
//!    staticPodPath at once, timed until containerd reports every container running; then their
//!    teardown (manifests removed → nothing of them left in the runtime). The baseline: the same
//!    CRI sequence sent straight to containerd by a client, 16 pods at a time (RunPodSandbox,
//!    PodSandboxStatus, ImageStatus, CreateContainer, StartContainer; teardown StopPodSandbox,
//!    RemovePodSandbox). Also counted, from the agent's own metrics: CRI calls per pod start by
//!    method (`kubelet_runtime_operations_total`), relists during the burst
//!    (`kubelet_pleg_relist_duration_seconds_count`), nodelet's CPU per pod start, its RSS and
//!    idle CPU with the pods running, and the whole machine's CPU for each side's starts.
//! 2. **Resilience at full size** (`RESILIENCE=0` skips), with the last repetition's pods running:
//!    the agent SIGKILLed and started again (time until `/pods` lists every pod Running,
//!    containers replaced, restart counts), then containerd stopped for `RUNTIME_DOWN_SECONDS`
//!    (default 20) and started again (time to report it down on healthz, the metric and the
//!    node's Ready condition; time to recover; pods lost, replaced or duplicated). Then a
//!    staticPodPath of 1,000 hostile entries beside 10 good manifests on a fresh agent (time to
//!    run the 10, bad files reported, RSS before, at peak and after).
//! 3. **A 300-pod node** (`BIG_PODS=N`, default 300, 0 skips; BestEffort pods that wait on one
//!    `sleep`, `maxPods` above it): start and teardown against the raw client, RSS and idle CPU, and a relist with no
//!    change timed over `ROUNDS` relists (default 100) by a PLEG in this process, with its CRI
//!    calls counted, interleaved round by round with its baseline: the same two listings by a
//!    plain client that does nothing with the answer.
//!
//! Run: `cargo bench --bench scale` (needs scripts/env/up.sh; stops and starts its containerd).
//! `IDLE_SECONDS=N` (default 20). `NODELET_BEFORE=/path/to/nodelet` runs an earlier build as a
//! third side of the burst, so that a change shows as a ratio in one run.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;
#[path = "../tests/hostile_dir/mod.rs"]
mod hostile_dir;
#[path = "../tests/runtime_ctl/mod.rs"]
mod runtime_ctl;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use nodelet::cri::{api, Cri, ImageService, RuntimeService};
use nodelet::kuberuntime::container::{container_config, ContainerInputs};
use nodelet::kuberuntime::labels;
use nodelet::kuberuntime::sandbox::sandbox_config;
use nodelet::kuberuntime::Settings;

use agent::env_usize;

/// The burst's pod: Burstable, one busybox container that exits 0 on SIGTERM.
fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

/// The 300-pod node's pod: BestEffort (300 requests of 10m would not fit 2 cores), quiet (one
/// `sleep` for the hour, not a new one every second, so that the relist is timed on an idle
/// node; on 2026-12-01 it made no difference: p99 36 ms against 40 ms with the forking pods).
fn best_effort(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n"
    )
}

/// CPU seconds of a process (utime + stime).
fn cpu_seconds(pid: u32) -> f64 {
    agent::cpu_seconds(pid, false)
}

/// Resident set size of a process, MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// CPU seconds of the whole machine (all cores), from /proc/stat.
fn machine_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let first = s.lines().next().unwrap_or("");
    let v: Vec<f64> = first
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // user nice system (idle iowait excluded) irq softirq steal
    (v[0]
        + v[1]
        + v[2]
        + v.get(5).unwrap_or(&0.0)
        + v.get(6).unwrap_or(&0.0)
        + v.get(7).unwrap_or(&0.0))
        / 100.0
}

/// Counters from an agent's `/metrics`: CRI calls by method and the relist count.
fn counters(port: u16) -> (BTreeMap<String, f64>, f64) {
    let mut calls = BTreeMap::new();
    let mut relists = 0.0;
    for (l, v) in agent::metric_samples(port, "/metrics") {
        if let Some(rest) = l.strip_prefix("kubelet_runtime_operations_total{operation_type=\"") {
            let op = rest.split('"').next().unwrap_or("").to_owned();
            *calls.entry(op).or_insert(0.0) += v;
        } else if l.starts_with("kubelet_pleg_relist_duration_seconds_count") {
            relists = v;
        }
    }
    (calls, relists)
}

/// Running containers of `node`'s pods (their sandboxes carry the node label) in the runtime.
async fn running(cri: &Cri, node: &str) -> usize {
    let sel: HashMap<String, String> = [(labels::NODE_NAME.to_string(), node.to_string())].into();
    let uids: std::collections::HashSet<String> = cri
        .list_pod_sandbox(sel)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| s.labels.get(labels::POD_UID).cloned())
        .collect();
    cri.list_containers(HashMap::new())
        .await
        .unwrap_or_default()
        .iter()
        .filter(|c| {
            c.state == api::ContainerState::ContainerRunning as i32
                && c.labels
                    .get(labels::POD_UID)
                    .is_some_and(|u| uids.contains(u))
        })
        .count()
}

/// Sandboxes of `node` in the runtime; `usize::MAX` when the runtime does not answer (so that
/// a teardown is never taken as done on a failed call).
async fn sandboxes(cri: &Cri, node: &str) -> usize {
    let sel: HashMap<String, String> = [(labels::NODE_NAME.to_string(), node.to_string())].into();
    cri.list_pod_sandbox(sel)
        .await
        .map_or(usize::MAX, |s| s.len())
}

/// One nodelet side's measurements of a repetition.
#[derive(Default, Clone)]
struct AgentRun {
    start: f64,
    machine_cpu: f64,
    teardown: f64,
    cpu_per_pod_ms: f64,
    /// The kernel's part of it (stime: directories, cgroups, sockets).
    sys_per_pod_ms: f64,
    calls: BTreeMap<String, f64>,
    relists: f64,
    relists_per_s: f64,
    rss_mib: f64,
    idle_cpu_pct: f64,
    /// Memory cgroups in the kernel when the burst began, live and dying (`/proc/cgroups`).
    memcgs: u64,
}

/// Memory cgroups in the kernel (`num_cgroups` of `memory` in `/proc/cgroups`): live ones and
/// "dying" ones, removed but kept by page cache still charged to them; 0 when unknown.
fn memory_cgroups() -> u64 {
    std::fs::read_to_string("/proc/cgroups")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"memory")).then(|| f.get(2)?.parse().ok())?
        })
        .unwrap_or(0)
}

/// Polls `f` every 20 ms until it holds; panics naming `what` after `limit`.
fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A burst of `pods` manifests (`manifest(name)`) on agent `a`: start, idle, and teardown; with
/// the pods running (after the idle window), `running_hook` is called, for the resilience cases.
#[allow(clippy::too_many_arguments)]
fn agent_rep(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    a: &mut agent::Agent,
    pods: usize,
    idle: Duration,
    rep: usize,
    manifest: fn(&str) -> String,
    running_hook: &mut dyn FnMut(&mut agent::Agent),
) -> AgentRun {
    let pid = a.child.id();
    let (calls0, relists0) = counters(a.port);
    let (cpu0, sys0) = (cpu_seconds(pid), agent::system_seconds(pid));
    let stage = a.dir.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    for i in 0..pods {
        std::fs::write(
            stage.join(format!("p{rep}-{i}.yaml")),
            manifest(&format!("p{rep}-{i}")),
        )
        .unwrap();
    }
    let memcgs = memory_cgroups();
    let m0 = machine_cpu();
    let t0 = Instant::now();
    for i in 0..pods {
        let f = format!("p{rep}-{i}.yaml");
        std::fs::rename(stage.join(&f), a.manifests.join(&f)).unwrap();
    }
    wait_for(Duration::from_secs(600), "nodelet: pods running", || {
        rt.block_on(running(cri, &a.node)) >= pods
    });
    let start = t0.elapsed().as_secs_f64();
    let machine_cpu = machine_cpu() - m0;
    let (cpu1, sys1) = (cpu_seconds(pid), agent::system_seconds(pid));
    let (calls1, relists1) = counters(a.port);
    let calls: BTreeMap<String, f64> = calls1
        .iter()
        .map(|(k, v)| (k.clone(), (v - calls0.get(k).unwrap_or(&0.0)) / pods as f64))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    // Idle with the pods running: settle, then measure.
    std::thread::sleep(Duration::from_secs(3));
    let (idle_cpu0, it0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(idle);
    let idle_cpu_pct = (cpu_seconds(pid) - idle_cpu0) / it0.elapsed().as_secs_f64() * 100.0;
    let rss = rss_mib(pid);
    running_hook(a);
    // Teardown.
    let t1 = Instant::now();
    for e in std::fs::read_dir(&a.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    wait_for(Duration::from_secs(600), "nodelet: teardown", || {
        rt.block_on(sandboxes(cri, &a.node)) == 0
    });
    AgentRun {
        start,
        machine_cpu,
        teardown: t1.elapsed().as_secs_f64(),
        cpu_per_pod_ms: (cpu1 - cpu0) * 1000.0 / pods as f64,
        sys_per_pod_ms: (sys1 - sys0) * 1000.0 / pods as f64,
        calls,
        relists: relists1 - relists0,
        relists_per_s: (relists1 - relists0) / start,
        rss_mib: rss,
        idle_cpu_pct,
        memcgs,
    }
}

/// The raw CRI side of a repetition.
struct RawRun {
    start: f64,
    machine_cpu: f64,
    teardown: f64,
}

/// The raw CRI side: the same pods (`manifest(name)`), 16 at a time.
fn raw_rep(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    pods: usize,
    rep: usize,
    manifest: fn(&str) -> String,
) -> RawRun {
    let node = format!("raw-{}", std::process::id());
    let cgroup_root = format!("/nodelet-bench-{node}");
    for m in nodelet::cm::cgroup_mounts() {
        std::fs::create_dir_all(m.join(cgroup_root.trim_start_matches('/'))).unwrap();
    }
    let logs = tempfile::tempdir().unwrap();
    let mut settings = Settings::example();
    settings.node_name = node.clone();
    settings.pod_logs_dir = logs.path().to_owned();
    let image = rt
        .block_on(cri.image_status("busybox:1.36"))
        .unwrap()
        .expect("busybox:1.36 pulled")
        .id;
    let layout = nodelet::cm::CgroupLayout {
        root: cgroup_root.clone(),
        per_qos: true,
        systemd: false,
    };
    let one = |i: usize| {
        let (settings, image, layout, node) = (&settings, &image, &layout, &node);
        async move {
            let mut pod: Pod = serde_yaml::from_str(&manifest(&format!("r{rep}-{i}"))).unwrap();
            let uid = format!("bench-raw-{rep}-{i}-{}", std::process::id());
            pod.metadata.uid = Some(uid.clone());
            pod.metadata.namespace = Some("default".into());
            pod.metadata.name = Some(format!("r{rep}-{i}-{node}"));
            pod.spec.as_mut().unwrap().node_name = Some(node.clone());
            let cgroup = layout.pod_cgroup_parent(&uid, nodelet::qos::pod_qos_class(&pod));
            for m in nodelet::cm::cgroup_mounts() {
                let _ = std::fs::create_dir_all(m.join(cgroup.trim_start_matches('/')));
            }
            let sb_cfg = sandbox_config(settings, &pod, 0, cgroup);
            std::fs::create_dir_all(&sb_cfg.log_directory).unwrap();
            let sb = cri.run_pod_sandbox(sb_cfg.clone(), "").await.unwrap();
            let ips: Vec<String> = cri
                .pod_sandbox_status(&sb)
                .await
                .unwrap()
                .and_then(|s| s.network)
                .map(|n| vec![n.ip])
                .unwrap_or_default();
            let _ = cri.image_status("busybox:1.36").await;
            let c = &pod.spec.as_ref().unwrap().containers[0];
            let cfg = container_config(
                settings,
                &pod,
                c,
                &ContainerInputs {
                    restart_count: 0,
                    image_ref: image,
                    pod_ips: &ips,
                    is_init: false,
                    env_sources: nodelet::kuberuntime::container::EnvSources {
                        objects: &Default::default(),
                    },
                },
            )
            .unwrap();
            let id = cri.create_container(&sb, cfg, sb_cfg).await.unwrap();
            cri.start_container(&id).await.unwrap();
            sb
        }
    };
    let m0 = machine_cpu();
    let t0 = Instant::now();
    let ids: Vec<String> = rt.block_on(async {
        use futures::stream::StreamExt;
        futures::stream::iter(0..pods)
            .map(one)
            .buffer_unordered(16)
            .collect()
            .await
    });
    let start = t0.elapsed().as_secs_f64();
    let machine_cpu = machine_cpu() - m0;
    let t1 = Instant::now();
    rt.block_on(async {
        use futures::stream::StreamExt;
        futures::stream::iter(ids)
            .map(|sb| async move {
                let _ = cri.stop_pod_sandbox(&sb).await;
                let _ = cri.remove_pod_sandbox(&sb).await;
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await
    });
    let teardown = t1.elapsed().as_secs_f64();
    // Removed as nodelet removes a pod cgroup, its page cache reclaimed first, so that the
    // baseline leaves no more dying memory cgroups behind than nodelet. Not timed.
    {
        use nodelet::cm::cgroupfs::{CgroupManager, Cgroupfs, Hierarchies};
        let _ = Cgroupfs::new(Hierarchies::current()).destroy(&cgroup_root);
    }
    RawRun {
        start,
        machine_cpu,
        teardown,
    }
}

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
struct Kill9 {
    pods: usize,
    running_after: f64,
    lost: usize,
    replaced: usize,
    duplicated: usize,
    restarts: i64,
}

fn kill9_case(rt: &tokio::runtime::Runtime, cri: &Cri, a: &mut agent::Agent) -> Kill9 {
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
struct RuntimeDown {
    pods: usize,
    down_for: f64,
    reported_down: f64,
    recovered: f64,
    all_running: f64,
    lost: usize,
    replaced: usize,
    duplicated: usize,
    restarts: i64,
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

fn runtime_down_case(
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
struct Hostile {
    regular_bad: usize,
    good_running: f64,
    reported: f64,
    reported_later: f64,
    rss_before: f64,
    rss_peak: f64,
    rss_after: f64,
    healthy: bool,
}

fn hostile_case(rt: &tokio::runtime::Runtime, cri: &Cri) -> Hostile {
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
    let regular_bad = hostile_dir::write_thousand(&a.manifests, other.path(), &good);
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
        reported() >= regular_bad as f64
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
        regular_bad,
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

/// What a relist with no change costs on a node, and its baseline.
struct RelistCost {
    /// Median and p99 of `Pleg::relist`, milliseconds.
    relist: (f64, f64),
    /// Median and p99 of the same two listings (ListPodSandbox and ListContainers, unfiltered,
    /// at once) by a plain client with nothing done with the answer, milliseconds: containerd's
    /// answer, the transport and the decoding, which any CRI client pays.
    raw: (f64, f64),
    /// CRI calls per relist.
    calls: f64,
}

/// Relists with no change on `node` by a PLEG in this process, interleaved round by round with
/// the raw listings it makes (the baseline, same client, same moment).
fn relist_cost(rt: &tokio::runtime::Runtime, node: &str, rounds: usize) -> RelistCost {
    let sock = std::path::PathBuf::from(agent::SOCKET);
    let m = nodelet::metrics::Metrics::new();
    let counted =
        rt.block_on(async { Cri::new(&sock, &sock, Duration::from_secs(120), m.clone()) });
    let raw_client = counted.clone();
    let (tx, _rx) = crossbeam_channel::bounded(100_000);
    let pleg = nodelet::pleg::Pleg::new(
        counted,
        node.to_owned(),
        nodelet::container::cache::PodCacheWriter::default(),
        tx,
        nodelet::metrics::Metrics::new(),
    );
    rt.block_on(pleg.relist()).unwrap();
    let total = || -> f64 {
        m.encode()
            .lines()
            .filter(|l| l.starts_with("kubelet_runtime_operations_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let mut times = Vec::with_capacity(rounds);
    let mut raw = Vec::with_capacity(rounds);
    let mut calls = 0.0;
    for _ in 0..rounds {
        let t = Instant::now();
        rt.block_on(async {
            tokio::try_join!(
                raw_client.list_pod_sandbox(HashMap::new()),
                raw_client.list_containers(HashMap::new())
            )
        })
        .unwrap();
        raw.push(t.elapsed().as_secs_f64() * 1e3);
        let c0 = total();
        let t = Instant::now();
        rt.block_on(pleg.relist()).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        calls += total() - c0;
    }
    RelistCost {
        relist: median_p99(&mut times),
        raw: median_p99(&mut raw),
        calls: calls / rounds as f64,
    }
}

/// (median, p99) of `v`, which it sorts.
fn median_p99(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1];
    (v[v.len() / 2], p99)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn list(v: impl IntoIterator<Item = f64>, digits: usize) -> String {
    v.into_iter()
        .map(|x| format!("{x:.digits$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "a, b, c (ratio x, y, z; median m)" for a side against the raw CRI side.
fn with_ratios(side: &[f64], raw: &[f64]) -> String {
    let r: Vec<f64> = side.iter().zip(raw).map(|(a, b)| a / b).collect();
    format!(
        "{} s (ratio {}; **median {:.2}**)",
        list(side.iter().copied(), 1),
        list(r.iter().copied(), 2),
        median(&mut r.clone())
    )
}

fn main() {
    let pods = env_usize("PODS", 110);
    let reps = env_usize("REPS", 5);
    assert!(reps > 0, "REPS must be at least 1");
    let big = env_usize("BIG_PODS", 300);
    let resilience = env_usize("RESILIENCE", 1) != 0;
    let down = Duration::from_secs(env_usize("RUNTIME_DOWN_SECONDS", 20) as u64);
    let idle = Duration::from_secs(env_usize("IDLE_SECONDS", 20) as u64);
    let rounds = env_usize("ROUNDS", 100);
    let sock = std::path::PathBuf::from(agent::SOCKET);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt.block_on(async {
        Cri::new(
            &sock,
            &sock,
            Duration::from_secs(120),
            nodelet::metrics::Metrics::new(),
        )
    });
    rt.block_on(cri.pull_image("busybox:1.36", None)).unwrap();
    let config = format!("maxPods: {}\n", pods + 10);
    let mut after = agent::start(
        &format!("scale-{}", std::process::id()),
        &config,
        std::process::Stdio::null(),
    );
    let mut before = std::env::var("NODELET_BEFORE").ok().map(|bin| {
        agent::start_binary(
            std::path::Path::new(&bin),
            &format!("scale-before-{}", std::process::id()),
            &config,
            std::process::Stdio::null(),
        )
    });
    let mut raw = Vec::new();
    let mut runs: Vec<AgentRun> = Vec::new();
    let mut before_runs: Vec<AgentRun> = Vec::new();
    let (mut kill9, mut runtime_down) = (None, None);
    for rep in 0..reps {
        let r = raw_rep(&rt, &cri, pods, rep, manifest);
        eprintln!(
            "  rep {rep}: raw CRI start {:.1} s, teardown {:.1} s",
            r.start, r.teardown
        );
        raw.push(r);
        let last = rep + 1 == reps && resilience;
        let mut hook = |a: &mut agent::Agent| {
            if last {
                let k = kill9_case(&rt, &cri, a);
                eprintln!(
                    "  kill -9: {} pods Running in /pods {:.2} s after the kill",
                    k.pods, k.running_after
                );
                kill9 = Some(k);
                let d = runtime_down_case(&rt, &cri, a, down);
                eprintln!(
                    "  runtime down: reported in {:.1} s, recovered {:.1} s after the restart",
                    d.reported_down, d.recovered
                );
                runtime_down = Some(d);
            }
        };
        let a = agent_rep(&rt, &cri, &mut after, pods, idle, rep, manifest, &mut hook);
        eprintln!(
            "  rep {rep}: nodelet start {:.1} s, teardown {:.1} s, relists {:.0}",
            a.start, a.teardown, a.relists
        );
        runs.push(a);
        if let Some(b) = before.as_mut() {
            let r = agent_rep(&rt, &cri, b, pods, idle, rep, manifest, &mut |_| {});
            eprintln!(
                "  rep {rep}: before start {:.1} s, teardown {:.1} s, relists {:.0}",
                r.start, r.teardown, r.relists
            );
            before_runs.push(r);
        }
    }
    for a in std::iter::once(after).chain(before) {
        let mut a = a;
        let _ = a.child.kill();
        let _ = a.child.wait();
        let _ =
            nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &a.cgroup_root);
    }
    let hostile = resilience.then(|| hostile_case(&rt, &cri));

    // The 300-pod node.
    let big_runs = (big > 0).then(|| {
        let r = raw_rep(&rt, &cri, big, 0, best_effort);
        eprintln!(
            "  {big} pods: raw CRI start {:.1} s, teardown {:.1} s",
            r.start, r.teardown
        );
        let mut a = agent::start(
            &format!("big-{}", std::process::id()),
            &format!("maxPods: {}\n", big + 10),
            std::process::Stdio::null(),
        );
        let mut cost = None;
        let run = agent_rep(&rt, &cri, &mut a, big, idle, 0, best_effort, &mut |a| {
            cost = Some(relist_cost(&rt, &a.node, rounds));
        });
        eprintln!(
            "  {big} pods: nodelet start {:.1} s, teardown {:.1} s",
            run.start, run.teardown
        );
        let _ = a.child.kill();
        let _ = a.child.wait();
        let _ =
            nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &a.cgroup_root);
        (r, run, cost)
    });

    // The table.
    let raw_start: Vec<f64> = raw.iter().map(|r| r.start).collect();
    let raw_down: Vec<f64> = raw.iter().map(|r| r.teardown).collect();
    let mut sides = vec![("nodelet", &runs)];
    if !before_runs.is_empty() {
        sides.push(("before", &before_runs));
    }
    println!("\nscale: {pods} pods, {reps} interleaved repetitions\n");
    print!("| | raw CRI |");
    for (name, _) in &sides {
        print!(" {name} |");
    }
    println!("\n|---|---|{}", "---|".repeat(sides.len()));
    let row = |label: &str, raw: String, f: &dyn Fn(&[AgentRun]) -> String| {
        print!("| {label} | {raw} |");
        for (_, rs) in &sides {
            print!(" {} |", f(rs));
        }
        println!();
    };
    row(
        &format!("{pods} pods → all running"),
        format!("{} s", list(raw_start.iter().copied(), 1)),
        &|rs| with_ratios(&rs.iter().map(|a| a.start).collect::<Vec<_>>(), &raw_start),
    );
    row(
        &format!("CPU of the whole machine for the {pods} starts"),
        format!("{} s", list(raw.iter().map(|r| r.machine_cpu), 1)),
        &|rs| format!("{} s", list(rs.iter().map(|a| a.machine_cpu), 1)),
    );
    row("nodelet's own CPU per pod start", "—".into(), &|rs| {
        format!("{} ms", list(rs.iter().map(|a| a.cpu_per_pod_ms), 1))
    });
    row(
        "  of which in the kernel (system time)",
        "—".into(),
        &|rs| format!("{} ms", list(rs.iter().map(|a| a.sys_per_pod_ms), 1)),
    );
    row(
        "memory cgroups in the kernel when the burst began (live and dying)",
        "—".into(),
        &|rs| list(rs.iter().map(|a| a.memcgs as f64), 0),
    );
    row(
        "CRI calls during the start, per pod (last repetition)",
        "5".into(),
        &|rs| {
            let last = rs.last().unwrap();
            let total: f64 = last.calls.values().sum();
            let listings = last.calls.get("list_podsandbox").copied().unwrap_or(0.0)
                + last.calls.get("list_containers").copied().unwrap_or(0.0);
            format!(
                "{total:.1} in all, **{:.1} besides the relists' listings** ({})",
                total - listings,
                last.calls
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    );
    row("relists during the burst", "—".into(), &|rs| {
        format!(
            "{} ({} per second)",
            list(rs.iter().map(|a| a.relists), 0),
            list(rs.iter().map(|a| a.relists_per_s), 1)
        )
    });
    row(
        &format!("teardown of {pods} pods"),
        format!("{} s", list(raw_down.iter().copied(), 1)),
        &|rs| {
            with_ratios(
                &rs.iter().map(|a| a.teardown).collect::<Vec<_>>(),
                &raw_down,
            )
        },
    );
    row(&format!("RSS with {pods} pods"), "—".into(), &|rs| {
        format!("{} MiB", list(rs.iter().map(|a| a.rss_mib), 1))
    });
    row(&format!("idle CPU with {pods} pods"), "—".into(), &|rs| {
        format!("{} % of a core", list(rs.iter().map(|a| a.idle_cpu_pct), 2))
    });
    if let Some(k) = kill9 {
        println!(
            "\nkill -9 with {} pods running, started again: all Running in /pods {:.2} s after the kill; pods lost {}, containers replaced {}, duplicated {}, restartCount sum {}",
            k.pods, k.running_after, k.lost, k.replaced, k.duplicated, k.restarts
        );
    }
    if let Some(d) = runtime_down {
        println!(
            "containerd stopped {:.1} s with {} pods running: reported down (healthz 500, nodelet_container_runtime_up 0, Ready False) {:.2} s after the stop; up again {:.2} s after containerd was started, every pod Running {:.2} s after; pods lost {}, containers replaced {}, duplicated {}, restartCount sum {}",
            d.down_for, d.pods, d.reported_down, d.recovered, d.all_running, d.lost, d.replaced, d.duplicated, d.restarts
        );
    }
    if let Some(h) = hostile {
        println!(
            "1,000 hostile entries beside 10 good manifests: the 10 running in {:.1} s; {} bad regular files, {:.0} reports, {:.0} after five more listings; RSS {:.1} MiB before, {:.1} at peak, {:.1} after; healthz {}",
            h.good_running, h.regular_bad, h.reported, h.reported_later, h.rss_before, h.rss_peak, h.rss_after, if h.healthy { "ok" } else { "NOT ok" }
        );
    }
    if let Some((r, a, cost)) = big_runs {
        println!("\n{big}-pod node (BestEffort pods):\n");
        println!("| | raw CRI | nodelet | ratio |\n|---|---|---|---|");
        println!(
            "| {big} pods → all running | {:.1} s | {:.1} s | {:.2} |",
            r.start,
            a.start,
            a.start / r.start
        );
        println!(
            "| teardown | {:.1} s | {:.1} s | {:.2} |",
            r.teardown,
            a.teardown,
            a.teardown / r.teardown
        );
        if let Some(c) = cost {
            println!(
                "| relist with no change ({rounds} relists, interleaved with the raw listings) | the two listings: median {:.2} ms, p99 {:.2} ms | median {:.2} ms, **p99 {:.2} ms**, {:.1} CRI calls | median {:.2}, p99 {:.2} |",
                c.raw.0, c.raw.1, c.relist.0, c.relist.1, c.calls, c.relist.0 / c.raw.0, c.relist.1 / c.raw.1
            );
        }
        println!(
            "| nodelet RSS, idle CPU | — | {:.1} MiB, {:.2} % of a core | |",
            a.rss_mib, a.idle_cpu_pct
        );
    }
}
