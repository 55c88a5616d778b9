//! The node API at `PODS` pods (issue 33; default 110), nodelet against kubelet v1.20.2 on the
//! same containerd, taking turns (`REPS` interleaved repetitions, default 2; kubelet removes
//! pods it did not start, so the two never run at once). Each side is joined to the cluster of
//! scripts/env/cluster.sh (so that `kubectl exec` goes through the API server), serves its API
//! with anonymous access and AlwaysAllow (as `../shared/tools/kubelet-peer.sh` starts kubelet),
//! and runs the same busybox pods. Measured on each side:
//!
//! 1. **Scrapes**: `SCRAPES` (default 50) GETs of `/stats/summary`, then of `/metrics/resource`,
//!    one at a time after 3 unmeasured ones: the client's latency (p50, p99), the answer's size,
//!    and the agent's CPU per scrape (its CPU over the loop less its idle rate, measured over
//!    `IDLE_SECONDS` (default 10) just before, times the loop's duration). kubelet answers from
//!    cAdvisor's cache, filled by its housekeeping: that cost is in its idle CPU, reported too.
//! 2. **exec**: `EXECS` (default 20) `kubectl exec POD -- true` through the API server, each timed
//!    from start to exit.
//! 3. **Log follow**: a container writing lines as fast as it can; `FOLLOW_SECONDS` (default 10)
//!    of `/containerLogs/…?follow=true` read by a client, against a reader of the log file itself
//!    (following it across rotation) over the same seconds: MB/s of log text (the lines without
//!    the CRI prefix, as a follower receives them) of both.
//!
//! CPU is read from `/proc/<pid>/task/*/schedstat` (nanoseconds; the 10 ms ticks of
//! `/proc/<pid>/stat` are too coarse for a scrape).
//!
//! Without a kubelet build (`../shared/tools/kubelet-peer.sh build`) the kubelet side is skipped
//! with a message, and nodelet's figures are printed alone.
//!
//! Run: `cargo bench --bench node_api` (needs scripts/env/up.sh and scripts/env/cluster.sh).
// Benchmark code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;
#[path = "peer/mod.rs"]
mod peer;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent::env_usize;
use nodelet::cri::{Cri, RuntimeService};

const ADMIN: &str = "/var/lib/nodelet-env/cluster/admin.kubeconfig";

/// Writes manifest `name` into `dir` whole (written beside it, then renamed in): kubelet's file
/// source reads a file on its first inotify event and, finding it half-written, waits for its
/// next full listing (`fileCheckFrequency`, 20 s).
fn put_manifest(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// A pod of the scale benchmark's kind: Burstable, one busybox container that sleeps.
fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

/// The pod that writes its log as fast as it can (`yes` of a 100-byte line).
const FLOOD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: flood, namespace: default}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"yes 0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456\"]\n";

/// One scraped path's figures.
#[derive(Debug, Default, Clone, Copy)]
struct Scrape {
    cpu_ms: f64,
    /// The part of the agent's CPU in the kernel (10 ms ticks of `/proc/<pid>/stat`), ms per
    /// scrape, idle not subtracted.
    sys_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    kib: f64,
}

/// One side's figures in one repetition.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    idle_cpu_pct: f64,
    summary: Scrape,
    resource: Scrape,
    /// The runtime's own `ListContainerStats` (every container), p50 and p99, ms.
    raw_stats_p50_ms: f64,
    raw_stats_p99_ms: f64,
    exec_p50_ms: f64,
    exec_p99_ms: f64,
    follow_mbps: f64,
    file_mbps: f64,
}

/// The `q` quantile (0–1) of `v`, nearest rank.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len());
    v[i - 1]
}

