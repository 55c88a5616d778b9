//! Upstream kubelet v1.20.2 as the benchmarks' peer, built once per machine by
//! `../shared/tools/kubelet-peer.sh build` (Debian's source package) and started here on the
//! private containerd with the same settings as that script's `start` (cgroupfs, cgroupRoot
//! `/kubeletpeer`, static pods, anonymous AlwaysAllow API on loopback), optionally joined to the
//! cluster of scripts/env/cluster.sh.
//!
//! kubelet removes every pod on its runtime that it did not start: a benchmark runs it only
//! while no nodelet runs, and [`Kubelet::stop`] removes what it leaves behind (it leaves its
//! stopped sandboxes to its own garbage collection).

#![allow(dead_code)] // each benchmark uses part of it

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodelet::cri::{Cri, RuntimeService};

/// Where kubelet-peer.sh puts the binary (`KUBELET_PEER_BIN` overrides).
pub const DEFAULT_BIN: &str = "/var/lib/kubelet-peer/bin/kubelet";

/// The kubelet binary, or why the peer side is skipped (one line, saying how to build it).
pub fn binary() -> Result<PathBuf, String> {
    let bin = std::env::var("KUBELET_PEER_BIN").unwrap_or_else(|_| DEFAULT_BIN.to_owned());
    let p = PathBuf::from(&bin);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "kubelet peer not built ({bin} missing): run `../shared/tools/kubelet-peer.sh build` \
             (about 10 minutes) to add kubelet's columns"
        ))
    }
}

/// A running kubelet.
pub struct Kubelet {
    /// Its files: config, manifests (staticPodPath), root dir; removed on drop.
    pub dir: tempfile::TempDir,
    /// staticPodPath.
    pub manifests: PathBuf,
    /// Its node name (`--hostname-override`); static pods are `<name>-<node>`.
    pub node: String,
    /// healthzPort (plain HTTP on loopback).
    pub healthz_port: u16,
    /// Its API port (HTTPS, self-signed, anonymous).
    pub api_port: u16,
    /// The process.
    pub child: Child,
    socket: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `bin` as node `node` on CRI `socket` (a path), joined to the API server of
/// `kubeconfig` when given (its API then on `0.0.0.0`: the API server reaches it at the node's
/// InternalIP, the host's own address; kubelet refuses a loopback `--node-ip`); waits for
/// `/healthz`.
pub fn start(bin: &Path, node: &str, socket: &str, kubeconfig: Option<&str>) -> Kubelet {
    start_with(bin, node, socket, kubeconfig, "")
}

/// [`start`] with `extra` configuration lines (KubeletConfiguration fields) after the base.
pub fn start_with(
    bin: &Path,
    node: &str,
    socket: &str,
    kubeconfig: Option<&str>,
    extra: &str,
) -> Kubelet {
    // On the benchmarks' file system, as nodelet's (its pod logs go to /var/log/pods).
    let dir = crate::agent::agent_dir();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for m in nodelet::cm::cgroup_mounts() {
        std::fs::create_dir_all(m.join("kubeletpeer")).unwrap();
    }
    let (healthz_port, api_port) = (free_port(), free_port());
    // `maxPods` 250 unless `extra` sets it (a key given twice is an error).
    let max_pods = if extra.contains("maxPods:") {
        ""
    } else {
        "maxPods: 250\n"
    };
    let address = if kubeconfig.is_some() {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\nfileCheckFrequency: 20s\ncgroupDriver: cgroupfs\ncgroupsPerQOS: true\ncgroupRoot: /kubeletpeer\nfailSwapOn: false\n{max_pods}healthzBindAddress: 127.0.0.1\nhealthzPort: {healthz_port}\naddress: {address}\nport: {api_port}\nreadOnlyPort: 0\nevictionHard: {{memory.available: 100Mi}}\nauthentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\nauthorization: {{mode: AlwaysAllow}}\n{extra}",
            manifests.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(dir.path().join("config.yaml"))
        .arg("--container-runtime=remote")
        .arg(format!("--container-runtime-endpoint=unix://{socket}"))
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--cert-dir")
        .arg(dir.path().join("pki"))
        .args(["--hostname-override", node]);
    if let Some(k) = kubeconfig {
        cmd.args(["--kubeconfig", k]);
    }
    let log = std::fs::File::create(dir.path().join("kubelet.log")).unwrap();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::blocking::get(format!("http://127.0.0.1:{healthz_port}/healthz"))
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "kubelet did not come up; see {}",
            dir.path().join("kubelet.log").display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Kubelet {
        dir,
        manifests,
        node: node.to_owned(),
        healthz_port,
        api_port,
        child,
        socket: socket.to_owned(),
    }
}

impl Kubelet {
    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The samples of its metrics page `path` (`/metrics`, `/metrics/probes`, on its API port)
    /// as [`metric_samples`] reads them.
    pub fn metric_samples(&self, path: &str) -> Vec<(String, f64)> {
        metric_samples(self.api_port, path)
    }

    /// Stops kubelet (SIGTERM, SIGKILL after 10 s), undoes the bind mount of its root
    /// directory onto itself, and removes every sandbox of its static pods (`*-<node>`) through
    /// CRI. Dropping a `Kubelet` does the same.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = nix::mount::umount(&self.dir.path().join("root"));
        // Its log outlives the run's directory, for a look after a surprise.
        let keep = std::env::temp_dir().join(format!("kubelet-peer-{}.log", self.node));
        let _ = std::fs::copy(self.dir.path().join("kubelet.log"), &keep);
        remove_pods_of(&self.socket, &self.node);
    }
}

/// The pods on the runtime (sandboxes, ready or not) that belong to none of the nodes `ours`
/// (by the `-<node>` ending of static pod names): what kubelet would remove when it starts.
pub fn foreign_pods(rt: &tokio::runtime::Runtime, cri: &Cri, ours: &[&str]) -> Vec<String> {
    rt.block_on(cri.list_pod_sandbox(Default::default()))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| s.metadata.map(|m| format!("{}/{}", m.namespace, m.name)))
        .filter(|n| !ours.iter().any(|o| n.ends_with(&format!("-{o}"))))
        .collect()
}

