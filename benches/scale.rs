//! Scale: a burst of `PODS` one-container busybox pods (default 110; requests cpu 10m / memory
//! 16Mi so that 110 of them fit a 2-core node's allocatable, limits cpu 500m / memory 64Mi,
//! grace 1 s), manifests renamed into staticPodPath at once,
//! timed until containerd reports every container running; then their teardown (manifests
//! removed → nothing of them left in the runtime). The baseline, in the same run and interleaved
//! repetition by repetition: the same CRI sequence sent straight to containerd by a client,
//! 16 pods at a time (RunPodSandbox, PodSandboxStatus, ImageStatus, CreateContainer,
//! StartContainer; teardown StopPodSandbox, RemovePodSandbox).
//!
//! Also counted, from the agent's own metrics: CRI calls per pod start by method
//! (`kubelet_runtime_operations_total`), relists during the burst
//! (`kubelet_pleg_relist_duration_seconds_count`), nodelet's CPU per pod start, its RSS and idle
//! CPU with the pods running.
//!
//! Run: `cargo bench --bench scale` (needs scripts/env/up.sh). `PODS=N`, `REPS=N` (default 3),
//! `IDLE_SECONDS=N` (default 20). `NODELET_BEFORE=/path/to/nodelet` runs an earlier build as a
//! third side, so that a change shows as a ratio in one run.

#[path = "agent/mod.rs"]
mod agent;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use nodelet::cri::{api, Cri, ImageService, RuntimeService};
use nodelet::kuberuntime::container::{container_config, ContainerInputs};
use nodelet::kuberuntime::labels;
use nodelet::kuberuntime::sandbox::sandbox_config;
use nodelet::kuberuntime::Settings;

use agent::env_usize;

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
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

/// Sandboxes of `node` in the runtime.
async fn sandboxes(cri: &Cri, node: &str) -> usize {
    let sel: HashMap<String, String> = [(labels::NODE_NAME.to_string(), node.to_string())].into();
    cri.list_pod_sandbox(sel).await.unwrap_or_default().len()
}

/// One nodelet side's measurements of a repetition.
#[derive(Default, Clone)]
struct AgentRun {
    start: f64,
    teardown: f64,
    cpu_per_pod_ms: f64,
    calls: BTreeMap<String, f64>,
    relists: f64,
    relists_per_s: f64,
    rss_mib: f64,
    idle_cpu_pct: f64,
}