/// The side under test: where its API is, its process, its node name and pod directories.
struct Side<'a> {
    name: &'static str,
    node: &'a str,
    pid: u32,
    api: String,
    manifests: &'a Path,
    /// Where its pods' logs are (`podLogsDir`).
    logs: PathBuf,
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn kubectl(args: &[&str]) -> std::process::Output {
    Command::new("kubectl")
        .args(["--kubeconfig", ADMIN])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Running containers of pods whose names end in `suffix`.
fn running(rt: &tokio::runtime::Runtime, cri: &Cri, suffix: &str) -> usize {
    rt.block_on(cri.list_containers(Default::default()))
        .unwrap_or_default()
        .iter()
        .filter(|c| c.state == nodelet::cri::api::ContainerState::ContainerRunning as i32)
        .filter(|c| {
            c.labels
                .get(nodelet::kuberuntime::labels::POD_NAME)
                .is_some_and(|p| p.ends_with(suffix))
        })
        .count()
}

/// Waits until `n` containers of pods whose names end in `suffix` run in containerd.
fn wait_running(rt: &tokio::runtime::Runtime, cri: &Cri, suffix: &str, n: usize, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let running = running(rt, cri, suffix);
        if running >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{running} of {n} containers of *{suffix} running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `SCRAPES` GETs of `path` on `side`, after 3 unmeasured ones.
fn scrape(side: &Side, path: &str, idle_rate: f64, scrapes: usize) -> Scrape {
    let c = client();
    let url = format!("{}{path}", side.api);
    let get = || {
        let r = c.get(&url).send().unwrap();
        assert!(r.status().is_success(), "{url}: {}", r.status());
        r.bytes().unwrap().len()
    };
    for _ in 0..3 {
        get();
    }
    let cpu0 = agent::cpu_seconds_fine(side.pid);
    let sys0 = agent::system_seconds(side.pid);
    let t0 = Instant::now();
    let mut lat = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let t = Instant::now();
        bytes = get();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = agent::cpu_seconds_fine(side.pid) - cpu0 - idle_rate * wall;
    Scrape {
        cpu_ms: (cpu.max(0.0) / scrapes as f64) * 1e3,
        sys_ms: (agent::system_seconds(side.pid) - sys0) / scrapes as f64 * 1e3,
        p50_ms: quantile(&mut lat, 0.5),
        p99_ms: quantile(&mut lat, 0.99),
        kib: bytes as f64 / 1024.0,
    }
}

/// `EXECS` `kubectl exec POD -- true` through the API server: p50 and p99, ms.
fn exec_latency(pod: &str, execs: usize) -> (f64, f64) {
    // The mirror pod must be in the API first.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(
        &kubectl(&[
            "-n",
            "default",
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .stdout,
    )
    .contains("Running")
    {
        assert!(Instant::now() < deadline, "mirror pod {pod} not Running");
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut lat = Vec::new();
    for _ in 0..execs {
        let t = Instant::now();
        let out = kubectl(&["-n", "default", "exec", pod, "--", "true"]);
        assert!(
            out.status.success(),
            "kubectl exec {pod}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    (quantile(&mut lat.clone(), 0.5), quantile(&mut lat, 0.99))
}

/// Bytes of log text (each line's text and its newline, what a follower is sent) appended to
/// the CRI log file `path` while `stop` is not set, following it when it is rotated (renamed, a
/// new file at `path`): what a reader of the file itself gets.
fn tail_file(path: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::Ordering;
    let open = || std::fs::File::open(path).ok();
    let Some(mut f) = open() else { return 0 };
    let mut ino = f.metadata().map(|m| m.ino()).unwrap_or(0);
    let _ = std::io::copy(&mut f, &mut std::io::sink()); // start at the end, as the follower
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut partial: Vec<u8> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match f.read(&mut buf) {
            Ok(0) => {
                if let Some(m) = std::fs::metadata(path).ok().filter(|m| m.ino() != ino) {
                    if let Some(nf) = open() {
                        ino = m.ino();
                        f = nf;
                        partial.clear();
                        continue;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(n) => {
                partial.extend_from_slice(&buf[..n]);
                let end = partial
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |i| i + 1);
                for line in partial[..end].split(|b| *b == b'\n') {
                    if let Some(e) = nodelet::nodeapi::logs::parse_line(line) {
                        total += e.text.len() as u64 + u64::from(e.full);
                    }
                }
                partial.drain(..end);
            }
            Err(_) => break,
        }
    }
    total
}

/// The flood pod's follow throughput through the side's API and of the file itself, MB/s.
fn follow_throughput(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    side: &Side,
    secs: u64,
) -> (f64, f64) {
    let pod = format!("flood-{}", side.node);
    // Log directories an interrupted run left (a static pod's UID is the same every run).
    for e in std::fs::read_dir(&side.logs)
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("default_{pod}_"))
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    put_manifest(side.manifests, "flood.yaml", FLOOD);
    wait_running(rt, cri, &pod, 1, 60);
    let deadline = Instant::now() + Duration::from_secs(30);
    let file = loop {
        let dir = std::fs::read_dir(&side.logs).ok().and_then(|d| {
            d.flatten()
                .find(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("default_{pod}_"))
                })
                .map(|e| e.path().join("c/0.log"))
        });
        if let Some(f) = dir.filter(|f| f.exists()) {
            break f;
        }
        assert!(Instant::now() < deadline, "no log file of {pod}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Sets `stop` when dropped, so that the file reader ends on a panic too (the scope would
    /// wait for it forever).
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let (followed, direct) = std::thread::scope(|s| {
        let guard = Stop(&stop);
        // From the last line on, as the file reader: the same stretch of output for both.
        let url = format!(
            "{}/containerLogs/default/{pod}/c?follow=true&tailLines=1",
            side.api
        );
        let c = reqwest::blocking::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        // kubelet answers 400 until its status cache has the container running.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut r = loop {
            let r = c.get(&url).send().unwrap();
            if r.status().is_success() {
                break r;
            }
            assert!(Instant::now() < deadline, "{url}: {}", r.status());
            std::thread::sleep(Duration::from_millis(200));
        };
        let direct = s.spawn(|| tail_file(&file, &stop));
        let t0 = Instant::now();
        let mut total = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        while t0.elapsed() < Duration::from_secs(secs) {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n as u64,
            }
        }
        drop(guard);
        (total, direct.join().unwrap())
    });
    std::fs::remove_file(side.manifests.join("flood.yaml")).unwrap();
    let mb = |b: u64| b as f64 / 1e6 / secs as f64;
    (mb(followed), mb(direct))
}

/// Every measurement on one started side with its pods written; then its pods removed.
fn measure(rt: &tokio::runtime::Runtime, cri: &Cri, side: &Side, pods: usize) -> Figures {
    let t = Instant::now();
    for i in 0..pods {
        put_manifest(
            side.manifests,
            &format!("p{i}.yaml"),
            &manifest(&format!("p{i}")),
        );
    }
    wait_running(rt, cri, &format!("-{}", side.node), pods, 300);
    eprintln!(
        "  {}: {pods} pods running in {:.1} s",
        side.name,
        t.elapsed().as_secs_f64()
    );
    let idle_secs = env_usize("IDLE_SECONDS", 10) as f64;
    let c0 = agent::cpu_seconds_fine(side.pid);
    std::thread::sleep(Duration::from_secs_f64(idle_secs));
    let idle_rate = (agent::cpu_seconds_fine(side.pid) - c0) / idle_secs;
    let scrapes = env_usize("SCRAPES", 50);
    let summary = scrape(side, "/stats/summary", idle_rate, scrapes);
    let resource = scrape(side, "/metrics/resource", idle_rate, scrapes);
    let mut raw: Vec<f64> = (0..scrapes)
        .map(|_| {
            let t = Instant::now();
            rt.block_on(cri.list_container_stats(Default::default()))
                .unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let (raw_stats_p50_ms, raw_stats_p99_ms) = (quantile(&mut raw, 0.5), quantile(&mut raw, 0.99));
    let (exec_p50_ms, exec_p99_ms) =
        exec_latency(&format!("p0-{}", side.node), env_usize("EXECS", 20));
    let (follow_mbps, file_mbps) =
        follow_throughput(rt, cri, side, env_usize("FOLLOW_SECONDS", 10) as u64);
    for i in 0..pods {
        let _ = std::fs::remove_file(side.manifests.join(format!("p{i}.yaml")));
    }
    let f = Figures {
        idle_cpu_pct: idle_rate * 100.0,
        summary,
        resource,
        raw_stats_p50_ms,
        raw_stats_p99_ms,
        exec_p50_ms,
        exec_p99_ms,
        follow_mbps,
        file_mbps,
    };
    eprintln!("  {}: {f:?}", side.name);
    f
}

/// Waits until no container of pods `*-<node>` is left in containerd (at most `secs`).
fn wait_gone(rt: &tokio::runtime::Runtime, cri: &Cri, node: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline && running(rt, cri, &format!("-{node}")) > 0 {
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn node_kubeconfig(name: &str) -> String {
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/env/cluster.sh"
        ))
        .args(["node-kubeconfig", name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster.sh node-kubeconfig: {} (run scripts/env/cluster.sh first)",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn run_nodelet(rt: &tokio::runtime::Runtime, cri: &Cri, pods: usize) -> Figures {
    let node = "bench-napi-nodelet";
    let _ = kubectl(&["delete", "node", node, "--wait=false"]);
    peer::remove_pods_of(&agent::socket(), node);
    let a = agent::start_with_args(
        Path::new(env!("CARGO_BIN_EXE_nodelet")),
        node,
        "address: 0.0.0.0\nmaxPods: 250\nauthentication: {anonymous: {enabled: true}}\nauthorization: {mode: AlwaysAllow}\n",
        Stdio::null(),
        vec!["--kubeconfig".into(), node_kubeconfig(node)],
    );
    let side = Side {
        name: "nodelet",
        node,
        pid: a.child.id(),
        api: format!("https://127.0.0.1:{}", a.api_port),
        manifests: &a.manifests,
        logs: a.logs.clone(),
    };
    let f = measure(rt, cri, &side, pods);
    wait_gone(rt, cri, node, 120);
    drop(a);
    peer::remove_pods_of(&agent::socket(), node);
    f
}

fn run_kubelet(rt: &tokio::runtime::Runtime, cri: &Cri, bin: &Path, pods: usize) -> Figures {
    let node = "bench-napi-kubelet";
    let _ = kubectl(&["delete", "node", node, "--wait=false"]);
    peer::remove_pods_of(&agent::socket(), node);
    let k = peer::start(bin, node, &agent::socket(), Some(&node_kubeconfig(node)));
    let side = Side {
        name: "kubelet",
        node,
        pid: k.pid(),
        api: format!("https://127.0.0.1:{}", k.api_port),
        manifests: &k.manifests,
        logs: PathBuf::from("/var/log/pods"),
    };
    let f = measure(rt, cri, &side, pods);
    wait_gone(rt, cri, node, 120);
    k.stop();
    f
}

/// A line of the table: its name and how to read it off one side's figures.
type Row<'a> = (&'a str, &'a dyn Fn(&Figures) -> f64);

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    quantile(&mut v, 0.5)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let pods = env_usize("PODS", 110);
    let reps = env_usize("REPS", 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sock = PathBuf::from(agent::socket());
    let cri = rt.block_on(async {
        Cri::new(
            &sock,
            &sock,
            Duration::from_secs(60),
            nodelet::metrics::Metrics::new(),
        )
    });
    let kubelet = peer::binary().and_then(|bin| {
        let others = peer::foreign_pods(&rt, &cri, &["bench-napi-nodelet", "bench-napi-kubelet"]);
        if others.is_empty() {
            Ok(bin)
        } else {
            Err(format!(
                "kubelet side skipped: kubelet would remove the other pods on this containerd ({}); stop the agent that runs them (scripts/up.sh's nodelet: `pkill -x nodelet`) first",
                others.join(", ")
            ))
        }
    });
    if let Err(why) = &kubelet {
        eprintln!("{why}");
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        eprintln!("repetition {}/{reps}", rep + 1);
        ours.push(run_nodelet(&rt, &cri, pods));
        if let Ok(bin) = &kubelet {
            theirs.push(run_kubelet(&rt, &cri, bin, pods));
        }
    }
    let col = |v: &[Figures], f: &dyn Fn(&Figures) -> f64| -> f64 {
        median(&v.iter().map(f).collect::<Vec<_>>())
    };
    println!("\nnode API at {pods} pods, median of {reps} (nodelet | kubelet | ratio)");
    let rows: [Row; 18] = [
        ("idle CPU, % of a core", &|f| f.idle_cpu_pct),
        ("/stats/summary CPU per scrape, ms", &|f| f.summary.cpu_ms),
        ("  of which in the kernel, ms", &|f| f.summary.sys_ms),
        ("/stats/summary p50, ms", &|f| f.summary.p50_ms),
        ("/stats/summary p99, ms", &|f| f.summary.p99_ms),
        ("/stats/summary size, KiB", &|f| f.summary.kib),
        ("/metrics/resource CPU per scrape, ms", &|f| {
            f.resource.cpu_ms
        }),
        ("  of which in the kernel, ms", &|f| f.resource.sys_ms),
        ("/metrics/resource p50, ms", &|f| f.resource.p50_ms),
        ("/metrics/resource p99, ms", &|f| f.resource.p99_ms),
        ("/metrics/resource size, KiB", &|f| f.resource.kib),
        ("raw CRI ListContainerStats p50, ms", &|f| {
            f.raw_stats_p50_ms
        }),
        ("raw CRI ListContainerStats p99, ms", &|f| {
            f.raw_stats_p99_ms
        }),
        ("kubectl exec -- true p50, ms", &|f| f.exec_p50_ms),
        ("kubectl exec -- true p99, ms", &|f| f.exec_p99_ms),
        ("logs follow, MB/s", &|f| f.follow_mbps),
        ("the log file read directly, MB/s", &|f| f.file_mbps),
        ("follow / file", &|f| f.follow_mbps / f.file_mbps.max(1e-9)),
    ];
    for (name, f) in rows {
        let a = col(&ours, f);
        if theirs.is_empty() {
            println!("{name:<40} {a:>10.2}");
        } else {
            let b = col(&theirs, f);
            println!("{name:<40} {a:>10.2} {b:>10.2} {:>8.2}", a / b.max(1e-9));
        }
    }
}
