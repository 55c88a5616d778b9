//! A nodelet process for the benchmarks: its own directory, manifest directory, node name, port
//! and cgroupRoot (created in every hierarchy), on the private containerd of scripts/env/up.sh.

#![allow(dead_code)] // each benchmark uses part of it

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The private containerd's CRI socket.
pub const SOCKET: &str = "/run/nodelet-env/containerd/containerd.sock";

/// The mount point of the benchmarks' file system for the agents' directories ([`bench_fs`]).
pub const BENCH_FS: &str = "/run/nodelet-env/benchfs";

/// The image behind [`BENCH_FS`]: 4 GiB, sparse, made once.
pub const BENCH_FS_IMAGE: &str = "/var/lib/nodelet-env/benchfs.img";

/// The directory under which every benchmarked agent, nodelet's and kubelet's, keeps its root
/// directory, configuration and staticPodPath ([`agent_dir`]): an ext4 file system with a
/// journal, as a node's `/var/lib/kubelet` is, loop-mounted at [`BENCH_FS`] from
/// [`BENCH_FS_IMAGE`] (made and mounted here the first time, as root). Pod logs stay on the
/// machine's own file system for both agents (kubelet v1.20 writes them to `/var/log/pods`).
///
/// Why: this machine's root file system is ext4 without a journal, where each new inode is
/// searched for past every inode freed in the last 60 s (300 s while its table block is dirty;
/// the kernel's `recently_deleted` in `fs/ext4/ialloc.c`, skipped when there is a journal), and
/// the benchmark frees thousands between the sides of a repetition. On 2026-12-05 the journal
/// took 11 % off a standalone nodelet's CPU per pod start and, in the scale benchmark, a
/// quarter off its kernel time (benches/README.md, "The agents' file system", run H).
///
/// `BENCH_FS=tmp` keeps the directories in the system's temporary directory, as before; so does
/// a machine where the loop mount cannot be made (the reason is printed).
pub fn bench_fs() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if std::env::var("BENCH_FS").is_ok_and(|v| v == "tmp") {
            println!("agents' directories: {} (BENCH_FS=tmp)", tmp.display());
            return tmp;
        }
        match mount_bench_fs() {
            Ok(()) => {
                println!("agents' directories: {BENCH_FS} (ext4 with a journal, {BENCH_FS_IMAGE}; BENCH_FS=tmp for the system's temporary directory)");
                PathBuf::from(BENCH_FS)
            }
            Err(e) => {
                println!(
                    "agents' directories: {} ({BENCH_FS} not made: {e})",
                    tmp.display()
                );
                tmp
            }
        }
    })
}

/// Makes [`BENCH_FS_IMAGE`] (when missing) and mounts it at [`BENCH_FS`] (when not mounted).
///
/// Errors: the command that failed, with its output.
fn mount_bench_fs() -> Result<(), String> {
    let mounted = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?
        .into_iter()
        .any(|m| m.mount_point == std::path::Path::new(BENCH_FS) && m.fs_type == "ext4");
    if mounted {
        return Ok(());
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    std::fs::create_dir_all(BENCH_FS).map_err(|e| format!("{BENCH_FS}: {e}"))?;
    if !std::path::Path::new(BENCH_FS_IMAGE).exists() {
        let part = format!("{BENCH_FS_IMAGE}.part");
        std::fs::File::create(&part)
            .and_then(|f| f.set_len(4 << 30))
            .map_err(|e| format!("{part}: {e}"))?;
        // mke2fs's ext4 defaults include the journal (has_journal).
        run(Command::new("mkfs.ext4").args(["-q", "-F", &part]))?;
        std::fs::rename(&part, BENCH_FS_IMAGE).map_err(|e| format!("{BENCH_FS_IMAGE}: {e}"))?;
    }
    run(Command::new("mount").args(["-o", "loop", BENCH_FS_IMAGE, BENCH_FS]))
}

/// A fresh directory for one agent's files, under [`bench_fs`]; removed on drop.
pub fn agent_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(bench_fs())
        .unwrap_or_else(|e| panic!("a directory in {}: {e}", bench_fs().display()))
}

/// The CRI socket the benchmarks use: `NODELET_CRI_ENDPOINT` (as the tests read it: the
/// cgroup v2 guest's containerd, say), else [`SOCKET`].
pub fn socket() -> String {
    std::env::var("NODELET_CRI_ENDPOINT")
        .map(|e| e.trim_start_matches("unix://").to_owned())
        .unwrap_or_else(|_| SOCKET.to_owned())
}

