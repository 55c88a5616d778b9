//! Shared harness of the integration tests: a real nodelet process against the real containerd
//! that `scripts/env/up.sh` starts, each test with its own node name, manifest directory, log
//! directory, cgroup root and port. Everything is removed on drop, even when the test fails.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nodelet::cri::{api, Cri, RuntimeService};
use nodelet::kuberuntime::labels;

/// The CRI socket of the test containerd (`NODELET_CRI_ENDPOINT`, else the env scripts' default).
pub fn cri_socket() -> PathBuf {
    let ep = std::env::var("NODELET_CRI_ENDPOINT")
        .unwrap_or_else(|_| "unix:///run/nodelet-env/containerd/containerd.sock".into());
    let p = PathBuf::from(ep.trim_start_matches("unix://"));
    assert!(
        p.exists(),
        "containerd socket {} not found: run scripts/env/up.sh (or scripts/test.sh) first",
        p.display()
    );
    p
}

/// A CRI client plus a runtime to call it from synchronous tests.
pub struct Runtime {
    pub cri: Cri,
    pub rt: tokio::runtime::Runtime,
    /// The containerd socket.
    pub socket: PathBuf,
}

impl Runtime {
    pub fn new() -> Self {
        Self::on(&cri_socket())
    }

    /// A client of the containerd at `sock`.
    pub fn on(sock: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cri = rt.block_on(async {
            Cri::new(
                sock,
                sock,
                Duration::from_secs(120),
                nodelet::metrics::Metrics::new(),
            )
        });
        Self {
            cri,
            rt,
            socket: sock.to_owned(),
        }
    }

    fn sel(key: &str, value: &str) -> HashMap<String, String> {
        [(key.to_string(), value.to_string())].into()
    }

    /// Sandboxes of a pod UID.
    pub fn sandboxes(&self, uid: &str) -> Vec<api::PodSandbox> {
        self.rt
            .block_on(self.cri.list_pod_sandbox(Self::sel(labels::POD_UID, uid)))
            .unwrap()
    }

    /// Containers of a pod UID.
    pub fn containers(&self, uid: &str) -> Vec<api::Container> {
        self.rt
            .block_on(self.cri.list_containers(Self::sel(labels::POD_UID, uid)))
            .unwrap()
    }

    /// Full status of a container.
    pub fn container_status(&self, id: &str) -> api::ContainerStatus {
        self.rt
            .block_on(self.cri.container_status(id))
            .unwrap()
            .unwrap()
    }

    /// Status of a container that may be removed meanwhile (None then).
    pub fn try_container_status(&self, id: &str) -> Option<api::ContainerStatus> {
        self.rt
            .block_on(self.cri.container_status(id))
            .ok()
            .flatten()
    }

    /// Runs `cmd` in a running container (CRI ExecSync, 10 s limit); returns its exit code and
    /// stdout.
    pub fn exec(&self, id: &str, cmd: &[&str]) -> (i32, String) {
        let r = self
            .rt
            .block_on(self.cri.exec_sync(
                id,
                cmd.iter().map(|s| s.to_string()).collect(),
                Duration::from_secs(10),
            ))
            .unwrap();
        (r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned())
    }

    /// The host PID of a running container's process (from the verbose status info).
    pub fn container_pid(&self, id: &str) -> Option<u32> {
        // The verbose `info` field of containerd carries the pid.
        let out = Command::new("ctr")
            .args([
                "--address",
                self.socket.to_str().unwrap(),
                "-n",
                "k8s.io",
                "tasks",
                "ls",
            ])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find(|l| l.starts_with(id))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
    }

