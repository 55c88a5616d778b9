//! Probe cost and scheduling, nodelet against kubelet v1.20.2 on the same pods (issue 36):
//! `PODS` busybox httpd pods (default 110), each with three liveness probes (exec `true`,
//! httpGet, tcpSocket) every `PERIOD` seconds (default 10), first after an initial delay. Each
//! agent in turn (never both at once: kubelet removes pods it did not start) runs the pods; a
//! window before the first probe is due gives its cost without probes (the baseline of the same
//! run), then a window of `SECONDS` (default 60) with the probes running gives:
//!
//! - **agent CPU per probe**: (CPU in the probe window − CPU at the baseline's rate) / probes
//!   run (`prober_probe_total` on the agent's `/metrics/probes`, nodelet's and kubelet's), with
//!   the baseline's own variation (between its two halves) per probe beside it: an agent whose
//!   background work moves more than its probes cost cannot be measured this way, and says so;
//! - **the runtime's CPU per exec probe**: containerd and the pods' shims (which run and reap
//!   `runc exec`), the same difference, per exec probe;
//! - **scheduling delay**, measured outside both agents: containerd's `/tasks/exec-started`
//!   events (their timestamps) for each container's exec probe; the delay of a probe is how far
//!   the interval since the container's previous one is from the period (p50/p99); it holds the
//!   runtime's own jitter in starting an exec, the same for both agents. nodelet's own
//!   histogram of how late its workers ran (`nodelet_prober_schedule_delay_seconds`) beside it.
//!
//! `KUBELET=0` skips kubelet's side (so does an unbuilt peer, with a message saying how to
//! build it).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;
#[path = "peer/mod.rs"]
mod peer;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use containerd_client::events::TaskExecStarted;
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::SubscribeRequest;
use nodelet::cri::{api, Cri, RuntimeService};
use nodelet::kuberuntime::labels;
use prost::Message;

use agent::env_usize;

/// The probes wait this long after each container starts (kubelet's `initialDelaySeconds`),
/// leaving room for the baseline window once every pod runs and the agent has settled.
const INITIAL_DELAY: u64 = 150;

/// After every container runs, the agent is left this long before the baseline window (kubelet
/// keeps working on new containers for a while: its cAdvisor finds them, its status manager
/// writes them).
const SETTLE: Duration = Duration::from_secs(20);

/// CPU seconds of a process, its reaped children included.
fn cpu_seconds(pid: u32) -> f64 {
    agent::cpu_seconds(pid, true)
}

/// The shims of the sandboxes `ids` (their command line names the sandbox: `-id <id>`).
fn shim_pids(ids: &[String]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_shim = args.first().is_some_and(|a| a.contains("containerd-shim"));
        let ours = args
            .windows(2)
            .any(|w| w[0] == "-id" && ids.contains(&w[1]));
        if is_shim && ours {
            out.push(pid);
        }
    }
    out
}

/// CPU seconds of containerd (the env's pid file) and of the shims `pids` (which run runc exec
/// and reap it, so the probes' exec cost shows in their children's time).
fn runtime_cpu(pids: &[u32]) -> f64 {
    let containerd: u32 = std::fs::read_to_string("/run/nodelet-env/containerd.pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    cpu_seconds(containerd) + pids.iter().copied().map(cpu_seconds).sum::<f64>()
}

/// Probes run so far, from `prober_probe_total` samples (every probe type and result).
fn probes_run(samples: &[(String, f64)]) -> f64 {
    samples
        .iter()
        .filter(|(l, _)| l.starts_with("prober_probe_total{"))
        .map(|(_, v)| v)
        .sum()
}

/// The pod: busybox httpd, with the three liveness probes every `period` seconds.
fn manifest(name: &str, period: u64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: busybox:1.36\n    command: [sh, -c, 'mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www']\n    resources: {{requests: {{cpu: 1m, memory: 4Mi}}}}\n    livenessProbe: {{exec: {{command: ['true']}}, periodSeconds: {period}, initialDelaySeconds: {INITIAL_DELAY}, failureThreshold: 30}}\n  - name: http\n    image: busybox:1.36\n    command: [sh, -c, 'trap \"exit 0\" TERM; sleep 3600 & wait']\n    resources: {{requests: {{cpu: 1m, memory: 4Mi}}}}\n    livenessProbe: {{httpGet: {{path: /index.html, port: 8080}}, periodSeconds: {period}, initialDelaySeconds: {INITIAL_DELAY}, failureThreshold: 30}}\n  - name: tcp\n    image: busybox:1.36\n    command: [sh, -c, 'trap \"exit 0\" TERM; sleep 3600 & wait']\n    resources: {{requests: {{cpu: 1m, memory: 4Mi}}}}\n    livenessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: {period}, initialDelaySeconds: {INITIAL_DELAY}, failureThreshold: 30}}\n"
    )
}

