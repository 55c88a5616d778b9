//! Scale (issues 14 and 36), one harness for every measurement, each against baselines in the
//! same run: raw CRI (the physical limit) and kubelet v1.20.2 (the peer, `peer::binary`).
//!
//! 1. **Burst**, `REPS` interleaved repetitions (default 5): `PODS` one-container busybox pods
//!    (default 110; requests cpu 10m / memory 16Mi so that 110 of them fit a 2-core node's
//!    allocatable, limits cpu 500m / memory 64Mi, grace 1 s), manifests renamed into
//!    staticPodPath at once, timed until containerd reports every container running; then their
//!    teardown (manifests removed → no container running; for nodelet also → no sandbox left).
//!    Sides: the same CRI sequence sent straight to containerd by a client, 16 pods at a time
//!    (RunPodSandbox, PodSandboxStatus, ImageStatus, CreateContainer, StartContainer; teardown
//!    StopPodSandbox of every pod, then RemovePodSandbox of every pod); nodelet and kubelet in
//!    turn, each started afresh per repetition (never both at once: kubelet removes every pod
//!    it did not start). Also counted, from each agent's own metrics (nodelet and kubelet name
//!    them alike): CRI calls per pod start by method (`kubelet_runtime_operations_total`),
//!    relists (`kubelet_pleg_relist_duration_seconds`), the agent's CPU per pod start, its RSS
//!    and idle CPU with the pods running, and the whole machine's CPU for each side's starts.
//! 2. **Resilience at full size** (`RESILIENCE=0` skips), with nodelet's last repetition's pods
//!    running ([`resilience`]): the agent SIGKILLed and started again, containerd stopped for
//!    `RUNTIME_DOWN_SECONDS` (default 20) and started again, and a staticPodPath of 1,000
//!    hostile entries beside 10 good manifests on a fresh agent.
//! 3. **A 300-pod node** (`BIG_PODS=N`, default 300, 0 skips; BestEffort pods that wait on one
//!    `sleep`, `maxPods` above it on both agents): start and teardown of raw CRI, nodelet and
//!    kubelet, RSS and idle CPU, relists at rest from each agent's histogram, the runtime's
//!    part (the two listings of a relist by a plain client), and nodelet's relist with no change
//!    timed over `ROUNDS` relists (default 100) by a PLEG in this process, with its CRI calls
//!    counted, interleaved round by round with the plain listings.
//!
//! Run: `cargo bench --bench scale` (needs scripts/env/up.sh; stops and starts its containerd).
//! The headline figures measure the packaged build: `scripts/dist.sh`, then
//! `NODELET_BIN=target/dist/nodelet cargo bench --bench scale`. Every side starts on a freshly
//! dropped page cache (`agent::fresh_page_cache`; `DROP_CACHES=0` skips it).
//! `IDLE_SECONDS=N` (default 20). `KUBELET=0` skips kubelet. `NODELET_BEFORE=/path/to/nodelet`
//! runs an earlier build as another side of the bursts, so that a change shows as a ratio.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;
#[path = "scale/burst.rs"]
mod burst;
#[path = "../tests/hostile_dir/mod.rs"]
mod hostile_dir;
#[path = "peer/mod.rs"]
mod peer;
#[path = "scale/resilience.rs"]
mod resilience;
#[path = "../tests/runtime_ctl/mod.rs"]
mod runtime_ctl;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nodelet::cri::{Cri, ImageService, RuntimeService};

use agent::env_usize;
use burst::{agent_rep, best_effort, manifest, raw_rep, AgentRun, RawRun, Target};

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

/// Median and p99 of the two listings of a relist (ListPodSandbox and ListContainers,
/// unfiltered, at once) by a plain client, over `rounds`, milliseconds: the runtime's share of
/// any agent's relist, measured beside kubelet's.
fn raw_listings(rt: &tokio::runtime::Runtime, cri: &Cri, rounds: usize) -> (f64, f64) {
    let mut raw = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        rt.block_on(async {
            tokio::try_join!(
                cri.list_pod_sandbox(HashMap::new()),
                cri.list_containers(HashMap::new())
            )
        })
        .unwrap();
        raw.push(t.elapsed().as_secs_f64() * 1e3);
        // About kubelet's pace (a relist a second would take too long; 10 a second is enough
        // to see the listing at this size).
        std::thread::sleep(Duration::from_millis(100));
    }
    median_p99(&mut raw)
}

