//! Resilience on the real containerd (issue 14, trimmed sizes; `cargo bench --bench scale` has
//! the full ones): the agent SIGKILLed with pods running and started again restarts no
//! container and lists every pod Running within seconds; on the quiet node it then trusts
//! containerd's event stream (a relist every 10 s, not every second) and housekeeping and log
//! rotation list nothing of their own. A hung file system (a frozen ext4) holds only the pods
//! whose volumes are on it: the others start and `/healthz` answers; a hung log directory holds
//! the log rotation, not the agent. A pod whose container was
//! removed from containerd behind CRI's back (`ctr`), which containerd's CRI then cannot remove,
//! still terminates and is gone, and the sandbox left is not killed again every pass.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

const PODS: usize = 20;

fn manifest(i: usize) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: r{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600'], resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}}}\n")
}

fn running_in_pods(n: &Nodelet) -> usize {
    n.pods()
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
        .count()
}

#[test]
fn a_sigkilled_agent_comes_back_without_restarting_a_container() {
    let mut n = Nodelet::new("kill9");
    n.start();
    for i in 0..PODS {
        n.write_manifest(&format!("r{i}.yaml"), &manifest(i));
    }
    wait_until(
        Duration::from_secs(120),
        "all pods Running in /pods",
        || running_in_pods(&n) == PODS,
    );
    let uids: Vec<String> = (0..PODS).map(|i| n.uid(&format!("r{i}"))).collect();
    let before: HashMap<String, String> = uids
        .iter()
        .map(|u| {
            let cs = n.runtime.containers(u);
            assert_eq!(cs.len(), 1, "{u}: {cs:?}");
            (u.clone(), cs[0].id.clone())
        })
        .collect();
    n.kill9();
    let restarted = Instant::now();
    n.start();
    wait_until(
        Duration::from_secs(5),
        "all pods Running in /pods after the restart",
        || running_in_pods(&n) == PODS,
    );
    let took = restarted.elapsed();
    eprintln!("{PODS} pods Running in /pods {took:?} after the agent was started again");
    // A few housekeeping passes later: the same containers, none restarted, no duplicates.
    n.wait_for_housekeeping(2);
    for (uid, id) in &before {
        let cs = n.runtime.containers(uid);
        assert_eq!(cs.len(), 1, "{uid}: {cs:?}");
        assert_eq!(&cs[0].id, id, "{uid}: container replaced");
        assert_eq!(n.runtime.sandboxes(uid).len(), 1, "{uid}: one sandbox");
    }
    for p in n.pods() {
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"], 0,
            "{p}"
        );
    }
    // Quiet now: no container event comes. Six housekeeping passes (12 s) cost at most the
    // periodic relist (every 10 s) and a follow-up, and no listing besides the relists'.
    let relists = || n.metric("kubelet_pleg_relist_duration_seconds_count");
    let listings =
        || n.metric("kubelet_runtime_operations_total{operation_type=\"list_podsandbox\"}");
    let (r0, l0) = (relists(), listings());
    n.wait_for_housekeeping(6);
    let (r, l) = (relists() - r0, listings() - l0);
    eprintln!("quiet node, 6 housekeeping passes: {r} relists, {l} ListPodSandbox calls");
    assert!(r <= 3.0, "{r} relists in 12 s on a quiet node");
    assert!(l <= r, "{l} ListPodSandbox calls besides {r} relists");
}

/// A small ext4 file system loop-mounted at `dir`, frozen (`fsfreeze -f`: every write to it
/// waits) until dropped, then thawed and unmounted. Declared after the agent, so that it is
/// dropped first: the agent's threads waiting on it are let go before the agent is killed.
struct FrozenFs {
    dir: std::path::PathBuf,
}

fn run(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

impl FrozenFs {
    /// Made, mounted and frozen.
    fn new(image: &std::path::Path, dir: &std::path::Path) -> Self {
        let fs = Self::mounted(image, dir, 16 << 20);
        fs.freeze();
        fs
    }

    /// Made (`bytes` large) and mounted at `dir`, not frozen yet.
    fn mounted(image: &std::path::Path, dir: &std::path::Path, bytes: u64) -> Self {
        std::fs::File::create(image)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        run(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(image));
        std::fs::create_dir_all(dir).unwrap();
        run(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(dir));
        Self {
            dir: dir.to_owned(),
        }
    }

    fn freeze(&self) {
        run(std::process::Command::new("fsfreeze")
            .arg("-f")
            .arg(&self.dir));
    }

    fn thaw(&self) {
        let _ = std::process::Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.dir)
            .output();
    }
}