/// Running containers of `node`'s static pods (`<name>-<node>`): (container ID, startedAt ns).
async fn running(cri: &Cri, node: &str) -> Vec<(String, i64)> {
    let suffix = format!("-{node}");
    let cs = cri
        .list_containers(HashMap::new())
        .await
        .unwrap_or_default();
    let mut out = Vec::new();
    for c in cs.iter().filter(|c| {
        c.state == api::ContainerState::ContainerRunning as i32
            && c.labels
                .get(labels::POD_NAME)
                .is_some_and(|n| n.ends_with(&suffix))
    }) {
        if let Ok(Some(s)) = cri.container_status(&c.id).await {
            out.push((c.id.clone(), s.started_at));
        }
    }
    out
}

/// Sandbox IDs of `node`'s static pods.
async fn sandbox_ids(cri: &Cri, node: &str) -> Vec<String> {
    let suffix = format!("-{node}");
    cri.list_pod_sandbox(HashMap::new())
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|s| {
            s.metadata
                .as_ref()
                .is_some_and(|m| m.name.ends_with(&suffix))
        })
        .map(|s| s.id)
        .collect()
}

/// Follows containerd's `/tasks/exec-started` events until the task is aborted, recording each
/// one's container and timestamp (ns) into `out`.
async fn exec_starts(socket: PathBuf, out: std::sync::Arc<std::sync::Mutex<Vec<(String, i64)>>>) {
    let channel = containerd_client::connect(socket)
        .await
        .expect("containerd's socket");
    let mut client = EventsClient::new(channel);
    let mut stream = client
        .subscribe(SubscribeRequest {
            filters: vec!["namespace==k8s.io,topic==\"/tasks/exec-started\"".to_owned()],
        })
        .await
        .expect("containerd's events")
        .into_inner();
    while let Ok(Some(e)) = stream.message().await {
        let (Some(ts), Some(any)) = (e.timestamp, e.event) else {
            continue;
        };
        if let Ok(ev) = TaskExecStarted::decode(any.value.as_slice()) {
            let ns = ts.seconds * 1_000_000_000 + i64::from(ts.nanos);
            out.lock().unwrap().push((ev.container_id, ns));
        }
    }
}

/// One agent's measurements.
struct Side {
    name: &'static str,
    probes_per_s: f64,
    exec_per_s: f64,
    agent_base_pct: f64,
    agent_with_pct: f64,
    agent_per_probe_ms: f64,
    /// The baseline's own variation, per probe (between its two halves), ms.
    noise_per_probe_ms: f64,
    runtime_per_exec_ms: f64,
    delay_p50_ms: f64,
    delay_p99_ms: f64,
    rss_mib: f64,
    /// p50 and p99 bounds of the agent's own schedule-delay histogram
    /// (`nodelet_prober_schedule_delay_seconds`, nodelet only), ms.
    own_delay: Option<(f64, f64)>,
}