    /// Removes every sandbox created for `node` (test cleanup), listing again until none is
    /// left (at most 10 s): a call the agent had in flight when it was killed can still be
    /// completing in the runtime. What is left then is reported, and the next test binary's
    /// sweep removes it ([`Runtime::remove_stale_test_pods`]).
    pub fn remove_node_pods(&self, node: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let sandboxes = self
                .rt
                .block_on(
                    self.cri
                        .list_pod_sandbox(Self::sel(labels::NODE_NAME, node)),
                )
                .unwrap_or_default();
            if sandboxes.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let left: Vec<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
                eprintln!("cleanup of {node}: sandboxes left: {left:?}");
                return;
            }
            for s in sandboxes {
                let _ = self.rt.block_on(self.cri.stop_pod_sandbox(&s.id));
                let _ = self.rt.block_on(self.cri.remove_pod_sandbox(&s.id));
            }
            // Listed again after a pause, whether a call failed or a sandbox came back (an
            // agent's call still completing).
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Removes what test processes no longer alive left behind: their nodelet agents (killed),
    /// sandboxes (with their containers) and cgroup roots. An interrupted `cargo test` leaves
    /// all three; a finished test can leave a sandbox whose creation the runtime completed after
    /// the test's cleanup had listed the node's pods. Test nodes are named `t<pid>-…`
    /// ([`Nodelet::with_config`]); a node whose test process is not in this PID namespace's
    /// `/proc` is stale (so tests sharing one containerd must share a PID namespace). Temporary
    /// directories are left to the system's cleaning of /tmp. Also removes containers whose
    /// sandbox is gone, whoever made them (no agent keeps such a container; kubelet's garbage
    /// collection removes them too), when both listings answer.
    pub fn remove_stale_test_pods(&self) -> Swept {
        let stale = |node: &str| {
            node.strip_prefix('t')
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        };
        let mut swept = Swept::default();
        // Agents first, or they would make their pods again.
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let node = args
                .windows(2)
                .find(|w| w[0] == b"--hostname-override")
                .map(|w| String::from_utf8_lossy(w[1]).into_owned());
            // Any nodelet binary (another checkout's or profile's too): the node name is what
            // ties it to a dead test process.
            let ours = args
                .first()
                .is_some_and(|a| a == b"nodelet" || a.ends_with(b"/nodelet"));
            if ours && node.is_some_and(|n| stale(&n)) {
                let pid = e.file_name().to_string_lossy().into_owned();
                if Command::new("kill")
                    .args(["-9", &pid])
                    .status()
                    .is_ok_and(|s| s.success())
                {
                    swept.agents += 1;
                }
            }
        }
        for s in self
            .rt
            .block_on(self.cri.list_pod_sandbox(HashMap::new()))
            .unwrap_or_default()
        {
            if s.labels.get(labels::NODE_NAME).is_some_and(|n| stale(n)) {
                let _ = self.rt.block_on(self.cri.stop_pod_sandbox(&s.id));
                if self.rt.block_on(self.cri.remove_pod_sandbox(&s.id)).is_ok() {
                    swept.sandboxes += 1;
                }
            }
        }
        // Containers whose sandbox is gone: made by a call still in flight when their
        // sandbox was removed. No agent keeps such a container. Containers are listed first: a
        // sandbox made after them cannot be theirs.
        // Both listings must answer: an empty sandbox list from a failed call would make
        // every container look orphaned.
        let containers = self.rt.block_on(self.cri.list_containers(HashMap::new()));
        let sandboxes = containers
            .is_ok()
            .then(|| self.rt.block_on(self.cri.list_pod_sandbox(HashMap::new())));
        match (containers, sandboxes) {
            (Ok(containers), Some(Ok(sandboxes))) => {
                let sandbox_ids: std::collections::HashSet<String> =
                    sandboxes.into_iter().map(|s| s.id).collect();
                for c in containers {
                    if !sandbox_ids.contains(&c.pod_sandbox_id)
                        && self.rt.block_on(self.cri.remove_container(&c.id)).is_ok()
                    {
                        swept.containers += 1;
                    }
                }
            }
            _ => eprintln!("sweep: the runtime did not list its containers and sandboxes"),
        }
        let mounts = nodelet::cm::cgroup_mounts();
        let mut roots = std::collections::BTreeSet::new();
        for m in &mounts {
            for e in std::fs::read_dir(m).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.strip_prefix("nodelet-test-").is_some_and(stale) {
                    roots.insert(name);
                }
            }
        }
        swept.cgroup_roots = roots
            .iter()
            .filter(|r| nodelet::cm::remove_cgroup_everywhere(&mounts, r).is_ok())
            .count();
        swept
    }
}

/// What [`Runtime::remove_stale_test_pods`] removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// nodelet processes of dead test processes, killed.
    pub agents: usize,
    /// Their sandboxes, with their containers.
    pub sandboxes: usize,
    /// Containers whose sandbox was gone.
    pub containers: usize,
    /// Their cgroup roots (`/nodelet-test-t<pid>-…`).
    pub cgroup_roots: usize,
}