/// A CRI client of the benchmarks' runtime ([`socket`], calls timed out after 120 s, metrics of
/// its own) on `rt`, with `busybox:1.36`, the image of the benchmarks' pods, pulled. Panics when
/// the runtime does not answer or the pull fails (run scripts/env/up.sh first).
pub fn cri_with_busybox(rt: &tokio::runtime::Runtime) -> nodelet::cri::Cri {
    use nodelet::cri::ImageService;
    let sock = PathBuf::from(socket());
    let cri = rt.block_on(async {
        nodelet::cri::Cri::new(
            &sock,
            &sock,
            Duration::from_secs(120),
            nodelet::metrics::Metrics::new(),
        )
    });
    rt.block_on(cri.pull_image("busybox:1.36", None, None))
        .unwrap_or_else(|e| panic!("pull busybox:1.36 on {}: {e}", sock.display()));
    cri
}

/// A running nodelet.
pub struct Agent {
    /// Root of its files (config, manifests, root dir), under [`bench_fs`]; removed on drop.
    pub dir: tempfile::TempDir,
    /// staticPodPath.
    pub manifests: PathBuf,
    /// podLogsDir: a directory of its own in the system's temporary directory; removed on drop.
    pub logs: PathBuf,
    logs_dir: tempfile::TempDir,
    /// --hostname-override.
    pub node: String,
    /// healthzPort.
    pub port: u16,
    /// The node API's `port` (HTTPS).
    pub api_port: u16,
    /// cgroupRoot.
    pub cgroup_root: String,
    /// The process.
    pub child: Child,
    /// The binary it runs (to start it again).
    pub bin: PathBuf,
    /// Command-line arguments besides the configuration, node name and root directory.
    pub args: Vec<String>,
}

/// The nodelet binary the benchmarks run: `NODELET_BIN` (the packaged build,
/// `target/dist/nodelet` after `scripts/dist.sh`, for the headline figures), else
/// the one cargo built beside the benchmark (profile `bench`).
pub fn nodelet_bin() -> PathBuf {
    std::env::var_os("NODELET_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_nodelet")),
        PathBuf::from,
    )
}

/// Starts nodelet ([`nodelet_bin`]) as `node` with the base configuration plus `extra` lines,
/// its stderr going to `stderr`, and waits for `/healthz` to answer.
pub fn start(node: &str, extra: &str, stderr: Stdio) -> Agent {
    start_binary(&nodelet_bin(), node, extra, stderr)
}

/// Drops the kernel's clean page cache (`sync`, then `3` into `/proc/sys/vm/drop_caches`), as on
/// a freshly booted node: the next agent reads its binary from disk, so the text it maps is what
/// the kernel's readahead brings in and not what an earlier copy or build left cached (the
/// kernel maps whole page-cache folios: the same binary maps 13.8 MiB of text after a drop, 15.4
/// after a `cp`, 17.3 after a `cat`; benches/README.md, "Headline"), and the memory cgroups that
/// earlier pods left dying (still charged with page cache) are released. Returns false when the
/// kernel refused (not root) or `DROP_CACHES=0`.
pub fn fresh_page_cache() -> bool {
    if std::env::var("DROP_CACHES").is_ok_and(|v| v == "0") {
        return false;
    }
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// [`start`] with another nodelet binary (an earlier build, to compare two in one run).
pub fn start_binary(bin: &std::path::Path, node: &str, extra: &str, stderr: Stdio) -> Agent {
    start_with_args(bin, node, extra, stderr, Vec::new())
}

/// [`start_binary`] with more command-line arguments `args` (e.g. `--kubeconfig FILE`).
pub fn start_with_args(
    bin: &std::path::Path,
    node: &str,
    extra: &str,
    stderr: Stdio,
    args: Vec<String>,
) -> Agent {
    let socket = socket();
    assert!(
        std::path::Path::new(&socket).exists(),
        "run scripts/env/up.sh first"
    );
    let dir = agent_dir();
    let manifests = dir.path().join("manifests");
    // Pod logs on the machine's file system, as kubelet's `/var/log/pods` ([`bench_fs`]).
    let logs_dir = tempfile::tempdir().unwrap();
    let logs = logs_dir.path().to_path_buf();
    std::fs::create_dir_all(&manifests).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The node API on a port of its own, as every agent serves one.
    let api_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cgroup_root = format!("/nodelet-bench-{node}");
    let cfg = dir.path().join("config.yaml");
    // As in the tests: a nearly full disk must not put the benchmark under DiskPressure.
    let eviction = if extra.contains("evictionHard") {
        ""
    } else {
        "evictionHard: {memory.available: 100Mi}\n"
    };
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\ncontainerRuntimeEndpoint: unix://{socket}\ncgroupRoot: {cgroup_root}\nhealthzPort: {port}\nport: {api_port}\npodLogsDir: {}\n{eviction}{extra}",
            manifests.display(),
            logs.display()
        ),
    )
    .unwrap();
    for m in nodelet::cm::cgroup_mounts() {
        std::fs::create_dir_all(m.join(cgroup_root.trim_start_matches('/'))).unwrap();
    }
    let child = spawn(bin, dir.path(), node, port, stderr, &args);
    Agent {
        dir,
        manifests,
        logs,
        logs_dir,
        node: node.to_owned(),
        port,
        api_port,
        cgroup_root,
        child,
        bin: bin.to_owned(),
        args,
    }
}

