//! PLEG latency and relist cost on the real containerd.
//!
//! 1. Container exit → ContainerDied event, over `EXITS` exits (default 50), for two PLEGs running
//!    side by side in the same process on the same containers: one fed by containerd's event
//!    stream (relist as safety net), one relisting every 1 s only (kubelet's generic PLEG).
//!    Latency = time the event is received − the container's `finishedAt` from containerd.
//! 2. A relist with `PODS` (default 110) running one-container pods and no change: CRI calls per
//!    relist (from the client's operation counters) and time per relist over `ROUNDS` relists
//!    (default 100, so that p99 is not the slowest one).
//!
//! 3. The two listings of a relist over those pods, decoded in full and briefly
//!    (`nodelet::cri::brief`), interleaved round by round: this process's CPU time and its heap
//!    allocations (counted by the bench's global allocator) per pair of listings.
//!
//! Run: `cargo bench --bench pleg` (needs scripts/env/up.sh).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use nodelet::container::cache::PodCacheWriter;
use nodelet::cri::{api, Cri, ImageService, RuntimeService};
use nodelet::kuberuntime::container::{container_config, ContainerInputs};
use nodelet::kuberuntime::sandbox::sandbox_config;
use nodelet::kuberuntime::Settings;
use nodelet::pleg::{Pleg, PodLifecycleEvent, PodLifecycleEventType};

/// The system allocator, counting allocations (part 3).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// This process's CPU time (user + system), seconds, from getrusage(2): microsecond
/// resolution, where /proc's clock ticks are 10 ms.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given and keeps no pointer.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut ru), 0);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

struct Bench {
    cri: Cri,
    settings: Settings,
    image: String,
    cgroup_root: String,
}

impl Bench {
    fn pod(&self, name: &str, uid: &str) -> Pod {
        let mut pod: Pod = serde_yaml::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec:\n  nodeName: {}\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]\n",
            self.settings.node_name
        ))
        .unwrap();
        pod.metadata.name = Some(name.into());
        pod
    }

    async fn sandbox(&self, pod: &Pod) -> (String, api::PodSandboxConfig) {
        let uid = pod.metadata.uid.clone().unwrap();
        let cg = format!("{}/pod{uid}", self.cgroup_root);
        let cfg = sandbox_config(&self.settings, pod, 0, cg);
        std::fs::create_dir_all(&cfg.log_directory).unwrap();
        (
            self.cri.run_pod_sandbox(cfg.clone(), "").await.unwrap(),
            cfg,
        )
    }

    async fn container(
        &self,
        pod: &Pod,
        sb: &str,
        cfg: &api::PodSandboxConfig,
        attempt: u32,
    ) -> String {
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let cc = container_config(
            &self.settings,
            pod,
            c,
            &ContainerInputs {
                restart_count: attempt,
                image_ref: &self.image,
                pod_ips: &[],
                is_init: false,
                env_sources: nodelet::kuberuntime::container::EnvSources {
                    objects: &Default::default(),
                    services: &[],
                },
            },
        )
        .unwrap();
        let id = self
            .cri
            .create_container(sb, cc, cfg.clone())
            .await
            .unwrap();
        self.cri.start_container(&id).await.unwrap();
        id
    }
}