/// A fresh nodelet (`bin`, or [`agent::nodelet_bin`]) as a burst's target, started on a fresh
/// page cache ([`agent::fresh_page_cache`]), as every side of a burst is.
fn nodelet_target(
    name: &'static str,
    bin: Option<&std::path::Path>,
    node: &str,
    config: &str,
) -> (agent::Agent, Target) {
    let bin = bin.map_or_else(agent::nodelet_bin, std::path::Path::to_path_buf);
    agent::fresh_page_cache();
    let a = agent::start_binary(&bin, node, config, std::process::Stdio::null());
    let port = a.port;
    let t = Target {
        name,
        pid: a.child.id(),
        manifests: a.manifests.clone(),
        stage: a.dir.path().join("stage"),
        node: a.node.clone(),
        metrics: Box::new(move || agent::metric_samples(port, "/metrics")),
        wait_cleared: true,
    };
    (a, t)
}

/// A fresh kubelet as a burst's target, `maxPods` `max_pods`, on a fresh page cache.
fn kubelet_target(bin: &std::path::Path, node: &str, max_pods: usize) -> (peer::Kubelet, Target) {
    agent::fresh_page_cache();
    let k = peer::start_with(
        bin,
        node,
        &agent::socket(),
        None,
        &format!("maxPods: {max_pods}\n"),
    );
    let api_port = k.api_port;
    let t = Target {
        name: "kubelet",
        pid: k.pid(),
        manifests: k.manifests.clone(),
        stage: k.dir.path().join("stage"),
        node: k.node.clone(),
        metrics: Box::new(move || peer::metric_samples(api_port, "/metrics")),
        wait_cleared: false,
    };
    (k, t)
}

/// Readies a fresh agent for its measured burst: left alone [`burst::SETTLE_BEFORE`], then a
/// warm-up burst of `WARMUP` pods (default 10, [`burst::warm_up`]), then 2 s more.
fn prepare(rt: &tokio::runtime::Runtime, cri: &Cri, t: &Target) {
    std::thread::sleep(burst::SETTLE_BEFORE);
    burst::warm_up(rt, cri, t, env_usize("WARMUP", 10));
    std::thread::sleep(Duration::from_secs(2));
}

/// Stops a nodelet of a burst and removes its cgroupRoot.
fn report(rep: usize, side: &str, r: &AgentRun) {
    eprintln!(
        "  rep {rep}: {side} start {:.1} s, no container running {:.1} s after the removal{}, {:.1} ms CPU per pod start, RSS {:.1} MiB, relists {:.0}",
        r.start,
        r.teardown,
        r.cleared
            .map(|c| format!(", no sandbox {c:.1} s"))
            .unwrap_or_default(),
        r.cpu_per_pod_ms,
        r.rss_mib,
        r.relists
    );
}

/// The sides of the bursts, each a run per repetition.
#[derive(Default)]
struct Runs {
    raw: Vec<RawRun>,
    nodelet: Vec<AgentRun>,
    kubelet: Vec<AgentRun>,
    before: Vec<AgentRun>,
}

/// The resilience cases' results.
#[derive(Default)]
struct Resilience {
    kill9: Option<resilience::Kill9>,
    runtime_down: Option<resilience::RuntimeDown>,
}

