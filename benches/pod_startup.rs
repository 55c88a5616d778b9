//! Pod start-up latency: manifest written → every container RUNNING, through nodelet, against
//! the same CRI calls made directly (the baseline) in the same run, interleaved pod by pod.
//!
//! Each sample is a one-container busybox pod (image already pulled). Latency is measured to the
//! container's `startedAt` as reported by containerd, so polling does not add to it:
//! - nodelet: time the manifest file is renamed into staticPodPath → startedAt;
//! - baseline: time of the first call → startedAt, with the calls kubelet makes for such a pod
//!   (RunPodSandbox, PodSandboxStatus, ImageStatus, CreateContainer, StartContainer) and the
//!   same sandbox and container configs nodelet builds.
//!
//! Run: `cargo bench --bench pod_startup` (needs scripts/env/up.sh). `PODS=N` sets the number of
//! samples per side (default 20). `NODELET_BEFORE=/path/to/nodelet` adds a third side: an earlier
//! build of nodelet, run as a second agent and interleaved with the other two, so that a change
//! is measured as the ratio after/before in one run.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
mod agent;

use nodelet::cri::{api, Cri, ImageService, RuntimeService};
use nodelet::kuberuntime::container::{container_config, ContainerInputs};
use nodelet::kuberuntime::labels;
use nodelet::kuberuntime::sandbox::sandbox_config;
use nodelet::kuberuntime::Settings;

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]\n"
    )
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx]
}

