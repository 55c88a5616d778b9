//! The command line at `PODS` pods (issue 34; default 110): `nodelet get pods` timed from the
//! process's start to its exit (`RUNS` times, default 30, after 3 unmeasured), against two
//! baselines measured in the same run and interleaved with it:
//!
//! - **raw CRI**: what `crictl pods` + `crictl ps` ask, `ListPodSandbox` and `ListContainers` on a
//!   fresh connection to containerd, in this process (no process start): the runtime's own
//!   answer about the same pods, the physical limit of a listing;
//! - **process start**: `nodelet --version`, the cost of starting the binary at all.
//!
//! Also timed: `get pods -o wide -A`, `describe pod`, `top pods`, `events`; and the agent's CPU
//! per `get pods` (its schedstat over the loop). kubelet has no command line to compare with.
//! Target: `get pods` p50 ≤ 100 ms.
//!
//! Run: `cargo bench --bench cli` (needs scripts/env/up.sh).
// Benchmark code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent::env_usize;
use nodelet::cri::{Cri, RuntimeService};

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

/// Milliseconds one run of `nodelet <args>` takes, start to exit; panics when it fails.
fn timed(root: &Path, args: &[&str]) -> f64 {
    let t = Instant::now();
    let st = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(root)
        .args(args)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    assert!(st.success(), "nodelet {args:?} failed");
    ms
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let pods = env_usize("PODS", 110);
    let runs = env_usize("RUNS", 30);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sock = PathBuf::from(agent::socket());
    let a = agent::start("bench-cli", "maxPods: 250\n", Stdio::null());
    let root = a.dir.path().join("root");
    for i in 0..pods {
        let tmp = a.dir.path().join(format!(".p{i}.yaml"));
        std::fs::write(&tmp, manifest(&format!("p{i}"))).unwrap();
        std::fs::rename(&tmp, a.manifests.join(format!("p{i}.yaml"))).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .arg("--root-dir")
            .arg(&root)
            .args(["get", "pods"])
            .output()
            .unwrap();
        let running = String::from_utf8_lossy(&out.stdout)
            .matches(" Running ")
            .count();
        if running >= pods {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{running} of {pods} pods running"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(3));
    for _ in 0..3 {
        timed(&root, &["get", "pods"]);
    }
    let raw = || {
        let t = Instant::now();
        rt.block_on(async {
            let cri = Cri::new(
                &sock,
                &sock,
                Duration::from_secs(60),
                nodelet::metrics::Metrics::new(),
            );
            let s = cri.list_pod_sandbox(HashMap::new()).await.unwrap();
            let c = cri.list_containers(HashMap::new()).await.unwrap();
            assert!(s.len() >= pods && c.len() >= pods);
        });
        t.elapsed().as_secs_f64() * 1000.0
    };
    let pid = a.child.id();
    let (mut get, mut base, mut start) = (Vec::new(), Vec::new(), Vec::new());
    let mut agent_cpu = 0.0;
    for _ in 0..runs {
        let c0 = agent::cpu_seconds_fine(pid);
        get.push(timed(&root, &["get", "pods"]));
        agent_cpu += agent::cpu_seconds_fine(pid) - c0;
        base.push(raw());
        start.push(timed(&root, &["--version"]));
    }
    let mut others: Vec<(&str, Vec<f64>)> = Vec::new();
    for (label, args) in [
        (
            "get pods -o wide -A",
            &["get", "pods", "-o", "wide", "-A"][..],
        ),
        ("describe pod p0", &["describe", "pod", "p0"][..]),
        ("top pods", &["top", "pods"][..]),
        ("events", &["events"][..]),
    ] {
        others.push((
            label,
            (0..runs.min(10)).map(|_| timed(&root, args)).collect(),
        ));
    }
    let (g50, g99) = (percentile(&mut get, 0.5), percentile(&mut get, 0.99));
    let (b50, b99) = (percentile(&mut base, 0.5), percentile(&mut base, 0.99));
    let (s50, s99) = (percentile(&mut start, 0.5), percentile(&mut start, 0.99));
    println!("\n## nodelet command line at {pods} pods ({runs} runs, interleaved)\n");
    println!("| | p50 ms | p99 ms | p50 / raw CRI |");
    println!("|---|---|---|---|");
    println!(
        "| `nodelet get pods` (process start to exit) | {g50:.1} | {g99:.1} | {:.2} |",
        g50 / b50
    );
    println!("| raw CRI: ListPodSandbox + ListContainers, fresh connection | {b50:.1} | {b99:.1} | 1.00 |");
    println!(
        "| process start: `nodelet --version` | {s50:.1} | {s99:.1} | {:.2} |",
        s50 / b50
    );
    for (label, mut v) in others {
        let (p50, p99) = (percentile(&mut v, 0.5), percentile(&mut v, 0.99));
        println!(
            "| `nodelet {label}` | {p50:.1} | {p99:.1} | {:.2} |",
            p50 / b50
        );
    }
    println!(
        "\nagent CPU per `get pods`: {:.2} ms; target get pods p50 <= 100 ms: {}",
        agent_cpu * 1000.0 / runs as f64,
        if g50 <= 100.0 { "met" } else { "NOT met" }
    );
    for e in std::fs::read_dir(&a.manifests).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while rt.block_on(async {
        let cri = Cri::new(
            &sock,
            &sock,
            Duration::from_secs(60),
            nodelet::metrics::Metrics::new(),
        );
        let sel: HashMap<String, String> = [(
            nodelet::kuberuntime::labels::NODE_NAME.to_string(),
            "bench-cli".to_string(),
        )]
        .into();
        cri.list_pod_sandbox(sel)
            .await
            .map(|s| s.len())
            .unwrap_or(1)
    }) > 0
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut a = a;
    let _ = a.child.kill();
    let _ = a.child.wait();
}
