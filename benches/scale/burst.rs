//! A burst of the scale benchmark on one side: `pods` manifests renamed into an agent's
//! staticPodPath at once (nodelet or kubelet, through [`Target`]), timed until containerd reports
//! every container running; the agent's idle cost with the pods running; then the manifests
//! removed, timed until no container of them runs (and, for nodelet, until no sandbox is left).
//! And the raw CRI baseline of the same pods ([`raw_rep`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use nodelet::cri::{api, Cri, ImageService, RuntimeService};
use nodelet::kuberuntime::container::{container_config, ContainerInputs};
use nodelet::kuberuntime::labels;
use nodelet::kuberuntime::sandbox::sandbox_config;
use nodelet::kuberuntime::Settings;

use super::agent;

/// The burst's pod: Burstable, one busybox container that exits 0 on SIGTERM.
pub fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

/// The 300-pod node's pod: BestEffort (300 requests of 10m would not fit 2 cores), quiet (one
/// `sleep` for the hour, not a new one every second, so that the relist is timed on an idle
/// node; on 2026-12-01 it made no difference: p99 36 ms against 40 ms with the forking pods).
pub fn best_effort(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n"
    )
}

/// CPU seconds of a process (utime + stime).
pub fn cpu_seconds(pid: u32) -> f64 {
    agent::cpu_seconds(pid, false)
}