/// The bursts: `reps` repetitions of raw CRI, then nodelet and kubelet in turn (their order
/// alternating), each agent started afresh (never both at once: kubelet removes pods it did
/// not start), then the earlier build when given. On the last repetition, with nodelet's pods
/// running, the resilience cases when `resilience_down` is given.
#[allow(clippy::too_many_arguments)]
fn bursts(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    pods: usize,
    reps: usize,
    idle: Duration,
    kubelet: Option<&std::path::Path>,
    before: Option<&std::path::Path>,
    resilience_down: Option<Duration>,
) -> (Runs, Resilience) {
    let mut runs = Runs::default();
    let mut res = Resilience::default();
    let config = format!("maxPods: {}\n", pods + 10);
    let me = std::process::id();
    for rep in 0..reps {
        agent::fresh_page_cache();
        let r = raw_rep(rt, cri, pods, rep, manifest);
        eprintln!(
            "  rep {rep}: raw CRI start {:.1} s, stopped {:.1} s, removed {:.1} s",
            r.start, r.teardown, r.cleared
        );
        runs.raw.push(r);
        let kubelet_first = rep % 2 == 1;
        for turn in 0..2 {
            if (turn == 0) == kubelet_first {
                let Some(bin) = kubelet else { continue };
                let (k, t) = kubelet_target(bin, &format!("kscale-{me}-{rep}"), pods + 10);
                prepare(rt, cri, &t);
                let r = agent_rep(rt, cri, &t, pods, idle, rep, manifest, &mut || {});
                report(rep, "kubelet", &r);
                runs.kubelet.push(r);
                k.stop();
            } else {
                let (mut a, t) =
                    nodelet_target("nodelet", None, &format!("scale-{me}-{rep}"), &config);
                prepare(rt, cri, &t);
                let last = rep + 1 == reps;
                let mut hook = || {
                    if let (true, Some(down)) = (last, resilience_down) {
                        let k = resilience::kill9_case(rt, cri, &mut a);
                        eprintln!(
                            "  kill -9: {} pods Running in /pods {:.2} s after the kill",
                            k.pods, k.running_after
                        );
                        res.kill9 = Some(k);
                        let d = resilience::runtime_down_case(rt, cri, &a, down);
                        eprintln!(
                            "  runtime down: reported in {:.1} s, recovered {:.1} s after the restart",
                            d.reported_down, d.recovered
                        );
                        res.runtime_down = Some(d);
                    }
                };
                let r = agent_rep(rt, cri, &t, pods, idle, rep, manifest, &mut hook);
                report(rep, "nodelet", &r);
                runs.nodelet.push(r);
                drop(a);
            }
        }
        if let Some(bin) = before {
            let (a, t) =
                nodelet_target("before", Some(bin), &format!("before-{me}-{rep}"), &config);
            prepare(rt, cri, &t);
            let r = agent_rep(rt, cri, &t, pods, idle, rep, manifest, &mut || {});
            report(rep, "before", &r);
            runs.before.push(r);
            drop(a);
        }
    }
    (runs, res)
}

/// The 300-pod node: raw CRI, nodelet (with the harness's PLEG relist timed against the raw
/// listings), kubelet (with the raw listings timed while its pods run).
struct Big {
    raw: RawRun,
    nodelet: AgentRun,
    cost: Option<RelistCost>,
    kubelet: Option<(AgentRun, (f64, f64))>,
}

fn big_node(
    rt: &tokio::runtime::Runtime,
    cri: &Cri,
    big: usize,
    idle: Duration,
    rounds: usize,
    kubelet: Option<&std::path::Path>,
) -> Big {
    let me = std::process::id();
    agent::fresh_page_cache();
    let raw = raw_rep(rt, cri, big, 0, best_effort);
    eprintln!(
        "  {big} pods: raw CRI start {:.1} s, stopped {:.1} s, removed {:.1} s",
        raw.start, raw.teardown, raw.cleared
    );
    let (a, t) = nodelet_target(
        "nodelet",
        None,
        &format!("big-{me}"),
        &format!("maxPods: {}\n", big + 10),
    );
    prepare(rt, cri, &t);
    let mut cost = None;
    let node = t.node.clone();
    let nodelet = agent_rep(rt, cri, &t, big, idle, 0, best_effort, &mut || {
        cost = Some(relist_cost(rt, &node, rounds));
    });
    report(0, &format!("{big} pods: nodelet"), &nodelet);
    drop(a);
    let kubelet = kubelet.map(|bin| {
        let (k, t) = kubelet_target(bin, &format!("kbig-{me}"), big + 10);
        prepare(rt, cri, &t);
        let mut listings = (0.0, 0.0);
        let r = agent_rep(rt, cri, &t, big, idle, 0, best_effort, &mut || {
            listings = raw_listings(rt, cri, rounds);
        });
        report(0, &format!("{big} pods: kubelet"), &r);
        k.stop();
        (r, listings)
    });
    Big {
        raw,
        nodelet,
        cost,
        kubelet,
    }
}