/// Removes every sandbox whose pod name ends in `-<node>` (with its containers) through CRI.
pub fn remove_pods_of(socket: &str, node: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sock = Path::new(socket);
    let cri = rt.block_on(async {
        Cri::new(
            sock,
            sock,
            Duration::from_secs(30),
            nodelet::metrics::Metrics::new(),
        )
    });
    let suffix = format!("-{node}");
    let sandboxes = rt
        .block_on(cri.list_pod_sandbox(Default::default()))
        .unwrap_or_default();
    for s in sandboxes.iter().filter(|s| {
        s.metadata
            .as_ref()
            .is_some_and(|m| m.name.ends_with(&suffix))
    }) {
        let _ = rt.block_on(cri.stop_pod_sandbox(&s.id));
        let _ = rt.block_on(cri.remove_pod_sandbox(&s.id));
    }
}

/// The samples of the metrics page `path` of a kubelet whose API is on `api_port` (HTTPS, its
/// self-signed certificate, anonymous): each line with its value (the last field; 0 when it is
/// not a number). Empty when it does not answer.
pub fn metric_samples(api_port: u16, path: &str) -> Vec<(String, f64)> {
    let client = reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let text = client
        .get(format!("https://127.0.0.1:{api_port}{path}"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let v = l
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            (l.to_owned(), v)
        })
        .collect()
}

/// The kubelet binary for a benchmark's kubelet side, or `None` with one line on stderr saying
/// why it is skipped (`bench` names the benchmark): `KUBELET=0`, the peer not built, or pods on
/// the runtime that kubelet would remove (every sandbox there, as it starts first on its node).
pub fn side(bench: &str, rt: &tokio::runtime::Runtime, cri: &Cri) -> Option<PathBuf> {
    if std::env::var("KUBELET").is_ok_and(|v| v == "0") {
        eprintln!("{bench}: kubelet's side skipped (KUBELET=0)");
        return None;
    }
    let bin = binary().map_err(|why| eprintln!("{bench}: {why}")).ok()?;
    let others = foreign_pods(rt, cri, &[]);
    if others.is_empty() {
        return Some(bin);
    }
    eprintln!(
        "{bench}: kubelet's side skipped: the runtime holds pods kubelet would remove ({}); remove them (or stop what runs them) first",
        others.join(", ")
    );
    None
}
