//! Months of uptime in minutes (issue 35): pods created and removed every 2 s, containers that
//! crash-loop, a container whose log rotates, for `CHURN_SECONDS` (default 180, the form CI
//! runs; 1800 for the long form), on nodelet and then, when it is built, on kubelet v1.20.2
//! (`../shared/tools/kubelet-peer.sh build`; `CHURN_PEER=0` leaves it out), never both at once,
//! on one containerd.
//!
//! What it counts, after a warm-up (the steady pods running, one round of churn done and gone)
//! and again after the churn (its pods gone and the agent settled): the node's sandboxes and
//! containers in the runtime (a crash-looping pod's running instance left out: it comes and
//! goes), images, pod-level and QoS cgroup directories, pod directories, pod log directories,
//! the agent's open descriptors and threads, and its RSS. nodelet must end where it started
//! (every count equal, threads within the blocking pool's `MAX_THREADS`, which grows and shrinks
//! with the pod workers' file-system steps) with RSS growth under 1 MiB; kubelet's are printed
//! beside it. Exit status 1 when nodelet does not.
//!
//! Image garbage collection is off for both (`imageGCHighThresholdPercent: 100`): on a disk more
//! than 85% used it would remove the environment's unused images, a change of the store that is
//! not the agent's leak (tests/garbage_collection.rs covers it).

// Benchmark code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod agent;
mod peer;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent::env_usize;
use nodelet::cri::{api, Cri, ImageService, RuntimeService};

/// A pod created and one removed every this often.
const PERIOD: Duration = Duration::from_secs(2);
/// How long the warm-up churns before the first census.
const WARM_UP: Duration = Duration::from_secs(30);
/// Longest wait for the churned pods to be gone and the counts to settle.
const SETTLE: Duration = Duration::from_secs(150);

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Census {
    sandboxes: usize,
    containers: usize,
    images: usize,
    cgroup_dirs: usize,
    pod_dirs: usize,
    log_dirs: usize,
    fds: usize,
    threads: usize,
    rss_kib: u64,
}

impl Census {
    /// Everything but RSS.
    fn counts(&self) -> [usize; 8] {
        [
            self.sandboxes,
            self.containers,
            self.images,
            self.cgroup_dirs,
            self.pod_dirs,
            self.log_dirs,
            self.fds,
            self.threads,
        ]
    }
}

/// Where an agent keeps what the census counts.
struct Site {
    node: String,
    pid: u32,
    manifests: PathBuf,
    root_dir: PathBuf,
    logs_dir: PathBuf,
    cgroup_root: String,
}

struct Ctx {
    rt: tokio::runtime::Runtime,
    cri: Cri,
}

impl Ctx {
    fn census(&self, s: &Site) -> Census {
        let suffix = format!("-{}", s.node);
        let sandboxes: Vec<api::PodSandbox> = self
            .rt
            .block_on(self.cri.list_pod_sandbox(Default::default()))
            .unwrap_or_default()
            .into_iter()
            .filter(|sb| {
                sb.metadata
                    .as_ref()
                    .is_some_and(|m| m.name.ends_with(&suffix))
            })
            .collect();
        let ids: HashSet<&str> = sandboxes.iter().map(|sb| sb.id.as_str()).collect();
        let crash: HashSet<&str> = sandboxes
            .iter()
            .filter(|sb| {
                sb.metadata
                    .as_ref()
                    .is_some_and(|m| m.name.starts_with("crash-"))
            })
            .map(|sb| sb.id.as_str())
            .collect();
        let containers = self
            .rt
            .block_on(self.cri.list_containers(Default::default()))
            .unwrap_or_default()
            .into_iter()
            .filter(|c| ids.contains(c.pod_sandbox_id.as_str()))
            .filter(|c| {
                !(crash.contains(c.pod_sandbox_id.as_str())
                    && c.state == api::ContainerState::ContainerRunning as i32)
            })
            .count();
        let images = self
            .rt
            .block_on(self.cri.list_images())
            .map(|v| v.len())
            .unwrap_or(0);
        let proc_dir = PathBuf::from(format!("/proc/{}", s.pid));
        let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
        let rss_kib = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Census {
            sandboxes: sandboxes.len(),
            containers,
            images,
            cgroup_dirs: pod_cgroups(&s.cgroup_root),
            pod_dirs: entries(&s.root_dir.join("pods"), |_| true),
            log_dirs: entries(&s.logs_dir, |n| n.contains(&format!("{suffix}_"))),
            fds: entries(&proc_dir.join("fd"), |_| true),
            threads: entries(&proc_dir.join("task"), |_| true),
            rss_kib,
        }
    }
}