/// The median of `f` over the runs, and the runs listed.
fn column(rs: &[AgentRun], digits: usize, f: impl Fn(&AgentRun) -> f64) -> String {
    let v: Vec<f64> = rs.iter().map(&f).collect();
    format!(
        "{} (**median {:.digits$}**)",
        list(v.iter().copied(), digits),
        median(&mut v.clone())
    )
}

/// The median, over the repetitions, of nodelet's figure divided by the other side's.
fn ratio(a: &[AgentRun], b: &[AgentRun], f: impl Fn(&AgentRun) -> f64) -> String {
    if b.is_empty() {
        return "—".into();
    }
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| f(x) / f(y)).collect();
    format!("**{:.2}**", median(&mut r))
}

fn raw_ratio(a: &[AgentRun], raw: &[f64], f: impl Fn(&AgentRun) -> f64) -> String {
    let mut r: Vec<f64> = a.iter().zip(raw).map(|(x, y)| f(x) / y).collect();
    format!("**{:.2}**", median(&mut r))
}

fn print_bursts(pods: usize, reps: usize, runs: &Runs) {
    let raw_start: Vec<f64> = runs.raw.iter().map(|r| r.start).collect();
    let raw_down: Vec<f64> = runs.raw.iter().map(|r| r.teardown).collect();
    let raw_cleared: Vec<f64> = runs.raw.iter().map(|r| r.cleared).collect();
    let (n, k) = (&runs.nodelet, &runs.kubelet);
    let kcol = |digits: usize, f: &dyn Fn(&AgentRun) -> f64| {
        if k.is_empty() {
            "not run".to_owned()
        } else {
            column(k, digits, f)
        }
    };
    println!("\nscale: {pods} pods, {reps} interleaved repetitions (values per repetition)");
    println!(
        "nodelet: {}; page cache dropped before each side: {}\n",
        agent::nodelet_bin().display(),
        if std::env::var("DROP_CACHES").is_ok_and(|v| v == "0") {
            "no (DROP_CACHES=0)"
        } else {
            "yes"
        }
    );
    println!("| | raw CRI | nodelet | kubelet v1.20.2 | nodelet / kubelet | nodelet / raw |");
    println!("|---|---|---|---|---|---|");
    let rawcol = |v: &[f64]| {
        format!(
            "{} (**median {:.1}**)",
            list(v.iter().copied(), 1),
            median(&mut v.to_vec())
        )
    };
    println!(
        "| {pods} pods → all running, s | {} | {} | {} | {} | {} |",
        rawcol(&raw_start),
        column(n, 1, |a| a.start),
        kcol(1, &|a| a.start),
        ratio(n, k, |a| a.start),
        raw_ratio(n, &raw_start, |a| a.start)
    );
    println!(
        "| manifests removed → no container running, s | {} | {} | {} | {} | {} |",
        rawcol(&raw_down),
        column(n, 1, |a| a.teardown),
        kcol(1, &|a| a.teardown),
        ratio(n, k, |a| a.teardown),
        raw_ratio(n, &raw_down, |a| a.teardown)
    );
    println!(
        "| manifests removed → no sandbox left, s | {} | {} | left to its garbage collection | — | {} |",
        rawcol(&raw_cleared),
        column(n, 1, |a| a.cleared.unwrap_or(0.0)),
        raw_ratio(n, &raw_cleared, |a| a.cleared.unwrap_or(0.0))
    );
    println!(
        "| agent CPU per pod start, ms | — | {} | {} | {} | — |",
        column(n, 2, |a| a.cpu_per_pod_ms),
        kcol(2, &|a| a.cpu_per_pod_ms),
        ratio(n, k, |a| a.cpu_per_pod_ms)
    );
    println!(
        "| of which in the kernel, ms | — | {} | {} | {} | — |",
        column(n, 2, |a| a.sys_per_pod_ms),
        kcol(2, &|a| a.sys_per_pod_ms),
        ratio(n, k, |a| a.sys_per_pod_ms)
    );
    println!(
        "| RSS with {pods} pods, MiB | — | {} | {} | {} | — |",
        column(n, 1, |a| a.rss_mib),
        kcol(1, &|a| a.rss_mib),
        ratio(n, k, |a| a.rss_mib)
    );
    println!(
        "| idle CPU with {pods} pods, % of a core | — | {} | {} | {} | — |",
        column(n, 2, |a| a.idle_cpu_pct),
        kcol(2, &|a| a.idle_cpu_pct),
        ratio(n, k, |a| a.idle_cpu_pct)
    );
    println!(
        "| machine CPU for the {pods} starts, s | {} | {} | {} | {} | {} |",
        rawcol(&runs.raw.iter().map(|r| r.machine_cpu).collect::<Vec<_>>()),
        column(n, 1, |a| a.machine_cpu),
        kcol(1, &|a| a.machine_cpu),
        ratio(n, k, |a| a.machine_cpu),
        raw_ratio(
            n,
            &runs.raw.iter().map(|r| r.machine_cpu).collect::<Vec<_>>(),
            |a| a.machine_cpu
        )
    );
    println!(
        "| relists per second during the start | — | {} | {} | | |",
        column(n, 1, |a| a.relists_per_s),
        kcol(1, &|a| a.relists_per_s)
    );
    let calls = |rs: &[AgentRun]| {
        rs.last().map_or("not run".to_owned(), |last| {
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
        })
    };
    println!(
        "| CRI calls per pod start (last repetition) | 5 | {} | {} | | |",
        calls(n),
        calls(k)
    );
    println!(
        "| memory cgroups in the kernel when the burst began | — | {} | {} | | |",
        list(n.iter().map(|a| a.memcgs as f64), 0),
        list(k.iter().map(|a| a.memcgs as f64), 0)
    );
    if !runs.before.is_empty() {
        let b = &runs.before;
        println!("\nnodelet against the earlier build (`NODELET_BEFORE`), median of nodelet / before: start {}, teardown {}, CPU per pod start {}, RSS {}",
            ratio(n, b, |a| a.start), ratio(n, b, |a| a.teardown), ratio(n, b, |a| a.cpu_per_pod_ms), ratio(n, b, |a| a.rss_mib));
    }
}