/// Histogram buckets `(le, cumulative count)` of `nodelet_prober_schedule_delay_seconds`.
fn delay_buckets(samples: &[(String, f64)]) -> Vec<(f64, f64)> {
    samples
        .iter()
        .filter_map(|(l, v)| {
            let le = l
                .strip_prefix("nodelet_prober_schedule_delay_seconds_bucket{le=\"")?
                .split('"')
                .next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, *v))
        })
        .collect()
}

/// p50 and p99 (bucket upper bounds, ms) of the schedule delays observed between two scrapes;
/// `None` when the agent has no such histogram (kubelet).
fn own_delay(before: &[(String, f64)], after: &[(String, f64)]) -> Option<(f64, f64)> {
    let (b, a) = (delay_buckets(before), delay_buckets(after));
    if a.is_empty() {
        return None;
    }
    let diff: Vec<(f64, f64)> = a
        .iter()
        .map(|(le, c)| {
            let was = b.iter().find(|(l, _)| l == le).map_or(0.0, |(_, c)| *c);
            (*le, c - was)
        })
        .collect();
    let total = diff.last().map_or(0.0, |(_, c)| *c);
    let q = |q: f64| {
        diff.iter()
            .find(|(_, c)| *c >= q * total)
            .map_or(f64::INFINITY, |(le, _)| *le * 1000.0)
    };
    Some((q(0.5), q(0.99)))
}

/// (median, p99) of `v`, which it sorts.
fn median_p99(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1];
    (v[v.len() / 2], p99)
}

/// The agent under measurement: its process, manifests and metrics.
struct Target {
    name: &'static str,
    pid: u32,
    node: String,
    manifests: PathBuf,
    stage: PathBuf,
    probe_metrics: Box<dyn Fn() -> Vec<(String, f64)>>,
}

