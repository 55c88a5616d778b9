//! Eviction before the OOM killer, and how fast: a BestEffort pod allocates 4 MiB every 100 ms in
//! a kubepods cgroup limited to 256 MiB, with `allocatableMemory.available<96Mi`. Two nodelets run
//! side by side, each with its own cgroupRoot, and the runs alternate between them:
//! - **notify:** nodelet's default, woken by the kernel memory threshold notification;
//! - **poll:** `kernelMemcgNotification: false` with the 10 s monitoring period, which is how
//!   kubelet runs by default (the baseline).
//!
//! The crossing is timed by the bench's own eventfd on the same kubepods cgroup at the same
//! threshold (kubelet's formula); the kill is timed by nodelet (`killIssuedAtUnixNanos` on
//! `/node`). A run counts as "evicted before OOM" when the pod ends Failed/Evicted while the
//! kernel's `oom_kill` counter (`/proc/vmstat`) and the kubepods `memory.failcnt` did not move.
//! A Guaranteed pod runs beside the hog throughout and must survive.
//!
//! Run: `cargo bench --bench eviction` (needs scripts/env/up.sh). `RUNS=N` per side (default 20).
//! On cgroup v2 (the guest of scripts/env/vm.sh, with `NODELET_CRI_ENDPOINT` naming its
//! cgroupfs containerd) the crossing is seen by polling the kubepods `memory.current` every
//! 2 ms, and "no OOM" also means the kubepods `memory.events` `max` count did not move.
//! The two agents' logs are left in `/tmp/nodelet-bench-eviction-{notify,poll}.log`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nodelet::eviction::notifier::MemcgNotifier;

mod agent;

const LIMIT: i64 = 256 << 20;
const THRESHOLD: i64 = 96 << 20;

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

fn mem_total() -> i64 {
    use procfs::Current;
    procfs::Meminfo::current().unwrap().mem_total as i64
}

fn oom_kills() -> i64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn hog(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: hog\n    image: busybox:1.36\n    command: [sh, -c, \"while true; do head -c 4194304 /dev/zero; sleep 0.1; done | tail\"]\n"
    )
}

const STEADY: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: steady}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]\n    resources: {limits: {cpu: 100m, memory: 32Mi}}\n";

struct Side {
    name: &'static str,
    agent: agent::Agent,
    notifier: Arc<MemcgNotifier>,
    crossed: crossbeam_channel::Receiver<(SystemTime, String)>,
    /// Where the v2 crossing watcher reports (the notifier's channel).
    cross_tx: crossbeam_channel::Sender<(SystemTime, String)>,
}

#[derive(Default)]
struct Tally {
    evicted_before_oom: usize,
    oom: usize,
    latencies_ms: Vec<f64>,
    internal_ms: Vec<f64>,
}

impl Side {
    fn start(name: &'static str, extra: &str) -> Self {
        // The agent's log outlives the run, for a look after a failure.
        let log = std::fs::File::create(format!("/tmp/nodelet-bench-eviction-{name}.log")).unwrap();
        let agent = agent::start(
            &format!("bench-evict-{name}-{}", std::process::id()),
            &format!(
                "systemReserved: {{memory: \"{}\"}}\nevictionHard: {{allocatableMemory.available: \"{THRESHOLD}\"}}\nevictionPressureTransitionPeriod: 1s\n{extra}",
                mem_total() - LIMIT
            ),
            log.into(),
        );
        let notifier = MemcgNotifier::new().unwrap();
        let (tx, crossed) = crossbeam_channel::unbounded();
        notifier.clone().spawn(tx.clone(), Box::new(|| {}));
        let s = Self {
            name,
            agent,
            notifier,
            crossed,
            cross_tx: tx,
        };
        std::fs::write(s.agent.manifests.join("steady.yaml"), STEADY).unwrap();
        s.wait(Duration::from_secs(60), "steady running", |s| {
            s.pod("steady")
                .is_some_and(|p| p["status"]["phase"] == "Running")
        });
        s
    }

    fn get(&self, path: &str) -> serde_json::Value {
        reqwest::blocking::get(format!("http://127.0.0.1:{}{path}", self.agent.port))
            .and_then(|r| r.json())
            .unwrap_or_default()
    }

    fn pod(&self, name: &str) -> Option<serde_json::Value> {
        let full = format!("{name}-{}", self.agent.node);
        self.get("/pods")["items"]
            .as_array()?
            .iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
            .cloned()
    }

    /// The kubepods memory cgroup: in the v1 memory hierarchy, or the unified one (cgroup v2,
    /// in the guest of scripts/env/vm.sh).
    fn kubepods_dir(&self) -> std::path::PathBuf {
        let v1 = format!("/sys/fs/cgroup/memory{}/kubepods", self.agent.cgroup_root);
        if std::path::Path::new(&v1).exists() {
            v1.into()
        } else {
            format!("/sys/fs/cgroup{}/kubepods", self.agent.cgroup_root).into()
        }
    }

    fn v2(&self) -> bool {
        self.kubepods_dir().join("memory.current").exists()
    }

    fn kubepods(&self, file: &str) -> String {
        std::fs::read_to_string(self.kubepods_dir().join(file))
            .unwrap()
            .trim()
            .to_string()
    }