fn entries(dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| keep(&e.file_name().to_string_lossy()))
                .count()
        })
        .unwrap_or(0)
}

/// Pod-level and QoS cgroup directories under `root` in every hierarchy (a container's own
/// cgroup comes and goes with a crash-looping instance, so it is not counted).
fn pod_cgroups(root: &str) -> usize {
    fn walk(dir: &Path, depth: usize, n: &mut usize) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("pod") {
                *n += 1;
            } else if depth < 2 && ["kubepods", "burstable", "besteffort"].contains(&name.as_str())
            {
                *n += 1;
                walk(&e.path(), depth + 1, n);
            }
        }
    }
    let mut n = 0;
    for m in nodelet::cm::cgroup_mounts() {
        walk(&m.join(root.trim_start_matches('/')), 0, &mut n);
    }
    n
}

fn steady_pods() -> Vec<(String, String)> {
    let crash = |name: &str| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'echo starting; sleep 1; exit 1']\n")
    };
    vec![
        ("crash-a.yaml".into(), crash("crash-a")),
        ("crash-b.yaml".into(), crash("crash-b")),
        (
            "logger.yaml".into(),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: logger}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'trap \"exit 0\" TERM; i=0; while true; do i=$((i+1)); echo \"line $i 0123456789012345678901234567890123456789012345678901234567890123456789\"; if [ $((i % 200)) = 0 ]; then sleep 0.1; fi; done']\n".into(),
        ),
    ]
}

fn churn_pod(i: usize) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: churn-{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'trap \"exit 0\" TERM; echo up; sleep 3600 & wait']\n    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n  volumes:\n  - {{name: scratch, emptyDir: {{}}}}\n")
}

/// Churns for `d` from pod number `from`: every [`PERIOD`] a pod is written and the one before
/// it removed. Returns the next number.
fn churn(manifests: &Path, from: usize, d: Duration) -> usize {
    let end = Instant::now() + d;
    let mut i = from;
    let mut next = Instant::now();
    while Instant::now() < end {
        let tmp = manifests.join(format!(".churn-{i}.tmp"));
        std::fs::write(&tmp, churn_pod(i)).unwrap();
        std::fs::rename(&tmp, manifests.join(format!("churn-{i}.yaml"))).unwrap();
        if i > from {
            let _ = std::fs::remove_file(manifests.join(format!("churn-{}.yaml", i - 1)));
        }
        i += 1;
        next += PERIOD;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let _ = std::fs::remove_file(manifests.join(format!("churn-{}.yaml", i - 1)));
    i
}

/// Waits until no churned pod has a sandbox and the census holds still for 10 s (or `SETTLE`
/// passes); returns it.
fn settled(ctx: &Ctx, s: &Site) -> Census {
    let deadline = Instant::now() + SETTLE;
    let mut last = ctx.census(s);
    let mut since = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        let now = ctx.census(s);
        let churn_left = ctx
            .rt
            .block_on(ctx.cri.list_pod_sandbox(Default::default()))
            .unwrap_or_default()
            .iter()
            .any(|sb| {
                sb.metadata
                    .as_ref()
                    .is_some_and(|m| m.name.starts_with("churn-") && m.name.ends_with(&s.node))
            });
        if now.counts() != last.counts() || churn_left {
            since = Instant::now();
        }
        last = now;
        if !churn_left && since.elapsed() >= Duration::from_secs(10) {
            break;
        }
    }
    last
}

/// One agent's run: the steady pods, a warm-up, the census, the churn, the census.
fn run(ctx: &Ctx, s: &Site, seconds: u64) -> (Census, Census, usize) {
    for (file, text) in steady_pods() {
        std::fs::write(s.manifests.join(file), text).unwrap();
    }
    let next = churn(&s.manifests, 0, WARM_UP);
    let start = settled(ctx, s);
    eprintln!("  {}: start {start:?}", s.node);
    let end_i = churn(&s.manifests, next, Duration::from_secs(seconds));
    let end = settled(ctx, s);
    eprintln!("  {}: end   {end:?}", s.node);
    (start, end, end_i - next)
}

fn row(name: &str, a: &str, b: &str) {
    println!("| {name} | {a} | {b} |");
}