/// Runs the pods on `t` and measures (see the module docs).
#[allow(clippy::too_many_arguments)]
fn measure(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    t: &Target,
    pods: usize,
    period: u64,
    window: Duration,
    execs: &std::sync::Arc<std::sync::Mutex<Vec<(String, i64)>>>,
) -> Side {
    std::fs::create_dir_all(&t.stage).unwrap();
    for i in 0..pods {
        let f = format!("p{i}.yaml");
        std::fs::write(t.stage.join(&f), manifest(&format!("p{i}"), period)).unwrap();
        std::fs::rename(t.stage.join(&f), t.manifests.join(&f)).unwrap();
    }
    let started = Instant::now();
    let wanted = pods * 3;
    let mut up = Vec::new();
    while up.len() < wanted {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{}: only {}/{wanted} containers running after 10 minutes",
            t.name,
            up.len()
        );
        std::thread::sleep(Duration::from_secs(1));
        up = rt.block_on(running(cri, &t.node));
    }
    eprintln!(
        "  {}: {wanted} containers running after {:.0} s",
        t.name,
        started.elapsed().as_secs_f64()
    );
    let now_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64
    };
    let first_start = up.iter().map(|(_, s)| *s).min().unwrap();
    let last_start = up.iter().map(|(_, s)| *s).max().unwrap();
    let first_due = first_start + INITIAL_DELAY as i64 * 1_000_000_000;
    let shims = shim_pids(&rt.block_on(sandbox_ids(cri, &t.node)));
    // The baseline: from SETTLE after every container ran until 2 s before the first probe,
    // as long as the probe window at most.
    std::thread::sleep(SETTLE);
    let base_len = (first_due - now_ns()) as f64 / 1e9 - 2.0;
    assert!(
        base_len >= 20.0,
        "{}: the pods took too long to start for a baseline window before the first probe",
        t.name
    );
    let (a0, r0, b0) = (cpu_seconds(t.pid), runtime_cpu(&shims), Instant::now());
    let half = Duration::from_secs_f64(base_len.min(window.as_secs_f64()) / 2.0);
    std::thread::sleep(half);
    let (a_half, half_wall) = (cpu_seconds(t.pid), b0.elapsed().as_secs_f64());
    std::thread::sleep(half);
    let base_wall = b0.elapsed().as_secs_f64();
    // How much the agent's own rate moves between the two halves of the baseline, CPU seconds
    // per second: the noise any per-probe figure stands on.
    let noise =
        ((a_half - a0) / half_wall - (cpu_seconds(t.pid) - a_half) / (base_wall - half_wall)).abs();
    let (agent_base, runtime_base) = (
        (cpu_seconds(t.pid) - a0) / base_wall,
        (runtime_cpu(&shims) - r0) / base_wall,
    );
    // Every probe worker past its initial delay and one period.
    let steady = last_start + (INITIAL_DELAY + period) as i64 * 1_000_000_000;
    let wait = (steady - now_ns()).max(0) as u64;
    std::thread::sleep(Duration::from_nanos(wait));
    let m0 = (t.probe_metrics)();
    let p0 = probes_run(&m0);
    let (w0_ns, a0, r0, w0) = (
        now_ns(),
        cpu_seconds(t.pid),
        runtime_cpu(&shims),
        Instant::now(),
    );
    std::thread::sleep(window);
    let (w1_ns, a1, r1, wall) = (
        now_ns(),
        cpu_seconds(t.pid),
        runtime_cpu(&shims),
        w0.elapsed().as_secs_f64(),
    );
    let m1 = (t.probe_metrics)();
    let probes = probes_run(&m1) - p0;
    let own_delay = own_delay(&m0, &m1);
    let rss = std::fs::read_to_string(format!("/proc/{}/status", t.pid))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0;
    // The exec probes of this side's containers: delays from the intervals.
    let ours: std::collections::HashSet<&String> = up.iter().map(|(id, _)| id).collect();
    let mut by_container: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (id, ns) in execs.lock().unwrap().iter() {
        if ours.contains(id) && *ns >= w0_ns - period as i64 * 1_000_000_000 && *ns <= w1_ns {
            by_container.entry(id.clone()).or_default().push(*ns);
        }
    }
    let mut delays = Vec::new();
    let mut exec_in_window = 0usize;
    for times in by_container.values_mut() {
        times.sort_unstable();
        exec_in_window += times.iter().filter(|t| **t >= w0_ns).count();
        for w in times.windows(2) {
            if w[1] >= w0_ns {
                let off = (w[1] - w[0]) as f64 / 1e6 - period as f64 * 1000.0;
                delays.push(off.abs());
            }
        }
    }
    let (d50, d99) = median_p99(&mut delays);
    let agent_extra = (a1 - a0) - agent_base * wall;
    let runtime_extra = (r1 - r0) - runtime_base * wall;
    Side {
        name: t.name,
        probes_per_s: probes / wall,
        exec_per_s: exec_in_window as f64 / wall,
        agent_base_pct: agent_base * 100.0,
        agent_with_pct: (a1 - a0) / wall * 100.0,
        agent_per_probe_ms: agent_extra * 1000.0 / probes,
        noise_per_probe_ms: noise * wall * 1000.0 / probes,
        runtime_per_exec_ms: runtime_extra * 1000.0 / exec_in_window as f64,
        delay_p50_ms: d50,
        delay_p99_ms: d99,
        rss_mib: rss,
        own_delay,
    }
}