impl Drop for FrozenFs {
    fn drop(&mut self) {
        self.thaw();
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn a_hung_file_system_holds_only_the_pods_that_touch_it() {
    let mut n = Nodelet::new("frozenfs");
    n.start();
    let work = tempfile::tempdir().unwrap();
    let frozen = FrozenFs::new(&work.path().join("fs.img"), &work.path().join("mnt"));
    // Three pods whose hostPath directory is to be made on the frozen file system: each pod's
    // volume set-up waits in mkdir (more of them than the runtime had worker threads).
    for i in 0..3 {
        n.write_manifest(
            &format!("hung{i}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: hung{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: v, hostPath: {{path: {}/d{i}, type: DirectoryOrCreate}}}}]\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600'], volumeMounts: [{{name: v, mountPath: /v}}]}}\n",
                frozen.dir.display()
            ),
        );
    }
    wait_until(
        Duration::from_secs(20),
        "the three hung pods admitted",
        || n.pods().len() == 3,
    );
    // The others go on: a new pod starts, /healthz and /pods answer.
    n.write_manifest("free.yaml", &manifest(0));
    wait_until(Duration::from_secs(60), "the free pod Running", || {
        running_in_pods(&n) == 1
    });
    assert_eq!(n.get("/healthz").as_deref(), Some("ok"));
    for i in 0..3 {
        let uid = n.uid(&format!("hung{i}"));
        assert!(
            n.runtime.sandboxes(&uid).is_empty(),
            "hung{i} got a sandbox while its volume could not be set up"
        );
    }
    // Thawed: the hung pods' set-up completes and they start.
    frozen.thaw();
    wait_until(
        Duration::from_secs(60),
        "every pod Running after the thaw",
        || running_in_pods(&n) == 4,
    );
    for i in 0..3 {
        assert!(frozen.dir.join(format!("d{i}")).is_dir(), "d{i} made");
    }
}

#[test]
fn a_hung_log_directory_holds_only_the_log_rotation() {
    let mut n = Nodelet::with_config(
        "frozenlogs",
        "containerLogMaxSize: 64Ki\ncontainerLogMaxFiles: 2\ncontainerLogMonitorInterval: 200ms\n",
    );
    let work = tempfile::tempdir().unwrap();
    // podLogsDir is a file system of its own, frozen once a log has rotated on it.
    let logs = FrozenFs::mounted(&work.path().join("fs.img"), &n.logs(), 64 << 20);
    n.start();
    n.write_manifest(
        "chatty.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: chatty}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, 'i=0; while true; do i=$((i+1)); echo \"line $i 0123456789012345678901234567890123456789\"; done']}\n",
    );
    let rotated = || {
        common::files_under(&n.logs())
            .iter()
            .any(|p| p.to_string_lossy().contains(".log."))
    };
    wait_until(Duration::from_secs(60), "a rotated log", rotated);
    logs.freeze();
    // Rotation passes (every 200 ms) meet the frozen directory with the log over its size:
    // they wait, the agent does not. Its housekeeping goes on and it answers.
    n.wait_for_housekeeping(3);
    assert_eq!(n.get("/healthz").as_deref(), Some("ok"));
    assert_eq!(n.pods().len(), 1);
    logs.thaw();
    n.wait_for_housekeeping(1);
}

/// `ctr` on the runtime at `socket`, namespace `k8s.io`; its status and stderr.
fn ctr(socket: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("ctr")
        .args(["--address", socket.to_str().unwrap(), "-n", "k8s.io"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Puts a containerd container of ID `.1` back when dropped (after the test's assertions, or
/// when one fails), so that containerd's CRI can remove its sandbox again: without it, the
/// sandbox would stay for every later sweep of stale test pods to meet.
struct PutBack(std::path::PathBuf, String);

impl Drop for PutBack {
    fn drop(&mut self) {
        let _ = ctr(
            &self.0,
            &[
                "containers",
                "create",
                "docker.io/library/busybox:1.36",
                &self.1,
            ],
        );
    }
}

#[test]
fn a_pod_whose_container_was_removed_behind_cri_still_terminates() {
    let mut n = Nodelet::new("tampered");
    n.start();
    n.write_manifest(
        "done.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: done}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: ['true']}\n",
    );
    wait_until(Duration::from_secs(60), "the pod Succeeded", || {
        n.pod("done")
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    });
    let uid = n.uid("done");
    let cs = n.runtime.containers(&uid);
    assert_eq!(cs.len(), 1, "{cs:?}");
    // Removed from containerd's own store with ctr, where CRI still lists it; containerd's CRI
    // then answers NotFound to the sandbox's removal.
    let _ = ctr(&n.socket, &["tasks", "delete", &cs[0].id]);
    let (ok, err) = ctr(&n.socket, &["containers", "delete", &cs[0].id]);
    let put_back = PutBack(n.socket.clone(), cs[0].id.clone());
    assert!(ok, "ctr containers delete: {err}");
    std::fs::remove_file(n.manifests().join("done.yaml")).unwrap();
    wait_until(
        Duration::from_secs(30),
        "the pod gone from /pods and its directory removed",
        || n.pod("done").is_none() && !n.root().join("pods").join(&uid).exists(),
    );
    // containerd still lists the sandbox: housekeeping kills it once more at most (it may have
    // listed it idle just after the kill), then leaves it to the garbage collector, not a
    // kill and a warning every pass.
    n.wait_for_housekeeping(4);
    let log = n.log();
    let warned = log.matches("sandbox removal found part of it gone").count();
    assert!((1..=2).contains(&warned), "warned {warned} times:\n{log}");
    drop(put_back);
    n.runtime.remove_node_pods(&n.node);
    assert!(n.runtime.sandboxes(&uid).is_empty(), "sandbox left");
}