fn main() {
    let seconds = env_usize("CHURN_SECONDS", 180) as u64;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = agent::cri_with_busybox(&rt);
    let ctx = Ctx { rt, cri };
    let logs =
        "containerLogMaxSize: 64Ki\ncontainerLogMaxFiles: 3\nimageGCHighThresholdPercent: 100\n";

    eprintln!("churn: nodelet, {seconds} s");
    let node = format!("churn-{}", std::process::id());
    let a = agent::start(
        &node,
        &format!("maxPods: 250\n{logs}"),
        std::process::Stdio::null(),
    );
    let site = Site {
        node: a.node.clone(),
        pid: a.child.id(),
        manifests: a.manifests.clone(),
        root_dir: a.dir.path().join("root"),
        logs_dir: a.logs.clone(),
        cgroup_root: a.cgroup_root.clone(),
    };
    let (n0, n1, pods) = run(&ctx, &site, seconds);
    drop(a);
    peer::remove_pods_of(&agent::socket(), &node);
    // The pods' cgroups were busy when the agent went: its cgroupRoot goes now that they are gone.
    let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &site.cgroup_root);

    let peer_wanted = env_usize("CHURN_PEER", 1) != 0;
    let kubelet = if peer_wanted {
        peer::binary()
    } else {
        Err("not run (CHURN_PEER=0)".to_owned())
    };
    let kubelet = kubelet.map(|bin| {
        eprintln!("churn: kubelet v1.20.2, {seconds} s");
        let node = format!("churn-k-{}", std::process::id());
        let k = peer::start_with(&bin, &node, &agent::socket(), None, logs);
        let site = Site {
            node: k.node.clone(),
            pid: k.pid(),
            manifests: k.manifests.clone(),
            root_dir: k.dir.path().join("root"),
            logs_dir: PathBuf::from("/var/log/pods"),
            cgroup_root: "/kubeletpeer".into(),
        };
        let r = run(&ctx, &site, seconds);
        drop(k);
        r
    });

    println!("\n## churn: {pods} pods created and removed over {seconds} s, crash-looping and log-rotating pods beside them\n");
    println!("| after the churn − before | nodelet | kubelet v1.20.2 |");
    println!("|---|---|---|");
    let names = [
        "sandboxes",
        "containers",
        "images",
        "pod and QoS cgroup directories",
        "pod directories",
        "pod log directories",
        "open descriptors",
        "threads",
    ];
    let delta = |a: usize, b: usize| format!("{:+} ({a} → {b})", b as i64 - a as i64);
    for (i, name) in names.iter().enumerate() {
        let k = match &kubelet {
            Ok((k0, k1, _)) => delta(k0.counts()[i], k1.counts()[i]),
            Err(e) => e.clone(),
        };
        row(name, &delta(n0.counts()[i], n1.counts()[i]), &k);
    }
    let rss = |a: &Census, b: &Census| {
        format!(
            "{:+.2} MiB ({:.1} → {:.1} MiB)",
            (b.rss_kib as f64 - a.rss_kib as f64) / 1024.0,
            a.rss_kib as f64 / 1024.0,
            b.rss_kib as f64 / 1024.0
        )
    };
    let k_rss = match &kubelet {
        Ok((k0, k1, _)) => rss(k0, k1),
        Err(e) => e.clone(),
    };
    row("RSS", &rss(&n0, &n1), &k_rss);

    let mut ok = true;
    // Threads are held to the blocking pool's bound, not to equality: tokio's blocking pool (a
    // pod worker's file-system steps, at most `nodelet::blocking::MAX_THREADS` threads) lets a
    // thread go after 10 s idle, so either census may find it full or empty, depending on the
    // crash-looping pods' last restart. A thread leaked per churned pod (90 of them) still shows.
    let (c0, c1) = (n0.counts(), n1.counts());
    if c0[..7] != c1[..7] || n1.threads > n0.threads + nodelet::blocking::MAX_THREADS {
        eprintln!("churn: FAILED: nodelet's counts changed: {n0:?} → {n1:?}");
        ok = false;
    }
    let growth = n1.rss_kib as i64 - n0.rss_kib as i64;
    if growth >= 1024 {
        eprintln!("churn: FAILED: nodelet's RSS grew {growth} KiB (limit: under 1024)");
        ok = false;
    }
    if !ok {
        std::process::exit(1);
    }
}