/// Starts `bin` on the configuration in `dir` and waits for `/healthz` to answer.
fn spawn(
    bin: &std::path::Path,
    dir: &std::path::Path,
    node: &str,
    port: u16,
    stderr: Stdio,
    args: &[String],
) -> Child {
    let child = Command::new(bin)
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(["--hostname-override", node])
        .arg("--root-dir")
        .arg(dir.join("root"))
        .args(args)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqwest::blocking::get(format!("http://127.0.0.1:{port}/healthz")).is_err() {
        assert!(Instant::now() < deadline, "nodelet did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// The agent is killed when its `Agent` goes (a benchmark that panics leaves no agent behind;
/// its pods stay for the next run's clean-up), and its cgroupRoot is removed from every
/// hierarchy where it is empty (else every run left its QoS cgroups, 7 in each of the 10 v1
/// hierarchies, on the machine).
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ =
            nodelet::cm::remove_cgroup_everywhere(&nodelet::cm::cgroup_mounts(), &self.cgroup_root);
    }
}

impl Agent {
    /// SIGKILLs the agent and starts it again on the same configuration, directories and port;
    /// returns once `/healthz` answers.
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(
            &self.bin,
            self.dir.path(),
            &self.node,
            self.port,
            Stdio::null(),
            &self.args,
        );
    }
}

/// The value of environment variable `name` as a number, `default` when unset or not one.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds of a process from `/proc/<pid>/stat`: utime + stime, and with `children` the
/// reaped children's too (cutime + cstime). 0 when the process is gone.
pub fn cpu_seconds(pid: u32, children: bool) -> f64 {
    let f = stat_ticks(pid);
    let mut ticks = f[0] + f[1];
    if children {
        ticks += f[2] + f[3];
    }
    ticks / 100.0
}

/// CPU seconds of a process's live threads at nanosecond resolution: the sum of the first
/// field of `/proc/<pid>/task/*/schedstat` (time on a CPU, ns). Threads that have exited are
/// not counted: for a short measurement of an agent whose threads live as long as it does.
pub fn cpu_seconds_fine(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// The part of [`cpu_seconds`] (without children) spent in the kernel (stime), seconds.
pub fn system_seconds(pid: u32) -> f64 {
    stat_ticks(pid)[1] / 100.0
}

/// utime, stime, cutime, cstime of a process, clock ticks; zeros when it is gone.
fn stat_ticks(pid: u32) -> [f64; 4] {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return [0.0; 4];
    };
    // Fields after the command, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // rest[0] is the state (field 3); utime is field 14 → rest[11].
    [f[11], f[12], f[13], f[14]]
}

/// The samples of an agent's metrics page `path` (`/metrics`, `/metrics/probes`): each line
/// with its value (the last field; 0 when it is not a number). Empty when the agent does not
/// answer.
pub fn metric_samples(port: u16, path: &str) -> Vec<(String, f64)> {
    let text = reqwest::blocking::get(format!("http://127.0.0.1:{port}{path}"))
        .and_then(|r| r.text())
        .unwrap_or_default();
    text.lines()
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