/// Sweeps what earlier test processes left behind, once per test binary (see
/// [`Runtime::remove_stale_test_pods`]).
fn sweep_stale_once() {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| {
        let s = Runtime::new().remove_stale_test_pods();
        if s.agents + s.sandboxes + s.containers + s.cgroup_roots > 0 {
            eprintln!("removed what earlier test runs left: {s:?}");
        }
    });
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One nodelet under test.
pub struct Nodelet {
    pub node: String,
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// The node API's port (`port`), on 127.0.0.1; a test's own `port:` line wins.
    pub api_port: u16,
    pub cgroup_root: String,
    pub child: Option<Child>,
    pub runtime: Runtime,
    /// The containerd socket it and its [`Runtime`] use.
    pub socket: PathBuf,
    extra_config: String,
    /// Extra command-line arguments.
    pub extra_args: Vec<String>,
    /// Extra environment variables of the process.
    pub extra_env: Vec<(String, String)>,
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Nodelet {
    /// Prepares directories and config; does not start the process.
    pub fn new(test: &str) -> Self {
        Self::with_config(test, "")
    }

    /// Like [`Nodelet::new`] with extra KubeletConfiguration lines appended.
    pub fn with_config(test: &str, extra: &str) -> Self {
        Self::on_runtime(test, extra, &cri_socket())
    }

    /// Like [`Nodelet::with_config`], against the containerd at `socket`.
    pub fn on_runtime(test: &str, extra: &str, socket: &Path) -> Self {
        sweep_stale_once();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let node = format!("t{}-{}-{n}", std::process::id(), test.replace('_', "-"));
        let node: String = node
            .chars()
            .take(40)
            .collect::<String>()
            .trim_end_matches('-')
            .to_string();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
        let s = Self {
            // The systemd driver's tree is systemd's own slices under the root slice (kubelet's
            // usual `/`), one agent at a time; the cgroupfs driver gets a root per test.
            cgroup_root: if extra.contains("cgroupDriver: systemd") {
                "/".into()
            } else {
                format!("/nodelet-test-{node}")
            },
            node,
            dir,
            port: free_port(),
            api_port: free_port(),
            child: None,
            runtime: Runtime::on(socket),
            socket: socket.to_owned(),
            extra_config: extra.to_string(),
            extra_args: Vec::new(),
            extra_env: Vec::new(),
        };
        s.write_config();
        s
    }

    /// `--root-dir`.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    pub fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    fn write_config(&self) {
        // Tests that are not about eviction keep only the memory threshold: a CI disk that is
        // nearly full must not refuse their pods under DiskPressure.
        let eviction = if self.extra_config.contains("evictionHard") {
            ""
        } else {
            "evictionHard: {memory.available: 100Mi}\n"
        };
        // Tests share one containerd: only the image garbage collection tests remove images (on
        // a disk more than 85% used, every agent's image GC would remove the others' images).
        let image_gc = if self.extra_config.contains("imageGC") {
            ""
        } else {
            "imageGCHighThresholdPercent: 100\n"
        };
        // Every agent serves its node API, each on a port of its own.
        let api = if self.extra_config.lines().any(|l| l.starts_with("port:")) {
            String::new()
        } else {
            format!("port: {}\n", self.api_port)
        };
        let cfg = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\nfileCheckFrequency: 2s\nsyncFrequency: 10s\ncontainerRuntimeEndpoint: unix://{}\ncgroupRoot: {}\nhealthzPort: {}\npodLogsDir: {}\n{api}{eviction}{image_gc}{}",
            self.manifests().display(),
            self.socket.display(),
            self.cgroup_root,
            self.port,
            self.logs().display(),
            self.extra_config
        );
        std::fs::write(self.config_path(), cfg).unwrap();
    }

    /// Starts the nodelet process and waits for /healthz. The cgroup root is created first in
    /// every hierarchy, as an operator would (nodelet refuses a missing cgroupRoot).
    pub fn start(&mut self) {
        for m in nodelet::cm::cgroup_mounts() {
            std::fs::create_dir_all(m.join(self.cgroup_root.trim_start_matches('/'))).unwrap();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nodelet.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args([
                "--config",
                self.config_path().to_str().unwrap(),
                "--hostname-override",
                &self.node,
                "--root-dir",
            ])
            .arg(self.dir.path().join("root"))
            .args(["-v", "2"])
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_until(Duration::from_secs(20), "nodelet /healthz", || {
            self.get("/healthz").is_some_and(|b| b == "ok")
        });
    }

    /// Runs the agent once in the foreground on this configuration and returns how it ended
    /// (for start-up refusals; the cgroup root is not created).
    pub fn run_to_exit(&self) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args([
                "--config",
                self.config_path().to_str().unwrap(),
                "--hostname-override",
                &self.node,
                "--root-dir",
            ])
            .arg(self.root())
            .output()
            .unwrap()
    }

    /// SIGKILLs the process (pods keep running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nodelet.log")).unwrap_or_default()
    }

    /// GET a path on the healthz listener; None when it does not answer 200.
    pub fn get(&self, path: &str) -> Option<String> {
        let r = reqwest::blocking::Client::new()
            .get(format!("http://127.0.0.1:{}{path}", self.port))
            .timeout(Duration::from_secs(5))
            .send()
            .ok()?;
        r.status().is_success().then(|| r.text().ok()).flatten()
    }

    /// The `/pods` list as JSON.
    pub fn pods(&self) -> Vec<serde_json::Value> {
        let body = self.get("/pods").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The value of the first `/metrics` sample whose line starts with `prefix` (a metric name,
    /// with or without labels); 0 when absent.
    pub fn metric(&self, prefix: &str) -> f64 {
        self.get("/metrics")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until `n` more housekeeping passes (every 2 s) have run: a marker of the agent's
    /// progress, used instead of a fixed sleep before checking that something did not happen.
    pub fn wait_for_housekeeping(&self, n: u32) {
        let count = || self.metric("kubelet_housekeeping_duration_seconds_count");
        let target = count() + f64::from(n);
        wait_until(
            Duration::from_secs(5 + 4 * u64::from(n)),
            &format!("{n} housekeeping passes"),
            || count() >= target,
        );
    }

    /// `(reason, message)` of the agent's events (`/events`, oldest first) about the container
    /// at `field_path` (`spec.containers{c}`) of the static pod `name` of `default`.
    pub fn container_events(&self, name: &str, field_path: &str) -> Vec<(String, String)> {
        let pod = format!("pod/default/{name}-{}", self.node);
        let events: serde_json::Value =
            serde_json::from_str(&self.get("/events").unwrap_or_default()).unwrap_or_default();
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["involvedObject"] == pod.as_str() && e["fieldPath"] == field_path)
            .map(|e| {
                let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (text("reason"), text("message"))
            })
            .collect()
    }

    /// The pod named `<name>-<node>` in `/pods`.
    pub fn pod(&self, name: &str) -> Option<serde_json::Value> {
        let full = format!("{name}-{}", self.node);
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
    }

    /// UID of pod `name` once `/pods` lists it.
    pub fn uid(&self, name: &str) -> String {
        wait_until(
            Duration::from_secs(20),
            &format!("pod {name} listed"),
            || self.pod(name).is_some(),
        );
        self.pod(name).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Writes a manifest file into the manifest directory.
    pub fn write_manifest(&self, file: &str, text: &str) {
        // Write then rename, as editors and config management do.
        let tmp = self.manifests().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.manifests().join(file)).unwrap();
    }

    /// Waits until the pod's containers named in `names` are all RUNNING in the runtime; returns
    /// their (name → container) map.
    pub fn wait_running(
        &self,
        uid: &str,
        names: &[&str],
        timeout: Duration,
    ) -> HashMap<String, api::Container> {
        let mut out = HashMap::new();
        wait_until(timeout, &format!("containers {names:?} running"), || {
            out = running_by_name(&self.runtime.containers(uid));
            names.iter().all(|n| out.contains_key(*n))
        });
        out
    }
}

/// Running containers of a listing, by container name.
pub fn running_by_name(cs: &[api::Container]) -> HashMap<String, api::Container> {
    cs.iter()
        .filter(|c| c.state == api::ContainerState::ContainerRunning as i32)
        .map(|c| (c.labels[labels::CONTAINER_NAME].clone(), c.clone()))
        .collect()
}

impl Drop for Nodelet {
    fn drop(&mut self) {
        self.kill9();
        self.runtime.remove_node_pods(&self.node);
        // Mounts the killed agent left in its root directory (memory-backed emptyDirs of pods
        // it was running), deepest first, or the temporary directory cannot be removed and the
        // tmpfs stays mounted on the machine.
        let mut left = nodelet::volume::removal::mounts_under(self.dir.path());
        left.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in left {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        let mounts = nodelet::cm::cgroup_mounts();
        let _ = nodelet::cm::remove_cgroup_everywhere(&mounts, &self.cgroup_root);
        if std::thread::panicking() {
            eprintln!("---- nodelet log ({}) ----\n{}", self.node, self.log());
        }
    }
}

/// Polls `f` every 50 ms until it is true; panics with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// A pod cgroup directory `pod<uid>` anywhere under `root` in any hierarchy.
pub fn pod_cgroup_dirs(root: &str, uid: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for m in nodelet::cm::cgroup_mounts() {
        find_dirs(
            &m.join(root.trim_start_matches('/')),
            &format!("pod{uid}"),
            &mut found,
        );
    }
    found
}

fn find_dirs(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            if e.file_name().to_string_lossy() == name {
                out.push(e.path());
            }
            find_dirs(&e.path(), name, out);
        }
    }
}

/// MemTotal of this machine, bytes (procfs reads `/proc/meminfo`).
pub fn mem_total() -> i64 {
    use procfs::Current;
    procfs::Meminfo::current().unwrap().mem_total as i64
}

/// The condition of type `kind` in a pod's `status` (JSON), or null.
pub fn condition(status: &serde_json::Value, kind: &str) -> serde_json::Value {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or_default()
}

/// The kernel's count of OOM kills since boot (`/proc/vmstat` `oom_kill`).
pub fn oom_kills() -> i64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Every file under `dir`, recursively (directories walked, not listed), sorted.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}