fn print_resilience(res: &Resilience, hostile: Option<&resilience::Hostile>) {
    if let Some(k) = &res.kill9 {
        println!(
            "\nkill -9 with {} pods running, started again: all Running in /pods {:.2} s after the kill; pods lost {}, containers replaced {}, duplicated {}, restartCount sum {}",
            k.pods, k.running_after, k.lost, k.replaced, k.duplicated, k.restarts
        );
    }
    if let Some(d) = &res.runtime_down {
        println!(
            "containerd stopped {:.1} s with {} pods running: reported down (healthz 500, nodelet_container_runtime_up 0, Ready False) {:.2} s after the stop; up again {:.2} s after containerd was started, every pod Running {:.2} s after; pods lost {}, containers replaced {}, duplicated {}, restartCount sum {}",
            d.down_for, d.pods, d.reported_down, d.recovered, d.all_running, d.lost, d.replaced, d.duplicated, d.restarts
        );
    }
    if let Some(h) = hostile {
        println!(
            "1,000 hostile entries beside 10 good manifests: the 10 running in {:.1} s; {} entries to report (bad regular files, device links, FIFOs), {:.0} reports, {:.0} after five more listings; RSS {:.1} MiB before, {:.1} at peak, {:.1} after; healthz {}",
            h.good_running, h.to_report, h.reported, h.reported_later, h.rss_before, h.rss_peak, h.rss_after, if h.healthy { "ok" } else { "NOT ok" }
        );
    }
}