    /// The kubepods limit, bytes.
    fn limit(&self) -> i64 {
        let file = if self.v2() {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        self.kubepods(file).parse().unwrap()
    }

    /// How often kubepods hit its limit (v1 `memory.failcnt`; v2 `memory.events` `max`).
    fn failcnt(&self) -> String {
        if self.v2() {
            self.kubepods("memory.events")
                .lines()
                .find_map(|l| l.strip_prefix("max ").map(str::to_owned))
                .unwrap_or_default()
        } else {
            self.kubepods("memory.failcnt")
        }
    }

    fn wait(&self, timeout: Duration, what: &str, f: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !f(self) {
            assert!(
                Instant::now() < deadline,
                "{}: timed out: {what}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One run: the hog starts, grows, and is evicted or OOM-killed; then it is removed.
    fn run(&self, i: usize, tally: &mut Tally) {
        let dir = self.kubepods_dir();
        // The crossing, by kubelet's formula: on the bench's own eventfd (v1), or seen by a
        // thread reading memory.current every 2 ms (v2 has no usage notification).
        let inactive = nodelet::eviction::signals::inactive_file(&dir).unwrap_or(0);
        let limit = self.limit();
        let at = limit - THRESHOLD + inactive;
        let watch_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if self.v2() {
            let (tx, stop, current) = (
                self.cross_tx.clone(),
                watch_stop.clone(),
                dir.join("memory.current"),
            );
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let now: i64 = std::fs::read_to_string(&current)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if now > at {
                        let _ = tx.send((SystemTime::now(), "crossing".into()));
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
        } else {
            self.notifier.register("crossing", &dir, at as u64).unwrap();
        }
        // A hog admitted under MemoryPressure would be refused (BestEffort): start each run on a
        // node without pressure, as the previous run's pressure clears at a later pass.
        self.wait(Duration::from_secs(60), "MemoryPressure cleared", |s| {
            s.get("/node")["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["reason"] == "KubeletHasSufficientMemory")
            })
        });
        while self.crossed.try_recv().is_ok() {}
        let (ooms, failcnt) = (oom_kills(), self.failcnt());
        let name = format!("hog{i}");
        std::fs::write(
            self.agent.manifests.join(format!("{name}.yaml")),
            hog(&name),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut crossed_at = None;
        let outcome = loop {
            if let Ok((t, _)) = self.crossed.try_recv() {
                crossed_at.get_or_insert(t);
            }
            if oom_kills() != ooms {
                break "oom";
            }
            let p = self.pod(&name).unwrap_or_default();
            if p["status"]["reason"] == "Evicted" {
                let message = p["status"]["message"].as_str().unwrap_or("");
                assert!(
                    message.starts_with("The node was low on resource"),
                    "{}: run {i}: {message}",
                    self.name
                );
                break "evicted";
            }
            assert!(
                Instant::now() < deadline,
                "{}: run {i} neither evicted nor OOM",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let uid = self.pod(&name).unwrap_or_default()["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        std::fs::remove_file(self.agent.manifests.join(format!("{name}.yaml"))).unwrap();
        self.wait(Duration::from_secs(30), "hog removed", |s| {
            s.pod(&name).is_none()
        });
        watch_stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let clean = oom_kills() == ooms && self.failcnt() == failcnt;
        if outcome == "evicted" && clean {
            tally.evicted_before_oom += 1;
        } else {
            tally.oom += 1;
        }
        let node = self.get("/node");
        let rec = node["evictions"]
            .as_array()
            .and_then(|a| a.iter().rev().find(|e| e["uid"] == uid.as_str()).cloned());
        let mut latency = None;
        if let (Some(rec), Some(crossed)) = (&rec, crossed_at) {
            let kill = rec["killIssuedAtUnixNanos"].as_i64().unwrap();
            latency = Some((kill - nanos(crossed)) as f64 / 1e6);
            tally.latencies_ms.extend(latency);
            if let Some(n) = rec["notifiedAtUnixNanos"].as_i64() {
                tally.internal_ms.push((kill - n) as f64 / 1e6);
            }
        }
        assert!(
            self.pod("steady")
                .is_some_and(|p| p["status"]["phase"] == "Running"),
            "{}: the Guaranteed pod did not survive run {i}",
            self.name
        );
        println!(
            "{:6} run {i:2}: {outcome:7} clean={clean} crossing seen={} eviction recorded={} crossing → kill ms={latency:?}",
            self.name,
            crossed_at.is_some(),
            rec.is_some(),
        );
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        for f in std::fs::read_dir(&self.agent.manifests)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_file(f.path());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.get("/pods")["items"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.agent.child.kill();
        let _ = self.agent.child.wait();
        let _ = nodelet::cm::remove_cgroup_everywhere(
            &nodelet::cm::cgroup_mounts(),
            &self.agent.cgroup_root,
        );
    }
}

fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let notify = Side::start("notify", "");
    let poll = Side::start(
        "poll",
        "kernelMemcgNotification: false\nevictionMonitoringPeriod: 10s\n",
    );
    let (mut tn, mut tp) = (Tally::default(), Tally::default());
    for i in 0..runs {
        notify.run(i, &mut tn);
        poll.run(i, &mut tp);
    }
    let line = |name: &str, t: &Tally| {
        println!(
            "{name:6}: evicted before OOM {}/{runs}, OOM {}; crossing → kill issued median {:.1} ms, p99 {:.1} ms (n={}); notification → kill median {:.1} ms, p99 {:.1} ms",
            t.evicted_before_oom,
            t.oom,
            percentile(&t.latencies_ms, 0.5),
            percentile(&t.latencies_ms, 0.99),
            t.latencies_ms.len(),
            percentile(&t.internal_ms, 0.5),
            percentile(&t.internal_ms, 0.99),
        );
    };
    line("notify", &tn);
    line("poll", &tp);
    println!(
        "ratio notify/poll, crossing → kill median: {:.4}",
        percentile(&tn.latencies_ms, 0.5) / percentile(&tp.latencies_ms, 0.5)
    );
}
