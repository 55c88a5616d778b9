//! Cluster mode at scale: 100 pods bound to the node through the API against the same 100 pods
//! as static manifests, in one run, the two sides interleaved `REPS` times (default 3).
//!
//! - API side: the pods are created through the API (as the admin, 8 requests at a time) with
//!   `spec.nodeName` set, timed from the first create to all of them `Running` in a list of the
//!   node's pods (what `kubectl get pods` shows), and to all their containers running in
//!   containerd;
//! - static side: the 100 manifests renamed into `staticPodPath` at once, timed to all containers
//!   running in containerd, and to all 100 mirror pods `Running` in the API;
//! - status PATCH calls per pod start, from the apiserver's own counter
//!   (`apiserver_request_total{verb="PATCH",resource="pods",subresource="status"}`), read before
//!   the pods are created and 3 s after they are all Running.
//!
//! Each pod: one busybox container, requests cpu 10m / memory 16Mi (100 pods fit 2 cores),
//! limits cpu 500m / memory 64Mi, grace 1 s, a shell that waits on `sleep`. Between sides every pod is deleted (API) or its
//! manifest removed (static), and the next side starts once containerd has none of them.
//!
//! Run: `cargo bench --bench api_pods` (needs scripts/env/up.sh and scripts/env/cluster.sh; says
//! SKIPPED without a control plane). `PODS=N` and `REPS=N` change the sizes.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

mod agent;

use agent::env_usize;
use nodelet::cri::{api, Cri, ImageService, RuntimeService};

const ADMIN: &str = "/var/lib/nodelet-env/cluster/admin.kubeconfig";

/// The pod spec of every sample, for `node` when it is an API pod.
fn pod_yaml(name: &str, node: Option<&str>) -> String {
    let bound = node.map_or(String::new(), |n| {
        format!("  nodeName: {n}\n  automountServiceAccountToken: false\n")
    });
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{bound}  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n    resources:\n      requests: {{cpu: 10m, memory: 16Mi}}\n      limits: {{cpu: 500m, memory: 64Mi}}\n"
    )
}

/// One side's measurements.
#[derive(Debug, Clone, Copy)]
struct Side {
    /// Start of the side to every pod Running in the API, seconds.
    api_running: f64,
    /// Start of the side to every container running in containerd, seconds.
    runtime_running: f64,
    /// Status PATCH calls per pod.
    patches_per_pod: f64,
}

struct Bench {
    client: kube::Client,
    cri: Cri,
    node: String,
    pods: usize,
}