fn agent_rep(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    a: &agent::Agent,
    pods: usize,
    idle: Duration,
    rep: usize,
) -> AgentRun {
    let pid = a.child.id();
    let (calls0, relists0) = counters(a.port);
    let cpu0 = cpu_seconds(pid);
    let stage = a.dir.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    for i in 0..pods {
        std::fs::write(
            stage.join(format!("p{rep}-{i}.yaml")),
            manifest(&format!("p{rep}-{i}")),
        )
        .unwrap();
    }
    let t0 = Instant::now();
    for i in 0..pods {
        let f = format!("p{rep}-{i}.yaml");
        std::fs::rename(stage.join(&f), a.manifests.join(&f)).unwrap();
    }
    let deadline = t0 + Duration::from_secs(600);
    while rt.block_on(running(cri, &a.node)) < pods {
        assert!(
            Instant::now() < deadline,
            "nodelet: pods not running in 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_seconds(pid);
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
    // Teardown.
    let t1 = Instant::now();
    for e in std::fs::read_dir(&a.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    while rt.block_on(sandboxes(cri, &a.node)) > 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(600),
            "nodelet: teardown over 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    AgentRun {
        start,
        teardown: t1.elapsed().as_secs_f64(),
        cpu_per_pod_ms: (cpu1 - cpu0) * 1000.0 / pods as f64,
        calls,
        relists: relists1 - relists0,
        relists_per_s: (relists1 - relists0) / start,
        rss_mib: rss,
        idle_cpu_pct,
    }
}

/// The raw CRI side: the same pods, 16 at a time; returns (start seconds, teardown seconds).
fn raw_rep(rt: &tokio::runtime::Runtime, cri: &Cri, pods: usize, rep: usize) -> (f64, f64) {
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
            let cgroup = layout.pod_cgroup_parent(&uid, nodelet::qos::QosClass::Burstable);
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
    let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &cgroup_root);
    (start, teardown)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let pods = env_usize("PODS", 110);
    let reps = env_usize("REPS", 3);
    let idle = Duration::from_secs(env_usize("IDLE_SECONDS", 20) as u64);
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
    let after = agent::start(
        &format!("scale-{}", std::process::id()),
        &config,
        std::process::Stdio::null(),
    );
    let before = std::env::var("NODELET_BEFORE").ok().map(|bin| {
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
    let machine0 = machine_cpu();
    for rep in 0..reps {
        let r = raw_rep(&rt, &cri, pods, rep);
        eprintln!(
            "  rep {rep}: raw CRI start {:.1} s, teardown {:.1} s",
            r.0, r.1
        );
        raw.push(r);
        let a = agent_rep(&rt, &cri, &after, pods, idle, rep);
        eprintln!(
            "  rep {rep}: nodelet start {:.1} s, teardown {:.1} s, relists {:.0}",
            a.start, a.teardown, a.relists
        );
        runs.push(a);
        if let Some(b) = &before {
            let r = agent_rep(&rt, &cri, b, pods, idle, rep);
            eprintln!(
                "  rep {rep}: before start {:.1} s, teardown {:.1} s, relists {:.0}",
                r.start, r.teardown, r.relists
            );
            before_runs.push(r);
        }
    }
    let machine = machine_cpu() - machine0;
    let ratios = |f: &dyn Fn(&AgentRun) -> f64, g: &dyn Fn(&(f64, f64)) -> f64, rs: &[AgentRun]| {
        let v: Vec<f64> = rs.iter().zip(&raw).map(|(a, r)| f(a) / g(r)).collect();
        let m = median(&mut v.clone());
        (v, m)
    };
    println!("scale: {pods} pods, {reps} interleaved repetitions (machine CPU over the run {machine:.0} s)");
    for (name, rs) in [("nodelet", &runs), ("before", &before_runs)] {
        if rs.is_empty() {
            continue;
        }
        let (s, sm) = ratios(&|a| a.start, &|r| r.0, rs);
        let (t, tm) = ratios(&|a| a.teardown, &|r| r.1, rs);
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!("{name}:");
        println!(
            "  start to all running: {} s (raw CRI {} s); ratio {} (median {sm:.2})",
            rs.iter()
                .map(|a| format!("{:.1}", a.start))
                .collect::<Vec<_>>()
                .join(", "),
            raw.iter()
                .map(|r| format!("{:.1}", r.0))
                .collect::<Vec<_>>()
                .join(", "),
            fmt(&s)
        );
        println!(
            "  teardown: {} s (raw CRI {} s); ratio {} (median {tm:.2})",
            rs.iter()
                .map(|a| format!("{:.1}", a.teardown))
                .collect::<Vec<_>>()
                .join(", "),
            raw.iter()
                .map(|r| format!("{:.1}", r.1))
                .collect::<Vec<_>>()
                .join(", "),
            fmt(&t)
        );
        let last = rs.last().unwrap();
        let total: f64 = last.calls.values().sum();
        let relist_calls = last.calls.get("list_podsandbox").copied().unwrap_or(0.0)
            + last.calls.get("list_containers").copied().unwrap_or(0.0);
        println!(
            "  CRI calls per pod start (last rep): {total:.1} in all, {:.1} besides the listings: {}",
            total - relist_calls,
            last.calls
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "  relists during the burst: {} ({} per second)",
            rs.iter()
                .map(|a| format!("{:.0}", a.relists))
                .collect::<Vec<_>>()
                .join(", "),
            rs.iter()
                .map(|a| format!("{:.1}", a.relists_per_s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "  nodelet CPU per pod start: {} ms; RSS with {pods} pods: {} MiB; idle CPU: {} % of a core",
            rs.iter().map(|a| format!("{:.1}", a.cpu_per_pod_ms)).collect::<Vec<_>>().join(", "),
            rs.iter().map(|a| format!("{:.1}", a.rss_mib)).collect::<Vec<_>>().join(", "),
            rs.iter().map(|a| format!("{:.2}", a.idle_cpu_pct)).collect::<Vec<_>>().join(", ")
        );
    }
    for a in std::iter::once(after).chain(before) {
        let mut a = a;
        let _ = a.child.kill();
        let _ = a.child.wait();
        let _ =
            nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &a.cgroup_root);
    }
}
