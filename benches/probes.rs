//! Probe cost and scheduling: `PODS` pods (default 110), each with an exec readiness probe and an
//! httpGet liveness probe every second, on the real containerd. Over `SECONDS` (default 30) of
//! steady state it measures nodelet's CPU per probe against the runtime's own CPU per probe
//! (containerd and its shims: the baseline of the same run), and the probe workers' scheduling
//! delay (`nodelet_prober_schedule_delay_seconds`, p50/p99 from its histogram).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;

use std::time::{Duration, Instant};

use agent::env_usize;

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

/// (total probes, schedule-delay histogram buckets (le, cumulative count), count) from
/// `/metrics/probes`.
fn probe_metrics(port: u16) -> (f64, Vec<(f64, f64)>, f64) {
    let mut total = 0.0;
    let mut buckets = Vec::new();
    let mut count = 0.0;
    for (l, v) in agent::metric_samples(port, "/metrics/probes") {
        if l.starts_with("prober_probe_total{") {
            total += v;
        } else if let Some(rest) =
            l.strip_prefix("nodelet_prober_schedule_delay_seconds_bucket{le=\"")
        {
            let le = rest.split('"').next().unwrap_or("+Inf");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(0.0)
            };
            buckets.push((le, v));
        } else if l.starts_with("nodelet_prober_schedule_delay_seconds_count") {
            count = v;
        }
    }
    (total, buckets, count)
}

/// The upper bound of the bucket holding quantile `q` of the observations between two scrapes.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, c - b)
        })
        .collect();
    let total = diff.last().map_or(0.0, |(_, c)| *c);
    diff.iter()
        .find(|(_, c)| *c >= q * total)
        .map_or(f64::INFINITY, |(le, _)| *le)
}

fn ready_pods(port: u16) -> usize {
    let body = reqwest::blocking::get(format!("http://127.0.0.1:{port}/pods"))
        .and_then(|r| r.text())
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .count()
}

/// Writes `pods` manifests into `a`'s staticPodPath, with the probes when `probes`.
fn write_pods(a: &agent::Agent, pods: usize, probes: bool) {
    for i in 0..pods {
        let probe_lines = if probes {
            "    readinessProbe: {exec: {command: ['true']}, periodSeconds: 1}\n    livenessProbe: {httpGet: {path: /index.html, port: 8080}, periodSeconds: 1, failureThreshold: 30}\n"
        } else {
            ""
        };
        let m = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: busybox:1.36\n    command: [sh, -c, 'mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www']\n    resources: {{requests: {{cpu: 1m, memory: 4Mi}}}}\n{probe_lines}"
        );
        let tmp = a.manifests.join(format!(".p{i}.tmp"));
        std::fs::write(&tmp, m).unwrap();
        std::fs::rename(tmp, a.manifests.join(format!("p{i}.yaml"))).unwrap();
    }
}

/// Waits until `pods` pods of `a` are Ready.
fn wait_ready(a: &agent::Agent, pods: usize) {
    let started = Instant::now();
    let mut last = 0;
    loop {
        let ready = ready_pods(a.port);
        if ready >= pods {
            break;
        }
        if ready != last {
            eprintln!(
                "  {ready}/{pods} pods of {} ready after {:.0} s",
                a.node,
                started.elapsed().as_secs_f64()
            );
            last = ready;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "only {ready}/{pods} pods ready after 10 minutes"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Removes `a`'s pods and stops it.
fn tear_down(mut a: agent::Agent) {
    for e in std::fs::read_dir(&a.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let body = reqwest::blocking::get(format!("http://127.0.0.1:{}/pods", a.port))
            .and_then(|r| r.text())
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if v["items"].as_array().is_none_or(|i| i.is_empty()) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = a.child.kill();
    let _ = a.child.wait();
    let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &a.cgroup_root);
}

fn main() {
    let pods = env_usize("PODS", 110);
    let seconds = env_usize("SECONDS", 30) as u64;
    let node = format!("probes-{}", std::process::id());
    let a = agent::start(&node, "maxPods: 250\n", std::process::Stdio::null());
    // The baseline: the same pods on a second agent, without probes, measured in the same window.
    let base = agent::start(
        &format!("noprobes-{}", std::process::id()),
        "maxPods: 250\n",
        std::process::Stdio::null(),
    );
    write_pods(&a, pods, true);
    write_pods(&base, pods, false);
    let started = Instant::now();
    wait_ready(&a, pods);
    wait_ready(&base, pods);
    eprintln!(
        "  all pods ready after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // Settle, then measure a steady window.
    std::thread::sleep(Duration::from_secs(5));
    let pid = a.child.id();
    let base_pid = base.child.id();
    let sandboxes: Vec<String> = {
        use nodelet::cri::RuntimeService;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let sock = std::path::PathBuf::from(agent::SOCKET);
        let cri = rt.block_on(async {
            nodelet::cri::Cri::new(
                &sock,
                &sock,
                Duration::from_secs(30),
                nodelet::metrics::Metrics::new(),
            )
        });
        let sel = [(
            nodelet::kuberuntime::labels::NODE_NAME.to_string(),
            node.clone(),
        )]
        .into();
        rt.block_on(cri.list_pod_sandbox(sel))
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    };
    let shims = shim_pids(&sandboxes);
    let (p0, b0, _) = probe_metrics(a.port);
    let (n0, x0, r0, t0) = (
        cpu_seconds(pid),
        cpu_seconds(base_pid),
        runtime_cpu(&shims),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs(seconds));
    let (p1, b1, _) = probe_metrics(a.port);
    let (n1, x1, r1, t1) = (
        cpu_seconds(pid),
        cpu_seconds(base_pid),
        runtime_cpu(&shims),
        Instant::now(),
    );
    let probes = p1 - p0;
    let wall = (t1 - t0).as_secs_f64();
    let with = (n1 - n0) * 1000.0;
    let without = (x1 - x0) * 1000.0;
    let per_probe = (with - without) / probes;
    let runtime_ms = (r1 - r0) * 1000.0 / probes;
    println!("probes: {pods} pods, exec readiness + httpGet liveness every 1 s, {wall:.1} s window ({} shims)", shims.len());
    println!(
        "  probes run: {probes:.0} ({:.1}/s; wanted {})",
        probes / wall,
        2 * pods
    );
    println!(
        "  nodelet CPU: {:.1}% of a core with probes, {:.1}% for the same pods without (baseline, same run)",
        with / 10.0 / wall,
        without / 10.0 / wall
    );
    println!(
        "  nodelet CPU per probe (with - without): {per_probe:.3} ms; runtime (containerd + shims, ExecSync included) per probe: {runtime_ms:.3} ms; ratio {:.3}",
        per_probe / runtime_ms
    );
    println!(
        "  scheduling delay (histogram bucket bounds): p50 <= {:.2} ms, p99 <= {:.2} ms",
        quantile(&b0, &b1, 0.5) * 1000.0,
        quantile(&b0, &b1, 0.99) * 1000.0
    );
    tear_down(a);
    tear_down(base);
}