/// Removes the pods of `t` and waits until none of its containers runs.
fn tear_down(rt: &tokio::runtime::Runtime, cri: &Cri, t: &Target) {
    for e in std::fs::read_dir(&t.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while !rt.block_on(running(cri, &t.node)).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn nodelet_side(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    pods: usize,
    period: u64,
    window: Duration,
    execs: &std::sync::Arc<std::sync::Mutex<Vec<(String, i64)>>>,
) -> Side {
    let node = format!("probes-{}", std::process::id());
    let mut a = agent::start(&node, "maxPods: 250\n", std::process::Stdio::null());
    let port = a.port;
    let t = Target {
        name: "nodelet",
        pid: a.child.id(),
        node: a.node.clone(),
        manifests: a.manifests.clone(),
        stage: a.dir.path().join("stage"),
        probe_metrics: Box::new(move || agent::metric_samples(port, "/metrics/probes")),
    };
    let side = measure(rt, cri, &t, pods, period, window, execs);
    tear_down(rt, cri, &t);
    // Sandboxes gone too, before kubelet may start.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !rt.block_on(sandbox_ids(cri, &t.node)).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = a.child.kill();
    let _ = a.child.wait();
    let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &a.cgroup_root);
    side
}

fn kubelet_side(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    bin: &Path,
    pods: usize,
    period: u64,
    window: Duration,
    execs: &std::sync::Arc<std::sync::Mutex<Vec<(String, i64)>>>,
) -> Side {
    let node = format!("kprobes-{}", std::process::id());
    let k = peer::start_with(bin, &node, &agent::socket(), None, "maxPods: 250\n");
    std::thread::sleep(Duration::from_secs(5));
    let api_port = k.api_port;
    let t = Target {
        name: "kubelet",
        pid: k.pid(),
        node: k.node.clone(),
        manifests: k.manifests.clone(),
        stage: k.dir.path().join("stage"),
        probe_metrics: Box::new(move || peer::metric_samples(api_port, "/metrics/probes")),
    };
    let side = measure(rt, cri, &t, pods, period, window, execs);
    tear_down(rt, cri, &t);
    k.stop();
    side
}

fn main() {
    let pods = env_usize("PODS", 110);
    let period = env_usize("PERIOD", 10) as u64;
    let window = Duration::from_secs(env_usize("SECONDS", 60) as u64);
    let sock = PathBuf::from(agent::socket());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt.block_on(async {
        Cri::new(
            &sock,
            &sock,
            Duration::from_secs(60),
            nodelet::metrics::Metrics::new(),
        )
    });
    let execs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let follower = rt.spawn(exec_starts(sock.clone(), execs.clone()));
    let kubelet = peer::side("probes", &rt, &cri);
    let mut sides = vec![nodelet_side(&rt, &cri, pods, period, window, &execs)];
    if let Some(bin) = kubelet {
        sides.push(kubelet_side(&rt, &cri, &bin, pods, period, window, &execs));
    }
    follower.abort();
    println!(
        "\nprobes: {pods} pods, liveness exec + httpGet + tcpSocket every {period} s ({} probes/s wanted, {:.1} exec), {:.0} s window\n",
        pods * 3 / period as usize,
        pods as f64 / period as f64,
        window.as_secs_f64()
    );
    println!("| | probes/s run (exec/s) | agent CPU without / with probes, % of a core | agent CPU per probe (± the baseline's variation) | runtime CPU per exec probe | delay p50 / p99 (exec-started intervals) | the agent's own delay histogram p50 / p99 | RSS |");
    println!("|---|---|---|---|---|---|---|---|");
    for s in &sides {
        println!(
            "| {} | {:.1} ({:.1}) | {:.2} / {:.2} | **{:.3} ms** (± {:.3}) | {:.2} ms | {:.1} / **{:.1} ms** | {} | {:.1} MiB |",
            s.name,
            s.probes_per_s,
            s.exec_per_s,
            s.agent_base_pct,
            s.agent_with_pct,
            s.agent_per_probe_ms,
            s.noise_per_probe_ms,
            s.runtime_per_exec_ms,
            s.delay_p50_ms,
            s.delay_p99_ms,
            s.own_delay.map_or("—".to_owned(), |(a, b)| format!("≤ {a:.1} / ≤ {b:.1} ms")),
            s.rss_mib
        );
    }
    if let [n, k] = &sides[..] {
        println!(
            "\nnodelet / kubelet: CPU per probe **{:.2}**, delay p99 {:.2}; nodelet's CPU per probe is {:.1} % of the runtime's per exec probe, kubelet's {:.1} %",
            n.agent_per_probe_ms / k.agent_per_probe_ms,
            n.delay_p99_ms / k.delay_p99_ms,
            n.agent_per_probe_ms / n.runtime_per_exec_ms * 100.0,
            k.agent_per_probe_ms / k.runtime_per_exec_ms * 100.0
        );
    }
}