impl Bench {
    /// Running containers in containerd whose pod name starts with `prefix`.
    async fn running_containers(&self, prefix: &str) -> usize {
        self.cri
            .list_containers(HashMap::new())
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.state == api::ContainerState::ContainerRunning as i32)
            .filter(|c| {
                c.labels
                    .get(nodelet::kuberuntime::labels::POD_NAME)
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .count()
    }

    /// Containers (any state) and sandboxes in containerd whose pod name starts with `prefix`.
    async fn leftovers(&self, prefix: &str) -> usize {
        let name_of = |l: &HashMap<String, String>| {
            l.get(nodelet::kuberuntime::labels::POD_NAME)
                .is_some_and(|n| n.starts_with(prefix))
        };
        let c = self.cri.list_containers(HashMap::new()).await;
        let s = self.cri.list_pod_sandbox(HashMap::new()).await;
        c.unwrap_or_default()
            .iter()
            .filter(|c| name_of(&c.labels))
            .count()
            + s.unwrap_or_default()
                .iter()
                .filter(|s| name_of(&s.labels))
                .count()
    }

    /// The node's pods in the API whose name starts with `prefix`, and how many are Running.
    /// Panics on one that failed (refused at admission, say): the run would never end.
    async fn api_pods(&self, prefix: &str) -> (usize, usize) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let Ok(list) = api.list(&lp).await else {
            return (0, 0);
        };
        let ours: Vec<&Pod> = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .collect();
        if let Some(p) = ours
            .iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        {
            let s = p.status.clone().unwrap_or_default();
            panic!(
                "{}: Failed: {} {}",
                p.metadata.name.as_deref().unwrap_or_default(),
                s.reason.unwrap_or_default(),
                s.message.unwrap_or_default()
            );
        }
        let running = ours
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|ph| ph == "Running")
            })
            .count();
        (ours.len(), running)
    }

    /// The apiserver's count of status PATCH calls on pods.
    async fn status_patches(&self) -> f64 {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = self.client.request_text(req).await.unwrap();
        text.lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
            .filter(|l| {
                l.contains("verb=\"PATCH\"")
                    && l.contains("resource=\"pods\"")
                    && l.contains("subresource=\"status\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Polls until every pod is Running in the API and in containerd; the two times from
    /// `t0`, seconds.
    async fn wait_running(&self, prefix: &str, t0: Instant) -> (f64, f64) {
        let deadline = t0 + Duration::from_secs(600);
        let (mut api_t, mut rt_t) = (None, None);
        while api_t.is_none() || rt_t.is_none() {
            assert!(
                Instant::now() < deadline,
                "{prefix}: not all Running in 600 s"
            );
            if rt_t.is_none() && self.running_containers(prefix).await == self.pods {
                rt_t = Some(t0.elapsed().as_secs_f64());
            }
            if api_t.is_none() && self.api_pods(prefix).await.1 == self.pods {
                api_t = Some(t0.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (api_t.unwrap_or_default(), rt_t.unwrap_or_default())
    }

    /// Waits until neither the API nor containerd holds a pod named `prefix*`.
    async fn wait_gone(&self, prefix: &str) {
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.api_pods(prefix).await.0 > 0 || self.leftovers(prefix).await > 0 {
            assert!(Instant::now() < deadline, "{prefix}: not gone in 600 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn api_side(&self, rep: usize) -> Side {
        let prefix = format!("api{rep}-");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let pods: Vec<Pod> = (0..self.pods)
            .map(|i| {
                serde_yaml::from_str(&pod_yaml(&format!("{prefix}{i}"), Some(&self.node))).unwrap()
            })
            .collect();
        let patches0 = self.status_patches().await;
        let t0 = Instant::now();
        futures::stream::iter(pods)
            .map(|p| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &p).await.unwrap() }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        let (api_running, runtime_running) = self.wait_running(&prefix, t0).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let patches = self.status_patches().await - patches0;
        futures::stream::iter(0..self.pods)
            .map(|i| {
                let api = api.clone();
                let name = format!("{prefix}{i}");
                async move { api.delete(&name, &DeleteParams::default()).await.unwrap() }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        self.wait_gone(&prefix).await;
        Side {
            api_running,
            runtime_running,
            patches_per_pod: patches / self.pods as f64,
        }
    }

    async fn static_side(&self, manifests: &Path, rep: usize) -> Side {
        let prefix = format!("st{rep}-");
        let staging = manifests.with_extension("staging");
        std::fs::create_dir_all(&staging).unwrap();
        for i in 0..self.pods {
            let name = format!("{prefix}{i}");
            std::fs::write(staging.join(format!("{name}.yaml")), pod_yaml(&name, None)).unwrap();
        }
        let patches0 = self.status_patches().await;
        let t0 = Instant::now();
        for i in 0..self.pods {
            let f = format!("{prefix}{i}.yaml");
            std::fs::rename(staging.join(&f), manifests.join(&f)).unwrap();
        }
        let (api_running, runtime_running) = self.wait_running(&prefix, t0).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let patches = self.status_patches().await - patches0;
        for i in 0..self.pods {
            std::fs::remove_file(manifests.join(format!("{prefix}{i}.yaml"))).unwrap();
        }
        self.wait_gone(&prefix).await;
        Side {
            api_running,
            runtime_running,
            patches_per_pod: patches / self.pods as f64,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if !Path::new(ADMIN).exists() {
        eprintln!("SKIPPED: no control plane (run `bash scripts/env/cluster.sh`)");
        return;
    }
    let pods = env_usize("PODS", 100);
    let reps = env_usize("REPS", 3);
    assert!(reps > 0, "REPS must be at least 1");
    let node = format!("bench-cluster-{}", std::process::id());
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/env/cluster.sh"
        ))
        .args(["node-kubeconfig", &node])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kubeconfig = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sock = std::path::PathBuf::from(agent::SOCKET);
    let (client, cri) = rt.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(ADMIN).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        let cri = Cri::new(
            &sock,
            &sock,
            Duration::from_secs(120),
            nodelet::metrics::Metrics::new(),
        );
        (kube::Client::try_from(config).unwrap(), cri)
    });
    rt.block_on(cri.pull_image("busybox:1.36", None, None))
        .unwrap();
    let agent = agent::start_with_args(
        Path::new(env!("CARGO_BIN_EXE_nodelet")),
        &node,
        &format!("maxPods: {}\n", pods + 10),
        std::process::Stdio::null(),
        vec!["--kubeconfig".into(), kubeconfig],
    );
    let bench = Bench {
        client,
        cri,
        node: node.clone(),
        pods,
    };
    // Mirror pods need the Node (their owner): wait for it to register.
    rt.block_on(async {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(bench.client.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        while nodes.get_opt(&node).await.ok().flatten().is_none() {
            assert!(Instant::now() < deadline, "the node did not register");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let (mut st, mut ap) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        // Alternate which side goes first, so neither always meets a warmer machine.
        let (s, a) = if rep % 2 == 0 {
            let s = rt.block_on(bench.static_side(&agent.manifests, rep));
            (s, rt.block_on(bench.api_side(rep)))
        } else {
            let a = rt.block_on(bench.api_side(rep));
            (rt.block_on(bench.static_side(&agent.manifests, rep)), a)
        };
        eprintln!("rep {rep}: static {s:?}\nrep {rep}: api    {a:?}");
        st.push(s);
        ap.push(a);
    }
    let col = |v: &[Side], f: fn(&Side) -> f64| v.iter().map(f).collect::<Vec<_>>();
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("\n{pods} pods, {reps} interleaved repetitions (one run)\n");
    println!("| | static manifests | API pods | ratio API/static (median) |");
    println!("|---|---|---|---|");
    for (what, f) in [
        (
            "start → all Running in the API, s",
            (|s: &Side| s.api_running) as fn(&Side) -> f64,
        ),
        ("start → all containers running (containerd), s", |s| {
            s.runtime_running
        }),
        ("status PATCH calls per pod", |s| s.patches_per_pod),
    ] {
        let (a, b) = (col(&st, f), col(&ap, f));
        let ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| y / x.max(1e-9)).collect();
        println!(
            "| {what} | {} | {} | {:.2} ({}) |",
            fmt(&a),
            fmt(&b),
            median(ratios.clone()),
            fmt(&ratios)
        );
    }
    let mut agent = agent;
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    rt.block_on(async {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(bench.client.clone());
        let _ = nodes.delete(&node, &DeleteParams::default()).await;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(bench.client.clone(), "kube-node-lease");
        let _ = leases.delete(&node, &DeleteParams::default()).await;
    });
}