fn print_big(big: usize, rounds: usize, b: &Big) {
    let (n, r) = (&b.nodelet, &b.raw);
    let k = b.kubelet.as_ref().map(|(k, _)| k);
    let kv = |f: &dyn Fn(&AgentRun) -> String| k.map_or("not run".to_owned(), f);
    let kr = |x: f64, f: &dyn Fn(&AgentRun) -> f64| {
        k.map_or("—".to_owned(), |k| format!("**{:.2}**", x / f(k)))
    };
    println!(
        "\n{big}-pod node (BestEffort pods, maxPods {} on both agents):\n",
        big + 10
    );
    println!("| | raw CRI | nodelet | kubelet v1.20.2 | nodelet / kubelet | nodelet / raw |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {big} pods → all running, s | {:.1} | {:.1} | {} | {} | {:.2} |",
        r.start,
        n.start,
        kv(&|k| format!("{:.1}", k.start)),
        kr(n.start, &|k| k.start),
        n.start / r.start
    );
    println!(
        "| manifests removed → no container running, s | {:.1} | {:.1} | {} | {} | {:.2} |",
        r.teardown,
        n.teardown,
        kv(&|k| format!("{:.1}", k.teardown)),
        kr(n.teardown, &|k| k.teardown),
        n.teardown / r.teardown
    );
    println!(
        "| agent CPU per pod start, ms | — | {:.2} | {} | {} | — |",
        n.cpu_per_pod_ms,
        kv(&|k| format!("{:.2}", k.cpu_per_pod_ms)),
        kr(n.cpu_per_pod_ms, &|k| k.cpu_per_pod_ms)
    );
    println!(
        "| RSS, MiB | — | {:.1} | {} | {} | — |",
        n.rss_mib,
        kv(&|k| format!("{:.1}", k.rss_mib)),
        kr(n.rss_mib, &|k| k.rss_mib)
    );
    println!(
        "| idle CPU, % of a core | — | {:.2} | {} | {} | — |",
        n.idle_cpu_pct,
        kv(&|k| format!("{:.2}", k.idle_cpu_pct)),
        kr(n.idle_cpu_pct, &|k| k.idle_cpu_pct)
    );
    println!(
        "| relists in the idle window: per second × mean duration (the agent's own metric) | — | {:.2}/s × {:.2} ms | {} | | |",
        n.idle_relists_per_s,
        n.idle_relist_ms,
        kv(&|k| format!("{:.2}/s × {:.2} ms", k.idle_relists_per_s, k.idle_relist_ms))
    );
    let listing = |(m, p): (f64, f64)| format!("median {m:.2} ms, p99 {p:.2} ms");
    println!(
        "| the runtime's part: the two listings by a plain client ({rounds} rounds) | — | {} | {} | | |",
        b.cost.as_ref().map_or("—".to_owned(), |c| listing(c.raw)),
        b.kubelet.as_ref().map_or("not run".to_owned(), |(_, l)| listing(*l))
    );
    if let Some(c) = &b.cost {
        println!(
            "| nodelet's relist with no change, timed in the harness ({rounds} relists interleaved with the listings) | — | median {:.2} ms, **p99 {:.2} ms**, {:.1} CRI calls | | | median {:.2}, p99 {:.2} of the listings |",
            c.relist.0, c.relist.1, c.calls, c.relist.0 / c.raw.0, c.relist.1 / c.raw.1
        );
    }
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
    rt.block_on(cri.pull_image("busybox:1.36", None, None))
        .unwrap();
    // kubelet removes every pod on its runtime that it did not start: its side runs only on a
    // runtime holding none but the benchmark's own.
    let kubelet = peer::side("scale", &rt, &cri);
    let before = std::env::var("NODELET_BEFORE")
        .ok()
        .map(std::path::PathBuf::from);
    let (runs, res) = bursts(
        &rt,
        &cri,
        pods,
        reps,
        idle,
        kubelet.as_deref(),
        before.as_deref(),
        resilience.then_some(down),
    );
    let hostile = resilience.then(|| resilience::hostile_case(&rt, &cri));
    let big_runs = (big > 0).then(|| big_node(&rt, &cri, big, idle, rounds, kubelet.as_deref()));
    print_bursts(pods, reps, &runs);
    print_resilience(&res, hostile.as_ref());
    if let Some(b) = &big_runs {
        print_big(big, rounds, b);
    }
}