async fn wait_for(
    rx: &crossbeam_channel::Receiver<PodLifecycleEvent>,
    id: &str,
    kind: PodLifecycleEventType,
    deadline: Instant,
) -> Option<i64> {
    while Instant::now() < deadline {
        while let Ok(ev) = rx.try_recv() {
            if ev.container_id == id && ev.kind == kind {
                return Some(now_ns());
            }
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    None
}

fn main() {
    let exits = env_usize("EXITS", 50);
    let pods = env_usize("PODS", 110);
    let sock = PathBuf::from("/run/nodelet-env/containerd/containerd.sock");
    assert!(sock.exists(), "run scripts/env/up.sh first");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let metrics = nodelet::metrics::Metrics::new();
    let cri =
        rt.block_on(async { Cri::new(&sock, &sock, Duration::from_secs(120), metrics.clone()) });
    rt.block_on(cri.pull_image("busybox:1.36", None, None))
        .unwrap();
    let image = rt
        .block_on(cri.image_status("busybox:1.36"))
        .unwrap()
        .unwrap()
        .id;
    let node = format!("plegbench{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::example();
    settings.node_name = node.clone();
    settings.pod_logs_dir = dir.path().to_owned();
    let b = Bench {
        cri: cri.clone(),
        settings,
        image,
        cgroup_root: format!("/nodelet-bench-{node}"),
    };

    // Two PLEGs on the same runtime: with the event stream, and relist-only.
    let (tx_ev, rx_ev) = crossbeam_channel::bounded(nodelet::pleg::CHANNEL_CAPACITY);
    let (tx_rl, rx_rl) = crossbeam_channel::bounded(nodelet::pleg::CHANNEL_CAPACITY);
    let with_events = Pleg::new(
        cri.clone(),
        node.clone(),
        PodCacheWriter::default(),
        tx_ev,
        nodelet::metrics::Metrics::new(),
    );
    let relist_only = Pleg::new(
        cri.clone(),
        node.clone(),
        PodCacheWriter::default(),
        tx_rl,
        nodelet::metrics::Metrics::new(),
    );
    rt.spawn(nodelet::pleg::events::run(
        sock.clone(),
        with_events.clone(),
    ));
    rt.spawn(with_events.clone().run());
    rt.spawn(relist_only.clone().run());

    let pod = b.pod("exiter", &format!("bench-exiter-{}", std::process::id()));
    let (sb, sb_cfg) = rt.block_on(b.sandbox(&pod));
    let (mut lat_ev, mut lat_rl) = (Vec::new(), Vec::new());
    let mut missed = (0, 0);
    for i in 0..exits {
        let id = rt.block_on(b.container(&pod, &sb, &sb_cfg, i as u32));
        // Both PLEGs must have seen it running before it dies.
        let deadline = Instant::now() + Duration::from_secs(3);
        let seen = rt.block_on(async {
            tokio::join!(
                wait_for(
                    &rx_ev,
                    &id,
                    PodLifecycleEventType::ContainerStarted,
                    deadline
                ),
                wait_for(
                    &rx_rl,
                    &id,
                    PodLifecycleEventType::ContainerStarted,
                    deadline
                )
            )
        });
        assert!(
            seen.0.is_some() && seen.1.is_some(),
            "both PLEGs saw the container start"
        );
        // Kill at a spread of moments within the relist period, not right after a relist.
        let jitter_ms = (i as u64 * 7919 + 104_729) % 1000;
        std::thread::sleep(Duration::from_millis(jitter_ms));
        // The waiters run on their own tasks from before the kill, so a receipt is timed when
        // it happens, not when StopContainer returns (which is after containerd's task delete).
        let deadline = Instant::now() + Duration::from_secs(3);
        let (rx_a, rx_b, id_a, id_b) = (rx_ev.clone(), rx_rl.clone(), id.clone(), id.clone());
        let wa = rt.spawn(async move {
            wait_for(&rx_a, &id_a, PodLifecycleEventType::ContainerDied, deadline).await
        });
        let wb = rt.spawn(async move {
            wait_for(&rx_b, &id_b, PodLifecycleEventType::ContainerDied, deadline).await
        });
        rt.block_on(cri.stop_container(&id, 0)).unwrap();
        let finished = rt
            .block_on(cri.container_status(&id))
            .unwrap()
            .unwrap()
            .finished_at;
        let (a, r) = rt.block_on(async { (wa.await.unwrap(), wb.await.unwrap()) });
        match a {
            Some(t) => lat_ev.push((t - finished) as f64 / 1e6),
            None => missed.0 += 1,
        }
        match r {
            Some(t) => lat_rl.push((t - finished) as f64 / 1e6),
            None => missed.1 += 1,
        }
        rt.block_on(cri.remove_container(&id)).unwrap();
    }
    let _ = rt.block_on(cri.stop_pod_sandbox(&sb));
    let _ = rt.block_on(cri.remove_pod_sandbox(&sb));
    println!("container exit -> PLEG ContainerDied, {exits} exits, same run:");
    println!(
        "  event stream + relist safety net: median {:.1} ms, p99 {:.1} ms (missed {})",
        pct(&mut lat_ev.clone(), 0.5),
        pct(&mut lat_ev.clone(), 0.99),
        missed.0
    );
    println!(
        "  relist only (1 s):                median {:.1} ms, p99 {:.1} ms (missed {})",
        pct(&mut lat_rl.clone(), 0.5),
        pct(&mut lat_rl.clone(), 0.99),
        missed.1
    );
    println!(
        "  ratio median stream/relist: {:.3}",
        pct(&mut lat_ev.clone(), 0.5) / pct(&mut lat_rl.clone(), 0.5)
    );

    // Relist cost with many running pods and no change.
    let t0 = Instant::now();
    let mut sandboxes = Vec::new();
    for i in 0..pods {
        let p = b.pod(
            &format!("p{i}"),
            &format!("bench-many-{i}-{}", std::process::id()),
        );
        let (sb, cfg) = rt.block_on(b.sandbox(&p));
        rt.block_on(b.container(&p, &sb, &cfg, 0));
        sandboxes.push(sb);
    }
    println!(
        "started {pods} pods directly in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let (tx, _rx) = crossbeam_channel::bounded(100_000);
    let m = nodelet::metrics::Metrics::new();
    let counted =
        rt.block_on(async { Cri::new(&sock, &sock, Duration::from_secs(120), m.clone()) });
    let quiet = Pleg::new(
        counted,
        node.clone(),
        PodCacheWriter::default(),
        tx,
        nodelet::metrics::Metrics::new(),
    );
    let first = rt.block_on(quiet.relist()).unwrap().len();
    let calls_before = total_calls(&m);
    let rounds = env_usize("ROUNDS", 100);
    let mut times = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let evs = rt.block_on(quiet.relist()).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(evs.is_empty(), "no change, no events");
    }
    let calls = (total_calls(&m) - calls_before) as f64 / rounds as f64;
    println!(
        "relist with {pods} running pods, no change: {calls:.1} CRI calls per relist (goal 2), median {:.2} ms, p99 {:.2} ms (first relist: {first} events)",
        pct(&mut times.clone(), 0.5),
        pct(&mut times.clone(), 0.99)
    );

    // The relist's two listings, full and brief, interleaved.
    let keep = &nodelet::kuberuntime::labels::BRIEF;
    let (mut full, mut brief) = ((0.0, 0u64, 0usize), (0.0, 0u64, 0usize));
    for _ in 0..rounds {
        for is_brief in [false, true] {
            let (c0, a0) = (cpu_seconds(), ALLOCATIONS.load(Ordering::Relaxed));
            let entries = rt.block_on(async {
                if is_brief {
                    let (s, c) = tokio::try_join!(
                        cri.list_pod_sandbox_brief(HashMap::new(), keep),
                        cri.list_containers_brief(HashMap::new(), keep)
                    )
                    .unwrap();
                    s.len() + c.len()
                } else {
                    let (s, c) = tokio::try_join!(
                        cri.list_pod_sandbox(HashMap::new()),
                        cri.list_containers(HashMap::new())
                    )
                    .unwrap();
                    s.len() + c.len()
                }
            });
            let t = if is_brief { &mut brief } else { &mut full };
            t.0 += cpu_seconds() - c0;
            t.1 += ALLOCATIONS.load(Ordering::Relaxed) - a0;
            t.2 = entries;
        }
    }
    let per = |t: (f64, u64, usize)| (t.0 * 1e3 / rounds as f64, t.1 as f64 / rounds as f64);
    let ((fc, fa), (bc, ba)) = (per(full), per(brief));
    println!(
        "a relist's two listings ({} entries), {rounds} interleaved rounds, CPU of this process and heap allocations per pair:",
        brief.2
    );
    println!("  full decode:  {fc:.3} ms, {fa:.0} allocations");
    println!("  brief decode: {bc:.3} ms, {ba:.0} allocations");
    println!(
        "  ratio brief/full: CPU {:.2}, allocations {:.2}",
        bc / fc,
        ba / fa
    );
    for s in sandboxes {
        let _ = rt.block_on(cri.stop_pod_sandbox(&s));
        let _ = rt.block_on(cri.remove_pod_sandbox(&s));
    }
    let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &b.cgroup_root);
}

fn total_calls(m: &nodelet::metrics::Metrics) -> u64 {
    let text = m.encode();
    text.lines()
        .filter(|l| l.starts_with("kubelet_runtime_operations_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