async fn started_at(cri: &Cri, uid: &str, deadline: Instant) -> i64 {
    let sel: HashMap<String, String> = [(labels::POD_UID.to_string(), uid.to_string())].into();
    loop {
        assert!(Instant::now() < deadline, "pod {uid} did not start in time");
        if let Some(c) = cri
            .list_containers(sel.clone())
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.state == api::ContainerState::ContainerRunning as i32)
        {
            return cri
                .container_status(&c.id)
                .await
                .unwrap()
                .unwrap()
                .started_at;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn baseline_pod(
    cri: &Cri,
    settings: &Settings,
    cgroup_root: &str,
    name: &str,
    node: &str,
) -> (i64, String) {
    let mut pod: Pod = serde_yaml::from_str(&manifest(name)).unwrap();
    let uid = format!("bench-direct-{name}-{}", std::process::id());
    pod.metadata.uid = Some(uid.clone());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.name = Some(format!("{name}-{node}"));
    pod.spec.as_mut().unwrap().node_name = Some(node.into());
    let t0 = now_ns();
    let layout = nodelet::cm::CgroupLayout {
        root: cgroup_root.to_owned(),
        per_qos: true,
        systemd: false,
    };
    let cgroup = layout.pod_cgroup_parent(&uid, nodelet::qos::QosClass::BestEffort);
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
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let image = cri
        .image_status(c.image.as_deref().unwrap())
        .await
        .unwrap()
        .expect("busybox:1.36 pulled")
        .id;
    let cfg = container_config(
        settings,
        &pod,
        c,
        &ContainerInputs {
            restart_count: 0,
            image_ref: &image,
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
    let started = cri.container_status(&id).await.unwrap().unwrap().started_at;
    (started - t0, sb)
}

fn main() {
    let n: usize = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let sock = std::path::PathBuf::from(agent::SOCKET);
    assert!(sock.exists(), "run scripts/env/up.sh first");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let metrics = nodelet::metrics::Metrics::new();
    let cri = rt
        .block_on(async { Cri::new(&sock, &sock, Duration::from_secs(120), Arc::clone(&metrics)) });
    rt.block_on(cri.pull_image("busybox:1.36", None, None))
        .unwrap();

    let agents: Vec<(&str, agent::Agent)> = std::iter::once((
        "nodelet",
        agent::start(&format!("bench{}", std::process::id()), "", Stdio::null()),
    ))
    .chain(std::env::var("NODELET_BEFORE").ok().map(|bin| {
        (
            "nodelet (before)",
            agent::start_binary(
                std::path::Path::new(&bin),
                &format!("before{}", std::process::id()),
                "",
                Stdio::null(),
            ),
        )
    }))
    .collect();
    // Baseline pods carry another node name, so nodelet's housekeeping leaves them alone.
    let direct_node = format!("direct{}", std::process::id());
    let mut settings = Settings::example();
    settings.pod_logs_dir = agents[0].1.logs.clone();
    settings.node_name = direct_node.clone();
    let cgroup_root = agents[0].1.cgroup_root.clone();

    let sides = 1 + agents.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); sides];
    let mut sandboxes = Vec::new();
    for i in 0..n {
        // Rotate which side goes first so that none always follows an idle gap.
        for k in 0..sides {
            let side = (i + k) % sides;
            if side == 0 {
                let (lat, sb) = rt.block_on(baseline_pod(
                    &cri,
                    &settings,
                    &cgroup_root,
                    &format!("d{i}"),
                    &direct_node,
                ));
                samples[0].push(lat as f64 / 1e6);
                sandboxes.push(sb);
            } else {
                let a = &agents[side - 1].1;
                let name = format!("n{i}");
                let tmp = a.manifests.join(format!(".{name}.tmp"));
                std::fs::write(&tmp, manifest(&name)).unwrap();
                let t0 = now_ns();
                std::fs::rename(&tmp, a.manifests.join(format!("{name}.yaml"))).unwrap();
                let uid = nodelet::source::manifest::static_pod_uid(
                    &a.manifests.join(format!("{name}.yaml")),
                    &a.node,
                    "default",
                    &name,
                );
                let started = rt.block_on(started_at(
                    &cri,
                    &uid,
                    Instant::now() + Duration::from_secs(30),
                ));
                samples[side].push((started - t0) as f64 / 1e6);
            }
        }
    }
    let p = |v: &[f64], q: f64| percentile(&mut v.to_vec(), q);
    let (d50, d90) = (p(&samples[0], 0.5), p(&samples[0], 0.9));
    println!("pod start-up, manifest written -> container RUNNING (startedAt), {n} pods per side, interleaved:");
    println!("  direct CRI calls (baseline): median {d50:.1} ms, p90 {d90:.1} ms");
    for (k, (label, a)) in agents.iter().enumerate() {
        let v = &samples[k + 1];
        let (m50, m90) = (p(v, 0.5), p(v, 0.9));
        let rss_kb = std::fs::read_to_string(format!("/proc/{}/status", a.child.id()))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_default();
        println!("  {label:<27}: median {m50:.1} ms, p90 {m90:.1} ms; ratio to baseline median {:.2}, p90 {:.2}; RSS with {n} pods {rss_kb} kB", m50 / d50, m90 / d90);
    }
    if agents.len() == 2 {
        let (after, before) = (p(&samples[1], 0.5), p(&samples[2], 0.5));
        println!(
            "  nodelet after/before:        median {:.3} (ratios to baseline {:.3} / {:.3})",
            after / before,
            after / d50,
            before / d50
        );
    }

    // Clean up: nodelet's pods by removing the manifests, the baseline's directly.
    let sel = |n: &str| -> HashMap<String, String> {
        [(labels::NODE_NAME.to_string(), n.to_string())].into()
    };
    for (_, a) in &agents {
        for e in std::fs::read_dir(&a.manifests).unwrap().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for (_, a) in &agents {
        while !rt
            .block_on(cri.list_pod_sandbox(sel(&a.node)))
            .unwrap()
            .is_empty()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut nodes = vec![direct_node.clone()];
    let mut roots = Vec::new();
    for (_, mut a) in agents {
        let _ = a.child.kill();
        let _ = a.child.wait();
        nodes.push(a.node.clone());
        roots.push(a.cgroup_root.clone());
    }
    for s in nodes
        .iter()
        .flat_map(|n| rt.block_on(cri.list_pod_sandbox(sel(n))).unwrap())
    {
        let _ = rt.block_on(cri.stop_pod_sandbox(&s.id));
        let _ = rt.block_on(cri.remove_pod_sandbox(&s.id));
    }
    for root in roots {
        let _ = nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &root);
    }
    assert_eq!(sandboxes.len(), n);
}