/// Resident set size of a process, MiB.
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// CPU seconds of the whole machine (all cores), from /proc/stat.
pub fn machine_cpu() -> f64 {
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

/// An agent's metrics that a burst reads, from its `/metrics` samples (nodelet and kubelet
/// v1.20 name them alike): CRI calls by method (`kubelet_runtime_operations_total`), relists
/// (`kubelet_pleg_relist_duration_seconds_count`) and the seconds they took (`_sum`).
#[derive(Default, Clone)]
pub struct Counters {
    pub calls: BTreeMap<String, f64>,
    pub relists: f64,
    pub relist_seconds: f64,
}

impl Counters {
    pub fn parse(samples: &[(String, f64)]) -> Self {
        let mut c = Counters::default();
        for (l, v) in samples {
            if let Some(rest) = l.strip_prefix("kubelet_runtime_operations_total{") {
                let Some(op) = rest
                    .split("operation_type=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                else {
                    continue;
                };
                *c.calls.entry(op.to_owned()).or_insert(0.0) += v;
            } else if l.starts_with("kubelet_pleg_relist_duration_seconds_count") {
                c.relists = *v;
            } else if l.starts_with("kubelet_pleg_relist_duration_seconds_sum") {
                c.relist_seconds = *v;
            }
        }
        c
    }
}

/// The agent a burst drives: nodelet or kubelet.
pub struct Target {
    /// "nodelet", "kubelet", "before".
    pub name: &'static str,
    pub pid: u32,
    /// staticPodPath.
    pub manifests: PathBuf,
    /// A directory on the same filesystem, where manifests are written before the rename.
    pub stage: PathBuf,
    /// Its node name: its static pods are `<name>-<node>`.
    pub node: String,
    /// Its `/metrics` samples.
    pub metrics: Box<dyn Fn() -> Vec<(String, f64)>>,
    /// Whether to wait, after the containers stopped, until no sandbox of it is left (nodelet
    /// removes them in the teardown; kubelet leaves them to its garbage collection).
    pub wait_cleared: bool,
}

/// Running containers of `node`'s static pods (`<name>-<node>`, the pod name label of every
/// container, kubelet's and nodelet's) in the runtime; `usize::MAX` when the runtime does not
/// answer.
pub async fn running(cri: &Cri, node: &str) -> usize {
    let suffix = format!("-{node}");
    cri.list_containers(HashMap::new())
        .await
        .map_or(usize::MAX, |cs| {
            cs.iter()
                .filter(|c| {
                    c.state == api::ContainerState::ContainerRunning as i32
                        && c.labels
                            .get(labels::POD_NAME)
                            .is_some_and(|n| n.ends_with(&suffix))
                })
                .count()
        })
}

/// Sandboxes of nodelet's `node` in the runtime; `usize::MAX` when the runtime does not answer
/// (so that a teardown is never taken as done on a failed call).
pub async fn sandboxes(cri: &Cri, node: &str) -> usize {
    let sel: HashMap<String, String> = [(labels::NODE_NAME.to_string(), node.to_string())].into();
    cri.list_pod_sandbox(sel)
        .await
        .map_or(usize::MAX, |s| s.len())
}

/// One agent side's measurements of a repetition.
#[derive(Default, Clone)]
pub struct AgentRun {
    pub start: f64,
    pub machine_cpu: f64,
    /// Manifests removed → no container of them running, seconds.
    pub teardown: f64,
    /// Manifests removed → no sandbox of them left, seconds (nodelet only).
    pub cleared: Option<f64>,
    pub cpu_per_pod_ms: f64,
    /// The kernel's part of it (stime: directories, cgroups, sockets).
    pub sys_per_pod_ms: f64,
    pub calls: BTreeMap<String, f64>,
    pub relists: f64,
    pub relists_per_s: f64,
    pub rss_mib: f64,
    pub idle_cpu_pct: f64,
    /// Relists per second in the idle window, and their mean duration, ms.
    pub idle_relists_per_s: f64,
    pub idle_relist_ms: f64,
    /// Memory cgroups in the kernel when the burst began, live and dying (`/proc/cgroups`).
    pub memcgs: u64,
}

/// Memory cgroups in the kernel (`num_cgroups` of `memory` in `/proc/cgroups`): live ones and
/// "dying" ones, removed but kept by page cache still charged to them; 0 when unknown.
pub fn memory_cgroups() -> u64 {
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
pub fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long an agent is left alone after it came up, before the burst (both sides: kubelet
/// starts its sources and managers after its healthz answers).
pub const SETTLE_BEFORE: Duration = Duration::from_secs(5);

/// A burst of `pods` manifests (`manifest(name)`) on `t`: start, idle, and teardown; with the
/// pods running (after the idle window), `running_hook` is called, for the resilience cases.
#[allow(clippy::too_many_arguments)]
pub fn agent_rep(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    t: &Target,
    pods: usize,
    idle: Duration,
    rep: usize,
    manifest: fn(&str) -> String,
    running_hook: &mut dyn FnMut(),
) -> AgentRun {
    let pid = t.pid;
    let c0 = Counters::parse(&(t.metrics)());
    let (cpu0, sys0) = (cpu_seconds(pid), agent::system_seconds(pid));
    std::fs::create_dir_all(&t.stage).unwrap();
    for i in 0..pods {
        std::fs::write(
            t.stage.join(format!("p{rep}-{i}.yaml")),
            manifest(&format!("p{rep}-{i}")),
        )
        .unwrap();
    }
    let memcgs = memory_cgroups();
    let m0 = machine_cpu();
    let t0 = Instant::now();
    for i in 0..pods {
        let f = format!("p{rep}-{i}.yaml");
        std::fs::rename(t.stage.join(&f), t.manifests.join(&f)).unwrap();
    }
    wait_for(
        Duration::from_secs(600),
        &format!("{}: pods running", t.name),
        || {
            let n = rt.block_on(running(cri, &t.node));
            n != usize::MAX && n >= pods
        },
    );
    let start = t0.elapsed().as_secs_f64();
    let machine_cpu = machine_cpu() - m0;
    let (cpu1, sys1) = (cpu_seconds(pid), agent::system_seconds(pid));
    let c1 = Counters::parse(&(t.metrics)());
    let calls: BTreeMap<String, f64> = c1
        .calls
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (v - c0.calls.get(k).unwrap_or(&0.0)) / pods as f64,
            )
        })
        .filter(|(_, v)| *v > 0.0)
        .collect();
    // Idle with the pods running: settle, then measure.
    std::thread::sleep(Duration::from_secs(3));
    let i0 = Counters::parse(&(t.metrics)());
    let (idle_cpu0, it0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(idle);
    let idle_wall = it0.elapsed().as_secs_f64();
    let idle_cpu_pct = (cpu_seconds(pid) - idle_cpu0) / idle_wall * 100.0;
    let i1 = Counters::parse(&(t.metrics)());
    let idle_relists = i1.relists - i0.relists;
    let rss = rss_mib(pid);
    running_hook();
    // Teardown.
    let t1 = Instant::now();
    for e in std::fs::read_dir(&t.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    wait_for(
        Duration::from_secs(600),
        &format!("{}: teardown", t.name),
        || rt.block_on(running(cri, &t.node)) == 0,
    );
    let teardown = t1.elapsed().as_secs_f64();
    let cleared = t.wait_cleared.then(|| {
        wait_for(
            Duration::from_secs(600),
            &format!("{}: sandboxes removed", t.name),
            || rt.block_on(sandboxes(cri, &t.node)) == 0,
        );
        t1.elapsed().as_secs_f64()
    });
    AgentRun {
        start,
        machine_cpu,
        teardown,
        cleared,
        cpu_per_pod_ms: (cpu1 - cpu0) * 1000.0 / pods as f64,
        sys_per_pod_ms: (sys1 - sys0) * 1000.0 / pods as f64,
        calls,
        relists: c1.relists - c0.relists,
        relists_per_s: (c1.relists - c0.relists) / start,
        rss_mib: rss,
        idle_cpu_pct,
        idle_relists_per_s: idle_relists / idle_wall,
        idle_relist_ms: if idle_relists > 0.0 {
            (i1.relist_seconds - i0.relist_seconds) * 1000.0 / idle_relists
        } else {
            0.0
        },
        memcgs,
    }
}

/// The raw CRI side of a repetition.
pub struct RawRun {
    pub start: f64,
    pub machine_cpu: f64,
    /// Every StopPodSandbox returned (no container running), seconds.
    pub teardown: f64,
    /// Every RemovePodSandbox returned too, seconds.
    pub cleared: f64,
}

/// The raw CRI side: the same pods (`manifest(name)`), 16 at a time; torn down in two passes,
/// StopPodSandbox of every pod (no container running), then RemovePodSandbox of every pod.
pub fn raw_rep(
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
                        services: &[],
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
    let each = |ids: &[String], remove: bool| {
        rt.block_on(async {
            use futures::stream::StreamExt;
            futures::stream::iter(ids)
                .map(|sb| async move {
                    let _ = if remove {
                        cri.remove_pod_sandbox(sb).await
                    } else {
                        cri.stop_pod_sandbox(sb).await
                    };
                })
                .buffer_unordered(16)
                .collect::<Vec<()>>()
                .await
        })
    };
    each(&ids, false);
    let teardown = t1.elapsed().as_secs_f64();
    each(&ids, true);
    let cleared = t1.elapsed().as_secs_f64();
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
        cleared,
    }
}

/// Pods of the warm-up burst each agent runs, unmeasured, before its measured burst
/// (`WARMUP=N`, 0 skips): a fresh agent's first pods pay for what it does once (threads,
/// connections, first faults of its code), kubelet's as nodelet's.
pub fn warm_up(rt: &tokio::runtime::Runtime, cri: &Cri, t: &Target, pods: usize) {
    if pods == 0 {
        return;
    }
    std::fs::create_dir_all(&t.stage).unwrap();
    for i in 0..pods {
        let f = format!("warm-{i}.yaml");
        std::fs::write(t.stage.join(&f), manifest(&format!("warm-{i}"))).unwrap();
        std::fs::rename(t.stage.join(&f), t.manifests.join(&f)).unwrap();
    }
    wait_for(
        Duration::from_secs(300),
        &format!("{}: warm-up pods running", t.name),
        || {
            let n = rt.block_on(running(cri, &t.node));
            n != usize::MAX && n >= pods
        },
    );
    for i in 0..pods {
        let _ = std::fs::remove_file(t.manifests.join(format!("warm-{i}.yaml")));
    }
    wait_for(
        Duration::from_secs(300),
        &format!("{}: warm-up pods stopped", t.name),
        || rt.block_on(running(cri, &t.node)) == 0,
    );
    if t.wait_cleared {
        wait_for(
            Duration::from_secs(300),
            &format!("{}: warm-up sandboxes removed", t.name),
            || rt.block_on(sandboxes(cri, &t.node)) == 0,
        );
    }
}
